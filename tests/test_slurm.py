"""``cmd: slurm`` on a real one-node SLURM cluster (tests/slurm/start_slurm.sh: slurmctld, slurmd
and munge on this machine): the job runner's results equal ``cmd: local``'s, a failed job is
named with its SLURM id and logs, Ctrl-C cancels the jobs, and the tiny recipe's stages make the
same bytes either way while changing ``cmd`` reruns nothing."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import forked_cli
import pytest
import torch

from asrtrain import AsrtrainError
from asrtrain.jobs import JobConfig, SlurmOptions, run_jobs
from asrtrain.slurm import task_args

REPO = Path(__file__).resolve().parents[1]
START = REPO / "tests" / "slurm" / "start_slurm.sh"
PARTITION = "debug"
# Small jobs for a small node: the machine's cores are shared with the rest of the suite.
SLURM = ["cmd=slurm", f"slurm.partition={PARTITION}", "slurm.mem_gb=1", "slurm.poll_s=0.5",
         "slurm.pending_timeout_s=240"]


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """A running one-node cluster (started, packages installed, by start_slurm.sh); the test
    fails with the script's output when it cannot start one.  Skipped, with the reason, only
    where the script cannot run at all: not root, or no apt-get and no SLURM."""
    have_slurm = all(shutil.which(c) for c in ("slurmctld", "slurmd", "sbatch", "munged"))
    why = None
    if os.geteuid() != 0:
        why = "not root: tests/slurm/start_slurm.sh installs and starts SLURM as root"
    elif not have_slurm and shutil.which("apt-get") is None:
        why = "no SLURM and no apt-get to install it (slurmctld, slurmd, slurm-client, munge)"
    if why:
        warnings.warn(f"tests/test_slurm.py skipped: {why}", stacklevel=1)
        pytest.skip(why)
    try:
        # not this process's OMP_NUM_THREADS (a stage run in it sets 1): the script sizes the
        # node with slurmd -C, and it is no business of a daemon's either
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
        proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=900,
                              env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{START} did not finish in {e.timeout} s:\n{e.stdout}\n{e.stderr}")
    if proc.returncode != 0:
        pytest.fail(f"{START} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return PARTITION


@pytest.fixture
def importable_tests(monkeypatch) -> None:
    """This module importable in the jobs (a fresh interpreter on the node, with the submitting
    environment): the jobs below are its functions, pickled by reference as any job is; and
    bench/, which it imports from (bench/forked_cli.py), as conftest has it for the suite."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(REPO / "tests"), str(REPO / "bench"), path) if p))


def _square_and_threads(x: int) -> tuple[int, int]:
    return x * x, torch.get_num_threads()


def _array_task(x: int) -> str | None:
    return os.environ.get("SLURM_ARRAY_TASK_ID")


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is not allowed")
    return x


def _sleep(x: int) -> int:
    time.sleep(300)
    return x


# A job that cannot start is an error naming squeue's reason after this long, not a hang; long
# enough for the jobs of the other tests (the sleepers of the Ctrl-C test) on a loaded 2-core node.
PENDING_TIMEOUT_S = 240


def _slurm_jobs(tmp_path: Path, nj: int = 2, threads: int = 1, **slurm) -> JobConfig:
    options = {"partition": PARTITION, "mem_gb": 0.5, "poll_s": 0.5,
               "pending_timeout_s": PENDING_TIMEOUT_S, **slurm}
    return JobConfig(nj=nj, cmd="slurm", threads=threads, log_dir=tmp_path / "slurm",
                     slurm=SlurmOptions(**options))


def test_the_node_has_every_cpu_of_the_machine(slurm_cluster):
    """slurm.conf's CPUs are slurmd's own count, not nproc's (which obeys OMP_NUM_THREADS=1)."""
    hw = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True,
                        timeout=60).stdout
    cpus = subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.split()
    assert cpus and f"CPUs={cpus[0]} " in hw, (cpus, hw)


