"""Where a stage's parallel jobs run, as Kaldi's ``run.pl`` / ``slurm.pl`` (``cmd``): a pool of
processes on this machine (``cmd: local``, the default) or a SLURM cluster (``cmd: slurm``).

A job is a module-level function and one picklable argument; it reads its own part of the data
from disk (a split of a data dir, :func:`split_by_speaker`), does its work, and returns what the
parent needs (statistics, counts, a few paths): never the corpus.  :func:`run_jobs` runs the same
functions whichever ``cmd``, so results do not depend on where they ran.  Every job first sets
its thread counts (torch and the BLAS libraries) to ``threads`` (one by default: ``nj`` jobs of
one thread fill ``nj`` cores); :func:`set_threads` does the same for a stage's own process.

The recipe's keys: ``nj`` (jobs at once), ``cmd`` (``local`` | ``slurm``), ``threads`` (per job
and per stage process), ``slurm:`` (partition, memory, time limit, extra sbatch options: see
:class:`SlurmOptions`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from asrtrain import AsrtrainError
from asrtrain.progress import Bar

log = logging.getLogger(__name__)

_A = TypeVar("_A")
_R = TypeVar("_R")

CMDS = ("local", "slurm")


@dataclass
class SlurmOptions:
    """``slurm:`` of a recipe: what each job asks the cluster for (``sbatch`` options)."""

    partition: str | None = None
    mem_gb: float = 4.0                  # per job
    timeout_min: int = 24 * 60
    cpus_per_task: int | None = None     # default: the job's ``threads``
    folder: str | None = None            # submitit's logs and pickles; default exp/log/slurm
    additional_parameters: dict = field(default_factory=dict)   # any other sbatch option
    poll_s: float = 2.0                  # how often the parent looks at the queue
    pending_timeout_s: float | None = None   # error when none of the jobs starts for this long

    @classmethod
    def from_config(cls, cfg: Mapping | None) -> SlurmOptions:
        values = dict(cfg or {})
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise AsrtrainError(f"unknown slurm option(s) {unknown}; known: "
                                f"{sorted(cls.__dataclass_fields__)}")
        if "additional_parameters" in values:
            values["additional_parameters"] = dict(values["additional_parameters"] or {})
        return cls(**values)


@dataclass
class JobConfig:
    """How a stage runs its jobs: ``nj`` at once, ``cmd`` where, ``threads`` each."""

    nj: int = 1
    cmd: str = "local"
    threads: int = 1
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    log_dir: Path | None = None          # where ``cmd: slurm`` keeps its files (exp/log/slurm)

    def __post_init__(self) -> None:
        if self.cmd not in CMDS:
            raise AsrtrainError(f"cmd={self.cmd!r}: expected one of {list(CMDS)}")
        if int(self.nj) < 1 or int(self.threads) < 1:
            raise AsrtrainError(f"nj={self.nj}, threads={self.threads}: both must be >= 1")
        self.nj, self.threads = int(self.nj), int(self.threads)

    @classmethod
    def from_config(cls, cfg: Mapping, log_dir: Path | None = None) -> JobConfig:
        """From a recipe's top-level ``nj``, ``cmd``, ``threads``, ``slurm``."""
        return cls(nj=int(cfg.get("nj", 1) or 1), cmd=str(cfg.get("cmd", "local") or "local"),
                   threads=int(cfg.get("threads", 1) or 1),
                   slurm=SlurmOptions.from_config(cfg.get("slurm")), log_dir=log_dir)


def as_job_config(nj: int | JobConfig) -> JobConfig:
    """A function's ``nj`` argument as a :class:`JobConfig`: a number is that many jobs on this
    machine (``cmd: local``); a JobConfig (a stage's, from the recipe) is taken as it is."""
    return nj if isinstance(nj, JobConfig) else JobConfig(nj=int(nj))


def set_threads(n: int) -> None:
    """This process's torch intra-op threads and its BLAS/OpenMP pools (numpy's OpenBLAS, MKL)
    to ``n``; the environment too, for the processes it starts. torch is not imported for it
    (1.2-1.7 CPU-s, most of a light stage's process: prepare, lang, lm): where it is not loaded
    yet, it takes ``OMP_NUM_THREADS`` when it is."""
    n = max(1, int(n))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:   # a dependency of ours; absent only in a broken install
        return
    threadpool_limits(n)


