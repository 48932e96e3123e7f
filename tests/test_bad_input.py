"""Bad data input through the real CLI: one line naming the file (and line), never a traceback.

Each case builds its bad input in tmp_path (a copy of the tiny corpus, a small Kaldi data dir for
recipes/datadir, or an STM/CTM pair for ``asrtrain score``) and runs ``asrtrain`` on top of a copy
of an earlier good run. It must end with exit status 1 and exactly one ``asrtrain: error:`` line
naming the culprit, leave no ``*.tmp`` behind, and leave the earlier outputs byte for byte as
they were. The warning cases must run (exit 0) and say what is wrong in one warning line.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import soundfile
from conftest import write_datadir

from asrtrain.relocate import relocate

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "data" / "tiny"
TRANS_2001A = "LDC97S62/swb_ms98_transcriptions/20/2001/sw2001A-ms98-a-trans.text"
SPH_2001 = "LDC97S62/swb1_d1/data/sw02001.sph"
EVAL_STM = "LDC2002T43/reference/hub5e00.english.000405.stm"


def asrtrain(*args: str) -> subprocess.CompletedProcess:
    return forked_cli.run(*args, timeout=600)


def snapshot(root: Path) -> dict[str, str]:
    """Digest of every file under ``root`` but the logs (which a failed run appends to) and the
    records of finished stages (the pipeline drops the record of a stage before it reruns)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in ("log", ".done")
            and p.name != ".lock"}


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``asrtrain: error:`` line of a failed run (and no traceback)."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("asrtrain: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def no_temporaries(root: Path) -> None:
    assert [str(p) for p in root.rglob("*.tmp")] == []


def rewrite(path: Path, edit: Callable[[str], str]) -> None:
    path.write_text(edit(path.read_text()))


def replace_line(path: Path, lineno: int, line: str) -> None:
    lines = path.read_text().splitlines(True)
    lines[lineno - 1] = line
    path.write_text("".join(lines))


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# ------------------------------------------------------------------------------- good runs
@dataclass
class GoodRun:
    corpus: Path          # the data dir (datadir) or the corpus root (tiny) it was made from
    exp: Path
    files: dict[str, str]
    stderr: str


@pytest.fixture(scope="module")
def good_datadir(tmp_path_factory) -> GoodRun:
    """recipes/datadir through features on a 6-utterance data dir (train = dev = test)."""
    root = tmp_path_factory.mktemp("good_datadir")
    data = write_datadir(root / "corpus")
    exp = root / "exp"
    proc = asrtrain("run", "recipes/datadir", f"exp_dir={exp}", "nj=1",
                    f"corpus.sets={{train: {data}, dev: {data}, test: {data}}}",
                    "--to", "features")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return GoodRun(data, exp, snapshot(exp), proc.stderr)


@pytest.fixture(scope="module")
def good_tiny(tmp_path_factory) -> GoodRun:
    """recipes/tiny through lang on the bundled tiny corpus."""
    exp = tmp_path_factory.mktemp("good_tiny") / "exp"
    proc = asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--to", "lang")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return GoodRun(TINY, exp, snapshot(exp), proc.stderr)