# Hang guards (pytest-timeout), sized for a loaded 2-core machine; a job that cannot start
# fails sooner, at PENDING_TIMEOUT_S.
@pytest.mark.timeout(600)
def test_slurm_jobs_return_what_local_jobs_return_in_order(slurm_cluster, importable_tests,
                                                           tmp_path):
    args = list(range(5))
    local = run_jobs(_square_and_threads, args, JobConfig(nj=2), "squares")
    on_slurm = run_jobs(_square_and_threads, args, _slurm_jobs(tmp_path), "squares")
    assert on_slurm == local == [(x * x, 1) for x in args]
    # one array of nj tasks, as Kaldi's JOB=1:nj: task j serves the arguments j, j+nj, ... in
    # one interpreter, each result a file of its own (written under a temporary name)
    tasks = run_jobs(_array_task, args, _slurm_jobs(tmp_path, threads=2), "tasks")
    assert tasks == [str(x % 2) for x in args]
    folder = tmp_path / "slurm" / "tasks"
    text = next(folder.glob("*_submission.sh")).read_text()
    assert "#SBATCH --array=0-1%2" in text and "#SBATCH --cpus-per-task=2" in text
    assert f"#SBATCH --partition={PARTITION}" in text
    array = next(folder.glob("*_submission.sh")).name.split("_")[0]
    assert sorted(p.name for p in folder.glob("*_job*_result.pkl*")) == sorted(
        f"{array}_{x % 2}_job{x + 1}_result.pkl" for x in args)
    assert len(list(folder.glob("*_log.out"))) == 2


def test_an_array_has_min_nj_and_jobs_tasks_each_serving_every_nj_th_job():
    assert task_args(5, 2) == [[0, 2, 4], [1, 3]]
    assert task_args(3, 1) == [[0, 1, 2]]
    assert task_args(2, 5) == [[0], [1]]
    assert task_args(9, 4) == [[0, 4, 8], [1, 5], [2, 6], [3, 7]]


@pytest.mark.timeout(600)
def test_a_failing_slurm_job_is_named_with_its_logs(slurm_cluster, importable_tests, tmp_path):
    with pytest.raises(AsrtrainError) as err:
        run_jobs(_fail_on_three, list(range(5)), _slurm_jobs(tmp_path), "counting")
    message = str(err.value)
    # job 4 is array task 1's second job (nj=2: task 1 serves jobs 2 and 4); the error names
    # the job, its task, the job's own traceback, and the task's logs, marked where each starts
    assert "counting: job 4 of 5 (SLURM job " in message
    assert "_1) failed: ValueError: three is not allowed" in message
    assert "in _fail_on_three" in message and "JobFailed" not in message, message
    assert "its logs (jobs 2, 4): " in message
    logs = [Path(w) for w in message.split() if w.endswith(("_log.out", "_log.err"))]
    assert len(logs) == 2 and all(p.is_file() for p in logs), message
    err_log = logs[1].read_text()
    assert "three is not allowed" in err_log
    # the job's traceback, beside the task's logs, is where the message's came from
    failed = list(logs[0].parent.glob("*_job4_failed.txt"))
    assert len(failed) == 1 and "three is not allowed" in failed[0].read_text(), failed
    assert err_log.index("counting: job 2 of 5") < err_log.index("counting: job 4 of 5") \
        < err_log.index("three is not allowed")


@pytest.mark.timeout(300)
def test_a_job_that_can_never_start_is_an_error_with_its_reason(slurm_cluster, importable_tests,
                                                                tmp_path):
    """More CPUs than the node has: SLURM keeps the jobs PENDING (PartitionConfig) for ever; after
    slurm.pending_timeout_s the run stops, says why, and cancels them."""
    jobs = _slurm_jobs(tmp_path, cpus_per_task=512, pending_timeout_s=3)
    start = time.time()
    with pytest.raises(AsrtrainError) as err:
        run_jobs(_array_task, [0, 1], jobs, "impossible")
    message = str(err.value)
    assert time.time() - start < 120, message
    assert "impossible: none of the 2 unfinished SLURM jobs" in message
    assert "PENDING (reason PartitionConfig" in message and "pending_timeout_s=3" in message
    deadline = time.time() + 60
    while _queued("asrtrain-impossible") and time.time() < deadline:
        time.sleep(0.5)
    assert not _queued("asrtrain-impossible")


