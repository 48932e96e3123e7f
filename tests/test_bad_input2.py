"""Issue 26's inputs and CLI cases through the real CLI: one clear line (or the right result) for
a recipe.yaml with a YAML syntax error, a huge topology, ``sets.test`` given as one name, a UTF-8
BOM in ``text``, audio shorter than one frame, a directory given to ``transcribe``, a moved or
copied exp dir, the features log's measured audio durations, and the jobs of a killed run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import write_datadir
from test_bad_input import asrtrain, error_line, no_temporaries, snapshot

REPO = Path(__file__).resolve().parents[1]


def _sets(train: Path, dev: Path | None = None, test: Path | None = None) -> str:
    return f"corpus.sets={{train: {train}, dev: {dev or train}, test: {test or train}}}"


def run_datadir(exp: Path, data: Path, *extra: str, to: str = "features"
                ) -> subprocess.CompletedProcess:
    return asrtrain("run", "recipes/datadir", f"exp_dir={exp}", "nj=1", _sets(data), *extra,
                    "--to", to)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr


# ----------------------------------------------------------------------------- recipe, CLI
def test_recipe_yaml_syntax_error_is_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    text = (REPO / "recipes" / "tiny" / "recipe.yaml").read_text()
    lines = text.splitlines(True)
    n = next(i for i, x in enumerate(lines) if x.startswith("nj:"))
    lines[n] = "nj: [2\n"                       # an unclosed flow sequence
    (recipe / "recipe.yaml").write_text("".join(lines))
    line = error_line(asrtrain("run", str(recipe), "--dry-run"))
    assert re.search(rf"{re.escape(str(recipe / 'recipe.yaml'))}:\d+:\d+: YAML syntax error: "
                     r"expected ',' or '\]'", line), line
    assert f"at {n + 1}:5" in line, line       # where the sequence opened


def test_recipe_yaml_tab_indent_names_line_and_column(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "recipe.yaml").write_text("defaults:\n  - corpus: tiny\nsets:\n\ttrain: x\n")
    line = error_line(asrtrain("run", str(recipe), "--dry-run"))
    assert f"{recipe / 'recipe.yaml'}:4:1: YAML syntax error:" in line, line


def test_config_group_yaml_syntax_error_is_one_line(tmp_path: Path) -> None:
    """A group file of the recipe's own (read by Hydra, not by asrtrain) names its line too."""
    recipe = tmp_path / "recipe"
    (recipe / "corpus").mkdir(parents=True)
    (recipe / "recipe.yaml").write_text("defaults:\n  - corpus: mine\n  - _self_\n")
    (recipe / "corpus" / "mine.yaml").write_text("kind: datadir\nsets: {train: /x\n")
    line = error_line(asrtrain("run", str(recipe), "--dry-run"))
    assert f"{recipe / 'corpus' / 'mine.yaml'}:3:1: YAML syntax error: expected ',' or '}}'" \
        in line and "(while parsing a flow mapping at 2:7)" in line, line


