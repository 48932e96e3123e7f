"""Warm learner starts: torchrun's learners forked from a fork server that imported torch once.

torchrun starts each learner as a new ``python -u -m MODULE ARGS`` process, and a new process
spends ~4 CPU-s importing torch, ``torch._dynamo`` (which the optimizer loads on first use) and
the trainer before it does any work: 30 s of CPU for 8 learners on a laptop, a third of the
test suite's CPU. :func:`warm_handlers` has torchrun's agent start the same command in a process
forked from Python's ``multiprocessing`` fork server instead, a clean interpreter started once
per launching process that imported :data:`PRELOAD` and never ran anything: it never touched
CUDA or autograd, so its children use the GPU as a new process does (a fork of a process that
asked CUDA anything cannot: docs/architecture.md, "fork after CUDA"), and no thread of the
launcher is copied.

What torchrun sees is unchanged: a process per learner with its pid, the leader of a session of
its own (torchrun signals the group), the agent's environment (the launcher's plus torchrun's
per-rank variables, exactly as torchrun would pass them; BLAS's thread count taken from it, as
a new process takes it), the launcher's stdin, stdout and
stderr (or torchrun's redirect files), unbuffered as ``-u`` makes them, its exit status (its
``sys.exit`` code, 1 for an uncaught exception, ``-N`` for a signal) and its error file. So
torchrun's monitor, its SIGTERM-then-SIGKILL shutdown and :func:`asrtrain.distributed.launch.
failure_message` work as they do for new processes. Differences, none of them read by a
learner: its name in ``top`` is ``learner-RANK`` and its command line (``ps``, ``pgrep -f``) is
the command torchrun would have run, but ``/proc/PID/environ`` is the fork server's; its
parent is the fork server (which ends when the launcher ends, so
:func:`asrtrain.distributed.liveness.die_with_launcher` watches it, and through it the
launcher), its ``sys.path`` is a new process's (working folder, ``PYTHONPATH``) followed by
the launcher's, and it ends with
``os._exit`` once its output is flushed (no atexit handlers; ``asrtrain train`` ends so anyway).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import io
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.process
import os
import runpy
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing import reduction, resource_tracker
from typing import Any

import setproctitle
from threadpoolctl import threadpool_info, threadpool_limits

from asrtrain.distributed.liveness import LAUNCHER_ENV

#: What the fork server imports once: torch with what a learner's first step loads (the optimizer
#: imports ``torch._dynamo`` on first use, ~1 CPU-s), and the trainer. Nothing here asks CUDA.
PRELOAD = ["torch", "torch.distributed", "torch.optim", "torch._dynamo", "asrtrain.cli",
           "asrtrain.train.worker", "asrtrain.train.trainer", "asrtrain.distributed.learner"]

_context = multiprocessing.get_context("forkserver")
_PR_SET_NAME = 15


class _Fd:
    """A file descriptor of the launcher, sent to the fork server's child with the process."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        # pickled while the fork server's Popen spawns: DupFd hands the fd over with the process
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return dup.detach()


