"""sclite's word alignment: dynamic programming over word networks with sclite's costs and ties.

Costs (SCTK word.c, wwd_WORD): correct 0, substitution 4, insertion/deletion 3, insertion/deletion
of an optionally deletable ``(word)`` 2, of the null word ``@`` 0.001.  With sclite's ``-D`` a
deleted optional word is scored *correct*; with ``-F`` a fragment ``abc-`` matches any word
starting ``abc`` (``-abc`` any word ending ``abc``).  Either side may contain alternations
``{ a b / c }`` (hypotheses get them from GLM contractions); the DP runs over the network of arcs
(net_dp.c), preferring substitution, then deletion, then insertion on equal cost, and the first
predecessor in arc order on equal cost, so the chosen alignment is sclite's own.  Costs are kept
in thousandths as integers so ties are exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from asrtrain import AsrtrainError
from asrtrain.score.glm import ascii_lower

CORR, SUB, DEL, INS = "C", "S", "D", "I"

_COST_NULL = 1  # insertion/deletion of '@'
_COST_NULL_SUB = 1000  # '@' for '@'
_COST_OPT = 2000  # insertion/deletion of an optionally deletable word
_COST_INS_DEL = 3000
_COST_SUB = 4000


@dataclass(frozen=True)
class Word:
    """A word as sclite's WORD: ``value`` lower-cased, ``intern`` without optional parentheses."""

    value: str
    opt_del: bool = False
    frag: bool = False

    @property
    def intern(self) -> str:
        return self.value[1:-1] if self.opt_del else self.value

    @property
    def is_null(self) -> bool:
        return self.value == "@"


def make_word(text: str, fragments: bool = True, optional: bool = True,
              lower: bool = True) -> Word:
    """Build a Word like sclite (new_WORD, decode_opt_del, decode_fragment)."""
    value = ascii_lower(text) if lower else text
    if len(value) > 1 and value.endswith("*"):
        value = value[:-1]
    opt_del = optional and len(value) >= 2 and value[0] == "(" and value[-1] == ")"
    frag = False
    if fragments and value:
        frag = value[-1] == "-" or value[0] == "-" or (
            opt_del and len(value) >= 2 and value[-2] == "-"
        )
    return Word(value, opt_del, frag)


def words_equal(ref: Word, hyp: Word) -> bool:
    """sclite's equal_WORD2: exact match of the internal text, or a fragment match."""
    it1, it2 = ref.intern, hyp.intern
    l1, l2 = len(it1), len(it2)
    if ref.frag or hyp.frag:
        if l1 > 1 and it1[0] == "-":
            if l2 < l1 - 1:
                return False
            return it1[1:] == it2[l2 - (l1 - 1):]
        if l1 > 1 and it1[-1] == "-":
            return it2[: l1 - 1] == it1[: l1 - 1]
        if l2 > 1 and it2[0] == "-":
            if l1 < l2 - 1:
                return False
            return it1[l1 - (l2 - 1):] == it2[1:]
        if l2 > 1 and it2[-1] == "-":
            return it1[: l2 - 1] == it2[: l2 - 1]
    return it1 == it2


def _cost(ref: Word | None, hyp: Word | None) -> int:
    """wwd_WORD in thousandths."""
    if hyp is None and ref is not None and ref.is_null:
        return _COST_NULL
    if ref is None and hyp is not None and hyp.is_null:
        return _COST_NULL
    if (ref is None and hyp is not None and hyp.opt_del) or (
        hyp is None and ref is not None and ref.opt_del
    ):
        return _COST_OPT
    if ref is None or hyp is None:
        return _COST_INS_DEL
    if ref.is_null and hyp.is_null:
        return _COST_NULL_SUB
    return 0 if words_equal(ref, hyp) else _COST_SUB


class Network:
    """A word network in topological arc order; arc 0 is sclite's null head arc.

    ``preds[i]`` lists the arcs entering arc i's start node in sclite's in-arc order and
    ``finals`` the arcs entering the stop node.
    """

    def __init__(self) -> None:
        self.words: list[Word | None] = [None]
        self.preds: list[list[int]] = [[]]
        self.finals: list[int] = [0]

    def _add(self, word: Word, preds: list[int]) -> int:
        self.words.append(word)
        self.preds.append(list(preds))
        return len(self.words) - 1

    def append_word(self, word: Word) -> None:
        self.finals = [self._add(word, self.finals)]

    def append_alternation(self, alternatives: Sequence[Sequence[Word]]) -> None:
        start = self.finals
        ends: list[int] = []
        for alt in alternatives:
            seq = list(alt) or [Word("@")]
            tails = start
            for w in seq:
                tails = [self._add(w, tails)]
            ends.extend(tails)
        self.finals = ends

    def __len__(self) -> int:
        return len(self.words) - 1


def network_from_tokens(tokens: Iterable[str | Sequence[Sequence[str]]], fragments: bool = True,
                        optional: bool = True) -> Network:
    """Build a network from words and alternations (a list of alternatives, each a word list)."""
    net = Network()
    for tok in tokens:
        if isinstance(tok, str):
            net.append_word(make_word(tok, fragments, optional))
        else:
            net.append_alternation(
                [[make_word(w, fragments, optional) for w in alt] for alt in tok]
            )
    return net


def parse_text(text: str) -> list[str | list[list[str]]]:
    """Split transcript text into words and ``{ a / b }`` alternations, as sclite tokenizes."""
    out: list[str | list[list[str]]] = []
    spaced = text.replace("{", " { ").replace("}", " } ").replace("/", " / ")
    tokens = spaced.split()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "{":
            alts: list[list[str]] = [[]]
            i += 1
            while i < len(tokens) and tokens[i] != "}":
                if tokens[i] == "/":
                    alts.append([])
                else:
                    alts[-1].append(tokens[i])
                i += 1
            out.append(alts)
        elif tok not in ("}",):
            out.append(tok)
        i += 1
    return out