def test_empty_or_broken_recipe_is_one_line(tmp_path: Path) -> None:
    """An empty recipe.yaml, and an interpolation to nothing, in a recipe or an override."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "recipe.yaml").write_text("")
    line = error_line(asrtrain("run", str(empty), "--dry-run"))
    assert f"{empty / 'recipe.yaml'}: no exp_dir, stages, sets; a recipe says" in line, line
    typo = tmp_path / "typo"
    typo.mkdir()
    (typo / "recipe.yaml").write_text("exp_dir: exp/${nothing}\nstages: [prepare]\n"
                                      "sets: {train: a, dev: b, test: [c]}\n")
    line = error_line(asrtrain("run", str(typo), "--dry-run"))
    assert line.endswith(f"{typo / 'recipe.yaml'}: exp_dir: Interpolation key 'nothing' not "
                         "found"), line
    line = error_line(asrtrain("run", "recipes/tiny", "model.cells=${nothing}", "--dry-run"))
    assert "recipes/tiny/recipe.yaml: model.cells: Interpolation key 'nothing' not found" in line


def test_topology_of_100000_learners(tmp_path: Path) -> None:
    proc = asrtrain("topology", "--learners", "100000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "100000 learners" in proc.stdout and "spectral gap" in proc.stdout
    ring = asrtrain("topology", "--learners", "100000", "--scheme", "ring")
    assert ring.returncode == 0 and "spectral gap" in ring.stdout, ring.stderr[-2000:]
    refused = asrtrain("topology", "--learners", "100000", "--scheme", "exponential")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "100000 nodes" in lines[0] and "74.5 GiB" in lines[0], lines


def test_sets_test_as_one_name_is_a_list_of_one(tmp_path: Path) -> None:
    data = write_datadir(tmp_path / "corpus")
    exp = tmp_path / "exp"
    shown = asrtrain("run", "recipes/datadir", f"exp_dir={exp}", "sets.test=mytest",
                     "--show-config")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert re.search(r"^  test:\n  - mytest$", shown.stdout, re.M), shown.stdout
    sets = f"corpus.sets={{train: {data}, dev: {data}, mytest: {data}}}"
    ok(asrtrain("run", "recipes/datadir", f"exp_dir={exp}", "nj=1", sets, "sets.test=mytest",
                "--to", "prepare"))
    assert (exp / "data" / "mytest" / "text").is_file()
    assert sorted(p.name for p in (exp / "data").iterdir() if p.name != "local") == [
        "dev", "mytest", "train"]
    line = error_line(asrtrain("run", "recipes/datadir", f"exp_dir={exp}", sets,
                               "sets.train=[a,b]", "--dry-run"))
    assert "sets.train=['a', 'b']: expected one set name" in line, line


def test_text_with_a_byte_order_mark(tmp_path: Path) -> None:
    data = write_datadir(tmp_path / "corpus")
    (data / "text").write_bytes(b"\xef\xbb\xbf" + (data / "text").read_bytes())
    exp = tmp_path / "exp"
    stderr = ok(run_datadir(exp, data, to="prepare"))
    warnings = [x for x in stderr.splitlines() if " WARNING " in x and "byte order mark" in x]
    assert len(warnings) == 1 and f"{data / 'text'}:" in warnings[0], stderr[-3000:]
    first = (exp / "data" / "train" / "text").read_bytes().splitlines()[0]
    assert first.startswith(b"spk0-utt0 "), first


def test_transcribe_a_directory(tmp_path: Path) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    line = error_line(asrtrain("transcribe", "--exp", str(tmp_path / "exp"), str(audio)))
    assert f"{audio}: is a directory, not an audio file" in line, line
    line = error_line(asrtrain("transcribe", "--exp", str(tmp_path / "exp"),
                               str(audio / "missing.wav")))
    assert f"{audio / 'missing.wav'}: audio file not found" in line, line


# ----------------------------------------------------------------------------- short audio
def _shorten(data: Path, utt: str, samples: int) -> Path:
    wav = Path(next(x.split()[1] for x in (data / "wav.scp").read_text().splitlines()
                    if x.split()[0] == utt))
    soundfile.write(wav, np.zeros(samples, np.int16), 8000, subtype="PCM_16")
    return wav


def test_audio_shorter_than_a_frame_is_dropped_with_a_warning(tmp_path: Path) -> None:
    data = write_datadir(tmp_path / "corpus")
    w100 = _shorten(data, "spk0-utt1", 100)
    w0 = _shorten(data, "spk1-utt2", 0)
    exp = tmp_path / "exp"
    stderr = ok(run_datadir(exp, data))
    warnings = [x for x in stderr.splitlines() if " WARNING " in x and "shorter than" in x]
    assert len(warnings) == 3, stderr[-3000:]       # train, dev and test: one line each
    for name, line in zip(("dev", "test", "train"), sorted(warnings, key=lambda x: x.split()[2]),
                          strict=True):
        assert f"{exp / 'data' / name}: 2 utterances shorter than one 25 ms frame (200 " \
               "samples at 8000 Hz) skipped" in line, line
        assert f"spk0-utt1 ({w100}: 100 samples)" in line and f"spk1-utt2 ({w0}: 0 samples)" \
            in line, line
    kept = ["spk0-utt0", "spk0-utt2", "spk1-utt0", "spk1-utt1"]
    for name in ("train", "dev", "test"):
        d = exp / "data" / name
        for table in ("text", "utt2spk", "wav.scp", "feats.scp", "utt2num_frames", "utt2dur"):
            assert [x.split()[0] for x in (d / table).read_text().splitlines()] == kept, table
        assert (d / "spk2utt").read_text() == "spk0 spk0-utt0 spk0-utt2\nspk1 spk1-utt0 " \
                                              "spk1-utt1\n"
    # the rest of the recipe reads them: the features of every kept utterance load
    from asrtrain.features import FeatureReader

    reader = FeatureReader(exp / "data" / "train")
    assert [reader[u].shape[0] > 0 for u in reader.utts] == [True] * 4
    # and a second run has nothing to do
    again = ok(run_datadir(exp, data))
    assert "nothing to do" in again and "WARNING" not in again, again[-2000:]


def test_audio_all_shorter_than_a_frame_is_one_line(tmp_path: Path) -> None:
    data = write_datadir(tmp_path / "corpus", n_speakers=1, utts_per_speaker=2)
    for utt in ("spk0-utt0", "spk0-utt1"):
        _shorten(data, utt, 150)
    exp = tmp_path / "exp"
    line = error_line(run_datadir(exp, data))
    assert "every utterance is shorter than one 25 ms frame" in line, line
    assert "spk0-utt0 (" in line and ": 150 samples)" in line, line
    no_temporaries(exp)


# ----------------------------------------------------------------------------- durations
def test_features_log_states_the_measured_audio_duration(tmp_path: Path) -> None:
    data = write_datadir(tmp_path / "corpus")
    # a 44.1 kHz file among them, resampled: its size says little about its length
    wav44 = Path((data / "wav.scp").read_text().splitlines()[0].split()[1])
    x = (3000 * np.sin(np.arange(int(44100 * 1.5)) / 7)).astype(np.int16)
    soundfile.write(wav44, x, 44100, subtype="PCM_16")
    exp = tmp_path / "exp"
    stderr = ok(run_datadir(exp, data, "corpus.resample=true"))
    seconds = 0.0
    for line in (data / "wav.scp").read_text().splitlines():
        info = soundfile.info(line.split()[1])
        seconds += info.frames / info.samplerate
    logged = re.search(r"processes, ([\d.]+) s of audio\)", stderr)
    assert logged is not None, stderr[-2000:]
    assert float(logged[1]) == pytest.approx(3 * seconds, abs=0.05), (logged[0], seconds)
    durations = dict(x.split() for x in (exp / "data" / "train" / "utt2dur").read_text()
                     .splitlines())
    assert float(durations["spk0-utt0"]) == pytest.approx(1.5, abs=1e-3)
    assert sum(map(float, durations.values())) == pytest.approx(seconds, abs=0.01)


# ----------------------------------------------------------------------------- moved exp dir
def _names_path(root: Path, path: Path) -> list[str]:
    """The files under ``root`` but its logs that name ``path``."""
    pattern = re.compile(re.escape(str(path)) + r"(?=[/\s\"',:|\]}]|$)", re.M)
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.name.endswith((".ark", ".pt", ".model")) and \
                p.relative_to(root).parts[0] != "log":
            try:
                if pattern.search(p.read_text(encoding="utf-8")):
                    found.append(str(p.relative_to(root)))
            except UnicodeDecodeError:
                pass
    return found


@pytest.mark.parametrize("how", ["move", "copy"])
def test_moved_exp_dir_just_works(how: str, tmp_path: Path) -> None:
    data = write_datadir(tmp_path / "corpus")
    base = tmp_path / "exp" / "base"
    ok(run_datadir(base, data))
    assert (base / ".done" / "location").read_text().strip() == str(base.resolve())
    assert _names_path(base, base)          # feats.scp and cmvn.scp name it
    moved = tmp_path / "exp" / "moved"
    (shutil.move if how == "move" else shutil.copytree)(base, moved)
    before = snapshot(moved)
    scp = moved / "data" / "train" / "feats.scp"
    mtime = scp.stat().st_mtime_ns
    # before any run there: a path a record holds is found where the exp dir is now
    from asrtrain.relocate import in_exp

    assert in_exp(moved, base / "train" / "m" / "final.pt") == moved.resolve() / "train" / "m" \
        / "final.pt"
    assert in_exp(moved, tmp_path / "elsewhere") == tmp_path / "elsewhere"

    dry = asrtrain("run", "recipes/datadir", f"exp_dir={moved}", "nj=1", _sets(data),
                   "--to", "features", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"the exp dir was at {base}" in dry.stderr, dry.stderr[-2000:]
    assert re.search(r"^features +done", dry.stdout, re.M), dry.stdout
    assert snapshot(moved) == before                      # a dry run changes nothing

    stderr = ok(run_datadir(moved, data))
    assert "nothing to do" in stderr, stderr[-2000:]      # nothing recomputed
    moves = [x for x in stderr.splitlines() if "the exp dir was moved" in x]
    assert len(moves) == 1 and f"from {base} to {moved}" in moves[0], stderr[-2000:]
    assert _names_path(moved, base) == []
    assert scp.stat().st_mtime_ns == mtime           # rewritten, its time kept
    assert (moved / ".done" / "location").read_text().strip() == str(moved.resolve())
    changed = {k for k in before if snapshot(moved).get(k) != before[k]}
    assert changed and all(k.endswith((".scp", "location")) for k in changed), changed
    if how == "copy":
        shutil.rmtree(base)                               # the copy needs nothing of it
    from asrtrain.features import FeatureReader

    for name in ("train", "dev", "test"):
        reader = FeatureReader(moved / "data" / name)
        assert all(reader[u].shape[1] == 40 for u in reader.utts)
    no_temporaries(moved)
    # the next run from there is an ordinary one
    assert "was moved" not in ok(run_datadir(moved, data))


def test_exp_dir_moved_before_its_place_was_recorded(tmp_path: Path) -> None:
    """An exp dir made before the location record existed: its place is read off feats.scp."""
    data = write_datadir(tmp_path / "corpus")
    base = tmp_path / "base"
    ok(run_datadir(base, data))
    (base / ".done" / "location").unlink()
    moved = tmp_path / "moved"
    base.rename(moved)
    stderr = ok(run_datadir(moved, data))
    assert "nothing to do" in stderr and f"moved from {base} to {moved}" in stderr, stderr[-2000:]
    assert _names_path(moved, base) == []


# ----------------------------------------------------------------------------- killed parent
JOB_SCRIPT = """
import os, sys, time
from pathlib import Path
from asrtrain.jobs import JobConfig, run_jobs

