"""Fisher English Training Speech, parts 1 and 2 (LDC2004S13 + LDC2005S13 audio, LDC2004T19 +
LDC2005T19 transcripts).

11,699 ten-minute telephone conversations between strangers on assigned topics (~1,900 h, 8 kHz
2-channel SPHERE, shorten-compressed), quickly transcribed at the LDC and by BBN/WordWave. With
Switchboard-1 it makes the 2000-hour "SWB-2000" training set.

This module follows Kaldi ``egs/fisher_swbd/s5/local/fisher_data_prep.sh``: utterance ids
``fe_03_00004-A-000738-000878`` (times in 10 ms, truncated), the side as speaker, lines holding
``((`` (uncertain words) dropped, noise tags mapped to the Switchboard ones ([laugh] ->
[laughter]; [sigh] [cough] [mn] [breath] [lipsmack] -> [noise]).

Layout expected on disk (the LDC directories may be given separately or as one directory
holding them all; ``fisher_eng_tr_sp_d1`` is the newer name of ``fe_03_p2_sph1``)::

    LDC2004T19/fe_03_p1_tran/data/trans/000/fe_03_00001.txt ...
    LDC2005T19/fe_03_p2_tran/data/trans/058/fe_03_05851.txt ...
    LDC2004S13/fe_03_p1_sph1/audio/000/fe_03_00001.sph ...   (fe_03_p1_sph1 ... fe_03_p1_sph7)
    LDC2005S13/fe_03_p2_sph1/audio/058/fe_03_05851.sph ...   (fe_03_p2_sph1 ... fe_03_p2_sph7)
"""

from __future__ import annotations

import re
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.corpora.ldc import (
    find_sphere,
    keep_recordings_in_use,
    read_lines,
    require_dir,
    side_tables,
)
from asrtrain.data.datadir import DataDir, Segment

LAYOUT = ("the LDC directories LDC2004T19 LDC2005T19 LDC2004S13 LDC2005S13 (or one directory) "
          "holding fe_03_p1_tran/ fe_03_p2_tran/ fe_03_p1_sph1..7/ fe_03_p2_sph1..7/")
TRAN_SUBDIRS = ["fe_03_p1_tran", "fe_03_p2_tran"]
SPH_SUBDIRS = [f"fe_03_p{p}_sph{i}" for p in (1, 2) for i in range(1, 8)]

#: fisher_data_prep.sh's sed lines: Fisher noise tags -> the Switchboard noise words.
NOISE_MAP = [("[laugh]", "[laughter]"), ("[sigh]", "[noise]"), ("[cough]", "[noise]"),
             ("[mn]", "[noise]"), ("[breath]", "[noise]"), ("[lipsmack]", "[noise]")]

# "7.38 8.78 A: an- so the topic is" (Perl's m// searches, so it is not anchored at the start).
_LINE = re.compile(r"([0-9.]+)\s+([0-9.]+) ([AB]):\s*(\S.+\S|\S)\s*$")
_HEADER = re.compile(r"# (.+)\.sph")
# A line of that shape whose words _LINE does not take ("((" alone, or a two-character utterance
# such as "ok", which (\S.+\S|\S) misses) is skipped, as Kaldi skips it.
_DATA_SHAPE = re.compile(r"^\s*[0-9.]+\s+[0-9.]+\s+[AB]:")


def _find_subdir(dirs: list[Path], name: str) -> Path:
    for d in dirs:
        if (d / name).is_dir():
            return d / name
        newer = name.replace("fe_03_p2_sph", "fisher_eng_tr_sp_d")
        if (d / newer).is_dir():
            return d / newer
    raise AsrtrainError(f"could not find the subdirectory {name} in any of "
                        f"{', '.join(map(str, dirs))}; expected {LAYOUT}")