def test_no_sbatch_is_an_error_that_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AsrtrainError, match="cmd=slurm but sbatch is not on PATH: install "
                                            "SLURM or use cmd=local"):
        run_jobs(_square_and_threads, [1, 2], _slurm_jobs(tmp_path), "squares")


def _queued(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-n", name, "-t", "PENDING,RUNNING",
                          "-o", "%i"], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()


@pytest.mark.timeout(600)
def test_ctrl_c_cancels_the_jobs(slurm_cluster, importable_tests, tmp_path):
    code = ("import sys, test_slurm as t; from pathlib import Path; "
            "from asrtrain.jobs import run_jobs; "
            f"run_jobs(t._sleep, [1, 2, 3], t._slurm_jobs(Path({str(tmp_path)!r})), 'sleepers')")
    # Ctrl-C as a terminal's foreground job gets it: with SIGINT at its default, so Python turns
    # it into KeyboardInterrupt (a suite started in the background of a non-interactive shell
    # hands its children SIGINT ignored, and Python then leaves it ignored)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO / "tests",
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not _queued("asrtrain-sleepers") and time.time() < deadline:
            time.sleep(0.5)
        assert _queued("asrtrain-sleepers"), "the jobs never reached the queue"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "cancelled" in out, out
    deadline = time.time() + 60
    while _queued("asrtrain-sleepers") and time.time() < deadline:
        time.sleep(0.5)
    assert not _queued("asrtrain-sleepers")


@pytest.mark.parametrize("recipe", ["tiny", "swb300", "swb2000"])
def test_where_jobs_run_is_in_no_stage_digest(recipe):
    from asrtrain.pipeline import Pipeline
    from asrtrain.recipe import compose_recipe
    from asrtrain.stages import STAGES

    plain = Pipeline(compose_recipe(REPO / "recipes" / recipe), STAGES).digests
    moved = Pipeline(compose_recipe(REPO / "recipes" / recipe, [
        *SLURM, "threads=4", "slurm.mem_gb=16", "slurm.timeout_min=10", "slurm.cpus_per_task=8",
        "+slurm.additional_parameters.account=x", "slurm.folder=/tmp/x"]), STAGES).digests
    assert moved == plain and len(plain) > 5


