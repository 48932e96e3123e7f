"""Liveness: heartbeats in the rendezvous store, to name the learner that died when a wait fails.

Each learner bumps a counter every ``interval`` seconds from a daemon thread, on its own store
connection (a store client is not shared between threads). A learner that fails because of a
peer records it, so only learners that went silent without a word are blamed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from asrtrain import AsrtrainError

#: The launcher's pid, set by :func:`asrtrain.distributed.launch.launch` for its learners.
LAUNCHER_ENV = "ASRTRAIN_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def launcher_pid() -> int | None:
    """The pid of the launcher that started this learner (None: not started by ``launch``)."""
    value = os.environ.get(LAUNCHER_ENV, "")
    return int(value) if value.isdigit() else None


def die_with_launcher() -> None:
    """Make this learner end when its launcher ends, however it ends (``kill -9`` included).

    Without it a learner whose launcher was killed is re-parented to init and trains on with
    nobody to supervise it or record its result. The kernel's parent-death signal does it at once
    (Linux); the heartbeat thread also checks the parent (:meth:`Liveness.start`), which covers
    other systems and a launcher that died before this call.
    """
    launcher = launcher_pid()
    if launcher is None:
        return
    # A learner has nothing to tidy up (checkpoints are written atomically): the launcher's
    # SIGTERM or SIGINT ends it at once, even inside a collective, where a Python handler
    # would wait for the collective to return.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != launcher:
        raise AsrtrainError(f"the launcher (pid {launcher}) ended before this learner started")


def record_error(error: BaseException) -> None:
    """Write this learner's error, one line, where torchrun's launcher reads it.

    :func:`asrtrain.distributed.launch.failure_message` then quotes it instead of pointing at
    interleaved logs.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    text = str(error) if isinstance(error, AsrtrainError) else f"{type(error).__name__}: {error}"
    line = (text.strip().splitlines() or [type(error).__name__])[0]
    # the first error of this learner is its error: its training loop and its gossip thread may
    # both fail at once (two writers of one file left one record with the end of the other's
    # after it, and torchrun's agent failed on the JSON); written whole under a temporary name
    with _recorded_lock:
        if _recorded:
            return
        _recorded.append(line)
        tmp = f"{path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"message": line, "timestamp": int(time.time())}, f)
            os.replace(tmp, path)


_recorded: list[str] = []
_recorded_lock = threading.Lock()


def _orphaned(launcher: int | None) -> bool:
    return launcher is not None and os.getppid() != launcher