def job(i):
    (Path(sys.argv[1]) / f"pid.{os.getpid()}").write_text("")
    time.sleep(3)
    return i

if __name__ == "__main__":
    run_jobs(job, list(range(4)), JobConfig(nj=2), "test jobs")
"""


def test_jobs_of_a_killed_parent_end_quietly(tmp_path: Path) -> None:
    """kill -9 of the process running local jobs (asrtrain run during align, nj=2): its jobs end
    at once, without BrokenPipeError tracebacks, and none is left behind."""
    script = tmp_path / "jobs_script.py"
    script.write_text(JOB_SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        parent = subprocess.Popen([sys.executable, str(script), str(pids)], cwd=REPO,
                                  stderr=f, stdout=f)
    deadline = time.time() + 300
    while len(list(pids.iterdir())) < 2 and time.time() < deadline:
        assert parent.poll() is None, err.read_text()
        time.sleep(0.2)
    workers = [int(p.name.split(".")[1]) for p in pids.iterdir()]
    assert len(workers) == 2
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 60
    alive = workers
    while alive and time.time() < deadline:
        alive = [p for p in workers if _alive(p)]
        time.sleep(0.2)
    assert alive == []
    time.sleep(4)        # longer than a job: one that went on would write its traceback now
    assert "Traceback" not in err.read_text() and "BrokenPipeError" not in err.read_text()
    assert len(list(pids.iterdir())) == 2                 # no job started after the kill


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_features_from_elsewhere_are_not_taken_for_a_move(tmp_path: Path) -> None:
    """An exp dir without a location record whose feats.scp names arks outside it (imported
    from a Kaldi setup with a feats/ dir of its own): no place is inferred, nothing rewritten."""
    from asrtrain.relocate import relocate

    kaldi = tmp_path / "kaldi" / "feats"
    kaldi.mkdir(parents=True)
    (kaldi / "raw_mfcc.1.ark").write_bytes(b"")
    exp = tmp_path / "exp"
    (exp / ".done").mkdir(parents=True)
    (exp / "data" / "train").mkdir(parents=True)
    scp = exp / "data" / "train" / "feats.scp"
    scp.write_text(f"u1 {kaldi / 'raw_mfcc.1.ark'}:10\n")
    assert relocate(exp) == []
    assert scp.read_text() == f"u1 {kaldi / 'raw_mfcc.1.ark'}:10\n"
    assert (exp / ".done" / "location").read_text().strip() == str(exp.resolve())
