"""``python -m asrtrain.cli ARGS`` for the tests, as a process of its own that starts warm.

A test that runs the command for its contract (exit status, the one-line error on stderr, what
is left on disk) needs a process of its own, but not a fresh interpreter each time: importing
torch and the stages is ~1.5 CPU-s a process, and the suite ran ~300 such commands. :func:`run`
forks the command from a fork server (Python's ``multiprocessing`` ``forkserver``): a clean
interpreter that imported :data:`PRELOAD` once and has run nothing since, so no fork copies a
thread pool, autograd's threads or pytest's state. The child then looks like
``python -m asrtrain.cli`` started by :func:`subprocess.run`: its own stdin (``/dev/null``),
stdout and stderr (files read back whole; unbuffered, ``PYTHONUNBUFFERED=1``, so that its lines
and its learners' keep their order), environment, working folder, ``sys.argv``, Python's
default warning filters, torch and BLAS thread counts as a new process would pick them from the
environment, its exit status (``sys.exit``'s code; 1 and the traceback for an uncaught
exception; killed by SIGINT for an uncaught Ctrl-C, as Python does), and the atexit handlers and
non-daemon threads a new interpreter ends with. What it returns is a
:class:`subprocess.CompletedProcess`, and a run past ``timeout`` is killed and raises
:class:`subprocess.TimeoutExpired`, as :func:`subprocess.run` does.

:func:`popen` is the same child for a test that signals or kills the run while it runs
(tests/test_faults.py, tests/test_straggler.py; tests/test_multinode.py's nodes, each in network
and UTS namespaces of its own): a session of its own, and the part of :class:`subprocess.Popen`
those tests use. Tests that need a new interpreter (another hash seed, the warnings of its
imports) start real processes with :mod:`subprocess` (tests/test_align_reproducible.py,
tests/test_console.py, ...), and tests/test_cli.py runs the installed console script: those
are the contracts this shortcut cannot show. This module is a plain module (no pytest), so the
fork server imports it without the suite's conftest.

:func:`start` is the same child for a caller that watches it run (bench/scale.py measures each
stage so): its output appended to a log, a session of its own (``os.killpg`` ends it and its
jobs), and, at its end, its own and its children's ``getrusage`` in a JSON report (a fork
server's child is not the caller's to ``wait4``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What every command imports (the CLI, the stage table, torch with what training and its
#: optimizer step load, the curves' plotting), imported once by the fork server; then what
#: the commands imported lazily, each again (Hydra for composing the recipe, torchrun's
#: launcher, TensorBoard's writer and reader, your own corpus's tables, soundfile: ~120 of the
#: ~130 s a py-spy profile of the suite saw the forked commands importing), and a first compose
#: (forked_warm).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.optim", "torchaudio",
           "matplotlib.pyplot", "asrtrain.cli", "asrtrain.stages", "asrtrain.train.trainer",
           "hydra", "hydra.compose", "hydra.initialize", "torch.distributed.run",
           "asrtrain.distributed.launch", "asrtrain.distributed.warm", "torch.utils.tensorboard",
           "tensorboard.backend.event_processing.event_accumulator",
           "asrtrain.data.corpora.datadir", "soundfile", __name__, "forked_warm"]
#: Python's own warning filters (``python -W`` none, no ``PYTHONWARNINGS``), first match first.
DEFAULT_WARNINGS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                    ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                    ("ignore", ResourceWarning, "")]

#: Linux's namespace flags (sched.h) for setns and unshare
CLONE_NEWNET, CLONE_NEWUTS = 0x40000000, 0x04000000

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def run(*args: str, cwd: str | Path = REPO, env: Mapping[str, str] | None = None,
        timeout: float | None = 900.0, check: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "asrtrain.cli", *args], cwd=cwd, env=env,
    capture_output=True, text=True, timeout=timeout)``, started warm (see the module).
    ``check``: a non-zero exit status fails the test with the command and its stderr's end."""
    args = [str(a) for a in args]
    command = [sys.executable, "-m", "asrtrain.cli", *args]
    env = _child_env(env)
    with tempfile.TemporaryDirectory(prefix="asrtrain-cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = _context.Process(target=_child, args=(args, str(cwd), env, str(out), str(err)),
                                name="asrtrain-cli")
        proc.start()
        proc.join(timeout)
        timed_out = proc.is_alive()
        if timed_out:
            proc.kill()
            proc.join()
        stdout, stderr = (p.read_text(errors="replace") if p.exists() else "" for p in (out, err))
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
    if check and proc.exitcode != 0:
        raise AssertionError(f"asrtrain {' '.join(args)} failed (exit status {proc.exitcode}):\n"
                             f"{stderr[-4000:]}")
    return subprocess.CompletedProcess(command, proc.exitcode, stdout, stderr)