class Liveness:
    """The heartbeat of one learner, and the judgement of who went silent."""

    def __init__(self, rank: int, world_size: int, interval: float = 1.0) -> None:
        self.rank = rank
        self.world_size = world_size
        self.interval = interval
        self.prefix = f"asrtrain/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self._port = int(os.environ.get("MASTER_PORT", "0"))
        # torchrun's node of this learner (its agent's group rank) and the number of nodes
        self.node = int(os.environ.get("GROUP_RANK", "0") or 0)
        self.nnodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
        self._stop = threading.Event()
        self._hung: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        # the judgements' own store connection (made at the start, so a store that went away
        # fails its next call at once instead of a connect's timeout), shared by the threads
        # that fail (the training loop, the gossip thread) under a lock; and why the store is
        # unreachable, once a call found out: every later judgement says so without asking
        self._judge: dist.TCPStore | None = None
        self._judge_lock = threading.Lock()
        self._lost: str | None = None

    def _client(self, timeout: float) -> dist.TCPStore:
        return dist.TCPStore(self._host, self._port, is_master=False,
                             timeout=timedelta(seconds=timeout), wait_for_workers=False)

    def start(self) -> None:
        try:
            store = self._client(30.0)
        except Exception as e:  # noqa: BLE001 - its host (the launcher or rank 0) is gone
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AsrtrainError(f"rank {self.rank}: cannot reach the learners' store at "
                                f"{self._host}:{self._port}: {why}") from e
        key = f"{self.prefix}/hb/{self.rank}"
        store.set(f"{self.prefix}/pid/{self.rank}",
                  f"{socket.gethostname()} {os.getpid()} {self.node}")
        store.add(key, 1)
        self._judge = self._client(30.0)
        self._judge.set_timeout(timedelta(seconds=5.0))   # its requests, once connected
        launcher = launcher_pid()

        def beat() -> None:
            while not self._stop.wait(self.interval):
                if _orphaned(launcher):
                    print(f"rank {self.rank}: the launcher (pid {launcher}) is gone: stopping",
                          file=sys.stderr, flush=True)
                    os._exit(143)
                try:
                    store.add(key, 1)
                except Exception as e:  # the store went away: nothing left to tell
                    self._lost = self._lost or first_line(e)
                    return

        self._thread = threading.Thread(target=beat, name="asrtrain-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeat and wait for its thread. A daemon thread still inside a store call
        when the interpreter exits is ended by ``pthread_exit`` as it takes the GIL back, which
        unwinds through C++ frames that may not unwind: ``terminate called without an active
        exception`` and SIGABRT of a learner whose training had finished."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 10.0)

    @contextlib.contextmanager
    def _store(self) -> Iterator[dist.TCPStore]:
        """The judgements' store connection, one thread at a time; a call that fails records
        that the store is unreachable (its host, the launcher or rank 0, is gone)."""
        with self._judge_lock:
            if self._lost is not None:
                raise _StoreLost(self._lost)
            try:
                if self._judge is None:   # a Liveness that was never started
                    self._judge = self._client(5.0)
                yield self._judge
            except Exception as e:
                self._lost = first_line(e)
                raise

    def report_failure(self, message: str) -> None:
        """Record that this learner fails because of someone else (so it is not blamed)."""
        with contextlib.suppress(Exception), self._store() as store:
            store.set(f"{self.prefix}/failed/{self.rank}", message)

    def silent_ranks(self) -> str:
        """Name the learners whose heartbeat stopped without a recorded failure of their own.

        Those of them still alive on this machine are hung: :meth:`fence_hung` kills them once
        this learner has recorded its error. A store that went away is said at once: the
        heartbeat thread or an earlier judgement found it out, or this call's first request
        does (on the connection made at the start: no connect to wait out).
        """
        try:
            with self._store() as store:
                keys = [f"{self.prefix}/hb/{r}" for r in range(self.world_size)]
                before = [store.add(k, 0) for k in keys]
                time.sleep(2.5 * self.interval)
                after = [store.add(k, 0) for k in keys]
                failed = {r for r in range(self.world_size)
                          if store.check([f"{self.prefix}/failed/{r}"])}
                silent = [r for r in range(self.world_size)
                          if after[r] == before[r] and r not in failed and r != self.rank]
                self._hung = {r: pid for r in silent if (pid := self._local_pid(store, r))}
                if silent:
                    return self._describe(store, silent)
        except Exception as e:  # the store lives in the launcher or on rank 0
            cause = self._lost or first_line(e)
            if self.nnodes > 1 and self.node != 0:
                return (f"node 0 is lost: the rendezvous store its launcher serves at "
                        f"{self._host}:{self._port} is unreachable ({cause}): node 0's "
                        "launcher or machine died")
            return f"the rendezvous store is unreachable ({cause}): rank 0 or the launcher died"
        return "every learner still has a heartbeat: one of them is hung or too slow"

    def _describe(self, store: dist.TCPStore, silent: list[int]) -> str:
        """The silent learners in words; over several nodes, a node all of whose learners went
        silent at once is named as the node that was lost (its launcher or machine died)."""
        def verdict(r: int) -> str:
            return ("stopped answering (hung: stopped or stuck), so it was killed"
                    if r in self._hung else "stopped (died or was killed)")

        if self.nnodes <= 1:
            return ", ".join(f"rank {r} {verdict(r)}" for r in silent)
        entries: dict[int, tuple[str, str, str]] = {}
        for r in range(self.world_size):
            with contextlib.suppress(Exception):  # a name is a courtesy; the rank is named
                entries[r] = self._entry(store, r)
        nodes: dict[str, list[int]] = {}
        for r, (_, _, node) in entries.items():
            nodes.setdefault(node, []).append(r)
        out, named = [], set()
        for node, ranks in sorted(nodes.items()):
            if node and all(r in silent and r not in self._hung for r in ranks):
                host = entries[ranks[0]][0]
                out.append(f"node {node} on {host} is lost (its learners, ranks "
                           f"{', '.join(map(str, ranks))}, all stopped: its launcher or machine "
                           "died, or they were killed)")
                named.update(ranks)
        for r in silent:
            if r not in named:
                host, _, node = entries.get(r, ("", "", ""))
                where = f" (node {node} on {host})" if node else ""
                out.append(f"rank {r}{where} {verdict(r)}")
        return ", ".join(out)

    def _entry(self, store: dist.TCPStore, rank: int) -> tuple[str, str, str]:
        """The host, pid and node that learner ``rank`` posted at its start."""
        parts = store.get(f"{self.prefix}/pid/{rank}").decode().split(" ")
        host, pid, node = (parts + ["", ""])[:3]
        return host, pid, node

    def _local_pid(self, store: dist.TCPStore, rank: int) -> int | None:
        """The pid of learner ``rank`` if it runs on this machine and is alive (not a zombie)."""
        host, pid, node = self._entry(store, rank)
        here = host == socket.gethostname() and (not node or node == str(self.node))
        return int(pid) if here and pid.isdigit() and _alive(pid) else None

    def fence_hung(self) -> None:
        """Kill the hung learners :meth:`silent_ranks` found on this machine.

        A hung learner never answers the launcher's SIGTERM either (a stopped process keeps it
        pending), so the run would wait out torchrun's 30 s grace before SIGKILL; killing it ends
        the run ``timeout_s`` after it stopped answering, and its exit names it.
        """
        for pid in self._hung.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._hung = {}


class _StoreLost(Exception):
    """A judgement not asked of a store already found unreachable."""


def first_line(error: BaseException) -> str:
    """The first line of an error's text, or its type's name when it has none."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _alive(pid: str) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux's /proc; False elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
