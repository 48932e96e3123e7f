"""``cmd: slurm``: a stage's jobs as one SLURM job array, submitted with submitit (as Kaldi's
``slurm.pl``; submitit is what Hydra's SLURM launcher uses).

The array has ``min(nj, len(args))`` tasks, as Kaldi's ``JOB=1:nj``: task ``j`` (0-based) serves
the arguments ``j, j + nj, j + 2·nj, ...`` one after another, in one interpreter, as a local
:class:`asrtrain.jobs.JobPool` worker serves several blocks (a task's start, a fresh interpreter
importing torch, is paid ``nj`` times a call, not once per argument).  Each call is the same
picklable callable :func:`asrtrain.jobs.run_jobs` runs locally; each result is written to a file
of its own, ``<task id>_job<k>_result.pkl`` (``k``: the argument's 1-based index), under a
temporary name and then renamed, as soon as it is made (:class:`ArrayTask`).  The tasks run the
submitting interpreter (``sys.executable``, so the same virtual environment) on a node, with the
submitting environment (``sbatch``'s default ``--export=ALL``).  submitit keeps its pickles and
the tasks' logs in ``slurm.folder`` or ``exp/log/slurm/<desc>/``; a task's log marks where each
of its jobs starts.  The parent polls the queue every ``slurm.poll_s`` seconds: results come
back in the order of the arguments, each as soon as it and those before it are done
(:func:`iter_slurm_jobs`; a result that comes early waits in its file, so the caller holds one
at a time); the first job that fails cancels the others and raises an error naming the job (its
argument's index), its array task's SLURM id, the task's logs and the end of its traceback (which
the task writes to ``<task id>_job<k>_failed.txt`` before it stops);
Ctrl-C cancels them all (``scancel``).  A task's state comes from submitit's watcher (``sacct``)
and from ``squeue``, so clusters without accounting work too.  When every unfinished task has
stayed PENDING, none running, for ``slurm.pending_timeout_s`` (a task the cluster can never
start: too many CPUs for its nodes, a partition down...), the tasks are cancelled and the error
gives squeue's reasons; without that option the wait goes on, with a warning after
:data:`PENDING_WARN_S`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from asrtrain import AsrtrainError
from asrtrain.logs import plural

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


def make_executor(jobs: JobConfig, desc: str, n_tasks: int):
    """A submitit executor for an array of ``n_tasks`` tasks, all at once, with the recipe's
    ``slurm:`` options."""
    import submitit

    s = jobs.slurm
    executor = submitit.AutoExecutor(folder=job_folder(jobs, desc), cluster="slurm")
    params: dict[str, Any] = {
        "name": f"asrtrain-{slug(desc)}", "timeout_min": int(s.timeout_min),
        "mem_gb": s.mem_gb, "cpus_per_task": int(s.cpus_per_task or jobs.threads),
        "nodes": 1, "tasks_per_node": 1,
        "slurm_array_parallelism": max(1, min(jobs.nj, n_tasks)),
    }
    if s.partition:
        params["slurm_partition"] = str(s.partition)
    if s.additional_parameters:
        params["slurm_additional_parameters"] = dict(s.additional_parameters)
    executor.update_parameters(**params)
    return executor


def task_args(n: int, nj: int) -> list[list[int]]:
    """The argument indices each array task serves: ``min(nj, n)`` tasks, task ``j`` the
    indices ``j, j + nj, j + 2·nj, ...`` below ``n`` (Kaldi's ``JOB=1:nj`` over the blocks)."""
    m = max(1, min(int(nj), n))
    return [list(range(j, n, m)) for j in range(m)]


def result_file(folder: Path | str, task_id: str, i: int) -> Path:
    """Where array task ``task_id`` (``"123_4"``) writes the result of argument ``i``."""
    return Path(folder) / f"{task_id}_job{i + 1}_result.pkl"


def failure_file(folder: Path | str, task_id: str, i: int) -> Path:
    """Where array task ``task_id`` writes the traceback of argument ``i``'s job when it fails."""
    return Path(folder) / f"{task_id}_job{i + 1}_failed.txt"


class JobFailed(Exception):
    """Raised by an array task, from the exception of one of its jobs (its cause), after it
    wrote the job's traceback to the job's :func:`failure_file`, where the parent reads it."""

    def __init__(self, i: int, n: int) -> None:
        super().__init__(f"this array task stopped at its failed job: job {i + 1} of {n}")
        self.i = i


class ArrayTask:
    """One array task's work: ``fn`` called on each of its ``(index, argument)`` pairs in turn,
    each result written to its own file (:func:`result_file`, in the task's submitit folder)
    under a temporary name, then renamed, so that the parent never reads a half-written result
    and holds one at a time.  A job that raises has its traceback written to its
    :func:`failure_file` (the same way) and ends the task with :class:`JobFailed`, caused by the
    job's exception: submitit records the whole traceback and SLURM the task as FAILED."""

    def __init__(self, fn: Callable[[Any], Any], n: int, desc: str) -> None:
        self.fn, self.n, self.desc = fn, n, desc

    def __call__(self, items: list[tuple[int, Any]]) -> int:
        import submitit
        from submitit.core.utils import cloudpickle_dump

        env = submitit.JobEnvironment()
        for i, arg in items:
            mark = f"--- {self.desc}: job {i + 1} of {self.n} (SLURM job {env.job_id})"
            print(mark, flush=True)
            print(mark, file=sys.stderr, flush=True)
            path = result_file(env.paths.folder, env.job_id, i)
            tmp = path.with_name(path.name + ".tmp")
            try:
                cloudpickle_dump(self.fn(arg), tmp)
            except Exception as e:
                tmp.unlink(missing_ok=True)   # a result that could not be pickled
                failed = failure_file(env.paths.folder, env.job_id, i)
                failed_tmp = failed.with_name(failed.name + ".tmp")
                failed_tmp.write_text(traceback.format_exc())
                os.replace(failed_tmp, failed)
                raise JobFailed(i, self.n) from e
            os.replace(tmp, path)
        return len(items)


def run_slurm_jobs(fn: Callable[[Any], Any], args: Sequence[Any], jobs: JobConfig,
                   desc: str) -> list:
    """``[fn(a) for a in args]`` as one SLURM job array of at most ``jobs.nj`` tasks; results in
    the order of ``args``.  See the module docstring."""
    return list(iter_slurm_jobs(fn, args, jobs, desc))


def iter_slurm_jobs(fn: Callable[[Any], Any], args: Sequence[Any], jobs: JobConfig,
                    desc: str) -> Iterator:
    """:func:`run_slurm_jobs`'s results one at a time, in the order of ``args``, each as soon as
    it and those before it are done; a result that comes early stays on disk (its file) until
    its turn, so the caller holds one result at a time however many jobs finish ahead of it
    (the align stage's per-block statistics: :class:`asrtrain.align.passes.PassJobs`)."""
    if shutil.which("sbatch") is None:
        raise AsrtrainError("cmd=slurm but sbatch is not on PATH: install SLURM or use cmd=local")
    args = list(args)
    if not args:
        return
    groups = task_args(len(args), jobs.nj)
    executor = make_executor(jobs, desc, len(groups))
    try:
        submitted = executor.map_array(ArrayTask(fn, len(args), desc),
                                       [[(i, args[i]) for i in g] for g in groups])
    except Exception as e:   # submitit's FailedSubmissionError: sbatch's own message
        raise AsrtrainError(f"{desc}: sbatch refused the array of {plural(len(groups), 'task')} "
                            f"for {plural(len(args), 'job')} (folder {job_folder(jobs, desc)}): "
                            f"{e}") from e
    log.info("%s: %s submitted to SLURM as array %s of %s (task j serves jobs j+1, j+1+%d, "
             "...; logs in %s)", desc, plural(len(args), "job"), submitted[0].job_id.split("_")[0],
             plural(len(groups), "task"), len(groups), job_folder(jobs, desc))
    finished = False
    try:
        timeout = jobs.slurm.pending_timeout_s
        yield from _collect(submitted, groups, desc, float(jobs.slurm.poll_s),
                            None if timeout is None else float(timeout))
        finished = True
    finally:
        if not finished:   # an error, Ctrl-C, or the caller stopped reading: none left running
            _cancel(submitted)


def _collect(submitted: list, groups: list[list[int]], desc: str, poll_s: float,
             pending_timeout_s: float | None = None) -> Iterator:
    """Wait for the array's tasks (``groups[t]``: the argument indices task ``t`` serves), a
    progress bar over the finished jobs; yield the results in order, each once it and those
    before it are done, read from its file at its turn (so at most one result is in memory).
    A task that fails (its result pickle, a traceback) stops the run at once, whichever job's
    turn it is.  An error when all the unfinished tasks stay PENDING for ``pending_timeout_s``
    (None: no limit)."""
    from submitit.core.utils import pickle_load

    n = sum(len(g) for g in groups)
    task_of = {i: t for t, g in enumerate(groups) for i in g}
    files = {i: result_file(submitted[t].paths.folder, submitted[t].job_id, i)
             for i, t in task_of.items()}
    done: set[int] = set()          # a result file, not yet given out
    nxt = 0
    pending = set(range(n))         # jobs without a result file
    gone_since: dict[int, float] = {}
    stalled_since, warned = time.time(), False

    def first_pending(t: int) -> int:
        return min((i for i in groups[t] if i in pending), default=groups[t][-1])

    def failed_job(t: int, task_traceback: str) -> tuple[int, str]:
        """The job of failed task ``t`` that failed, and its own traceback (its failure file);
        the task's first unfinished job and the task's traceback when it failed outside its
        jobs (its start, say)."""
        folder, task_id = submitted[t].paths.folder, submitted[t].job_id
        for i in groups[t]:
            path = failure_file(folder, task_id, i)
            if path.exists():
                return i, path.read_text(errors="replace")
        return first_pending(t), task_traceback

    with tqdm(total=n, desc=desc, unit="job", file=sys.stderr, disable=None, leave=False) as bar:
        while nxt < n:
            before = len(pending)
            for i in sorted(pending):
                if files[i].exists():
                    pending.discard(i)
                    done.add(i)
                    bar.update()
            while nxt in done:
                done.discard(nxt)
                result = _load(pickle_load, files[nxt])
                nxt += 1
                yield result
            if not pending:
                continue
            open_tasks = sorted({task_of[i] for i in pending})
            for t in open_tasks:   # a task's own pickle: its failure, or its end
                path = submitted[t].paths.result_pickle
                if path.exists():
                    outcome, v = _load(pickle_load, path)
                    if outcome != "success":
                        i, tb = failed_job(t, str(v))
                        raise AsrtrainError(_failure(desc, i, n, submitted[t], groups[t],
                                                     "failed", tb))
            states = _queue_states(submitted[0].job_id.split("_")[0])
            now = time.time()
            if len(pending) < before or any(
                    _state(submitted[t], states) != "PENDING" for t in open_tasks):
                stalled_since, warned = now, False
            waited = now - stalled_since
            if pending_timeout_s is not None and waited > pending_timeout_s:
                raise AsrtrainError(
                    f"{desc}: none of the {len(open_tasks)} unfinished SLURM jobs (array "
                    f"{submitted[0].job_id.split('_')[0]}) started in {waited:.0f} s "
                    f"(slurm.pending_timeout_s={pending_timeout_s:g}): "
                    f"{_pending_reasons(submitted, open_tasks, states)}. The cluster cannot "
                    f"run them as asked (sinfo: nodes down? cpus_per_task or mem_gb more than a "
                    f"node has? the partition?) or is busy: raise slurm.pending_timeout_s to wait "
                    f"longer; the jobs were cancelled")
            if waited > PENDING_WARN_S and not warned:
                warned = True
                log.warning("%s: none of the %d unfinished SLURM jobs started in %.0f s: %s",
                            desc, len(open_tasks), waited,
                            _pending_reasons(submitted, open_tasks, states))
            for t in open_tasks:
                state = _state(submitted[t], states)
                if state in UNFINISHED and not submitted[t].paths.result_pickle.exists():
                    gone_since.pop(t, None)
                elif now - gone_since.setdefault(t, now) > RESULT_GRACE_S:
                    raise AsrtrainError(_failure(
                        desc, first_pending(t), n, submitted[t], groups[t],
                        f"ended without a result (SLURM state {state}: killed, out of memory "
                        f"or time, or the node failed)", _tail(submitted[t].paths.stderr)))
            time.sleep(poll_s)


def _load(pickle_load: Callable, path: Path) -> tuple[str, Any]:
    """A pickle, read again once when caught half-written."""
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


def _pending_reasons(submitted: list, tasks: list[int], states: dict) -> str:
    """``PENDING (reason PartitionConfig: 150_0, 150_1)``: squeue's reasons for the tasks."""
    by_reason: dict[str, list[str]] = {}
    for t in tasks:
        job_id = submitted[t].job_id
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


def _failure(desc: str, i: int, n: int, task: Any, serves: list[int], what: str,
             detail: str) -> str:
    """The error of a failed job: which one, its array task's SLURM id, the end of its
    traceback (or of the task's stderr), where the task's logs are and which jobs they hold."""
    lines = [ln for ln in detail.strip().splitlines() if ln.strip()][-TAIL_LINES:]
    held = ", ".join(str(k + 1) for k in serves[:8]) + (", ..." if len(serves) > 8 else "")
    return (f"{desc}: job {i + 1} of {n} (SLURM job {task.job_id}) {what}"
            + (f": {lines[-1].strip()}" if lines else "")
            + "".join(f"\n    {ln}" for ln in lines)
            + f"\n  its logs (jobs {held}): {task.paths.stdout}"
            + f"\n            {task.paths.stderr}")


def _cancel(submitted: list) -> None:
    """``scancel`` the tasks that have not finished (a failure elsewhere, or Ctrl-C)."""
    todo = [j for j in submitted if not j.paths.result_pickle.exists()]
    for job in todo:
        job.cancel(check=False)
    if todo:
        log.warning("cancelled %d SLURM jobs (%s)", len(todo),
                    ", ".join(j.job_id for j in todo[:5]) + (", ..." if len(todo) > 5 else ""))