def start(*args: str, log: str | Path, report: str | Path, cwd: str | Path = REPO,
          env: Mapping[str, str] | None = None) -> multiprocessing.process.BaseProcess:
    """``python -m asrtrain.cli ARGS`` started warm and not waited for: stdout and stderr
    appended to ``log``, in a session of its own (its pid is its process group's), and at its
    end ``report`` holds ``{"self_cpu_s", "children_cpu_s", "self_rss_mb", "children_rss_mb"}``
    (``getrusage`` of itself and of the children it waited for: its jobs). The caller joins
    the returned process (``exitcode``), or kills its group."""
    args = [str(a) for a in args]
    env = _child_env(env)
    proc = _context.Process(target=_child, args=(args, str(cwd), env, str(log), str(log)),
                            kwargs={"report": str(report), "session": True},
                            name="asrtrain-cli")
    proc.start()
    return proc


def popen(*args: str, cwd: str | Path = REPO, env: Mapping[str, str] | None = None,
          merge: bool = False, netns: str | None = None,
          hostname: str | None = None) -> Started:
    """``subprocess.Popen([sys.executable, "-m", "asrtrain.cli", *args], cwd=cwd, env=env,
    stdout=PIPE, stderr=STDOUT if merge else PIPE, text=True, start_new_session=True)``,
    started warm, for a test that signals or kills the run while it runs: what it returns has
    the part of ``Popen`` such tests use (:class:`Started`). Its output goes to files, read
    back whole by ``communicate`` (``Started.output``: what it has written so far).
    ``netns``: in that network namespace (``ip netns add``'s), and with ``hostname``, in a UTS
    namespace of its own with that name, as ``ip netns exec NETNS unshare --uts`` and
    ``hostname`` put a new process (tests/test_multinode.py's nodes)."""
    args = [str(a) for a in args]
    env = _child_env(env)
    tmp = tempfile.TemporaryDirectory(prefix="asrtrain-cli-")
    out = Path(tmp.name) / "stdout"
    err = out if merge else Path(tmp.name) / "stderr"
    proc = _context.Process(target=_child, args=(args, str(cwd), env, str(out), str(err)),
                            kwargs={"session": True, "netns": netns, "hostname": hostname},
                            name="asrtrain-cli")
    proc.start()
    return Started(proc, [sys.executable, "-m", "asrtrain.cli", *args], out, err, tmp)


class Started:
    """:func:`popen`'s command: ``pid``, ``returncode``, ``poll``, ``wait``, ``kill``,
    ``send_signal`` and ``communicate`` as :class:`subprocess.Popen` has them (stdout and
    stderr read from its files once it ended; stderr None where merged into stdout)."""

    def __init__(self, process: multiprocessing.process.BaseProcess, args: list[str],
                 out: Path, err: Path, tmp: tempfile.TemporaryDirectory) -> None:
        self._process, self.args, self._out, self._err, self._tmp = process, args, out, err, tmp
        self.pid: int = process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> str:
        """What it has written to stdout so far (and stderr, where merged)."""
        return self._out.read_text(errors="replace") if self._out.exists() else ""

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        self.wait(timeout)
        out = self.output()
        err = None if self._err == self._out else (
            self._err.read_text(errors="replace") if self._err.exists() else "")
        self._tmp.cleanup()
        return out, err


def _child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The child's environment: ``env`` (default: this process's), unbuffered output."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    if env.get("PYTHONHASHSEED") != os.environ.get("PYTHONHASHSEED"):
        raise ValueError("forked_cli: a forked process keeps its fork server's hash seed "
                         "(this process's PYTHONHASHSEED); start one with subprocess for another")
    return env


