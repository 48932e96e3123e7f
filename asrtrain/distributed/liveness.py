"""Liveness: heartbeats in the rendezvous store, to name the learner that died when a wait fails.

Each learner bumps a counter every ``interval`` seconds from a daemon thread, on its own store
connection (a store client is not shared between threads). A learner that fails because of a
peer records it, so only learners that went silent without a word are blamed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist


class Liveness:
    """The heartbeat of one learner, and the judgement of who went silent."""

    def __init__(self, rank: int, world_size: int, interval: float = 1.0) -> None:
        self.rank = rank
        self.world_size = world_size
        self.interval = interval
        self.prefix = f"asrtrain/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self._port = int(os.environ.get("MASTER_PORT", "0"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _client(self, timeout: float) -> dist.TCPStore:
        return dist.TCPStore(self._host, self._port, is_master=False,
                             timeout=timedelta(seconds=timeout), wait_for_workers=False)

    def start(self) -> None:
        store = self._client(30.0)
        key = f"{self.prefix}/hb/{self.rank}"
        store.add(key, 1)

        def beat() -> None:
            while not self._stop.wait(self.interval):
                try:
                    store.add(key, 1)
                except Exception:  # the store went away: nothing left to tell
                    return

        self._thread = threading.Thread(target=beat, name="asrtrain-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def report_failure(self, message: str) -> None:
        """Record that this learner fails because of someone else (so it is not blamed)."""
        with contextlib.suppress(Exception):
            self._client(5.0).set(f"{self.prefix}/failed/{self.rank}", message)

    def silent_ranks(self) -> str:
        """Name the learners whose heartbeat stopped without a recorded failure of their own."""
        try:
            store = self._client(5.0)
            keys = [f"{self.prefix}/hb/{r}" for r in range(self.world_size)]
            before = [store.add(k, 0) for k in keys]
            time.sleep(2.5 * self.interval)
            after = [store.add(k, 0) for k in keys]
            failed = {r for r in range(self.world_size)
                      if store.check([f"{self.prefix}/failed/{r}"])}
        except Exception as e:  # the store lives in the launcher or on rank 0
            return f"the rendezvous store is unreachable ({e}): rank 0 or the launcher died"
        silent = [r for r in range(self.world_size)
                  if after[r] == before[r] and r not in failed and r != self.rank]
        if not silent:
            return "every learner still has a heartbeat: one of them is hung or too slow"
        return ", ".join(f"rank {r}" for r in silent) + " stopped (died or was killed)"
