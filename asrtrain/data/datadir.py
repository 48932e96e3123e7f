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

from dataclasses import dataclass, field
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.fileio import atomic_open

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
        """Read the data dir at ``path``; raise :class:`AsrtrainError` naming the bad file/line."""
        path = Path(path)
        if not path.is_dir():
            raise AsrtrainError(f"{path}: not a data directory (does the stage before ran?)")
        d = cls()
        for name in ("wav.scp", "text", "utt2spk"):
            if not (path / name).is_file():
                raise AsrtrainError(
                    f"{path / name}: missing; a data dir needs wav.scp, text, utt2spk")
        d.wav = read_table(path / "wav.scp")
        d.text = read_table(path / "text", allow_empty_value=True)
        d.utt2spk = read_table(path / "utt2spk")
        if (path / "segments").is_file():
            for lineno, key, value in _lines(path / "segments"):
                parts = value.split()
                try:
                    reco, start, end = parts[0], float(parts[1]), float(parts[2])
                    if len(parts) != 3:
                        raise ValueError
                except (ValueError, IndexError):
                    raise AsrtrainError(
                        f"{path / 'segments'}:{lineno}: expected '<utt> <recording> <start> <end>'"
                    ) from None
                d.segments[key] = Segment(reco, start, end)
        if (path / "reco2file_and_channel").is_file():
            for lineno, key, value in _lines(path / "reco2file_and_channel"):
                parts = value.split()
                if len(parts) != 2:
                    raise AsrtrainError(f"{path / 'reco2file_and_channel'}:{lineno}: expected "
                                        "'<recording> <file> <channel>'")
                d.reco2file_and_channel[key] = (parts[0], parts[1])
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
        return d

    # ---------------------------------------------------------------- checking
    def validate(self, where: str | Path = "<data dir>") -> None:
        """Check the relations between tables, as Kaldi's validate_data_dir.sh does."""
        where = Path(where)
        if not self.utt2spk:
            raise AsrtrainError(f"{where}/utt2spk: no utterances")
        for utt, words in self.text.items():
            if utt not in self.utt2spk:
                raise AsrtrainError(f"{where}/text: utterance {utt} is not in utt2spk")
            if not words.strip():
                raise AsrtrainError(f"{where}/text: utterance {utt} has an empty transcript")
        for utt in self.utt2spk:
            if self.text and utt not in self.text:
                raise AsrtrainError(f"{where}/utt2spk: utterance {utt} has no transcript in text")
        if self.segments:
            for utt in self.utt2spk:
                seg = self.segments.get(utt)
                if seg is None:
                    raise AsrtrainError(f"{where}/segments: utterance {utt} has no segment")
                if seg.recording not in self.wav:
                    raise AsrtrainError(f"{where}/segments: utterance {utt} refers to recording "
                                        f"{seg.recording}, which is not in wav.scp")
                if not (0 <= seg.start < seg.end):
                    raise AsrtrainError(f"{where}/segments: utterance {utt} has start {seg.start} "
                                        f"and end {seg.end}")
        else:
            for utt in self.utt2spk:
                if utt not in self.wav:
                    raise AsrtrainError(f"{where}/wav.scp: utterance {utt} has no audio "
                                        "(and there is no segments file)")
        for utt in self.utt2spk:
            if not utt.startswith(self.utt2spk[utt]):
                raise AsrtrainError(
                    f"{where}/utt2spk: utterance {utt} does not start with its speaker id "
                    f"{self.utt2spk[utt]} (Kaldi sorts utterances by speaker; prefix them)")
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
        d = DataDir()
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
        return d


def _lines(path: Path):
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            key, _, value = line.strip().partition(" ")
            yield lineno, key, value.strip()


def read_table(path: str | Path, allow_empty_value: bool = False) -> dict[str, str]:
    """Read a Kaldi table ``<key> <value...>``; duplicate keys and missing values are errors."""
    path = Path(path)
    out: dict[str, str] = {}
    for lineno, key, value in _lines(path):
        if key in out:
            raise AsrtrainError(f"{path}:{lineno}: duplicate key {key}")
        if not value and not allow_empty_value:
            raise AsrtrainError(f"{path}:{lineno}: key {key} has no value")
        out[key] = value
    return out


def write_table(path: str | Path, table: dict[str, str]) -> None:
    """Write ``<key> <value>`` lines in C-locale key order, atomically."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        for key in sorted(table):
            f.write(f"{key} {table[key]}\n")
