"""``cmd: slurm``: a stage's jobs as one SLURM job array, submitted with submitit (as Kaldi's
``slurm.pl``; submitit is what Hydra's SLURM launcher uses).

Each job is the same picklable callable :func:`asrtrain.jobs.run_jobs` runs locally, run by the
submitting interpreter (``sys.executable``, so the same virtual environment) on a node, with the
submitting environment (``sbatch``'s default ``--export=ALL``).  submitit keeps its pickles and
the jobs' logs in ``slurm.folder`` or ``exp/log/slurm/<desc>/``.  The parent polls the queue
every ``slurm.poll_s`` seconds: results come back in the order of the arguments, each as soon as
it and those before it are done (:func:`iter_slurm_jobs`; a large result that comes early waits in
its pickle, so the caller holds one at a time); the first job
that fails cancels the others and raises an error with its SLURM id, its logs and the end of its
traceback; Ctrl-C cancels them all (``scancel``).  A job's state comes from submitit's watcher
(``sacct``) and from ``squeue``, so clusters without accounting work too.  When every unfinished
job has stayed PENDING, none running, for ``slurm.pending_timeout_s`` (a job the cluster can never
start: too many CPUs for its nodes, a partition down...), the jobs are cancelled and the error
gives squeue's reasons; without that option the wait goes on, with a warning after
:data:`PENDING_WARN_S`.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from asrtrain import AsrtrainError

if TYPE_CHECKING:  # annotations only: asrtrain.jobs imports this module
    from asrtrain.jobs import JobConfig

log = logging.getLogger(__name__)

#: SLURM states of a job that has not finished (submitit's list, with squeue's spellings).
UNFINISHED = {"READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED",
              "CONFIGURING", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "STAGE_OUT",
              "SIGNALING"}
#: How long a finished job's result pickle may take to appear (a shared file system's cache).
RESULT_GRACE_S = 30.0
#: Lines of a failed job's traceback or stderr quoted in the error.
TAIL_LINES = 12
#: Seconds all unfinished jobs may stay PENDING, none running, before a warning with the reasons.
PENDING_WARN_S = 120.0


def slug(desc: str) -> str:
    """A folder name for ``desc`` (``"fbank jobs"`` -> ``fbank-jobs``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", desc).strip("-") or "jobs"


def job_folder(jobs: JobConfig, desc: str) -> Path:
    """Where submitit writes this call's pickles and logs: ``slurm.folder`` or
    ``<log_dir>/<desc>`` (``exp/log/slurm/<desc>``), a folder per call's ``desc``."""
    base = Path(jobs.slurm.folder) if jobs.slurm.folder else jobs.log_dir
    if base is None:
        base = Path("exp") / "log" / "slurm"
    return base.resolve() / slug(desc)


def make_executor(jobs: JobConfig, desc: str, n_jobs: int):
    """A submitit executor for ``n_jobs`` array jobs with the recipe's ``slurm:`` options."""
    import submitit

    s = jobs.slurm
    executor = submitit.AutoExecutor(folder=job_folder(jobs, desc), cluster="slurm")
    params: dict[str, Any] = {
        "name": f"asrtrain-{slug(desc)}", "timeout_min": int(s.timeout_min),
        "mem_gb": s.mem_gb, "cpus_per_task": int(s.cpus_per_task or jobs.threads),
        "nodes": 1, "tasks_per_node": 1,
        "slurm_array_parallelism": max(1, min(jobs.nj, n_jobs)),
    }
    if s.partition:
        params["slurm_partition"] = str(s.partition)
    if s.additional_parameters:
        params["slurm_additional_parameters"] = dict(s.additional_parameters)
    executor.update_parameters(**params)
    return executor


def run_slurm_jobs(fn: Callable[[Any], Any], args: Sequence[Any], jobs: JobConfig,
                   desc: str) -> list:
    """``[fn(a) for a in args]`` as one SLURM job array, at most ``jobs.nj`` running at once;
    results in the order of ``args``.  See the module docstring."""
    return list(iter_slurm_jobs(fn, args, jobs, desc))


def iter_slurm_jobs(fn: Callable[[Any], Any], args: Sequence[Any], jobs: JobConfig,
                    desc: str) -> Iterator:
    """:func:`run_slurm_jobs`'s results one at a time, in the order of ``args``, each as soon as
    it and those before it are done; a result that comes early stays on disk (its pickle) until
    its turn, so the caller holds one result at a time however many jobs finish ahead of it
    (the align stage's per-block statistics: :class:`asrtrain.align.passes.PassJobs`)."""
    if shutil.which("sbatch") is None:
        raise AsrtrainError("cmd=slurm but sbatch is not on PATH: install SLURM or use cmd=local")
    args = list(args)
    if not args:
        return
    executor = make_executor(jobs, desc, len(args))
    try:
        submitted = executor.map_array(fn, args)
    except Exception as e:   # submitit's FailedSubmissionError: sbatch's own message
        raise AsrtrainError(f"{desc}: sbatch refused the {len(args)} jobs (folder "
                            f"{job_folder(jobs, desc)}): {e}") from e
    log.info("%s: %d jobs submitted to SLURM as array %s (at most %d at once; logs in %s)",
             desc, len(args), submitted[0].job_id.split("_")[0], min(jobs.nj, len(args)),
             job_folder(jobs, desc))
    finished = False
    try:
        timeout = jobs.slurm.pending_timeout_s
        yield from _collect(submitted, desc, float(jobs.slurm.poll_s),
                            None if timeout is None else float(timeout))
        finished = True
    finally:
        if not finished:   # an error, Ctrl-C, or the caller stopped reading: none left running
            _cancel(submitted)


#: A finished job's result pickle up to this size is read as soon as it is there, ahead of its
#: turn (a failure is a short traceback: the run stops at once); a larger one waits on disk.
PEEK_BYTES = 1 << 20


def _collect(submitted: list, desc: str, poll_s: float,
             pending_timeout_s: float | None = None) -> Iterator:
    """Wait for the jobs, a progress bar over the finished ones; yield the results in order,
    each once it and those before it are done.  A result that finishes ahead of its turn is
    read then only when its pickle is small (:data:`PEEK_BYTES`: a failure stops the run at
    once); a large one is read at its turn, so at most one large result is in memory.  An error
    when all the unfinished jobs stay PENDING for ``pending_timeout_s`` (None: no limit)."""
    from submitit.core.utils import pickle_load

    n = len(submitted)
    early: dict[int, Any] = {}      # small results read ahead of their turn
    done: set[int] = set()          # finished (a result pickle), not yet given out
    nxt = 0
    pending = set(range(n))
    gone_since: dict[int, float] = {}
    stalled_since, warned = time.time(), False

    def value(i: int) -> Any:
        outcome, v = _load(pickle_load, submitted[i].paths.result_pickle)
        if outcome != "success":
            raise AsrtrainError(_failure(desc, i, n, submitted[i], "failed", str(v)))
        return v

    with tqdm(total=n, desc=desc, unit="job", file=sys.stderr, disable=None, leave=False) as bar:
        while nxt < n:
            before = len(pending)
            for i in sorted(pending):
                path = submitted[i].paths.result_pickle
                if path.exists():
                    if i != nxt and path.stat().st_size <= PEEK_BYTES:
                        early[i] = value(i)
                    pending.discard(i)
                    done.add(i)
                    bar.update()
            while nxt in done:
                done.discard(nxt)
                result = early.pop(nxt) if nxt in early else value(nxt)
                nxt += 1
                yield result
            if not pending:
                continue
            states = _queue_states(submitted[0].job_id.split("_")[0])
            now = time.time()
            if len(pending) < before or any(
                    _state(submitted[i], states) != "PENDING" for i in pending):
                stalled_since, warned = now, False
            waited = now - stalled_since
            if pending_timeout_s is not None and waited > pending_timeout_s:
                raise AsrtrainError(
                    f"{desc}: none of the {len(pending)} unfinished SLURM jobs (array "
                    f"{submitted[0].job_id.split('_')[0]}) started in {waited:.0f} s "
                    f"(slurm.pending_timeout_s={pending_timeout_s:g}): "
                    f"{_pending_reasons(submitted, pending, states)}. The cluster cannot run "
                    f"them as asked (sinfo: nodes down? cpus_per_task or mem_gb more than a "
                    f"node has? the partition?) or is busy: raise slurm.pending_timeout_s to wait "
                    f"longer; the jobs were cancelled")
            if waited > PENDING_WARN_S and not warned:
                warned = True
                log.warning("%s: none of the %d unfinished SLURM jobs started in %.0f s: %s",
                            desc, len(pending), waited,
                            _pending_reasons(submitted, pending, states))
            for i in sorted(pending):
                state = _state(submitted[i], states)
                if state in UNFINISHED:
                    gone_since.pop(i, None)
                elif now - gone_since.setdefault(i, now) > RESULT_GRACE_S:
                    raise AsrtrainError(_failure(
                        desc, i, n, submitted[i], f"ended without a result (SLURM state "
                        f"{state}: killed, out of memory or time, or the node failed)",
                        _tail(submitted[i].paths.stderr)))
            time.sleep(poll_s)


def _load(pickle_load: Callable, path: Path) -> tuple[str, Any]:
    """A result pickle, read again once when caught half-written."""
    try:
        return pickle_load(path)
    except EOFError:
        time.sleep(2)
        return pickle_load(path)


def _queue_states(array_id: str) -> dict[str, tuple[str, str]]:
    """``squeue``'s state and reason of each job of the array (``"123_4": ("PENDING",
    "Resources")``); finished jobs stay listed for the cluster's ``MinJobAge``, then leave;
    ``{"*": ("UNKNOWN", ...)}`` when squeue cannot answer."""
    try:
        lines = subprocess.run(["squeue", "-h", "-r", "--states=all", "-j", array_id,
                                "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=60,
                               check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("squeue -j %s: %s; SLURM states may lag", array_id, e)
        return {"*": ("UNKNOWN", "squeue failed")}
    states = {}
    for line in lines:
        parts = line.strip().split("|")
        if len(parts) >= 2:
            states[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return states


def _pending_reasons(submitted: list, pending: set[int], states: dict) -> str:
    """``PENDING (reason PartitionConfig: 150_0, 150_1)``: squeue's reasons for the jobs."""
    by_reason: dict[str, list[str]] = {}
    for i in sorted(pending):
        job_id = submitted[i].job_id
        reason = states.get(job_id, ("", "not in squeue"))[1] or "none given"
        by_reason.setdefault(reason, []).append(job_id)
    return "; ".join(f"PENDING (reason {r}: " + ", ".join(ids[:5])
                     + (", ..." if len(ids) > 5 else "") + ")" for r, ids in by_reason.items())


def _state(job: Any, states: dict[str, tuple[str, str]]) -> str:
    """One job's state: squeue's, else submitit's (``sacct``), else GONE (in neither)."""
    if job.job_id in states:
        return states[job.job_id][0].upper()
    if "*" in states:
        return "UNKNOWN"
    state = str(job.state).upper().split()[0] if job.state else "UNKNOWN"
    return "GONE" if state == "UNKNOWN" else state


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path.name})"


def _failure(desc: str, i: int, n: int, job: Any, what: str, detail: str) -> str:
    """The error of a failed job: which one, its SLURM id, the end of its traceback (or of its
    stderr), where its logs are."""
    lines = [ln for ln in detail.strip().splitlines() if ln.strip()][-TAIL_LINES:]
    return (f"{desc}: job {i + 1} of {n} (SLURM job {job.job_id}) {what}"
            + (f": {lines[-1].strip()}" if lines else "")
            + "".join(f"\n    {ln}" for ln in lines)
            + f"\n  its logs: {job.paths.stdout}\n            {job.paths.stderr}")


def _cancel(submitted: list) -> None:
    """``scancel`` the jobs that have not finished (a failure elsewhere, or Ctrl-C)."""
    todo = [j for j in submitted if not j.paths.result_pickle.exists()]
    for job in todo:
        job.cancel(check=False)
    if todo:
        log.warning("cancelled %d SLURM jobs (%s)", len(todo),
                    ", ".join(j.job_id for j in todo[:5]) + (", ..." if len(todo) > 5 else ""))