def _open_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _learner(module: str, args: list[str], env: dict[str, str], fds: list[int | None]) -> None:
    """The child of the fork server: ``python -u -m module args`` in this warm process."""
    os.setsid()  # as torchrun's Popen(start_new_session=True): torchrun signals the group
    # the launcher's fds arrived under any numbers, 0-2 included: move them above 2 first
    moved = [None if fd is None else fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in fds]
    for fd in fds:
        if fd is not None and fd > 2:
            os.close(fd)
    for target, fd in enumerate(moved):
        if fd is not None:
            os.dup2(fd, target)
            os.close(fd)
    _forget_the_fork_server()
    # what ps and pgrep -f show; first: it moves the environment out of the way
    setproctitle.setproctitle(" ".join([sys.executable, "-u", "-m", module, *args]))
    _name(f"learner-{env.get('RANK', '')}")
    os.environ.clear()
    os.environ.update(env)
    # the process whose death ends this learner (die_with_launcher): the fork server, which ends
    # when its launcher does
    os.environ[LAUNCHER_ENV] = str(os.getppid())
    # -u: unbuffered binary layer, write-through text layer
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=sys.stdout.encoding,
                                  errors=sys.stdout.errors, write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=sys.stderr.encoding,
                                  errors="backslashreplace", write_through=True)
    # BLAS took its thread count from the fork server's environment when numpy was imported;
    # torch reads the learner's when its pool starts
    blas = int(env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS") or 0)
    threadpool_limits(blas or len(os.sched_getaffinity(0)), user_api="blas")
    # python -m puts the working folder first, then PYTHONPATH; the launcher's path follows
    head = [os.getcwd(), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    sys.path[:] = [*head, *(p for p in sys.path if p not in head)]
    sys.argv = [module, *args]
    # as in a new process, the module runs as __main__ only (preloaded, runpy would warn that it
    # is in sys.modules already); what it imports stays loaded
    sys.modules.pop(module, None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


def _forget_the_fork_server() -> None:
    """Be a main process, as a new one is, not a child of the fork server's.

    The fork server hands each child the write end of its "alive" pipe and the launcher's
    resource tracker: a child holding the pipe keeps the server up after the launcher is gone
    (and so its learners, whose parent-death signal waits for the server), and semaphores of a
    learner would be the launcher's to clean up. A learner that uses ``multiprocessing`` starts
    its own server and tracker, as a new process does; ``multiprocessing.parent_process()`` is
    None (asrtrain.progress tells job processes by it).
    """
    server = multiprocessing.forkserver._forkserver
    for fd in (server._forkserver_alive_fd, resource_tracker._resource_tracker._fd):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None
    server._inherited_fds = None
    resource_tracker._resource_tracker._fd = resource_tracker._resource_tracker._pid = None
    multiprocessing.process._parent_process = None


def start_fork_server() -> bool:
    """Start this process's learner fork server now, as a fork of this process; False (and
    nothing done) where that is not safe or one is running already.

    ``asrtrain run`` calls this first thing, while its process is as clean as the fork server
    that ``multiprocessing`` would start on the first learner (a new interpreter): it has
    imported modules, configured no logging, run no stage and started no thread. The fork shares
    those imports (a launcher forked from a warm process, as the tests' commands are, has torch
    and the trainer already; a new one imports them in the server, as before) and waits: it
    imports :data:`PRELOAD` only when the first learner is asked for, so a run that trains no
    learners pays one fork. It holds none of the launcher's output (its stdin, stdout and stderr
    are ``/dev/null``; a learner gets the launcher's from torchrun, :class:`WarmProcess`), and it
    ends when the launcher ends, as ``multiprocessing``'s does (the same "alive" pipe).

    Not safe, so not done: a process with more than one thread (a fork copies only the calling
    thread, and locks or thread pools the others held), or a ``multiprocessing`` whose fork
    server this code does not know (Python 3.11-3.13's are alike; a later one may differ).
    """
    server = multiprocessing.forkserver._forkserver
    known = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")
    if (not all(hasattr(server, a) for a in known) or hasattr(server, "_forkserver_authkey")
            or server._forkserver_pid is not None or not _one_thread()):
        return False
    from multiprocessing import connection

    # no lock taken: this process runs one thread, and a fork would copy a held lock held
    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork server
        code = 0
        try:
            os.close(alive_w)
            _fork_server(listener.fileno(), alive_r)
        except BaseException:  # noqa: BLE001 - its stderr is /dev/null: a launcher that finds
            code = 1            # it gone before asking starts multiprocessing's own
        os._exit(code)
    os.close(alive_r)
    listener.close()
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return True


def _one_thread() -> bool:
    """Whether this process runs one thread of its own: Python's main thread, and no native
    thread but OpenBLAS's workers (numpy's BLAS starts them when it loads, and makes them safe
    to fork: it stops them before a fork and starts them again after; ``multiprocessing``'s own
    fork server has them too). An OpenMP pool (torch's, once it ran a parallel region) is not:
    a forked child hangs in its first parallel region. Linux only (False elsewhere)."""
    import threading

    try:
        native = len(os.listdir("/proc/self/task"))
    except OSError:
        return False
    blas = sum(max(0, pool["num_threads"] - 1) for pool in threadpool_info()
               if pool["internal_api"] == "openblas")
    return threading.active_count() == 1 and native <= 1 + blas


def _fork_server(listener: int, alive: int) -> None:
    """The forked fork server: wait for the first learner (or the launcher's end), import what
    learners need, then serve as ``multiprocessing``'s fork server does."""
    _forget_the_fork_server()   # a launcher forked from a fork server holds that one's fds
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    setproctitle.setproctitle(f"asrtrain learner fork server (launcher {os.getppid()})")
    _name("asrtrain-fork")
    if alive in select.select([listener, alive], [], [])[0]:
        return   # the launcher ended before it asked for a learner
    for module in PRELOAD:
        __import__(module)
    multiprocessing.forkserver.main(listener, alive, [], None, None)


def _name(name: str) -> None:
    """The process name ``top`` and ``ps -o comm`` show (``ps``'s command line is the title
    :func:`_learner` sets)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class WarmProcess:
    """The part of :class:`subprocess.Popen` torchrun's handler uses, for a fork server's child."""

    def __init__(self, module: str, args: list[str], env: dict[str, str],
                 stdout: io.IOBase | None, stderr: io.IOBase | None) -> None:
        fds = [0, stdout.fileno() if stdout else 1, stderr.fileno() if stderr else 2]
        sent = [_Fd(fd) if _open_fd(fd) else None for fd in fds]
        self._process = _context.Process(target=_learner, args=(module, args, env, sent),
                                         name=f"learner {env.get('RANK', '?')}")
        self._process.start()
        self.pid: int = self._process.pid
        self.args = [sys.executable, "-u", "-m", module, *args]

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)


def _module_command(command: tuple) -> tuple[str, list[str]] | None:
    """``(module, args)`` of torchrun's ``python -u -m module args`` command run by this
    interpreter, else None (``PYTHON_EXEC`` may name another one)."""
    if len(command) >= 4 and command[0] == sys.executable and command[1:3] == ("-u", "-m"):
        return str(command[3]), [str(a) for a in command[4:]]
    return None


@contextlib.contextmanager
def warm_handlers() -> Iterator[None]:
    """While inside, torchrun's agent (in this process) starts ``-m`` learners warm.

    torchrun's ``SubprocessContext`` makes each learner's handler with
    ``get_subprocess_handler`` of ``torch.distributed.elastic.multiprocessing.api``; this
    context replaces that function with one whose handler forks the learner from the fork
    server (:class:`WarmProcess`). A command that is not ``python -u -m MODULE`` with this
    interpreter starts as torchrun starts it. ``tests/test_warm.py`` checks that torch still
    looks the name up there.
    """
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    class WarmHandler(SubprocessHandler):
        def _popen(self, args: tuple, env: dict[str, str]) -> Any:
            parsed = _module_command(tuple(args))
            if parsed is None:
                return super()._popen(args, env)
            return WarmProcess(*parsed, env, self._stdout, self._stderr)

    def get_subprocess_handler(entrypoint: str, args: tuple, env: dict[str, str],
                               stdout: str, stderr: str, local_rank_id: int,
                               numa_options: Any = None) -> SubprocessHandler:
        if numa_options is not None:  # numactl wraps the command: a new process it is
            return original(entrypoint=entrypoint, args=args, env=env, stdout=stdout,
                            stderr=stderr, local_rank_id=local_rank_id,
                            numa_options=numa_options)
        return WarmHandler(entrypoint=entrypoint, args=args, env=env, stdout=stdout,
                           stderr=stderr, local_rank_id=local_rank_id, numa_options=None)

    forkserver = multiprocessing.forkserver._forkserver
    # a fork server already running (the tests' forked_cli) keeps its own preload
    preload = list(getattr(forkserver, "_preload_modules", None) or [])
    _context.set_forkserver_preload([*preload, *(m for m in PRELOAD if m not in preload)])
    original = api.get_subprocess_handler
    api.get_subprocess_handler = get_subprocess_handler
    try:
        yield
    finally:
        api.get_subprocess_handler = original