@dataclass
class AlignedPair:
    """One step of an alignment: ``op`` is C/S/D/I; an empty string stands for a missing word."""

    op: str
    ref: str
    hyp: str


def align_networks(ref: Network, hyp: Network) -> list[AlignedPair]:
    """Align two networks with sclite's DP (Network_dpalign) and return the best path."""
    # One function over 80 lines on purpose: the fill and the back-trace mirror net_dp.c step by
    # step (tie order included, which parity with sclite depends on) and this inner loop is the
    # scorer's hot path, where helper calls per cell cost measurably.
    na, nb = len(ref.words), len(hyp.words)
    inf = 1 << 60
    cost = [[inf] * nb for _ in range(na)]
    back: list[list[tuple[str, int, int]]] = [[("", -1, -1)] * nb for _ in range(na)]
    cost[0][0] = 0
    rw, hw = ref.words, hyp.words
    for b in range(1, nb):
        best, bi = inf, -1
        for pb in hyp.preds[b]:
            if cost[0][pb] < best:
                best, bi = cost[0][pb], pb
        cost[0][b] = best + _cost(None, hw[b])
        back[0][b] = (INS, 0, bi)
    for a in range(1, na):
        best, ai = inf, -1
        for pa in ref.preds[a]:
            if cost[pa][0] < best:
                best, ai = cost[pa][0], pa
        cost[a][0] = best + _cost(rw[a], None)
        back[a][0] = (DEL, ai, 0)
    for a in range(1, na):
        ra = rw[a]
        preds_a = ref.preds[a]
        del_cost = _cost(ra, None)
        row = cost[a]
        for b in range(1, nb):
            hb = hw[b]
            preds_b = hyp.preds[b]
            ins, ib = inf, -1
            for pb in preds_b:
                if row[pb] < ins:
                    ins, ib = row[pb], pb
            dele, da = inf, -1
            for pa in preds_a:
                if cost[pa][b] < dele:
                    dele, da = cost[pa][b], pa
            sub, sa, sb = inf, -1, -1
            for pa in preds_a:
                crow = cost[pa]
                for pb in preds_b:
                    if crow[pb] < sub:
                        sub, sa, sb = crow[pb], pa, pb
            sub += _cost(ra, hb)
            dele += del_cost
            ins += _cost(None, hb)
            if sub <= dele and sub <= ins:
                row[b] = sub
                back[a][b] = (SUB, sa, sb)
            elif dele < ins:
                row[b] = dele
                back[a][b] = (DEL, da, b)
            else:
                row[b] = ins
                back[a][b] = (INS, a, ib)
    best, a, b = inf, -1, -1
    for fa in ref.finals:
        for fb in hyp.finals:
            if cost[fa][fb] < best:
                best, a, b = cost[fa][fb], fa, fb
    path: list[AlignedPair] = []
    while a > 0 or b > 0:
        op, pa, pb = back[a][b]
        if op == DEL:
            w = rw[a]
            if not w.is_null:
                path.append(AlignedPair(CORR, w.value, "") if w.opt_del
                            else AlignedPair(DEL, w.value, ""))
        elif op == SUB:
            r, h = rw[a], hw[b]
            if not (r.is_null and h.is_null):
                path.append(AlignedPair(CORR if words_equal(r, h) else SUB, r.value, h.value))
        elif op == INS:
            w = hw[b]
            if not w.is_null:
                path.append(AlignedPair(CORR, "", w.value) if w.opt_del
                            else AlignedPair(INS, "", w.value))
        else:
            raise AsrtrainError("internal error: broken alignment back-trace")
        a, b = pa, pb
    path.reverse()
    return path


@dataclass
class Counts:
    """Word and segment counts as sclite reports them (a deleted optional word counts correct)."""

    corr: int = 0
    sub: int = 0
    dels: int = 0
    ins: int = 0
    segments: int = 0
    sent_err: int = 0

    @property
    def err(self) -> int:
        return self.sub + self.dels + self.ins

    @property
    def ref_words(self) -> int:
        return self.corr + self.sub + self.dels

    @property
    def hyp_words(self) -> int:
        return self.corr + self.sub + self.ins

    @property
    def wer(self) -> float:
        """Word error rate in percent (0 when there are no reference words)."""
        return 100.0 * self.err / self.ref_words if self.ref_words else 0.0

    def add_path(self, path: Iterable[AlignedPair]) -> None:
        errors = 0
        for p in path:
            if p.op == CORR:
                self.corr += 1
            elif p.op == SUB:
                self.sub += 1
            elif p.op == DEL:
                self.dels += 1
            else:
                self.ins += 1
            errors += p.op != CORR
        self.segments += 1
        self.sent_err += errors > 0

    def __iadd__(self, other: Counts) -> Counts:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, int]:
        return {"corr": self.corr, "sub": self.sub, "dels": self.dels, "ins": self.ins,
                "err": self.err, "ref_words": self.ref_words, "segments": self.segments,
                "sent_err": self.sent_err}


def align_words(ref: Sequence[str], hyp: Sequence[str], fragments: bool = True,
                optional: bool = True) -> list[AlignedPair]:
    """Align two word sequences (alternations allowed as ``{ a / b }`` text) like sclite."""
    return align_networks(
        network_from_tokens(parse_text(" ".join(ref)), fragments, optional),
        network_from_tokens(parse_text(" ".join(hyp)), fragments, optional),
    )