def _ctm_from_stm(stm: Path) -> str:
    """A CTM that says every scored word of the STM, spread evenly over its segment."""
    out = []
    for line in stm.read_text().splitlines():
        f = line.split()
        if not f or line.startswith(";;") or "IGNORE_TIME_SEGMENT" in line:
            continue
        words = [w.strip("()") for w in f[6:] if w.strip("()")]
        start, dur = float(f[3]), (float(f[4]) - float(f[3])) / len(words)
        out += [f"{f[0]} {f[1]} {start + i * dur:.2f} {dur:.2f} {w}" for i, w in enumerate(words)]
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def good_score(tmp_path_factory, good_tiny: GoodRun) -> GoodRun:
    """``asrtrain score`` of a CTM made from the tiny test set's STM: the reports in out/."""
    root = tmp_path_factory.mktemp("good_score")
    for name in ("stm", "glm"):
        shutil.copy(good_tiny.exp / "data" / "eval2000" / name, root / name)
    (root / "ctm").write_text(_ctm_from_stm(root / "stm"))
    proc = asrtrain("score", "--stm", str(root / "stm"), "--ctm", str(root / "ctm"), "--glm",
                    str(root / "glm"), "--out", str(root / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^all +\| Sum/Avg \| +43 +\d+ \| 100\.0", proc.stdout, re.M), proc.stdout
    return GoodRun(root, root / "out", snapshot(root / "out"), proc.stderr)


def test_tiny_prepare_warns_once_that_it_is_a_stand_in(good_tiny: GoodRun) -> None:
    warnings = [x for x in good_tiny.stderr.splitlines() if " WARNING " in x]
    assert len(warnings) == 1, good_tiny.stderr
    assert "small synthetic stand-in" in warnings[0] and "not the full" in warnings[0]
    assert "LDC97S62" in warnings[0] and str(TINY / "README.md") in warnings[0]
    assert "synthetic stand-in" in (good_tiny.exp / "log" / "prepare.log").read_text()


# ------------------------------------------------------------------------------- the cases
@dataclass
class Case:
    """What to run on top of the good run, and what its one error line must say."""

    overrides: list[str]
    expect: list[str]                    # substrings of the error line (or of the warning)
    to: str = "prepare"
    extra: list[str] = field(default_factory=list)
    warn: bool = False                   # exit 0 with one warning line holding ``expect``


def _sets(train: Path, good: GoodRun, dev: Path | None = None) -> str:
    return f"corpus.sets={{train: {train}, dev: {dev or good.corpus}, test: {good.corpus}}}"


def _bad_datadir(tmp: Path) -> Path:
    return write_datadir(tmp / "bad")


def _wav_of(data: Path, lineno: int = 1) -> Path:
    return Path((data / "wav.scp").read_text().splitlines()[lineno - 1].split()[1])


def dd_non_utf8_text(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    raw = (d / "text").read_bytes().splitlines(True)
    raw[2] = raw[2].rstrip(b"\n") + b" caf\xe9\n"
    (d / "text").write_bytes(b"".join(raw))
    return Case([_sets(d, good)], [f"{d}/text:3: not UTF-8 text (byte 0xe9"])


def dd_non_utf8_utt2spk(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    (d / "utt2spk").write_bytes((d / "utt2spk").read_bytes().replace(b"spk1\n", b"spk\xff1\n", 1))
    return Case([_sets(d, good)], [f"{d}/utt2spk:4: not UTF-8 text (byte 0xff"])


def dd_empty_text_file(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    (d / "text").write_text("")
    return Case([_sets(d, good)], [f"{d}/text: no transcripts (the file is empty)"])


def dd_empty_transcript(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    replace_line(d / "text", 2, "spk0-utt1\n")
    return Case([_sets(d, good)], [f"{d}/text:2: utterance spk0-utt1 has an empty transcript"])


def _duplicate_line(table: str, key: str) -> Callable[[Path, GoodRun], Case]:
    def case(tmp: Path, good: GoodRun) -> Case:
        d = _bad_datadir(tmp)
        lines = (d / table).read_text().splitlines(True)
        # A second line for the key right after the first, with another value: the error names
        # both lines (one of them would win silently otherwise).
        first = next(i for i, x in enumerate(lines) if x.split()[0] == key)
        other = lines[(first + 1) % len(lines)].split(maxsplit=1)[1]
        lines.insert(first + 1, f"{key} {other}")
        (d / table).write_text("".join(lines))
        return Case([_sets(d, good)], [f"{d}/{table}:{first + 2}: duplicate key {key} "
                                       f"(first on line {first + 1})"])
    return case


def _segments(d: Path) -> list[str]:
    """A segments file cutting each recording's first 0.5 s (so wav.scp keys are recordings)."""
    return [f"{x.split()[0]} {x.split()[0]} 0.00 0.50\n"
            for x in (d / "wav.scp").read_text().splitlines()]


def dd_duplicate_segments_line(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    lines = _segments(d)
    lines.insert(4, lines[3])          # the very same line twice
    (d / "segments").write_text("".join(lines))
    return Case([_sets(d, good)], [f"{d}/segments:5: duplicate key spk1-utt0 (first on line 4)"])


def dd_duplicate_segments_key(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    lines = _segments(d)
    lines.insert(6, "spk1-utt2 spk1-utt0 0.10 0.40\n")   # the last utterance, other audio
    (d / "segments").write_text("".join(lines))
    return Case([_sets(d, good)], [f"{d}/segments:7: duplicate key spk1-utt2 (first on line 6)"])


def dd_segment_time_inf(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    lines = _segments(d)
    lines[2] = "spk0-utt2 spk0-utt2 0.00 inf\n"
    (d / "segments").write_text("".join(lines))
    return Case([_sets(d, good)], [f"{d}/segments:3: times 0.00 inf are not finite"])


def dd_spk2utt_other_speaker(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    (d / "spk2utt").write_text("spk0 spk0-utt0 spk0-utt1 spk0-utt2 spk1-utt0\n"
                               "spk1 spk1-utt1 spk1-utt2\n")
    return Case([_sets(d, good)], [f"{d}/spk2utt:1: utterance spk1-utt0 is listed under speaker "
                                   "spk0, but utt2spk line 4 gives spk1"])


def dd_spk2utt_lacks_utterance(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    replace_line(d / "spk2utt", 2, "spk1 spk1-utt0 spk1-utt2\n")
    return Case([_sets(d, good)], [f"{d}/spk2utt:2: speaker spk1 lacks utterance spk1-utt1 "
                                   "(utt2spk line 5)"])


def dd_spk2utt_lacks_speaker(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    replace_line(d / "spk2utt", 2, "")
    return Case([_sets(d, good)], [f"{d}/spk2utt: speaker spk1 (utt2spk line 4) is missing"])


def dd_unsorted_utt2spk(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    lines = (d / "utt2spk").read_text().splitlines(True)
    lines[1], lines[2] = lines[2], lines[1]
    (d / "utt2spk").write_text("".join(lines))
    return Case([_sets(d, good)], [f"{d}/utt2spk:3: key spk0-utt1 is out of order (after "
                                   "spk0-utt2 on line 2)"])


def dd_truncated_wav(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    wav = _wav_of(d, 2)
    frames = soundfile.info(str(wav)).frames
    truncate(wav, 44 + 2 * 1000)
    return Case([_sets(d, good)], [f"{wav}: header says {frames} samples, file holds 1000 "
                                   f"(truncated)", f"{d}/wav.scp:2"])


def dd_truncated_sphere(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    sph = tmp / "sw02001.sph"
    sph.write_bytes((TINY / SPH_2001).read_bytes()[:1024 + 2 * 60000])
    replace_line(d / "wav.scp", 1, f"spk0-utt0 {sph}\n")
    return Case([_sets(d, good)], [f"{sph}: header says 651148 samples, file holds 60000 "
                                   "(truncated)", f"{d}/wav.scp:1"])


def dd_garbage_sphere_header(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    sph = tmp / "garbage.sph"
    sph.write_bytes(b"NIST_1A\n   1024\nsample_rate -i 8000\nsample_count -i many\nend_head\n"
                    .ljust(1024, b" ") + bytes(16000))
    replace_line(d / "wav.scp", 3, f"spk0-utt2 {sph}\n")
    return Case([_sets(d, good)], [f"{sph}: bad NIST SPHERE header", f"{d}/wav.scp:3"])


def dd_wrong_rate(tmp: Path, good: GoodRun) -> Case:
    d = _bad_datadir(tmp)
    wav = _wav_of(d, 4)
    soundfile.write(wav, np.zeros(16000, np.int16), 16000)
    return Case([_sets(d, good), "corpus.resample=false"],
                [f"{d}/wav.scp:4: recording spk1-utt0 is at 16000 Hz, expected 8000 Hz"])


def dd_characters_outside_units(tmp: Path, good: GoodRun) -> Case:
    dev = _bad_datadir(tmp)
    rewrite(dev / "text", lambda t: t.replace("spk0-utt1 ", "spk0-utt1 CAFÉ ", 1))
    return Case([_sets(good.corpus, good, dev=dev)], [
        f"{good.exp}/data/dev/text: 4 characters in 1 of 6 utterances are not among the",
        "(they become <unk>): 'A' x1, 'C' x1, 'F' x1, 'É' x1",
        "first in utterance spk0-utt1 (line 2)"], to="lang", warn=True)


def dd_truncated_after_prepare(tmp: Path, good: GoodRun) -> Case:
    """The audio is cut short after prepare (a copy went wrong): features name the file."""
    wav = tmp / "cut.wav"
    shutil.copy(good.corpus.parent / "wav" / "spk1-utt1.wav", wav)
    frames = soundfile.info(str(wav)).frames
    truncate(wav, 44 + 2 * 300)
    for name in ("train", "dev", "test"):
        rewrite(good.exp / "data" / name / "wav.scp",
                lambda t: re.sub(r"(?m)^spk1-utt1 .*$", f"spk1-utt1 {wav}", t))
    return Case([_sets(good.corpus, good)], [
        f"{good.exp}/data/train/wav.scp:5: recording spk1-utt1: {wav}: header says {frames} "
        "samples, file holds 300 (truncated)"],
        to="features", extra=["--stage", "features", "--force", "features"])


DATADIR_CASES = {f.__name__: f for f in (
    dd_non_utf8_text, dd_non_utf8_utt2spk, dd_empty_text_file, dd_empty_transcript,
    dd_duplicate_segments_line, dd_duplicate_segments_key, dd_segment_time_inf,
    dd_spk2utt_other_speaker, dd_spk2utt_lacks_utterance, dd_spk2utt_lacks_speaker,
    dd_unsorted_utt2spk, dd_truncated_wav, dd_truncated_sphere, dd_garbage_sphere_header,
    dd_wrong_rate, dd_characters_outside_units, dd_truncated_after_prepare)}
DATADIR_CASES.update({
    "dd_duplicate_text_key": _duplicate_line("text", "spk1-utt2"),
    "dd_duplicate_utt2spk_key": _duplicate_line("utt2spk", "spk0-utt0"),
    "dd_duplicate_wav_key": _duplicate_line("wav.scp", "spk0-utt2"),
})


def _run_case(case: Case, good: GoodRun, exp: Path, recipe: str) -> None:
    # ``exp`` is a copy of the good run: its scps are made to name it first, as the run would
    # (asrtrain.relocate), so that what the bad input must leave alone is the copy's own
    relocate(exp)
    before = snapshot(exp)
    proc = asrtrain("run", recipe, f"exp_dir={exp}", "nj=1", *case.overrides, *case.extra,
                    "--to", case.to)
    no_temporaries(exp)
    if case.warn:
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        warnings = [x for x in proc.stderr.splitlines()
                    if " WARNING " in x and all(e in x for e in case.expect)]
        assert len(warnings) == 1, proc.stderr[-3000:]
        return
    line = error_line(proc)
    for expected in case.expect:
        assert expected in line, line
    assert snapshot(exp) == before


@pytest.mark.parametrize("name", sorted(DATADIR_CASES))
def test_bad_datadir(name: str, good_datadir: GoodRun, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    shutil.copytree(good_datadir.exp, exp, symlinks=True)
    good = GoodRun(good_datadir.corpus, exp, good_datadir.files, good_datadir.stderr)
    _run_case(DATADIR_CASES[name](tmp_path, good), good, exp, "recipes/datadir")


# ------------------------------------------------------------------------------ tiny corpus
def tiny_non_utf8_transcript(root: Path) -> list[str]:
    f = root / TRANS_2001A
    lines = f.read_bytes().splitlines(True)
    lines[4] = lines[4].rstrip(b"\n") + b" na\xefve\n"   # latin-1, as an old editor saves it
    f.write_bytes(b"".join(lines))
    return [f"{f}:5: not UTF-8 text (byte 0xef"]


def tiny_non_utf8_lexicon(root: Path) -> list[str]:
    f = root / "LDC97S62/swb_ms98_transcriptions/sw-ms98-dict.text"
    lines = f.read_bytes().splitlines(True)
    lines[-1] = b"caf\xe9  k ae f ey\n"
    f.write_bytes(b"".join(lines))
    return [f"{f}:{len(lines)}: not UTF-8 text (byte 0xe9"]


def tiny_truncated_sphere(root: Path) -> list[str]:
    truncate(root / SPH_2001, 1024 + 2 * 60000)
    return [f"{root / SPH_2001}: header says 651148 samples, file holds 60000 (truncated)"]


def tiny_garbage_sphere_header(root: Path) -> list[str]:
    sph = root / "LDC2002S09/hub5e_00/english/en_4170.sph"
    raw = sph.read_bytes()
    sph.write_bytes(raw[:16] + b"\x00\xff garbage \x01" * 20 + raw[16 + 240:])
    return [f"{sph}: bad NIST SPHERE header"]


def tiny_stm_time_nan(root: Path) -> list[str]:
    stm = root / EVAL_STM
    lineno = next(i for i, x in enumerate(stm.read_text().splitlines(), 1)
                  if not x.startswith(";;"))
    rewrite(stm, lambda t: t.replace(" 0.34 6.67 ", " nan 6.67 ", 1))
    return [f"{stm}:{lineno}: times nan 6.67 are not finite"]


def tiny_stm_ends_before_start(root: Path) -> list[str]:
    stm = root / EVAL_STM
    lineno = next(i for i, x in enumerate(stm.read_text().splitlines(), 1) if " 0.34 6.67 " in x)
    rewrite(stm, lambda t: t.replace(" 0.34 6.67 ", " 6.67 0.34 ", 1))
    return [f"{stm}:{lineno}: segment ends at 0.34, before it starts at 6.67"]


def tiny_transcript_time_inf(root: Path) -> list[str]:
    f = root / TRANS_2001A
    first = f.read_text().splitlines()[0].split()
    replace_line(f, 1, " ".join([first[0], first[1], "inf", *first[3:]]) + "\n")
    return [f"{f}:1: times {float(first[1])} inf are not finite"]


TINY_CASES = {f.__name__: f for f in (
    tiny_non_utf8_transcript, tiny_non_utf8_lexicon, tiny_truncated_sphere,
    tiny_garbage_sphere_header, tiny_stm_time_nan, tiny_stm_ends_before_start,
    tiny_transcript_time_inf)}


@pytest.mark.parametrize("name", sorted(TINY_CASES))
def test_bad_tiny_corpus(name: str, good_tiny: GoodRun, tmp_path: Path) -> None:
    root = tmp_path / "tiny"
    shutil.copytree(TINY, root, ignore=shutil.ignore_patterns("make_tiny.py"))
    expect = TINY_CASES[name](root)
    exp = tmp_path / "exp"
    shutil.copytree(good_tiny.exp, exp, symlinks=True)
    _run_case(Case([f"corpus.root={root}"], expect), good_tiny, exp, "recipes/tiny")


# ------------------------------------------------------------------------------ scoring
def _edit_field(path: Path, lineno: int, index: int, value: str) -> str:
    lines = path.read_text().splitlines(True)
    fields = lines[lineno - 1].split()
    old, fields[index] = fields[index], value
    lines[lineno - 1] = " ".join(fields) + "\n"
    path.write_text("".join(lines))
    return old


def _first_segment_line(stm: Path) -> int:
    return next(i for i, x in enumerate(stm.read_text().splitlines(), 1) if not x.startswith(";;"))


def score_ctm_start_nan(stm: Path, ctm: Path) -> tuple[Path, str]:
    _edit_field(ctm, 3, 2, "nan")
    return ctm, f"{ctm}:3: CTM start 'nan' is not a finite time"


def score_ctm_duration_inf(stm: Path, ctm: Path) -> tuple[Path, str]:
    _edit_field(ctm, 5, 3, "inf")
    return ctm, f"{ctm}:5: CTM duration 'inf' is not a finite non-negative duration"


def score_ctm_duration_negative(stm: Path, ctm: Path) -> tuple[Path, str]:
    _edit_field(ctm, 7, 3, "-0.25")
    return ctm, f"{ctm}:7: CTM duration '-0.25' is not a finite non-negative duration"


def score_stm_start_nan(stm: Path, ctm: Path) -> tuple[Path, str]:
    n = _first_segment_line(stm)
    _edit_field(stm, n, 3, "NaN")
    return stm, f"{stm}:{n}: STM start time 'NaN' is not finite"


def score_stm_end_inf(stm: Path, ctm: Path) -> tuple[Path, str]:
    n = _first_segment_line(stm) + 2
    _edit_field(stm, n, 4, "inf")
    return stm, f"{stm}:{n}: STM end time 'inf' is not finite"


def score_stm_ends_before_start(stm: Path, ctm: Path) -> tuple[Path, str]:
    n = _first_segment_line(stm) + 1
    _edit_field(stm, n, 3, "99.00")
    end = stm.read_text().splitlines()[n - 1].split()[4]
    return stm, f"{stm}:{n}: STM segment ends at {end}, before it starts at 99.00"


SCORE_CASES = {f.__name__: f for f in (
    score_ctm_start_nan, score_ctm_duration_inf, score_ctm_duration_negative,
    score_stm_start_nan, score_stm_end_inf, score_stm_ends_before_start)}


@pytest.mark.parametrize("name", sorted(SCORE_CASES))
def test_bad_score_input(name: str, good_score: GoodRun, tmp_path: Path) -> None:
    for f in ("stm", "ctm", "glm"):
        shutil.copy(good_score.corpus / f, tmp_path / f)
    out = tmp_path / "out"
    shutil.copytree(good_score.exp, out)
    _, expected = SCORE_CASES[name](tmp_path / "stm", tmp_path / "ctm")
    proc = asrtrain("score", "--stm", str(tmp_path / "stm"), "--ctm", str(tmp_path / "ctm"),
                    "--glm", str(tmp_path / "glm"), "--out", str(out))
    assert expected in error_line(proc)
    no_temporaries(out)
    assert snapshot(out) == good_score.files
