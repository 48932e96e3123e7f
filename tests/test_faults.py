"""Faults with real processes: the launcher killed, Ctrl-C and SIGTERM, a hung learner, a full
disk, a read-only experiment, a run's leftovers. Each case asserts the exit status, one line
naming the culprit, no traceback, no half-written ``*.tmp`` file and no process left behind, and
that the same command then resumes. The stops of a training run are one experiment's, stopped
five ways in a row, each run the resume of the run before: a learner start is ~3.7 CPU-s."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import forked_cli
import pytest
from conftest import copy_exp
from test_e2e import SMALL

# Long enough to be interrupted in the middle: the tests stop it as soon as epochs finish.
# Three learners where one hangs or dies: a rank to hang (2) beside the rank that dies (1) and
# rank 0, which writes, so the one named is picked among its peers; two where the launcher is
# signalled (it stops every learner it has). Each learner more is a process start more (~3.7
# CPU-s) in every run here.
LEARNERS = 3
LONG = ["trainer.epochs=400", "trainer.backend=adpsgd", f"trainer.learners={LEARNERS}"]
HANG_GUARD = 600  # seconds; a hang guard for a loaded machine, never a speed assertion


@pytest.fixture(scope="module")
def featured(tiny_tri1: Path, tmp_path_factory) -> Path:
    """An experiment with everything the CTC training reads (prepare, lang, features): a copy
    of conftest's tiny_tri1 (its GMM passes unused here), found done up to features."""
    exp = copy_exp(tiny_tri1, tmp_path_factory.mktemp("faults") / "exp")
    out = forked_cli.run("run", "recipes/tiny",
                         f"exp_dir={exp}", *SMALL, "--to", "features", timeout=HANG_GUARD)
    assert out.returncode == 0 and "nothing to do" in out.stderr, out.stderr[-3000:]
    return exp


