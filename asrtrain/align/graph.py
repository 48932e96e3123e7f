"""Per-utterance training graphs (Kaldi's ``compile-train-graphs``) as arrays for batched Viterbi.

An utterance's transcript becomes a phone DAG: the pronunciations of each word (alternatives in
parallel), with the optional silence of the lexicon FST before the first word and after every word
(costs ``-log(1 - sil_prob)`` to skip, ``-log sil_prob`` to take).  Phone arcs are expanded to
triphones ``(left, phone, right)`` -- the context each arc actually has on each path, so alternative
pronunciations and optional silences get the right contexts, as composing with Kaldi's C does --
and each triphone to the HMM states of its phone, each carrying the pdf the tree gives it.  The
result is an acceptor over emitting HMM states: ``pdf[s]``, arcs ``src -> dst`` with log weights
(transition probabilities with Kaldi's self-loop scale, plus the lexicon's silence costs), start
weights and final weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from asrtrain.lang.lexicon import Lang


@dataclass
class PhoneArc:
    src: int
    dst: int
    phone: int
    cost: float          # -log probability (silence choices)
    word: int            # index of the word in the transcript, -1 for optional silence


@dataclass
class PhoneGraph:
    arcs: list[PhoneArc]
    start: int
    final: dict[int, float]   # node -> final cost


def phone_graph(lang: Lang, words: list[str]) -> PhoneGraph:
    """The lexicon FST restricted to one transcript, without epsilons (see module docstring)."""
    ps = lang.phones
    sil = ps.phones[ps.optional_silence]
    sil_cost, no_sil_cost = -math.log(lang.sil_prob), -math.log(1.0 - lang.sil_prob)
    arcs: list[PhoneArc] = []
    n = 0

    def node() -> int:
        nonlocal n
        n += 1
        return n - 1

    # junction j precedes word j; from it: skip silence (cost no_sil) or take sil to after_sil[j]
    junction = [node() for _ in range(len(words) + 1)]
    after_sil = [node() for _ in range(len(words) + 1)]
    for j in range(len(words) + 1):
        arcs.append(PhoneArc(junction[j], after_sil[j], sil, sil_cost, -1))
    for j, w in enumerate(words):
        for pron in lang.lexicon[w]:
            for origin, cost in ((junction[j], no_sil_cost), (after_sil[j], 0.0)):
                cur = origin
                for k, p in enumerate(pron):
                    nxt = junction[j + 1] if k == len(pron) - 1 else node()
                    arcs.append(PhoneArc(cur, nxt, ps.phones[p], cost if k == 0 else 0.0, j))
                    cur = nxt
    return PhoneGraph(arcs, junction[0], {junction[-1]: no_sil_cost, after_sil[-1]: 0.0})


@dataclass
class HmmGraph:
    """An acceptor over emitting HMM states (all arrays numpy; costs are log probabilities)."""

    pdf: np.ndarray          # [S] int64 pdf id of each state
    phone: np.ndarray        # [S] phone id
    hmm_state: np.ndarray    # [S] state index within the phone's HMM
    word: np.ndarray         # [S] word index in the transcript (-1: optional silence)
    src: np.ndarray          # [A] int64
    dst: np.ndarray          # [A] int64
    weight: np.ndarray       # [A] float32 log weight
    start: np.ndarray        # [S] float32 log weight to begin in a state (-inf: cannot)
    final: np.ndarray        # [S] float32 log weight to end in a state (-inf: cannot)
    # how the weights were made, so new transition probabilities need no recompile
    # (:meth:`reweighted`): an index into :func:`transition_table` (-1: none) plus a lexicon cost
    arc_trans: np.ndarray | None = None     # [A] int32
    arc_cost: np.ndarray | None = None      # [A] float64 log weight
    final_trans: np.ndarray | None = None   # [S] int32
    final_cost: np.ndarray | None = None    # [S] float64 log weight

    @property
    def num_states(self) -> int:
        return len(self.pdf)

    def reweighted(self, table: np.ndarray) -> HmmGraph:
        """This graph's structure with the transition log weights of ``table`` (the same
        arithmetic as compiling afresh, so the same weights bit for bit)."""
        if self.arc_trans is None:
            raise ValueError("graph compiled without its transition indices")
        final = np.where(self.final_trans >= 0, table[self.final_trans] + self.final_cost,
                         -np.inf).astype(np.float32)
        return replace(self, weight=(table[self.arc_trans] + self.arc_cost).astype(np.float32),
                       final=final)


@dataclass
class TransitionTable:
    """Scaled transition log weights of all phones in one flat vector: ``offset[phone] +
    s * (n + 1) + d`` is arc ``s -> d`` of the phone's ``[n, n + 1]`` matrix."""

    table: np.ndarray
    offset: dict[int, int]