def _read_transcript(path: Path, text: dict[str, tuple[str, Path, int]]) -> None:
    # fe_03_00004.txt:
    #   # fe_03_00004.sph
    #   # Transcribed at the LDC
    #   <blank>
    #   7.38 8.78 A: an- so the topic is
    call_id = path.name[: -len(".txt")]
    lines = read_lines(path)
    first = next(lines, None)
    m = _HEADER.search(first[1]) if first else None
    if m is None:
        raise AsrtrainError(f"{path}:1: expected the header '# {call_id}.sph'")
    if m.group(1) != call_id:
        raise AsrtrainError(f"{path}:1: header names {m.group(1)}.sph, file is {call_id}")
    for lineno, line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        m = _LINE.search(line)
        if m is None and _DATA_SHAPE.match(line):
            continue
        if m is None:
            raise AsrtrainError(f"{path}:{lineno}: expected '<start> <end> <A|B>: <words>', "
                                f"got {line.strip()!r}")
        try:
            start, end = int(float(m.group(1)) * 100.0), int(float(m.group(2)) * 100.0)
        except ValueError:   # the pattern lets through "1.2.3" and "."
            raise AsrtrainError(f"{path}:{lineno}: times {m.group(1)} {m.group(2)} are not "
                                "numbers") from None
        if end > 999999:
            raise AsrtrainError(f"{path}:{lineno}: time too long ({m.group(2)} s)")
        utt = f"{call_id}-{m.group(3)}-{start:06d}-{end:06d}"
        if utt in text:
            raise AsrtrainError(f"{path}:{lineno}: utterance {utt} repeats "
                                f"{text[utt][1]}:{text[utt][2]}")
        text[utt] = (m.group(4), path, lineno)


def prepare_fisher(dirs: list[Path], expected_conversations: int | None = 11699) -> DataDir:
    """Prepare Fisher English parts 1+2 as Kaldi's fisher_data_prep.sh does (set train_fisher).

    ``dirs``: the LDC directories (or one holding every subdirectory).
    ``expected_conversations``: transcript files and .sph files to find (11699; ``None`` skips).
    """
    dirs = [require_dir(Path(d), "Fisher", LAYOUT) for d in dirs]
    if not dirs:
        raise AsrtrainError(f"no Fisher directories given; expected {LAYOUT}")
    tran_files = sorted(p for name in TRAN_SUBDIRS
                        for p in (_find_subdir(dirs, name) / "data").rglob("*")
                        if p.suffix.lower() == ".txt" and p.is_file())
    sph: dict[str, Path] = {}
    for name in SPH_SUBDIRS:
        sub = _find_subdir(dirs, name)
        for conv, path in find_sphere(sub, "Fisher audio", LAYOUT, allow_none=True).items():
            sph.setdefault(conv, path)   # Kaldi: sort -k1,1 -u
    if not sph:
        raise AsrtrainError(f"no .sph files in the Fisher audio directories under "
                            f"{', '.join(map(str, dirs))}; expected {LAYOUT}")
    if expected_conversations is not None:
        for what, n in (("transcript files", len(tran_files)), (".sph files", len(sph))):
            if n != expected_conversations:
                raise AsrtrainError(f"expected to find {expected_conversations} {what} in the "
                                    f"Fisher data under {', '.join(map(str, dirs))}, found {n}")

    raw: dict[str, tuple[str, Path, int]] = {}
    for path in tran_files:
        _read_transcript(path, raw)
    data = DataDir()
    for utt in sorted(raw):
        words, path, lineno = raw[utt]
        if "((" in words:
            continue
        for tag, word in NOISE_MAP:
            words = words.replace(tag, word)
        call_id, side, start, end = utt.rsplit("-", 3)
        reco = f"{call_id}-{side}"
        if call_id not in sph:
            raise AsrtrainError(f"{path}:{lineno}: conversation {call_id} has transcripts but "
                                f"no audio {call_id}.sph; expected {LAYOUT}")
        if int(end) <= int(start):
            continue   # no duration: Kaldi's feature extraction skips these
        data.text[utt] = words
        data.utt2spk[utt] = reco
        data.segments[utt] = Segment(reco, 0.01 * int(start), 0.01 * int(end))
    if not data.utt2spk:
        raise AsrtrainError(f"no utterances in the Fisher transcripts under "
                            f"{', '.join(map(str, dirs))}")
    wav, r2fc = side_tables(sph)
    data.wav, data.reco2file_and_channel = keep_recordings_in_use(
        wav, r2fc, {s.recording for s in data.segments.values()})
    data.validate("train_fisher")
    return data