@pytest.fixture
def exp(featured: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "exp"
    shutil.copytree(featured, copy, symlinks=True)
    return copy


def command(exp: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny", f"exp_dir={exp}",
            *SMALL, *extra, "--to", "train"]


def start(exp: Path, *extra: str) -> forked_cli.Started:
    """The command started warm, not waited for (bench/forked_cli.py: a process of its own, in
    a session of its own, as ``subprocess.Popen(..., start_new_session=True)``)."""
    return forked_cli.popen(*command(exp, *extra)[3:])


def run(exp: Path, *extra: str) -> subprocess.CompletedProcess:
    """The same command run to its end, warm (bench/forked_cli.py: a process of its own)."""
    return forked_cli.run(*command(exp, *extra)[3:], timeout=HANG_GUARD)


def learners(exp: Path) -> dict[int, int]:
    """{rank: pid} of the live learners of this experiment (``asrtrain train`` processes)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            # learner-RANK, with the command torchrun would have run (asrtrain/distributed/warm.py)
            comm = (d / "comm").read_text().strip()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (d / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if (comm.startswith("learner-") and b"asrtrain.cli train" in cmd
                and str(exp).encode() in cmd and state != "Z"):
            found[int(comm.removeprefix("learner-"))] = int(d.name)
    return found


def wait_for(predicate, what: str, proc: forked_cli.Started | None = None) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (status {proc.returncode}) before {what}:\n"
                                 + proc.communicate()[1][-3000:])
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def last_epoch(exp: Path) -> int:
    """The last epoch whose model checkpoint is on disk (0: none)."""
    return max((int(m.group(1)) for p in (exp / "train" / "blstm_tiny").glob("epoch-*.pt")
                if (m := re.fullmatch(r"epoch-(\d+)\.pt", p.name))), default=0)


def trained_past(exp: Path, epoch: int, n: int):
    """Whether the run has written an epoch's checkpoint after ``epoch``, its ``n`` learners
    up."""
    return lambda: last_epoch(exp) > epoch and len(learners(exp)) >= n


def one_error_line(stderr: str) -> str:
    """The run's last line, which must be its only ``asrtrain:`` line; no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    # a learner's progress bar may still hold the line when the launcher's error comes
    lines = [line[line.index("asrtrain: "):] for line in re.split(r"[\r\n]", stderr)
             if "asrtrain: " in line]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def no_leftovers(exp: Path) -> None:
    """Once every learner has ended (a killed launcher's learners end on their own, and may be
    writing until then): no temporary file left."""
    wait_for(lambda: not learners(exp), "every learner to end")
    assert not list(exp.rglob("*.tmp")), list(exp.rglob("*.tmp"))


def resumes(exp: Path, *extra: str) -> None:
    """The same command (a resumable setting: one epoch more than were kept) continues from the
    last epoch kept and finishes the stage."""
    kept = last_epoch(exp)
    out = run(exp, *LONG[1:], *extra, f"trainer.epochs={kept + 1}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming after epoch {kept} from" in out.stderr, out.stderr[-3000:]
    assert (exp / "train" / "blstm_tiny" / "final.pt").is_file()
    assert (exp / ".done" / "train").is_file()


def stopped(exp: Path, kept: int, sig: signal.Signals, rank: int | None = None,
            n: int = LEARNERS, *extra: str) -> tuple[int, str]:
    """Start the long run with ``n`` learners, wait for an epoch after ``kept`` (a run after the
    first must have resumed after epoch ``kept``), send ``sig`` to the launcher (``rank`` None)
    or to learner ``rank``, and once the run has ended: its exit status and output. What every
    stop leaves: no learner, no ``*.tmp``, neither a final model nor the stage's record."""
    proc = start(exp, *LONG, f"trainer.learners={n}", *extra)
    wait_for(trained_past(exp, kept, n), f"an epoch after epoch {kept}", proc)
    os.kill(proc.pid if rank is None else learners(exp)[rank], sig)
    _, stderr = proc.communicate(timeout=HANG_GUARD)
    no_leftovers(exp)
    assert not (exp / "train" / "blstm_tiny" / "final.pt").exists()
    assert not (exp / ".done" / "train").exists()
    if kept:
        assert f"resuming after epoch {kept} from" in stderr, stderr[-3000:]
    else:
        assert "resuming after" not in stderr, stderr[-3000:]
    return proc.returncode, stderr


@pytest.mark.timeout(HANG_GUARD * 7)
def test_a_run_stopped_each_way_says_so_in_one_line_and_resumes_each_time(exp: Path) -> None:
    """One experiment's training stopped five ways in a row, each run the resume of the run
    before it (resuming reads what the stop left on disk, whatever stopped it; the same command,
    or one whose learners differ, a resumable setting), then resumed to its end by the same
    command (:func:`resumes`). Every stop: :func:`stopped`'s checks. SIGTERM and SIGINT to the
    launcher only, as a scheduler or a terminal's Ctrl-C: exit status 128 + the signal, one line
    saying so. SIGKILL to the launcher: its learners end with it (no orphan trains on with
    nobody to record its result). A learner hung (SIGSTOP: alive, silent) or killed: exit status
    1, one line naming it first (the hung one by who waited for it)."""
    kept = 0
    for sig, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        code, stderr = stopped(exp, kept, sig, None, 2)
        assert code == status, stderr[-3000:]
        assert one_error_line(stderr) == (f"asrtrain: stage train interrupted by {sig.name}: what "
                                          "finished is kept; run the same command to resume")
        kept = last_epoch(exp)
    stopped(exp, kept, signal.SIGKILL, None, 2)
    kept = last_epoch(exp)
    for sig, rank, said in ((signal.SIGSTOP, 2, "rank 2 stopped"),  # hung: alive, silent
                            (signal.SIGKILL, 1, "(exit code -9")):
        code, stderr = stopped(exp, kept, sig, rank, LEARNERS, "trainer.timeout_s=15")
        assert code == 1, stderr[-3000:]
        line = one_error_line(stderr)
        assert line.startswith(f"asrtrain: error: learner rank {rank} failed first"), line
        assert said in line
        kept = last_epoch(exp)
    resumes(exp)


def test_leftover_temporaries_of_a_killed_run_are_removed(exp: Path) -> None:
    stale = [exp / "feats" / ".raw_fbank.ark.x1y2.tmp", exp / "train" / ".epoch-3.pt.tmp"]
    stale[1].parent.mkdir(parents=True, exist_ok=True)
    for p in stale:
        p.write_bytes(b"half")
    out = run(exp, "--to", "features")
    assert out.returncode == 0, out.stderr
    assert "removed 2 half-written temporary file(s)" in out.stderr
    assert not any(p.exists() for p in stale)


def test_nj_must_be_a_positive_whole_number(exp: Path) -> None:
    for bad in ("0", "-2", "four"):
        out = run(exp, f"nj={bad}", "--force", "features")
        assert out.returncode == 1
        assert "nj=" in one_error_line(out.stderr)
        assert "starts" not in out.stderr


# -- the file system: these need a small file system of their own (root mounts a tmpfs) --------

@contextmanager
def tmpfs(path: Path, size_kb: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


needs_mount = pytest.mark.skipif(not can_mount(), reason="a full disk and a read-only file "
                                 "system are made with tmpfs mounts, which need root")


@needs_mount
def test_a_full_disk_is_one_line_leaves_nothing_half_written_and_resumes(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", 3000) as fs:
        exp = fs / "exp"
        args = ["run", "recipes/tiny", f"exp_dir={exp}", *SMALL, "--to", "features"]
        out = forked_cli.run(*args, timeout=HANG_GUARD)
        assert out.returncode == 1
        line = one_error_line(out.stderr)
        assert line.startswith("asrtrain: error: stage features: no space left on the device")
        assert not list(exp.rglob("*.tmp"))
        assert (exp / ".done" / "prepare").is_file() and not (exp / ".done" / "features").exists()
        prepared = {p: p.read_bytes() for p in (exp / "data").rglob("*") if p.is_file()}
        subprocess.run(["mount", "-o", "remount,size=80000k", str(fs)], check=True)
        again = forked_cli.run(*args, timeout=HANG_GUARD)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "stage prepare       already done" in again.stderr
        assert all(p.read_bytes() == b for p, b in prepared.items() if p.name != "feats.scp"
                   and p.name != "cmvn.scp")


@needs_mount
def test_a_read_only_experiment_is_one_line(featured: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", 80000) as fs:
        shutil.copytree(featured, fs / "exp", symlinks=True)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        out = run(fs / "exp", "--force", "features")
        assert out.returncode == 1
        line = one_error_line(out.stderr)
        assert "cannot write" in line and "Read-only file system" in line


@needs_mount
@pytest.mark.timeout(HANG_GUARD * 3)
def test_a_full_disk_during_training_is_one_line_keeps_the_epochs_and_resumes(
        featured: Path, tmp_path: Path) -> None:
    """4 learners fill the exp dir's disk with their epoch checkpoints: one line (not a
    traceback per learner and torch's 'unexpected pos'), the epochs written stay good, and the
    same command resumes once there is room."""
    from asrtrain.models import checksum

    with tmpfs(tmp_path / "small", 80000) as fs:
        exp = fs / "exp"
        shutil.copytree(featured, exp, symlinks=True)  # its tables name featured's arks
        used = shutil.disk_usage(fs).used // 1024
        # room for the first epoch's model and 4 optimizer states (~2.6 MB), not the second's
        subprocess.run(["mount", "-o", f"remount,size={used + 4000}k", str(fs)], check=True)
        out = run(exp, *LONG, "trainer.learners=4")
        assert out.returncode == 1, out.stderr[-3000:]
        assert "enforce fail" not in out.stderr and "terminate called" not in out.stderr
        line = one_error_line(out.stderr)
        assert re.fullmatch(r"asrtrain: error: stage train: no space left on the device of "
                            rf"{re.escape(str(exp))}/train/blstm_tiny\S*: free some, then run "
                            r"the same command", line), line
        no_leftovers(exp)
        model = exp / "train" / "blstm_tiny"
        kept = sorted(model.glob("epoch-*.pt"))
        assert kept and all(checksum.damage(p) is None for p in kept), kept
        subprocess.run(["mount", "-o", "remount,size=200000k", str(fs)], check=True)
        resumes(exp, "trainer.learners=4")