def transition_table(scaled: dict[int, np.ndarray]) -> TransitionTable:
    """Flatten :func:`scale_transitions`'s matrices (phones in id order)."""
    offset, parts, n = {}, [], 0
    for phone in sorted(scaled):
        offset[phone] = n
        parts.append(scaled[phone].ravel())
        n += scaled[phone].size
    return TransitionTable(np.concatenate(parts) if parts else np.zeros(0), offset)


def scale_transitions(log_trans: dict[int, np.ndarray], self_loop_scale: float = 0.1,
                      transition_scale: float = 1.0) -> dict[int, np.ndarray]:
    """Kaldi's graph scales: a self-loop gets ``self_loop_scale * log p``; the other arcs of a
    state ``transition_scale * log(q / (1 - p)) + self_loop_scale * log(1 - p)``."""
    scaled: dict[int, np.ndarray] = {}
    for phone, lt in log_trans.items():
        m = np.full_like(lt, -np.inf)
        for s in range(lt.shape[0]):
            p_loop = math.exp(lt[s, s])
            rest = math.log(max(1.0 - p_loop, 1e-10))
            for d in range(lt.shape[1]):
                if d == s:
                    m[s, d] = self_loop_scale * lt[s, s]
                elif lt[s, d] > -np.inf:
                    m[s, d] = transition_scale * (lt[s, d] - rest) + self_loop_scale * rest
        scaled[phone] = m
    return scaled


def phone_arcs(m: np.ndarray) -> list[tuple[int, int]]:
    """The arcs ``(s, d)`` a phone's ``[n, n + 1]`` transition matrix has (a weight above
    -inf), ``s`` then ``d`` ascending; ``d == n`` leaves the phone. The training graphs' and
    the decoding graph's H (:func:`asrtrain.decode.graph.make_h`) are made from them."""
    n = m.shape[0]
    live = (m > -np.inf).tolist()
    return [(s, d) for s in range(n) for d in range(n + 1) if live[s][d]]


PdfOf = Callable[[int, int, int, int], int]   # (left, phone, right, pdf_class) -> pdf id