def _child(args: list[str], cwd: str, env: dict[str, str], out: str, err: str,
           report: str | None = None, session: bool = False, netns: str | None = None,
           hostname: str | None = None) -> None:
    """In the forked process: become ``python -m asrtrain.cli ARGS`` and end as it would
    (``out`` == ``err``: both appended to that file; ``session``: a session of its own;
    ``report``: the rusage JSON of :func:`start`, written last; ``netns``, ``hostname``: see
    :func:`popen`)."""
    import atexit
    import json
    import resource
    import threading
    import traceback

    if netns is not None:   # first: its learners' fork server is forked in become()
        _enter(netns, hostname)
    become(args, cwd, env, out, err, session)
    code: int | str | None = 0
    try:
        from asrtrain.cli import main

        main.main(args=args, prog_name="python -m asrtrain.cli")
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
        traceback.print_exc()
        code = 1
    threading._shutdown()  # the interpreter's own end: non-daemon threads, then atexit
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if report is not None:
        me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                    resource.RUSAGE_CHILDREN))
        with open(report, "w") as f:
            json.dump({"self_cpu_s": me.ru_utime + me.ru_stime,
                       "children_cpu_s": kids.ru_utime + kids.ru_stime,
                       "self_rss_mb": me.ru_maxrss / 1024,
                       "children_rss_mb": kids.ru_maxrss / 1024}, f)
    if code == -signal.SIGINT:   # Python ends an uncaught Ctrl-C by the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code or 0)


def _enter(netns: str, hostname: str | None) -> None:
    """This process into the network namespace ``netns`` and, with ``hostname``, a UTS
    namespace of its own named so (a new process would get both from ``ip netns exec NETNS
    unshare --uts``; this one is single-threaded, as setns and unshare need)."""
    import ctypes
    import socket

    libc = ctypes.CDLL(None, use_errno=True)

    def checked(code: int, what: str) -> None:
        if code != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        checked(libc.setns(fd, CLONE_NEWNET), f"setns into network namespace {netns}")
    finally:
        os.close(fd)
    if hostname is not None:
        checked(libc.unshare(CLONE_NEWUTS), "unshare the UTS namespace")
        socket.sethostname(hostname)


def become(args: list[str], cwd: str, env: dict[str, str], out: str, err: str,
           session: bool = False) -> None:
    """The forked child made ``python -m asrtrain.cli ARGS`` as started: its output, environment,
    working folder, path, argv, warning filters, signals and thread counts; ``asrtrain run``'s
    learner fork server started first (tests/test_warm.py checks it)."""
    import io
    import warnings

    import setproctitle

    if session:
        os.setsid()
    if out == err:   # one log, appended
        target = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd in (1, 2):
            os.dup2(target, fd)
        os.close(target)
    else:
        for fd, path in ((1, out), (2, err)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    # what ps and pgrep -f show, as for the command it is; first: it moves the environment out
    # of the way, which it cannot do once the environment has been replaced (the titles of the
    # learners, which tests find by their command line, would then stay the fork server's)
    setproctitle.setproctitle(" ".join([sys.executable, "-m", "asrtrain.cli", *args]))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # PYTHONPATH as a new interpreter would put it on sys.path (the server's is its start's)
    extra = [d for d in env.get("PYTHONPATH", "").split(os.pathsep) if d and d not in sys.path]
    sys.path[1:1] = extra
    sys.argv = [str(REPO / "asrtrain" / "cli.py"), *args]
    warnings.resetwarnings()
    for action, category, module in reversed(DEFAULT_WARNINGS):
        warnings.filterwarnings(action, category=category, module=module)
    if args[:1] == ["run"] and not {"--dry-run", "--show-config"} & set(args):
        # what `asrtrain run` does first (its own call then finds this one), done here before
        # the thread counts: a BLAS count lowered in a fork (from this server's) leaves an
        # OpenBLAS worker behind, and torch's set_num_threads starts its OpenMP pool, and with
        # either thread the command could not fork it: multiprocessing then started a new
        # interpreter for it, ~8 CPU-s of imports for each command that trains
        from asrtrain.distributed.warm import start_fork_server

        start_fork_server()
    _threads_as_started(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _threads_as_started(env: Mapping[str, str]) -> None:
    """torch's and BLAS's thread counts as a new interpreter would take them from ``env`` (the
    fork server's came from the environment it started with)."""
    import torch
    from threadpoolctl import threadpool_limits

    cores = len(os.sched_getaffinity(0))
    omp = int(env.get("OMP_NUM_THREADS") or 0) or cores
    torch.set_num_threads(omp)
    threadpool_limits(int(env.get("OPENBLAS_NUM_THREADS") or 0) or omp, user_api="blas")
