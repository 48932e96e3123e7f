"""Kaldi data directories: read, write and validate (in the spirit of utils/validate_data_dir.sh).

A data dir holds one file per relation, each sorted by its first field (``LC_ALL=C`` order):

- ``wav.scp``      ``<recording-id> <path>`` or ``<recording-id> <command> |``
- ``segments``     ``<utt-id> <recording-id> <start-seconds> <end-seconds>`` (optional)
- ``text``         ``<utt-id> <words...>``
- ``utt2spk``      ``<utt-id> <speaker-id>``; ``spk2utt`` is its inverse
- ``reco2file_and_channel`` ``<recording-id> <file-id> <A|B>`` (maps a side back to sclite's names)
- ``stm``, ``glm`` for scored test sets; ``feats.scp cmvn.scp utt2num_frames`` after features.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.textfile import utf8_lines
from asrtrain.fileio import atomic_dir, atomic_open

TABLES = ("wav.scp", "segments", "text", "utt2spk", "spk2utt", "reco2file_and_channel",
          "feats.scp", "cmvn.scp", "utt2num_frames", "utt2dur")


@dataclass(frozen=True)
class Segment:
    """One utterance's place in a recording, in seconds."""

    recording: str
    start: float
    end: float


@dataclass
class DataDir:
    """The tables of one Kaldi data dir, as ordered dicts keyed by their first field."""

    wav: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    utt2spk: dict[str, str] = field(default_factory=dict)
    segments: dict[str, Segment] = field(default_factory=dict)
    reco2file_and_channel: dict[str, tuple[str, str]] = field(default_factory=dict)
    feats: dict[str, str] = field(default_factory=dict)
    cmvn: dict[str, str] = field(default_factory=dict)
    utt2num_frames: dict[str, int] = field(default_factory=dict)
    #: table name -> key -> line number, for tables read from disk: errors name the line.
    lines: dict[str, dict[str, int]] = field(default_factory=dict, repr=False, compare=False)
    #: the directory it was read from (kept by subsets), for errors found later (audio).
    source: Path | None = field(default=None, repr=False, compare=False)

    # ---------------------------------------------------------------- derived views
    @property
    def spk2utt(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for utt in sorted(self.utt2spk):
            out.setdefault(self.utt2spk[utt], []).append(utt)
        return dict(sorted(out.items()))

    @property
    def utts(self) -> list[str]:
        return sorted(self.utt2spk)

    # ---------------------------------------------------------------- reading
    @classmethod
    def read(cls, path: str | Path, validate: bool = True) -> DataDir:
        """Read the data dir at ``path``; raise :class:`AsrtrainError` naming the bad file/line.

        The tables a user may bring (``wav.scp text utt2spk spk2utt segments
        reco2file_and_channel``) must be sorted and free of repeated keys, as Kaldi's
        ``utils/validate_data_dir.sh`` demands: a repeated key would silently keep one of two
        lines (an utterance trained on the wrong audio, or with the wrong words).
        """
        path = Path(path)
        if not path.is_dir():
            raise AsrtrainError(f"{path}: not a data directory (does the stage before ran?)")
        d = cls(source=path)
        for name in ("wav.scp", "text", "utt2spk"):
            if not (path / name).is_file():
                raise AsrtrainError(
                    f"{path / name}: missing; a data dir needs wav.scp, text, utt2spk")
        d.wav = d._read_sorted(path, "wav.scp")
        d.text = d._read_sorted(path, "text", allow_empty_value=True)
        d.utt2spk = d._read_sorted(path, "utt2spk")
        if (path / "segments").is_file():
            d.segments = {utt: _segment(path / "segments", d.lines["segments"][utt], value)
                          for utt, value in d._read_sorted(path, "segments").items()}
        if (path / "reco2file_and_channel").is_file():
            for reco, value in d._read_sorted(path, "reco2file_and_channel").items():
                parts = value.split()
                if len(parts) != 2:
                    raise AsrtrainError(
                        f"{path / 'reco2file_and_channel'}:{d.lines['reco2file_and_channel'][reco]}"
                        ": expected '<recording> <file> <channel>'")
                d.reco2file_and_channel[reco] = (parts[0], parts[1])
        if (path / "feats.scp").is_file():
            d.feats = read_table(path / "feats.scp")
        if (path / "cmvn.scp").is_file():
            d.cmvn = read_table(path / "cmvn.scp")
        if (path / "utt2num_frames").is_file():
            for lineno, key, value in _lines(path / "utt2num_frames"):
                try:
                    d.utt2num_frames[key] = int(value)
                except ValueError:
                    raise AsrtrainError(
                        f"{path / 'utt2num_frames'}:{lineno}: not an integer: {value!r}") from None
        if validate:
            d.validate(path)
            if (path / "spk2utt").is_file():
                check_spk2utt(path / "spk2utt", d)
        return d

    def _read_sorted(self, path: Path, name: str, allow_empty_value: bool = False
                     ) -> dict[str, str]:
        """Table ``name`` of the dir ``path``, its line numbers kept in ``self.lines``."""
        table, self.lines[name] = read_keyed(path / name, allow_empty_value, sorted_keys=True)
        return table

    def _at(self, where: Path | None, name: str, key: str) -> str:
        """``<dir>/<table>:<line>`` of ``key`` when the table was read from disk."""
        line = self.lines.get(name, {}).get(key)
        return f"{where}/{name}:{line}" if line else f"{where}/{name}"

    def at(self, name: str, key: str) -> str:
        """Where table ``name`` holds ``key``: ``<dir>/<table>:<line>`` for a data dir read from
        disk, else just the table's name."""
        return self._at(self.source, name, key) if self.source is not None else name

    # ---------------------------------------------------------------- checking
    def validate(self, where: str | Path = "<data dir>") -> None:
        """Check the relations between tables, as Kaldi's validate_data_dir.sh does."""
        where = Path(where)
        self._check_speakers(where)
        self._check_text(where)
        if self.segments:
            self._check_segments(where)
        else:
            for utt in self.utt2spk:
                if utt not in self.wav:
                    raise AsrtrainError(f"{self._at(where, 'utt2spk', utt)}: utterance {utt} "
                                        "has no audio in wav.scp (and there is no segments file)")
        for name, table in (("feats.scp", self.feats), ("utt2num_frames", self.utt2num_frames)):
            if table:
                missing = [u for u in self.utt2spk if u not in table]
                if missing:
                    raise AsrtrainError(f"{where}/{name}: {len(missing)} utterances missing, "
                                        f"e.g. {missing[0]}")
        if self.cmvn:
            for spk in self.spk2utt:
                if spk not in self.cmvn:
                    raise AsrtrainError(f"{where}/cmvn.scp: speaker {spk} missing")

    def _check_speakers(self, where: Path) -> None:
        if not self.utt2spk:
            raise AsrtrainError(f"{where}/utt2spk: no utterances")
        for utt, spk in self.utt2spk.items():
            if len(spk.split()) != 1:
                raise AsrtrainError(f"{self._at(where, 'utt2spk', utt)}: utterance {utt} has "
                                    f"speaker {spk!r}; expected '<utterance> <speaker>'")
            if not utt.startswith(spk):
                raise AsrtrainError(
                    f"{self._at(where, 'utt2spk', utt)}: utterance {utt} does not start with its "
                    f"speaker id {spk} (Kaldi sorts utterances by speaker; prefix them)")

    def _check_text(self, where: Path) -> None:
        if not self.text:
            raise AsrtrainError(f"{where}/text: no transcripts (the file is empty); every "
                                "utterance in utt2spk needs one")
        for utt, words in self.text.items():
            if utt not in self.utt2spk:
                raise AsrtrainError(
                    f"{self._at(where, 'text', utt)}: utterance {utt} is not in utt2spk")
            if not words.strip():
                raise AsrtrainError(
                    f"{self._at(where, 'text', utt)}: utterance {utt} has an empty transcript")
        for utt in self.utt2spk:
            if utt not in self.text:
                raise AsrtrainError(f"{self._at(where, 'utt2spk', utt)}: utterance {utt} has no "
                                    "transcript in text")

    def _check_segments(self, where: Path) -> None:
        for utt in self.utt2spk:
            seg = self.segments.get(utt)
            if seg is None:
                raise AsrtrainError(f"{self._at(where, 'utt2spk', utt)}: utterance {utt} has no "
                                    "line in segments")
            at = self._at(where, "segments", utt)
            if seg.recording not in self.wav:
                raise AsrtrainError(f"{at}: utterance {utt} refers to recording "
                                    f"{seg.recording}, which is not in wav.scp")
            if not (0 <= seg.start < seg.end):
                raise AsrtrainError(f"{at}: utterance {utt} has start {seg.start} "
                                    f"and end {seg.end}")

    # ---------------------------------------------------------------- writing
    def write(self, path: str | Path) -> None:
        """Write every non-empty table, each atomically, sorted as Kaldi expects."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_table(path / "wav.scp", self.wav)
        write_table(path / "text", self.text)
        write_table(path / "utt2spk", self.utt2spk)
        write_table(path / "spk2utt", {k: " ".join(v) for k, v in self.spk2utt.items()})
        if self.segments:
            write_table(path / "segments", {u: f"{s.recording} {s.start:.2f} {s.end:.2f}"
                                            for u, s in self.segments.items()})
        if self.reco2file_and_channel:
            write_table(path / "reco2file_and_channel",
                        {r: f"{f} {c}" for r, (f, c) in self.reco2file_and_channel.items()})
        if self.feats:
            write_table(path / "feats.scp", self.feats)
        if self.cmvn:
            write_table(path / "cmvn.scp", self.cmvn)
        if self.utt2num_frames:
            write_table(path / "utt2num_frames",
                        {u: str(n) for u, n in self.utt2num_frames.items()})

    def copy_without_features(self, dest: str | Path, extra: tuple[str, ...] = ("stm", "glm"),
                              source: str | Path | None = None) -> None:
        """Write this data dir to ``dest`` without its feature tables (which ``dest`` loses too,
        so stale ones never survive), copying the files ``extra`` from ``source`` (the dir this
        was read from) when they exist: the second data dir Kaldi keeps for other features."""
        import shutil

        dest = Path(dest)
        copy = self.subset(self.utts)
        copy.feats, copy.cmvn, copy.utt2num_frames = {}, {}, {}
        for table in ("feats.scp", "cmvn.scp", "utt2num_frames"):
            (dest / table).unlink(missing_ok=True)
        copy.write(dest)
        for name in extra if source is not None else ():
            if (Path(source) / name).is_file():
                with atomic_open(dest / name, "wb") as f, open(Path(source) / name, "rb") as src:
                    shutil.copyfileobj(src, f)

    def subset(self, utts: list[str] | set[str]) -> DataDir:
        """A new data dir holding only ``utts`` (and the recordings and speakers they use)."""
        keep = set(utts)
        d = DataDir(source=self.source)
        d.utt2spk = {u: s for u, s in self.utt2spk.items() if u in keep}
        d.text = {u: t for u, t in self.text.items() if u in keep}
        d.segments = {u: s for u, s in self.segments.items() if u in keep}
        recos = {s.recording for s in d.segments.values()} if self.segments else keep
        d.wav = {r: w for r, w in self.wav.items() if r in recos}
        d.reco2file_and_channel = {r: v for r, v in self.reco2file_and_channel.items()
                                   if r in recos}
        d.feats = {u: f for u, f in self.feats.items() if u in keep}
        d.utt2num_frames = {u: n for u, n in self.utt2num_frames.items() if u in keep}
        spks = set(d.utt2spk.values())
        d.cmvn = {s: c for s, c in self.cmvn.items() if s in spks}
        # Line numbers of its own keys only: subsets go to worker processes, one per job.
        d.lines = {name: {k: n for k, n in table.items() if k in keep or k in recos}
                   for name, table in self.lines.items()}
        return d


def _lines(path: Path) -> Iterator[tuple[int, str, str]]:
    """``(line number, key, value)`` of every non-blank line; the key ends at the first white
    space, as Kaldi's table readers split."""
    for lineno, line in utf8_lines(path):
        parts = line.split(maxsplit=1)
        if parts:
            yield lineno, parts[0], parts[1].strip() if len(parts) > 1 else ""


def read_keyed(path: str | Path, allow_empty_value: bool = False, sorted_keys: bool = False
               ) -> tuple[dict[str, str], dict[str, int]]:
    """A Kaldi table ``<key> <value...>`` and the line number of each key.

    A repeated key is an error naming both lines; so is a key without a value (unless
    ``allow_empty_value``) and, with ``sorted_keys``, a key out of C-locale order.
    """
    path = Path(path)
    out: dict[str, str] = {}
    lines: dict[str, int] = {}
    last = None
    for lineno, key, value in _lines(path):
        if key in out:
            raise AsrtrainError(f"{path}:{lineno}: duplicate key {key} (first on line "
                                f"{lines[key]}); each key may occur once")
        if not value and not allow_empty_value:
            raise AsrtrainError(f"{path}:{lineno}: key {key} has no value")
        if sorted_keys and last is not None and key < last:
            raise AsrtrainError(
                f"{path}:{lineno}: key {key} is out of order (after {last} on line "
                f"{lines[last]}); Kaldi tables are sorted: LC_ALL=C sort {path.name}, or run "
                "utils/fix_data_dir.sh")
        out[key], lines[key], last = value, lineno, key
    return out, lines


def read_table(path: str | Path, allow_empty_value: bool = False) -> dict[str, str]:
    """Read a Kaldi table ``<key> <value...>``; duplicate keys and missing values are errors."""
    return read_keyed(path, allow_empty_value)[0]


def _segment(path: Path, lineno: int, value: str) -> Segment:
    """One ``segments`` value ``<recording> <start> <end>``, times finite and in order."""
    parts = value.split()
    try:
        if len(parts) != 3:
            raise ValueError
        reco, start, end = parts[0], float(parts[1]), float(parts[2])
    except ValueError:
        raise AsrtrainError(
            f"{path}:{lineno}: expected '<utt> <recording> <start> <end>'") from None
    if not (math.isfinite(start) and math.isfinite(end)):
        raise AsrtrainError(f"{path}:{lineno}: times {parts[1]} {parts[2]} are not finite")
    return Segment(reco, start, end)


def check_spk2utt(path: Path, data: DataDir) -> None:
    """``spk2utt`` must be the inverse of utt2spk, line for line, as Kaldi's
    validate_data_dir.sh requires (``utt2spk_to_spk2utt.pl utt2spk | cmp - spk2utt``)."""
    table, lines = read_keyed(path, sorted_keys=True)
    utt2spk_line = data.lines.get("utt2spk", {})
    expected = data.spk2utt
    for spk, value in table.items():
        at, utts = f"{path}:{lines[spk]}", value.split()
        for utt in utts:
            owner = data.utt2spk.get(utt)
            if owner is None:
                raise AsrtrainError(f"{at}: utterance {utt} of speaker {spk} is not in utt2spk")
            if owner != spk:
                raise AsrtrainError(f"{at}: utterance {utt} is listed under speaker {spk}, but "
                                    f"utt2spk line {utt2spk_line.get(utt, '?')} gives {owner}")
        listed = set(utts)
        lacking = [u for u in expected[spk] if u not in listed]
        if lacking:
            raise AsrtrainError(f"{at}: speaker {spk} lacks utterance {lacking[0]} (utt2spk line "
                                f"{utt2spk_line.get(lacking[0], '?')})")
        if utts != expected[spk]:
            raise AsrtrainError(f"{at}: the utterances of speaker {spk} are repeated or not in "
                                "sorted order (remake spk2utt with utils/utt2spk_to_spk2utt.pl)")
    for spk, utts in expected.items():
        if spk not in table:
            raise AsrtrainError(f"{path}: speaker {spk} (utt2spk line "
                                f"{utt2spk_line.get(utts[0], '?')}) is missing")


#: Tables keyed by utterance, and by recording (which lose a recording no utterance uses).
_UTT_TABLES = ("text", "utt2spk", "segments", "feats.scp", "utt2num_frames", "utt2dur")
_RECO_TABLES = ("wav.scp", "reco2file_and_channel")


def drop_utterances(path: str | Path, utts: set[str]) -> None:
    """Remove ``utts`` from the data dir at ``path`` as Kaldi's ``utils/fix_data_dir.sh`` does:
    their lines go from every table keyed by utterance, ``spk2utt`` loses them (and a speaker
    left with none), ``wav.scp`` and ``reco2file_and_channel`` a recording no utterance uses any
    more. The other lines are kept byte for byte; each table is rewritten atomically."""
    path = Path(path)
    data = DataDir.read(path, validate=False)
    keep = set(data.utt2spk) - utts
    recos = ({s.recording for u, s in data.segments.items() if u in keep} if data.segments
             else keep)

    def filtered(name: str, wanted) -> None:
        if not (path / name).is_file():
            return
        lines = (path / name).read_text(encoding="utf-8").splitlines(True)
        kept = [x for x in lines if x.split(maxsplit=1) and wanted(x.split(maxsplit=1)[0])]
        with atomic_open(path / name, "w", encoding="utf-8") as f:
            f.writelines(kept)

    for name in _UTT_TABLES:
        filtered(name, lambda key: key in keep)
    for name in _RECO_TABLES:
        filtered(name, lambda key: key in recos)
    spk2utt = {}
    for utt in sorted(keep):
        spk2utt.setdefault(data.utt2spk[utt], []).append(utt)
    write_table(path / "spk2utt", {k: " ".join(v) for k, v in sorted(spk2utt.items())})


def read_utt2dur(data_dir: str | Path) -> dict[str, float]:
    """The data dir's ``utt2dur`` (seconds per utterance, measured from the decoded samples by
    the features stage), or {} when it has none or it cannot be read as one."""
    path = Path(data_dir) / "utt2dur"
    if not path.is_file():
        return {}
    try:
        return {u: float(v) for u, v in read_table(path).items()}
    except (AsrtrainError, ValueError):
        return {}


def write_table(path: str | Path, table: dict[str, str]) -> None:
    """Write ``<key> <value>`` lines in C-locale key order, atomically."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        for key in sorted(table):
            f.write(f"{key} {table[key]}\n")


def remove_dup_utts(data: DataDir, max_count: int) -> DataDir:
    """Kaldi's utils/data/remove_dup_utts.sh: at most ~max_count copies of any transcript.

    Transcripts seen fewer than ``max_count`` times are all kept; the others are kept with
    probability max_count/n drawn from Kaldi's own predictable generator, so the same utterances
    survive as in Kaldi.
    """
    counts: dict[str, int] = {}
    for utt in sorted(data.text):
        counts[data.text[utt]] = counts.get(data.text[utt], 0) + 1
    k = 0
    keep = []
    for utt in sorted(data.text):
        n = counts[data.text[utt]]
        if n < max_count:
            keep.append(utt)
            continue
        k = (k + 103349) % 71147
        if k / 71147 < max_count / n:
            keep.append(utt)
    return data.subset(keep)


# ------------------------------------------------------------------------------ subsets
#: The rules of :func:`subset_data_dir`, each Kaldi's (``utils/subset_data_dir.sh`` and
#: ``utils/data/remove_dup_utts.sh``); their values are counts, ``speaker_prefix``'s a string.
SUBSET_RULES = ("shortest", "first", "last", "evenly", "speakers", "speaker_prefix", "max_dup")


def check_subset_rules(rules: object, where: str) -> list[tuple[str, int | str]]:
    """``rules`` (a list of one-key mappings, or one mapping of one key, or None) as a list of
    ``(rule, value)``; a user error names ``where`` and what is expected."""
    if rules is None:
        return []
    items = [rules] if isinstance(rules, dict) else rules
    if not isinstance(items, list):
        raise AsrtrainError(f"{where}={rules!r}: expected a list of subset rules, e.g. "
                            "[{shortest: 100000}, {evenly: 30000}]")
    out: list[tuple[str, int | str]] = []
    for item in items:
        if not isinstance(item, dict) or len(item) != 1:
            raise AsrtrainError(f"{where}: {item!r} is not one rule; write each as a mapping of "
                                f"one key, one of {', '.join(SUBSET_RULES)}")
        (rule, value), = item.items()
        if rule not in SUBSET_RULES:
            raise AsrtrainError(f"{where}: unknown subset rule {rule!r}; expected one of "
                                f"{', '.join(SUBSET_RULES)}")
        if rule == "speaker_prefix":
            if not isinstance(value, str) or not value:
                raise AsrtrainError(f"{where}: speaker_prefix={value!r}: expected a non-empty "
                                    "string (e.g. sw0: the Switchboard speakers)")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1 or \
                (rule == "max_dup" and value < 2):
            raise AsrtrainError(f"{where}: {rule}={value!r}: expected a positive count"
                                + (" of at least 2 (remove_dup_utts.sh's max-count)"
                                   if rule == "max_dup" else ""))
        out.append((rule, value))
    return out


def subset_slug(rules: list[tuple[str, int | str]]) -> str:
    """A name for the subset ``rules`` make (``first100000_maxdup200``; empty for none): the
    subset data dir is named by its rules, so passes on the same subset share one dir."""
    return "_".join(f"{rule.replace('_', '')}{value}" for rule, value in rules)


def subset_data_dir(data: DataDir, rules: list[tuple[str, int | str]]) -> DataDir:
    """``data`` cut by ``rules`` in order, as the Kaldi scripts cut a data dir:

    - ``shortest: N``: ``subset_data_dir.sh --shortest``, the N utterances of fewest frames
      (``utt2num_frames``; ties in C order of the utterance id, as ``sort -n -k2`` breaks them);
    - ``first: N`` / ``last: N``: ``--first`` / ``--last``, the first / last N of ``utt2spk``;
    - ``evenly: N``: ``subset_data_dir.sh`` with no option, N utterances spread evenly through
      ``utt2spk`` (``subset_scp.pl``'s halving, no randomness);
    - ``speakers: N``: ``--speakers``, whole speakers in ``shuffle_list.pl``'s order (Perl's
      ``srand(0)``, ``drand48``) until they hold at least N utterances;
    - ``speaker_prefix: P``: ``--spk-list`` of the speakers whose id starts with P (fisher_swbd's
      ``swbd_spklist``: ``sw0``);
    - ``max_dup: N``: ``remove_dup_utts.sh N``, about N copies of any transcript at most.

    A count over the utterances left is an error, as in ``subset_data_dir.sh``.
    """
    for rule, value in rules:
        utts = data.utts
        if rule == "speaker_prefix":
            keep = [u for u in utts if data.utt2spk[u].startswith(str(value))]
            if not keep:
                raise AsrtrainError(f"{data.source}: no speaker id starts with {value!r}")
            data = data.subset(keep)
            continue
        if rule == "max_dup":
            data = remove_dup_utts(data, int(value))
            continue
        n = int(value)
        if n > len(utts):
            raise AsrtrainError(f"{data.source}: {rule}={n} asks for more utterances than the "
                                f"{len(utts)} left (subset_data_dir.sh refuses it too)")
        if rule == "shortest":
            missing = [u for u in utts if u not in data.utt2num_frames]
            if missing:
                raise AsrtrainError(f"{data.source}/utt2num_frames: missing or lacks {missing[0]}"
                                    "; shortest needs the features' lengths (run mfcc first)")
            data = data.subset(sorted(utts, key=lambda u: (data.utt2num_frames[u], u))[:n])
        elif rule == "first":
            data = data.subset(utts[:n])
        elif rule == "last":
            data = data.subset(utts[len(utts) - n:])
        elif rule == "evenly":
            data = data.subset(_spread(utts, n))
        else:   # speakers
            data = data.subset(_shuffled_speakers(data, n))
    return data


def _spread(items: list[str], n: int) -> list[str]:
    """``subset_scp.pl``'s ``select_n``: halve the list and the count, recursively."""
    out: list[str] = []

    def select(start: int, end: int, needed: int) -> None:
        if end - start == 1:
            if needed > 0:
                out.append(items[start])
            return
        half = (end - start) // 2
        select(start, start + half, needed // 2)
        select(start + half, end, needed - needed // 2)

    if items and n > 0:
        select(0, len(items), n)
    return out


def _shuffled_speakers(data: DataDir, n: int) -> list[str]:
    """The utterances of whole speakers taken as ``subset_data_dir.sh --speakers`` takes them:
    ``shuffle_list.pl`` keys each spk2utt line with Perl's ``rand()`` after ``srand(0)`` (a
    48-bit LCG, drand48) and sorts the keys as strings (Perl prints them ``%.15g``); ``awk``
    keeps speakers while fewer than N utterances are kept."""
    x = 0x330E                     # srand(0): (seed << 16) + 0x330E
    keyed = []
    for spk, utts in data.spk2utt.items():
        x = (x * 0x5DEECE66D + 0xB) % (1 << 48)
        keyed.append((f"{x / 2 ** 48:.15g}", spk, utts))
    keep: list[str] = []
    for _key, _spk, utts in sorted(keyed, key=lambda k: k[0]):
        if len(keep) >= n:
            break
        keep.extend(utts)
    return keep


# ------------------------------------------------------------------ split data dirs

#: The rule that cuts a data dir into blocks of whole speakers (:func:`split_blocks`); it does
#: not involve ``nj``, so neither do the statistics summed block by block.  A block is about
#: ``SPLIT_BLOCK_FRAMES`` frames (2.8 h of speech: SWB-300's 286 h make 103 blocks, work for a
#: 64-core node), at least ``SPLIT_MIN_BLOCKS`` of them (work for a few jobs on a small set)
#: and at most ``SPLIT_MAX_BLOCKS`` (each block's statistics travel to the stage's process:
#: SWB-2000's ~720M frames make 128 blocks of 5.6M frames), never more than the speakers.
SPLIT_BLOCK_FRAMES = 1_000_000
SPLIT_MIN_BLOCKS = 8
SPLIT_MAX_BLOCKS = 128
#: The tables a block's dir gets (those a job reads), and what its key is made from.
_SPLIT_TABLES = ("utt2spk", "text", "feats.scp", "cmvn.scp", "utt2num_frames", "segments",
                 "wav.scp")


def num_split_blocks(frames: int, speakers: int) -> int:
    """How many blocks :func:`split_blocks` makes of ``frames`` frames of ``speakers``
    speakers: ``ceil(frames / SPLIT_BLOCK_FRAMES)`` within ``[SPLIT_MIN_BLOCKS,
    SPLIT_MAX_BLOCKS]``, at most one a speaker."""
    n = -(-int(frames) // SPLIT_BLOCK_FRAMES)
    return max(1, min(int(speakers), max(SPLIT_MIN_BLOCKS, min(SPLIT_MAX_BLOCKS, n))))


def split_blocks(data: DataDir) -> list[list[str]]:
    """The data dir's utterances in blocks of whole speakers (Kaldi's ``split_data.sh``
    without ``--per-utt``: fMLLR needs a speaker's every utterance in one job), balanced by
    ``utt2num_frames`` (by utterances without it): speakers, largest first, each to the
    lightest block (ties: the lower block).  How many: :func:`num_split_blocks`.  A block
    lists its speakers in sorted order and their utterances sorted, so the blocks depend on
    the data dir only."""
    spk2utt = data.spk2utt
    frames = data.utt2num_frames
    weight = {s: sum(frames.get(u, 1) for u in us) for s, us in spk2utt.items()}
    n = num_split_blocks(sum(weight.values()), len(spk2utt))
    load = [0] * n
    blocks: list[list[str]] = [[] for _ in range(n)]
    for s in sorted(spk2utt, key=lambda s: (-weight[s], s)):
        j = min(range(n), key=lambda j: (load[j], j))
        blocks[j].append(s)
        load[j] += weight[s]
    return [[u for s in sorted(b) for u in spk2utt[s]] for b in blocks if b]


def split_data_dir(path: str | Path) -> list[Path]:
    """The data dir at ``path`` split into :func:`split_blocks`, one data dir each (Kaldi's
    ``data/<set>/split<N>/<k>``, k from 1): its utterances' tables, so a job reads its block's
    tables, not the corpus's.  Written once, atomically (the whole ``split<N>`` under a
    temporary name, then renamed); reused while its ``key`` (a digest of the tables it was cut
    from) matches, rewritten when the data dir changed.  Returns the block dirs in order."""
    import hashlib

    path = Path(path)
    h = hashlib.sha256()
    for name in _SPLIT_TABLES:
        f = path / name
        h.update(name.encode() + b"\0")
        if f.is_file():
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        h.update(b"\0")
    h.update(f"{SPLIT_BLOCK_FRAMES} {SPLIT_MIN_BLOCKS} {SPLIT_MAX_BLOCKS}".encode())
    key = h.hexdigest()
    data = DataDir.read(path)
    frames = sum(data.utt2num_frames.get(u, 1) for u in data.utt2spk)
    n_max = num_split_blocks(frames, len(set(data.utt2spk.values())))
    where = path / f"split{n_max}"
    keyfile = where / "key"
    if keyfile.is_file() and keyfile.read_text().strip() == key:
        return [where / str(k + 1) for k in range(len(list(where.glob("[0-9]*"))))]
    blocks = split_blocks(data)
    with atomic_dir(where) as tmp:
        for k, utts in enumerate(blocks):
            data.subset(utts).write(tmp / str(k + 1))
        (tmp / "key").write_text(key + "\n")
    return [where / str(k + 1) for k in range(len(blocks))]