def _job_start(threads: int, parent: int | None = None) -> None:
    """A local job: its threads, the default action on SIGTERM (the pool's way of ending it),
    and Ctrl-C left to the parent (it inherited the CLI's handlers, which print a traceback).
    A job whose parent dies (kill -9) gets SIGTERM at once and ends quietly (Linux's
    PR_SET_PDEATHSIG), instead of finishing its call and printing a BrokenPipeError on the
    closed result pipe. ``parent``: the pid a forked job's parent must have (None for a job
    started by a fork server, whose parent is the server; the server ends with the run)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:   # it died before prctl
        os._exit(0)
    set_threads(threads)


def _start_method(threads: int) -> str:
    """How local jobs start: forked (cheap: they share the parent's imports) where a job runs
    one thread, else from a fork server. GNU OpenMP (torch's and numpy's thread pools) is not
    fork-safe: a child forked after the parent ran a parallel region hangs in its first own
    parallel region with more than one thread (seen: threads=2 nj=2, the align stage's jobs
    in futex_do_wait at tri1's first iteration). The fork server is a fresh interpreter, so
    its children start clean and pay only their imports (~1-2 s, once a pool)."""
    if sys.platform != "linux":
        return "spawn"
    return "fork" if threads <= 1 else "forkserver"


class _Job:
    """One job's call: the thread count set first (a SLURM job starts a fresh interpreter)."""

    def __init__(self, fn: Callable[[Any], Any], threads: int) -> None:
        self.fn, self.threads = fn, threads

    def __call__(self, arg: Any) -> Any:
        set_threads(self.threads)
        return self.fn(arg)


class JobPool:
    """The local processes of a series of :func:`run_jobs` calls (a GMM pass's iterations):
    started at the first call that runs jobs in parallel and kept until :meth:`close` (or the
    ``with`` block's end), instead of a pool started and ended by every call (``nj`` forks and
    their start, 0.1-0.2 s a call, 40 calls a pass).  Its workers are forked then, so they see
    the parent as it was at that call; a job must read what changes between calls (a model, a
    table) from disk, as every job of ours does.  A call whose job fails or dies ends the
    pool; the next call starts a new one."""

    def __init__(self, jobs: JobConfig) -> None:
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None
        self.started = 0          # pools started (the tests count them)

    def executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = mp.get_context(_start_method(self.jobs.threads))
            self._pool = ProcessPoolExecutor(self.jobs.nj, mp_context=ctx,
                                             initializer=_job_start,
                                             initargs=(self.jobs.threads, os.getpid()
                                                       if ctx.get_start_method() == "fork"
                                                       else None))
            self.started += 1
        return self._pool

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None

    def __enter__(self) -> JobPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close(cancel=exc[0] is not None)


def iter_cluster_jobs(fn: Callable[[_A], _R], args: Sequence[_A], jobs: JobConfig,
                      desc: str) -> Iterator[_R]:
    """``cmd: slurm``'s :func:`run_jobs` one result at a time, in order, each as soon as it and
    those before it are done (a large result that comes early waits on disk)."""
    from asrtrain.slurm import iter_slurm_jobs

    return iter_slurm_jobs(_Job(fn, jobs.threads), args, jobs, desc)


def run_jobs(fn: Callable[[_A], _R], args: Sequence[_A], jobs: JobConfig, desc: str,
             *, in_process: bool = False, pool: JobPool | None = None) -> list[_R]:
    """``[fn(a) for a in args]``, each call a job, at most ``jobs.nj`` at once, on this machine
    or the cluster (``jobs.cmd``); results in the order of ``args``.  A job that raises or dies
    stops the run with an error naming the job (``desc`` and its index).  ``in_process`` (or a
    single job with ``cmd: local``) runs the calls here, one after another: nothing to start.
    ``pool``: local processes kept between calls (:class:`JobPool`; default: a pool for this
    call only)."""
    args = list(args)
    if not args:
        return []
    if jobs.cmd == "slurm":
        return list(iter_cluster_jobs(fn, args, jobs, desc))
    if in_process or len(args) == 1 or jobs.nj == 1:
        return [fn(a) for a in Bar(args, desc=desc, unit="job", file=sys.stderr,
                                   hidden=len(args) == 1, leave=False)]
    own = pool is None
    if own:
        pool = JobPool(JobConfig(nj=min(jobs.nj, len(args)), cmd=jobs.cmd,
                                 threads=jobs.threads))
    try:
        out = _run_pooled(fn, args, pool.executor(), desc)
    except BaseException:
        pool.close(cancel=True)   # a failed or interrupted call ends its pool
        raise
    if own:
        pool.close()
    return out


def _run_pooled(fn: Callable[[_A], _R], args: list[_A], executor: ProcessPoolExecutor,
                desc: str) -> list[_R]:
    out: list[Any] = [None] * len(args)
    with Bar(total=len(args), desc=desc, unit="job", file=sys.stderr, disable=None,
              leave=False) as bar:
        futures = {executor.submit(fn, a): i for i, a in enumerate(args)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                out[i] = fut.result()
            except BrokenProcessPool as e:
                for f in futures:
                    f.cancel()
                running = sorted(futures[f] + 1 for f in futures if not f.done())
                raise AsrtrainError(f"{desc}: a job process died (killed or out of memory) "
                                    f"while jobs {running} of {len(args)} were running") from e
            except AsrtrainError as e:
                for f in futures:
                    f.cancel()
                raise AsrtrainError(f"{desc}: job {i + 1} of {len(args)}: {e}") from e
            except Exception as e:
                for f in futures:
                    f.cancel()
                raise AsrtrainError(f"{desc}: job {i + 1} of {len(args)} failed: "
                                    f"{type(e).__name__}: {e}") from e
            bar.update()
    return out


def split_by_speaker(spk2utt: Mapping[str, Sequence[str]], nj: int,
                     frames: Mapping[str, int] | None = None) -> list[list[str]]:
    """Utterance lists of at most ``nj`` parts, whole speakers in each (as Kaldi's
    ``split_data.sh`` without ``--per-utt``: fMLLR needs a speaker's every utterance in one
    job), balanced by frames when ``frames`` is given (else by utterances): speakers go, largest
    first, to the lightest part.  Speakers and their utterances keep sorted order in a part, so
    a part's contents depend only on the data and ``nj``."""
    weight = {s: sum((frames or {}).get(u, 1) for u in us) for s, us in spk2utt.items()}
    n = max(1, min(int(nj), len(spk2utt)))
    load = [0] * n
    parts: list[list[str]] = [[] for _ in range(n)]
    for s in sorted(spk2utt, key=lambda s: (-weight[s], s)):
        j = min(range(n), key=lambda j: (load[j], j))
        parts[j].append(s)
        load[j] += weight[s]
    return [[u for s in sorted(p) for u in sorted(spk2utt[s])] for p in parts if p]


def job_log_dir(exp_dir: Path | str) -> Path:
    """``exp/log/slurm``: where ``cmd: slurm`` keeps submitit's pickles and the jobs' logs."""
    return Path(exp_dir) / "log" / "slurm"