def hmm_graph(lang: Lang, pg: PhoneGraph, pdf_of: PdfOf, log_trans: dict[int, np.ndarray],
              self_loop_scale: float = 0.1, transition_scale: float = 1.0,
              scaled: dict[int, np.ndarray] | None = None) -> HmmGraph:
    """Expand a phone DAG to triphones and HMM states.

    ``log_trans[phone]`` is a ``[num_states, num_states + 1]`` matrix of log transition
    probabilities (last column: leave the phone).  Kaldi's scaling for alignment: a self-loop gets
    ``self_loop_scale * log p``, the other arcs of a state ``log(q / (1 - p))`` plus
    ``self_loop_scale * log(1 - p)``, all non-self-loop parts times ``transition_scale``;
    ``scaled`` passes those matrices precomputed (:func:`scale_transitions`) for a batch.
    """
    # One function on purpose (over 80 lines): the triphone expansion and the HMM state arcs
    # index the same state tables as they are built; Kaldi's CompileGraph is one routine too.
    into: dict[int, list[int]] = {}
    out_of: dict[int, list[int]] = {}
    for i, a in enumerate(pg.arcs):
        into.setdefault(a.dst, []).append(i)
        out_of.setdefault(a.src, []).append(i)
    # triphone nodes: (arc, left, right); left = phone of an arc into src (0 at the start),
    # right = phone of an arc out of dst (0 where the utterance may end)
    cd_nodes: list[tuple[int, int, int]] = []
    cd_index: dict[tuple[int, int, int], int] = {}
    for i, a in enumerate(pg.arcs):
        lefts = {pg.arcs[k].phone for k in into.get(a.src, [])}
        if a.src == pg.start:
            lefts.add(0)
        rights = {pg.arcs[k].phone for k in out_of.get(a.dst, [])}
        if a.dst in pg.final:
            rights.add(0)
        for left in sorted(lefts):
            for right in sorted(rights):
                cd_index[(i, left, right)] = len(cd_nodes)
                cd_nodes.append((i, left, right))

    rights_of: dict[tuple[int, int], list[int]] = {}
    for arc_i, left, right in cd_nodes:
        rights_of.setdefault((arc_i, left), []).append(right)

    if scaled is None:
        scaled = scale_transitions(log_trans, self_loop_scale, transition_scale)
    tt = transition_table(scaled)

    pdf, phones, hstate, word, first = [], [], [], [], []
    for arc_i, left, right in cd_nodes:
        a = pg.arcs[arc_i]
        first.append(len(pdf))
        for s in range(log_trans[a.phone].shape[0]):
            pdf.append(pdf_of(left, a.phone, right, s))
            phones.append(a.phone)
            hstate.append(s)
            word.append(a.word)
    num = len(pdf)
    start = np.full(num, -np.inf, dtype=np.float32)
    final_trans = np.full(num, -1, dtype=np.int32)
    final_cost = np.zeros(num)
    # each phone's arcs within its HMM, (s, d, index into the table), and its exits, (s, index)
    inside_of: dict[int, list[tuple[int, int, int]]] = {}
    exits_of: dict[int, list[tuple[int, int]]] = {}
    for phone in {pg.arcs[arc_i].phone for arc_i, _, _ in cd_nodes}:
        ns, off = scaled[phone].shape[0], tt.offset[phone]
        arcs = phone_arcs(scaled[phone])
        inside_of[phone] = [(s, d, off + s * (ns + 1) + d) for s, d in arcs if d < ns]
        exits_of[phone] = [(s, off + s * (ns + 1) + ns) for s, d in arcs if d == ns]
    src, dst, trans, cost = [], [], [], []
    for c, (arc_i, left, right) in enumerate(cd_nodes):
        a = pg.arcs[arc_i]
        base, inside = first[c], inside_of[a.phone]
        src += [base + s for s, _, _ in inside]
        dst += [base + d for _, d, _ in inside]
        trans += [t for _, _, t in inside]
        cost += [0.0] * len(inside)
        if a.src == pg.start and left == 0:
            start[base] = -a.cost
        exits = exits_of[a.phone]
        if right == 0:
            for s, w in exits:
                final_trans[base + s] = w
                final_cost[base + s] = -pg.final[a.dst]
        else:
            for k in out_of.get(a.dst, []):
                nxt = pg.arcs[k]
                if nxt.phone != right:
                    continue
                for right2 in rights_of[(k, a.phone)]:
                    t = first[cd_index[(k, a.phone, right2)]]
                    for s, w in exits:
                        src.append(base + s)
                        dst.append(t)
                        trans.append(w)
                        cost.append(-nxt.cost)
    trans_a = np.asarray(trans, dtype=np.int32)
    cost_a = np.asarray(cost, dtype=np.float64)
    empty = np.zeros(0, dtype=np.float32)
    g = HmmGraph(np.asarray(pdf, dtype=np.int64), np.asarray(phones, dtype=np.int64),
                 np.asarray(hstate, dtype=np.int64), np.asarray(word, dtype=np.int64),
                 np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), empty, start,
                 empty, trans_a, cost_a, final_trans, final_cost)
    return g.reweighted(tt.table)


def equal_alignment(lang: Lang, words: list[str], num_frames: int,
                    num_states: Callable[[int], int]) -> list[tuple[int, int]] | None:
    """Kaldi's ``align-equal-compiled`` for the flat start, made deterministic: the first
    pronunciation of each word, no optional silence, frames shared equally among the HMM states.
    Returns per-frame ``(phone, hmm_state)`` or None when there are fewer frames than states."""
    seq = []
    for w in words:
        for p in lang.lexicon[w][0]:
            pid = lang.phones.phones[p]
            seq.extend((pid, s) for s in range(num_states(pid)))
    if not seq or num_frames < len(seq):
        return None
    idx = (np.arange(num_frames) * len(seq)) // num_frames
    return [seq[i] for i in idx]
