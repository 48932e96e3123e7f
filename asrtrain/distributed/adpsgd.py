"""Asynchronous decentralized parallel SGD (AD-PSGD): local steps plus background pairwise gossip.

    compute thread:   x_i <- x_i - lr(s) * m_i,   m_i the learner's own (local) momentum buffer
    gossip thread:    x_i <- x_i + w * sum_{j in round r} (x_j^(r) - x_i^(r))

Lian et al., "Asynchronous Decentralized Parallel Stochastic Gradient Descent", ICML 2018; for
speech, Zhang et al., "Distributed deep learning strategies for automatic speech recognition",
ICASSP 2019, and Zhang, Cui, Kingsbury et al., ICASSP 2020 / TASLP 2021 (randomized ring,
delay-by-one). ``x^(r)`` are the models both partners had when round ``r`` started; the round's
change is added to the *current* model under the model lock, so gradient steps taken during an
exchange are kept and the average over learners is unchanged by gossip. The gossip thread has its
own gloo process group over CPU copies (one process group must never be used from two threads);
rounds follow ``topology.Schedule`` (matchings in a shared order: deadlock-free). A round starts
after each local step, or after ``idle_s`` without one, so a slow learner still answers its
neighbours and never holds up their computation. With ``delay_by_one`` a round's messages are
posted and applied at the next round, so the network wait overlaps the next step and a learner
averages with its neighbours' models of the previous round. The LR schedule follows ``s``, the
samples of all learners, known through counters that ride along every exchange (element-wise max).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import (
    DistributedBackend,
    Liveness,
    add_flat_,
    common_dtype,
    flat_params,
)
from asrtrain.distributed.topology import Schedule, describe


@dataclass
class _Posted:
    """The messages of one round in flight: one (partner, send, recv, buffer) per exchange."""

    round: int
    snapshot: torch.Tensor
    exchanges: list[tuple[int, dist.Work | None, dist.Work | None, torch.Tensor]]


class Gossip:
    """The gossip thread of one learner (or one node leader) and its bookkeeping.

    Args:
        backend: the owning backend (model lock, error naming).
        params: the parameters to average.
        group: a gloo process group used by this thread only.
        ranks: global rank of each gossip member, indexed by member number.
        me: this learner's member number.
        schedule: the shared round schedule over ``len(ranks)`` members.
        apply_in_thread: add a round's change to ``params`` at once (AD-PSGD); otherwise keep it
            in :meth:`take_pending` for the main thread to share inside the node (H-AD-PSGD).
    """

    def __init__(self, backend: DistributedBackend, params: list[torch.Tensor],
                 group: dist.ProcessGroup, ranks: list[int], me: int, schedule: Schedule,
                 timeout: timedelta, delay_by_one: bool, idle_s: float,
                 apply_in_thread: bool) -> None:
        self.backend = backend
        self.params = params
        self.group = group
        self.ranks = ranks
        self.me = me
        self.schedule = schedule
        self.timeout = timeout
        self.delay_by_one = delay_by_one
        self.idle_s = idle_s
        self.apply_in_thread = apply_in_thread
        self.dtype = common_dtype(params)
        self.numel = sum(p.numel() for p in params)
        n = len(ranks)
        #: Samples known to have been used by each member (a vector clock, merged by max).
        self.counts = torch.zeros(n, dtype=torch.int64)
        self.pending = torch.zeros(self.numel, dtype=self.dtype)
        self.has_pending = False
        self.cond = threading.Condition()
        self.steps = 0               # local steps notified by the main thread
        self.rounds = 0              # rounds started by the thread
        self.idle = True             # the thread waits for its next round
        self.inflight = False        # delay-by-one: a posted round is not yet applied
        self.hold = False            # the main thread is agreeing on a drain limit
        self.limit: int | None = None
        self.stop = False
        self.error: AsrtrainError | None = None
        self.exchanges = 0           # completed pairwise exchanges (for tests and logs)
        self._thread = threading.Thread(target=self._run, name="asrtrain-gossip", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- main thread -----------------------------------------------------------------------------
    def notify_step(self, samples: int) -> None:
        with self.cond:
            self.steps += 1
            self.counts[self.me] += int(samples)
            self.cond.notify_all()

    def global_samples(self) -> int:
        with self.cond:
            return int(self.counts.sum())

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def take_pending(self) -> torch.Tensor | None:
        """The change gossip made since the last call (None if none); call under the model lock."""
        if not self.has_pending:
            return None
        out = self.pending.clone()
        self.pending.zero_()
        self.has_pending = False
        return out

    def hold_and_count(self) -> int:
        """Stop starting rounds and return how many were started (first half of a drain)."""
        with self.cond:
            self.hold = True
            return self.rounds

    def drain_to(self, limit: int, timeout_s: float) -> None:
        """Run rounds up to ``limit`` (the maximum over learners), apply them, then wait idle."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            self.limit = limit
            self.hold = False
            self.cond.notify_all()
            while not (self.error or (self.idle and not self.inflight and self.rounds >= limit)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.backend.fail(
                        f"draining gossip to round {limit} (at round {self.rounds})",
                        TimeoutError(f"no progress for {timeout_s:.0f} s"))
                self.cond.wait(min(left, 1.0))
        self.check()

    def release(self) -> None:
        with self.cond:
            self.limit = None
            self.cond.notify_all()

    def shutdown(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        self._thread.join(timeout=self.timeout.total_seconds())

    # -- gossip thread ---------------------------------------------------------------------------
    def _may_start(self, r: int, last_steps: int, last_time: float) -> bool:
        if self.limit is not None:
            return r < self.limit
        if self.hold or self.steps == 0:
            return False  # before the first step the models are still as setup() left them
        return self.steps > last_steps or time.monotonic() - last_time >= self.idle_s

    def _run(self) -> None:
        posted: _Posted | None = None
        last_steps, last_time = 0, time.monotonic()
        try:
            while True:
                with self.cond:
                    while True:
                        if self.stop:
                            return
                        r = self.rounds
                        if posted is not None and self.limit is not None and r >= self.limit:
                            break  # drain: finish the round still in flight
                        if self._may_start(r, last_steps, last_time):
                            self.rounds += 1
                            self.idle = False
                            last_steps = self.steps
                            break
                        self.idle = True
                        self.cond.notify_all()
                        self.cond.wait(self.idle_s if self.limit is None else 1.0)
                    start_round = self.rounds > r
                last_time = time.monotonic()
                if not start_round:
                    assert posted is not None
                    self._finish(posted)
                    posted = None
                    with self.cond:
                        self.inflight = False
                    continue
                if self.delay_by_one:
                    # Apply the previous round (its messages travelled during the last step),
                    # then post this one: the averaging uses models one step old, never waits.
                    if posted is not None:
                        self._finish(posted)
                    posted = self._post(r)
                    with self.cond:
                        self.inflight = True
                else:
                    self._finish(self._post(r))
        except Exception as e:  # noqa: BLE001 - handed to the main thread, which raises it
            bad = None
            if isinstance(e, _PeerError):
                bad, e = e.peer, e.cause
            err = self.backend.fail(f"gossip exchange (round {self.rounds - 1})", e, peer=bad)
            with self.cond:
                self.error = err
                self.idle = True
                self.cond.notify_all()

    def _snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.backend.model_lock:
            x = flat_params(self.params, self.dtype)
            if not self.apply_in_thread:
                x += self.pending
        with self.cond:
            counts = self.counts.clone()
        return x, counts

    def _post(self, r: int) -> _Posted:
        x, counts = self._snapshot()
        n = len(self.ranks)
        # One message per exchange: the counters, then the parameters (8-byte aligned).
        send = torch.empty(8 * n + x.numel() * x.element_size(), dtype=torch.uint8)
        send[: 8 * n].view(torch.int64).copy_(counts)
        send[8 * n :].view(self.dtype).copy_(x)
        exchanges = []
        for phase, partner in enumerate(self.schedule.partners(self.me, r)):
            if partner is None:
                continue
            peer = self.ranks[partner]
            recv = torch.empty_like(send)
            try:
                ws = dist.isend(send, dst=peer, group=self.group, tag=phase)
                wr = dist.irecv(recv, src=peer, group=self.group, tag=phase)
            except Exception as e:  # noqa: BLE001
                raise _PeerError(peer, e) from e
            if not self.delay_by_one:
                # One neighbour at a time: this pair finishes before the next phase starts.
                # (A gloo Work must be waited on once only: a second wait hangs.)
                self._wait(peer, ws, wr)
                ws = wr = None
            exchanges.append((peer, ws, wr, recv))
        return _Posted(r, x, exchanges)

    def _wait(self, peer: int, ws: dist.Work, wr: dist.Work) -> None:
        try:
            wr.wait(timeout=self.timeout)
            ws.wait(timeout=self.timeout)
        except Exception as e:  # noqa: BLE001
            raise _PeerError(peer, e) from e

    def _finish(self, posted: _Posted) -> None:
        n = len(self.ranks)
        delta = torch.zeros_like(posted.snapshot)
        counts = None
        for peer, ws, wr, recv in posted.exchanges:
            if ws is not None and wr is not None:
                self._wait(peer, ws, wr)
            delta += recv[8 * n :].view(self.dtype) - posted.snapshot
            c = recv[: 8 * n].view(torch.int64)
            counts = c.clone() if counts is None else torch.maximum(counts, c)
        if posted.exchanges:
            delta *= self.schedule.weight
            with self.backend.model_lock:
                if self.apply_in_thread:
                    add_flat_(self.params, delta)
                else:
                    self.pending += delta
                    self.has_pending = True
        with self.cond:
            if counts is not None:
                counts[self.me] = self.counts[self.me]  # our own count is always the newest
                torch.maximum(self.counts, counts, out=self.counts)
            self.exchanges += len(posted.exchanges)


class _PeerError(Exception):
    def __init__(self, peer: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.peer = peer
        self.cause = cause


class ADPSGDBackend(DistributedBackend):
    """AD-PSGD over all learners (one gossip member per learner)."""

    name = "adpsgd"

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device,
                 timeout_s: float, liveness: Liveness | None, topology: str = "random_ring",
                 seed: int = 0, delay_by_one: bool = False, idle_s: float = 0.1,
                 sync_init: bool = True) -> None:
        super().__init__(rank, world_size, local_rank, device, timeout_s, liveness)
        self.topology = topology
        self.schedule = Schedule(world_size, topology, seed)
        self.delay_by_one = delay_by_one
        self.idle_s = idle_s
        self.sync_init = sync_init
        # Created on every rank at start, in the same order (see DESIGN.md on new_group).
        self.gossip_group = dist.new_group(list(range(world_size)), backend="gloo",
                                           timeout=self.timeout)
        self.gossip: Gossip | None = None

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              global_samples: int = 0) -> None:
        self.check_setup(model)
        self.start_samples = int(global_samples)
        if self.sync_init:
            self.broadcast_params(0, None, "initial model broadcast")
        # Everyone is set up before anyone gossips (a partner's first round waits otherwise).
        self.wait(dist.barrier(async_op=True), "setup barrier")
        self.gossip = Gossip(self, self.params, self.gossip_group, list(range(self.world_size)),
                             self.rank, self.schedule, self.timeout, self.delay_by_one,
                             self.idle_s, apply_in_thread=True)
        self.gossip.start()

    def _gossip(self) -> Gossip:
        if self.gossip is None:
            raise AsrtrainError(f"rank {self.rank}: backend used before setup()")
        return self.gossip

    def after_backward(self, step: int) -> None:
        self._gossip().check()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        with self.model_lock:
            optimizer.step()

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)
        g = self._gossip()
        g.check()
        g.notify_step(batch_samples)

    def global_samples(self) -> int:
        return self.start_samples + self._gossip().global_samples()

    def drain(self) -> None:
        """Agree on a last round with everyone, finish it, and stop gossip until release()."""
        g = self._gossip()
        started = g.hold_and_count()
        limit = self.allreduce_sum_max(started)
        g.drain_to(limit, self.timeout.total_seconds())

    def allreduce_sum_max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dev = self._comm_device()
        t = t.to(dev)
        self.wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True), "gossip drain")
        return int(t.cpu()[0])

    def consensus(self) -> dict[str, torch.Tensor]:
        self.drain()
        try:
            return self.average_state()
        finally:
            self._gossip().release()

    def consensus_distance(self) -> float:
        self.drain()
        try:
            return self.distance_to(self.average_state())
        finally:
            self._gossip().release()

    def reduce_mean(self, values: Mapping[str, float]) -> dict[str, float]:
        return super().reduce_mean(values)

    def describe(self) -> str:
        mode = ", delay-by-one" if self.delay_by_one else ""
        return (f"backend adpsgd{mode}: " + describe(self.world_size, self.topology, 1,
                                                      self.schedule.seed))

    def close(self) -> None:
        if self.gossip is not None:
            self.drain()
            self.gossip.shutdown()
            self.gossip = None
        self.close_group()
