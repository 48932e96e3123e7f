"""The job runner (asrtrain.jobs): results in order, errors that name the job, threads per job,
whole speakers per split."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from asrtrain import AsrtrainError
from asrtrain.jobs import (
    JobConfig,
    JobPool,
    SlurmOptions,
    run_jobs,
    set_threads,
    split_by_speaker,
)


def _square_and_pid(x: int) -> tuple[int, int, int]:
    return x * x, os.getpid(), torch.get_num_threads()


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is not allowed")
    return x


def _die_on_two(x: int) -> int:
    if x == 2:
        os._exit(9)   # a job killed from outside looks the same to the pool
    return x


@pytest.mark.timeout(120)
def test_local_jobs_run_in_processes_in_order_with_their_threads():
    out = run_jobs(_square_and_pid, list(range(7)), JobConfig(nj=3, threads=1), "squares")
    assert [r[0] for r in out] == [x * x for x in range(7)]
    assert os.getpid() not in {r[1] for r in out}
    assert {r[2] for r in out} == {1}
    two = run_jobs(_square_and_pid, [1, 2], JobConfig(nj=2, threads=2), "two threads")
    assert {r[2] for r in two} == {2}


@pytest.mark.timeout(120)
def test_a_pool_is_kept_across_calls_and_ended_by_a_failure():
    """A JobPool (a GMM pass's) starts its processes once for many calls: the same worker
    pids answer every call; a failing job ends the pool (error named as without one) and the
    next call starts a new one; the pool's end leaves no worker behind."""
    jobs = JobConfig(nj=2, threads=1)
    with JobPool(jobs) as pool:
        pids = set()
        for k in range(4):
            out = run_jobs(_square_and_pid, [k, k + 1, k + 2], jobs, f"call {k}", pool=pool)
            assert [r[0] for r in out] == [x * x for x in (k, k + 1, k + 2)]
            pids |= {r[1] for r in out}
        assert pool.started == 1 and len(pids) <= 2 and os.getpid() not in pids
        with pytest.raises(AsrtrainError, match=r"call 5: job 2 of 3 failed: ValueError"):
            run_jobs(_fail_on_three, [1, 3, 4], jobs, "call 5", pool=pool)
        out = run_jobs(_square_and_pid, [5, 6], jobs, "call 6", pool=pool)
        assert [r[0] for r in out] == [25, 36] and pool.started == 2
        assert not pids & {r[1] for r in out}   # new processes
        workers = list(pool.executor()._processes.values())
    assert workers and all(not w.is_alive() for w in workers)


def test_one_job_runs_here():
    out = run_jobs(_square_and_pid, [4], JobConfig(nj=4), "one")
    assert out[0][:2] == (16, os.getpid())


@pytest.mark.timeout(120)
def test_a_failing_job_is_named():
    with pytest.raises(AsrtrainError, match=r"counting: job 4 of 5 failed: ValueError: three"):
        run_jobs(_fail_on_three, list(range(5)), JobConfig(nj=2), "counting")


@pytest.mark.timeout(120)
def test_a_dying_job_is_an_error_not_a_hang():
    with pytest.raises(AsrtrainError, match=r"dying: a job process died"):
        run_jobs(_die_on_two, list(range(4)), JobConfig(nj=2), "dying")


def test_config_errors():
    with pytest.raises(AsrtrainError, match="cmd='qsub'"):
        JobConfig(cmd="qsub")
    with pytest.raises(AsrtrainError, match="nj=0"):
        JobConfig(nj=0)
    with pytest.raises(AsrtrainError, match=r"unknown slurm option\(s\) \['queue'\]"):
        SlurmOptions.from_config({"queue": "x"})
    c = JobConfig.from_config({"nj": 3, "cmd": "slurm", "threads": 2,
                               "slurm": {"partition": "debug", "mem_gb": 2}})
    assert (c.nj, c.cmd, c.threads, c.slurm.partition, c.slurm.mem_gb) == (3, "slurm", 2,
                                                                           "debug", 2)


def test_set_threads_sets_torch_and_the_environment():
    before = torch.get_num_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    finally:
        torch.set_num_threads(before)


def test_set_threads_before_torch_is_loaded_reaches_torch_when_it_is():
    """A stage's process sets its threads before it knows whether it needs torch: set_threads
    does not import it (a light stage's process would spend most of its time on that), and
    torch, imported afterwards, runs at that count: 1, where its default is a thread a core
    (torch takes OMP_NUM_THREADS up to the cores, so a count above them is capped there)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: torch's default is already one thread, nothing to tell apart")
    code = ("import sys; from asrtrain.jobs import set_threads; set_threads(1); "
            "assert 'torch' not in sys.modules; import torch; print(torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    assert out.stdout.split() == ["1"], out.stderr


def test_split_by_speaker_keeps_speakers_whole_and_balances_frames():
    spk2utt = {"a": ["a1", "a2"], "b": ["b1"], "c": ["c1", "c2", "c3"], "d": ["d1"]}
    frames = {"a1": 100, "a2": 100, "b1": 300, "c1": 50, "c2": 50, "c3": 50, "d1": 10}
    parts = split_by_speaker(spk2utt, 2, frames)
    assert sorted(u for p in parts for u in p) == sorted(frames)
    spk_of = {u: s for s, us in spk2utt.items() for u in us}
    for s in spk2utt:   # every speaker in exactly one part
        assert sum(any(spk_of[u] == s for u in p) for p in parts) == 1
    loads = sorted(sum(frames[u] for u in p) for p in parts)
    assert loads == [310, 350]   # largest first to the lightest part: b+d, a+c
    assert split_by_speaker(spk2utt, 2, frames) == parts            # the same every time
    assert len(split_by_speaker(spk2utt, 10)) == 4                   # at most one per speaker
    assert split_by_speaker(spk2utt, 1) == [sorted(frames)]


_AFTER_THREADS = """
import torch
from asrtrain.jobs import JobConfig, JobPool, run_jobs, set_threads
import jobs_threaded
set_threads(2)
a = torch.randn(1500, 1500)
for _ in range(5):
    a = torch.tanh(a @ a)            # the parent's OpenMP pool now has running threads
with JobPool(JobConfig(nj=2, threads=2)) as pool:
    for call in range(2):
        out = run_jobs(jobs_threaded.work, [1, 2, 3], JobConfig(nj=2, threads=2), "matmuls",
                       pool=pool)
        assert [o[0] for o in out] == [1, 2, 3] and all(o[1] == 2 for o in out), out
print("ok", pool.started)
"""

_THREADED_JOB = """
import torch

def work(x):
    a = torch.randn(1500, 1500)
    for _ in range(5):
        a = torch.tanh(a @ a)        # a parallel region of the job's own, 2 threads
    return x, torch.get_num_threads()
"""


@pytest.mark.timeout(300)
def test_jobs_of_several_threads_after_the_parent_ran_threads_do_not_hang(tmp_path):
    """GNU OpenMP is not fork-safe: a job forked after the parent ran a parallel region hangs in
    its first parallel region of more than one thread (threads=2 nj=2 hung the align stage).
    Such jobs start from a fork server; this run hangs (killed at the guard) with fork."""
    import subprocess
    import sys

    (tmp_path / "jobs_threaded.py").write_text(_THREADED_JOB)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, "-c", _AFTER_THREADS], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["ok", "1"]