# ------------------------------------------------------------------------ the tiny recipe
def asrtrain(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return forked_cli.run(*args, timeout=timeout, check=True)


def _same_tree(local: Path, slurm: Path, sub: str, *, skip: tuple[str, ...] = ()) -> list[str]:
    """The files under ``sub`` of two exp dirs that differ (or are in one only), but for those
    named in ``skip``; tables that name their own exp dir (scps) are compared with that path
    replaced."""
    a, b = local / sub, slurm / sub
    names = {p.relative_to(a) for p in a.rglob("*") if p.is_file()} | \
            {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    assert names, f"nothing under {a} or {b}"
    differ = []
    for rel in sorted(names):
        if rel.name in skip or rel.parts[0] in skip:
            continue
        pa, pb = a / rel, b / rel
        if not (pa.is_file() and pb.is_file()):
            differ.append(f"{rel} (in one only)")
        elif not filecmp.cmp(pa, pb, shallow=False):
            ta, tb = pa.read_bytes(), pb.read_bytes()
            if ta.replace(str(local).encode(), b"EXP") != tb.replace(str(slurm).encode(), b"EXP"):
                differ.append(str(rel))
    return differ


@pytest.mark.timeout(900)
def test_features_stage_on_slurm_makes_the_same_bytes_and_cmd_reruns_nothing(slurm_cluster,
                                                                            tmp_path):
    local, slurm = tmp_path / "local", tmp_path / "slurm"
    asrtrain("run", "recipes/tiny", f"exp_dir={local}", "nj=2", "--to", "features")
    out = asrtrain("run", "recipes/tiny", f"exp_dir={slurm}", "nj=2", *SLURM,
                   "--to", "features")
    assert "submitted to SLURM" in out.stderr
    logs = list((slurm / "log" / "slurm").rglob("*_log.out"))
    assert logs, "no SLURM job logs: the features jobs did not go through SLURM"
    arks = sorted(p.name for p in (local / "feats").glob("*.ark"))
    assert any(a.startswith("raw_fbank") for a in arks) and \
        any(a.startswith("raw_mfcc") for a in arks)
    assert _same_tree(local, slurm, "feats") == []
    assert _same_tree(local, slurm, "data") == []
    # cmd, threads and slurm say where the work runs, not what it makes: nothing reruns
    again = asrtrain("run", "recipes/tiny", f"exp_dir={local}", "nj=2", *SLURM, "threads=2",
                     "slurm.mem_gb=2", "--to", "features")
    assert "nothing to do" in again.stderr and "starts" not in again.stderr, again.stderr


def align_small() -> list[str]:
    """The GMM passes small (recipes/tiny/small.yaml's, bench/small.py): mono and tri1, a few
    iterations, no decoding. Imported here, not at the top: a SLURM job of this module's
    functions imports the module without conftest, which puts bench/ on the path."""
    import small

    return small.overrides("tri1")


@pytest.mark.timeout(1800)
def test_align_stage_on_slurm_makes_the_same_alignments(slurm_cluster, tiny_tri1, tmp_path):
    """The session's local run of the small GMM passes (conftest's tiny_tri1) against the same
    align stage on SLURM, from a copy of its inputs (a moved exp dir: its tables are rewritten),
    so that only the align stage runs there (the features test checks the data stages' jobs).

    The copy keeps the local mono pass (its dir and its step record, ``align/mono/.done``, with
    the stage's generation): the stage resumes at tri1 as a run killed there would, so SLURM runs
    tri1's every job kind (tree statistics, iterations, realignment, final alignment) and the dev
    set's alignment, about half the job runs of the two passes, each an array of nj=2 tasks
    (each a fresh interpreter that imports torch) serving the 8 (train) or 5 (dev) blocks.
    Mono's own job kinds, the global mean and variance and the equal alignment (``setup_job``
    with moments only, ``iter_job`` with ``align="equal"``), therefore go through SLURM in no
    test; they are the same job functions, run by the same ``run_jobs``, as tri1's."""
    local, slurm = tiny_tri1, tmp_path / "slurm"
    stages = "stages=[prepare,lang,features,lm,mfcc,align]"    # tiny_tri1's
    # everything but the align stage's record and outputs; then its finished mono pass
    shutil.copytree(local, slurm, symlinks=True, ignore=shutil.ignore_patterns("align"))
    shutil.copytree(local / "align" / "mono", slurm / "align" / "mono", symlinks=True)
    assert not (slurm / ".done" / "align").exists()
    assert (slurm / "align" / "mono" / ".done").is_file()
    assert not (slurm / "log" / "slurm").exists(), "the local run left SLURM logs"
    # mono's files as copied (but the scps, which name the exp dir and are rewritten to its
    # new place): a mono pass trained again writes them anew
    mono = {p: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (slurm / "align" / "mono").iterdir() if p.suffix != ".scp"}
    assert {"final.mdl", "ali.ark", ".done"} <= {p.name for p in mono}
    out = asrtrain("run", "recipes/tiny", f"exp_dir={slurm}", "nj=2", stages, *align_small(),
                   *SLURM)
    assert re.findall(r"stage (\w+) +starts:", out.stderr) == ["align"], out.stderr[-3000:]
    assert "align mono: done already" in out.stderr, out.stderr[-3000:]
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in mono} == mono, \
        "the mono pass was trained again"
    align_logs = list((slurm / "log" / "slurm").rglob("*_log.out"))
    assert align_logs, ("the align stage ran no job through SLURM (its jobs do not go through "
                        f"asrtrain.jobs.run_jobs yet):\n{out.stderr[-3000:]}")
    # one SLURM log dir a job (an array): tri1's job kinds, the dev set's alignment, no mono's
    kinds = {re.sub(r"-\d+", "-N", p.parent.name) for p in align_logs}
    assert {"tri1-tree-statistics", "tri1-iter-N", "tri1-iter-N-align",
            "tri1-final-alignment"} <= kinds, kinds
    assert any(k.startswith("align-tri1-") for k in kinds), kinds
    assert not [k for k in kinds if "mono" in k], kinds
    # each job an array of nj tasks, as Kaldi's JOB=1:nj, not a task a block: a task serves
    # several blocks (each block's result its own file), and gives the same bytes (below)
    arrays = {}
    for script in (slurm / "log" / "slurm").rglob("*_submission.sh"):
        array = script.name.split("_")[0]
        size = re.search(r"#SBATCH --array=0-(\d+)%(\d+)\n", script.read_text())
        assert size, script.read_text()
        results = list(script.parent.glob(f"{array}_*_job*_result.pkl"))
        arrays[f"{script.parent.name}/{array}"] = (int(size[1]) + 1, int(size[2]), len(results))
    assert all(tasks == at_once == min(2, n) for tasks, at_once, n in arrays.values()), arrays
    iters = [n for k, (_, _, n) in arrays.items() if re.match(r"tri1-iter-\d+/", k)]
    assert iters and min(iters) > 2, arrays
    # the models, trees and alignments; not the timings (log.txt, passes.json) nor the step
    # keys (.done: each exp dir's stages have digests of their own generation)
    assert {"final.mdl", "tree.txt", "ali.ark"} <= {p.name for p in (slurm / "align").rglob("*")}
    assert _same_tree(local, slurm, "align", skip=("log", ".done", "log.txt", "passes.json")) \
        == []


@pytest.mark.timeout(1800)
def test_decode_gmm_searches_on_slurm_decode_as_locally(slurm_cluster, tiny_tri1, tmp_path):
    """decode_gmm's searches go through the job runner (Kaldi's decode.sh with its ``$cmd``):
    mono and tri1 of a copy of the session's tiny_tri1 decoded here, then the same decodes
    redone on SLURM from a copy of that run less its decodes (the graphs kept: the stage resumes
    as a run killed after them would, and mkgraph runs where the stage runs), give the same
    hypotheses and scores."""
    stages = "stages=[prepare,lang,features,lm,mfcc,align,decode_gmm]"
    args = ["run", "recipes/tiny", "nj=2", stages, *align_small(), "align.decode=true"]
    local, slurm = tmp_path / "local", tmp_path / "slurm"
    shutil.copytree(tiny_tri1, local, symlinks=True)
    out = asrtrain(*args, f"exp_dir={local}")
    assert re.findall(r"stage (\w+) +starts:", out.stderr) == ["decode_gmm"], out.stderr[-3000:]
    assert not (local / "log" / "slurm").exists()
    shutil.copytree(local, slurm, symlinks=True, ignore=shutil.ignore_patterns("decode"))
    for marker in [slurm / ".done" / "decode_gmm", *(slurm / "align").glob("*/.decoded")]:
        marker.unlink()
    out = asrtrain(*args, f"exp_dir={slurm}", *SLURM)
    assert re.findall(r"stage (\w+) +starts:", out.stderr) == ["decode_gmm"], out.stderr[-3000:]
    assert "submitted to SLURM" in out.stderr, out.stderr[-3000:]
    # one array a search, named for its pass and set; the graphs were not made again
    searched = {re.sub(r"-\d+-jobs?$", "", p.parent.name)
                for p in (slurm / "log" / "slurm").rglob("*_log.out")}
    assert searched == {"decode-mono-eval2000", "decode-tri1-eval2000"}, searched
    for name in ("mono", "tri1"):
        assert f"decode_gmm {name} graph: done already" in out.stderr, out.stderr[-3000:]
    for name in ("mono", "tri1"):
        assert (slurm / "decode" / name / "eval2000" / "score" / "result.json").is_file(), name
    # the hypotheses, the ctm and every score file; not the timings (decode.json) nor when each
    # result was recorded (result.json: the same counts, below)
    assert _same_tree(local, slurm, "decode", skip=("decode.json", "result.json")) == []
    for name in ("mono", "tri1"):
        recorded = [json.loads((exp / "decode" / name / "eval2000" / "score" / "result.json")
                               .read_text()) for exp in (local, slurm)]
        assert [r["wer"] for r in recorded] == [recorded[0]["wer"]] * 2, recorded
