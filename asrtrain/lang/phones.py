"""Phone inventory of a lang dir: symbol tables, word-position phones, phone sets and HMM topology.

Phones are word-position dependent as in Kaldi's default ``prepare_lang.sh``: every phone ``p``
becomes ``p_B p_I p_E p_S`` (begin, inside, end of a word, singleton word) and every silence phone
additionally keeps its plain form (``sil`` is what the lexicon FST inserts *between* words).  Why:
the position is known from the lexicon for free, the decision tree may ask about it (position
questions are added to the extra questions) so word-initial and word-final allophones can get their
own states where the data supports it, while ``sets.txt``/``roots.txt`` keep all variants of a base
phone on one tree root so a monophone system still has one set of states per base phone.  The
positions also give word boundaries in alignments (``word_boundary.txt``), which CTMs need.

Topology (Kaldi's ``utils/gen_topo.pl`` defaults): non-silence phones have 3 emitting states left to
right with self-loops; silence phones have 5 states, 0..3 fully connected forward/backward among
1..3, state 4 leaves the model.  Each HMM state has its own pdf-class (``pdf_class == state``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.textfile import utf8_lines
from asrtrain.fileio import write_text


def read_fields(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, whitespace-separated fields) of every non-blank line of a text file."""
    for lineno, line in utf8_lines(path):
        parts = line.split()
        if parts:
            yield lineno, parts

POSITIONS = ("B", "E", "I", "S")
#: reserved word symbols, in Kaldi's order: <eps> first, #0 <s> </s> last.
EPS = "<eps>"


class SymbolTable:
    """A bidirectional symbol <-> integer table (Kaldi ``words.txt`` / ``phones.txt``)."""

    def __init__(self, symbols: list[str] | None = None) -> None:
        self.id2sym: list[str] = []
        self.sym2id: dict[str, int] = {}
        for s in symbols or []:
            self.add(s)

    def add(self, sym: str) -> int:
        if sym in self.sym2id:
            raise AsrtrainError(f"symbol {sym!r} added twice to a symbol table")
        self.sym2id[sym] = len(self.id2sym)
        self.id2sym.append(sym)
        return self.sym2id[sym]

    def __len__(self) -> int:
        return len(self.id2sym)

    def __contains__(self, sym: str) -> bool:
        return sym in self.sym2id

    def __getitem__(self, sym: str) -> int:
        return self.sym2id[sym]

    def write(self, path: Path) -> None:
        write_text(path, "".join(f"{s} {i}\n" for i, s in enumerate(self.id2sym)))

    @classmethod
    def read(cls, path: Path) -> SymbolTable:
        table = cls()
        for lineno, parts in read_fields(path):
            if len(parts) != 2 or not parts[1].isdigit():
                raise AsrtrainError(f"{path}:{lineno}: expected '<symbol> <integer>'")
            if int(parts[1]) != len(table):
                raise AsrtrainError(f"{path}:{lineno}: ids must be consecutive from 0")
            table.add(parts[0])
        return table


@dataclass(frozen=True)
class HmmTopology:
    """An HMM for one phone: ``transitions[s]`` lists ``(next_state, initial_prob)``; the state
    numbered ``num_states`` is the non-emitting exit."""

    num_states: int
    transitions: tuple[tuple[tuple[int, float], ...], ...]

    def to_kaldi(self, phones: list[int]) -> str:
        lines = ["<TopologyEntry>", "<ForPhones>", " ".join(map(str, phones)), "</ForPhones>"]
        for s, arcs in enumerate(self.transitions):
            arcs_txt = " ".join(f"<Transition> {d} {p:g}" for d, p in arcs)
            lines.append(f"<State> {s} <PdfClass> {s} {arcs_txt} </State>")
        lines += [f"<State> {self.num_states} </State>", "</TopologyEntry>"]
        return "\n".join(lines)


def nonsilence_topology() -> HmmTopology:
    return HmmTopology(3, (((0, 0.75), (1, 0.25)), ((1, 0.75), (2, 0.25)), ((2, 0.75), (3, 0.25))))


def silence_topology() -> HmmTopology:
    return HmmTopology(5, (
        ((0, 0.25), (1, 0.25), (2, 0.25), (3, 0.25)),
        ((1, 0.25), (2, 0.25), (3, 0.25), (4, 0.25)),
        ((1, 0.25), (2, 0.25), (3, 0.25), (4, 0.25)),
        ((1, 0.25), (2, 0.25), (3, 0.25), (4, 0.25)),
        ((4, 0.75), (5, 0.25)),
    ))


@dataclass
class PhoneSet:
    """Everything about phones a lang dir knows (read back with :meth:`read`)."""

    phones: SymbolTable
    silence: list[str]                 # base silence phones, e.g. sil spn nsn lau
    nonsilence: list[str]              # base non-silence phones
    optional_silence: str              # inserted between words, e.g. sil
    disambig: list[str]                # #0 #1 ...
    extra_questions: list[list[str]] = field(default_factory=list)   # sets of base phones

    # ---------------------------------------------------------------- derived
    def variants(self, base: str) -> list[str]:
        """All phones (position variants) of one base phone, as in Kaldi's sets.txt."""
        out = [base] if base in self.silence else []
        return out + [f"{base}_{p}" for p in POSITIONS]

    def base_of(self, phone: str) -> str:
        head, _, pos = phone.rpartition("_")
        return head if pos in POSITIONS and head else phone

    def position_of(self, phone: str) -> str:
        """B, E, I, S, or '' for the plain (between-words) silence phone."""
        head, _, pos = phone.rpartition("_")
        return pos if pos in POSITIONS and head else ""

    @property
    def real_phone_ids(self) -> list[int]:
        """Ids of all phones that have an HMM (no <eps>, no disambiguation symbols)."""
        return [i for i, s in enumerate(self.phones.id2sym) if i > 0 and not s.startswith("#")]

    @property
    def disambig_ids(self) -> list[int]:
        return [self.phones[d] for d in self.disambig]

    def is_silence(self, phone_id: int) -> bool:
        return self.base_of(self.phones.id2sym[phone_id]) in self.silence

    def topology(self, phone_id: int) -> HmmTopology:
        return silence_topology() if self.is_silence(phone_id) else nonsilence_topology()

    def root_of(self) -> dict[int, int]:
        """phone id -> index of its base phone (its tree root / sets.txt line)."""
        bases = self.silence + self.nonsilence
        index = {b: i for i, b in enumerate(bases)}
        return {p: index[self.base_of(self.phones.id2sym[p])] for p in self.real_phone_ids}

    @property
    def bases(self) -> list[str]:
        return self.silence + self.nonsilence

    def questions(self) -> list[set[int]]:
        """Extra questions as phone-id sets: the dict's extra_questions (all position variants of
        each listed base phone) plus one question per word position (as prepare_lang does)."""
        out = []
        for q in self.extra_questions:
            out.append({self.phones[v] for b in q for v in self.variants(b)})
        for pos in POSITIONS:
            out.append({self.phones[f"{b}_{pos}"] for b in self.bases})
        out.append({self.phones[s] for s in self.silence})   # the plain between-word silences
        return out

    # ---------------------------------------------------------------- io
    def write(self, lang_dir: Path) -> None:
        d = lang_dir / "phones"
        self.phones.write(lang_dir / "phones.txt")
        write_text(d / "silence.txt", "".join(v + "\n" for b in self.silence
                                              for v in self.variants(b)))
        write_text(d / "nonsilence.txt", "".join(v + "\n" for b in self.nonsilence
                                                 for v in self.variants(b)))
        write_text(d / "optional_silence.txt", self.optional_silence + "\n")
        write_text(d / "disambig.txt", "".join(s + "\n" for s in self.disambig))
        write_text(d / "disambig.int", "".join(f"{i}\n" for i in self.disambig_ids))
        write_text(d / "silence.csl", ":".join(str(self.phones[v]) for b in self.silence
                                               for v in self.variants(b)) + "\n")
        write_text(d / "sets.txt", "".join(" ".join(self.variants(b)) + "\n" for b in self.bases))
        write_text(d / "roots.txt", "".join("shared split " + " ".join(self.variants(b)) + "\n"
                                            for b in self.bases))
        write_text(d / "extra_questions.txt", "".join(" ".join(q) + "\n"
                                                      for q in self.extra_questions))
        kinds = {"B": "begin", "E": "end", "I": "internal", "S": "singleton"}
        write_text(d / "word_boundary.txt", "".join(
            f"{s} {kinds.get(self.position_of(s), 'nonword')}\n"
            for s in (self.phones.id2sym[i] for i in self.real_phone_ids)))
        nonsil = [i for i in self.real_phone_ids if not self.is_silence(i)]
        sil = [i for i in self.real_phone_ids if self.is_silence(i)]
        topo = ["<Topology>", nonsilence_topology().to_kaldi(nonsil),
                silence_topology().to_kaldi(sil), "</Topology>"]
        write_text(lang_dir / "topo", "\n".join(topo) + "\n")

    @classmethod
    def read(cls, lang_dir: Path) -> PhoneSet:
        lang_dir = Path(lang_dir)
        for name in ("phones.txt", "phones/sets.txt", "phones/silence.txt",
                     "phones/optional_silence.txt", "phones/disambig.txt"):
            if not (lang_dir / name).is_file():
                raise AsrtrainError(f"{lang_dir / name}: missing; run the lang stage first")
        phones = SymbolTable.read(lang_dir / "phones.txt")

        def lines(name: str) -> list[list[str]]:
            with open(lang_dir / "phones" / name, encoding="utf-8") as f:
                return [ln.split() for ln in f if ln.strip()]

        silence_variants = {p for (p,) in lines("silence.txt")}
        bases = [s[0] if len(s) == 5 else s[0].rsplit("_", 1)[0] for s in lines("sets.txt")]
        sil = [b for b in bases if b in silence_variants]
        nonsil = [b for b in bases if b not in silence_variants]
        return cls(phones=phones, silence=sil, nonsilence=nonsil,
                   optional_silence=lines("optional_silence.txt")[0][0],
                   disambig=[d for (d,) in lines("disambig.txt")],
                   extra_questions=lines("extra_questions.txt"))


def build_phone_set(silence: list[str], nonsilence: list[str], optional_silence: str,
                    num_disambig: int, extra_questions: list[list[str]]) -> PhoneSet:
    """Number the phones as Kaldi does: <eps>, silence phones with variants, non-silence phones with
    variants, then the disambiguation symbols #0..#num_disambig."""
    table = SymbolTable([EPS])
    ps = PhoneSet(table, list(silence), list(nonsilence), optional_silence,
                  [f"#{i}" for i in range(num_disambig + 1)], [list(q) for q in extra_questions])
    for b in ps.bases:
        for v in ps.variants(b):
            table.add(v)
    for d in ps.disambig:
        table.add(d)
    return ps

