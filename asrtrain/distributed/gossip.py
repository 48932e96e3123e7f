"""The gossip of AD-PSGD: a background thread that averages a learner's model with its neighbours'.

    x_i <- x_i + w * sum_{j in round r} (x_j^(r) - x_i^(r))

Lian et al., "Asynchronous Decentralized Parallel Stochastic Gradient Descent", ICML 2018; the
randomized ring and delay-by-one of Zhang, Cui, Kingsbury et al., ICASSP 2020 / TASLP 2021.
``x^(r)`` are the models both partners had when round ``r`` started; the round's change is added
to the *current* model under the model lock, so gradient steps taken during an exchange are kept
and the average over learners is unchanged by gossip. The thread has its own process group (one
process group must never be used from two threads): gloo over host copies of the parameters
(page-locked for a GPU model), or NCCL between GPUs (``wire="nccl"``, below). Rounds follow
``topology.Schedule`` (matchings in a shared order: deadlock-free). A round starts after each
local step, or after ``idle_s`` without one, so a slow learner still answers its neighbours and
never holds up their computation. With ``delay_by_one`` a round's messages are posted and applied
at the next round, so the network wait overlaps the next step. Sample counters ride along every
exchange (element-wise max), so each member knows the global progress that drives the LR.

For a GPU model the copies out and the updates in are queued on a CUDA stream of the gossip
thread's own, ordered against the optimizer steps by events (:mod:`.streams`): the main thread
never waits for a copy, and the exchange runs while the next steps compute. On the CPU the same
code runs with a null stream object and gives the results the thread always gave.

NCCL gossip (``wire="nccl"``, for nodes of several GPUs) sends and receives from device memory on
an NCCL communicator of its own; each pair's send and receive are issued together
(``batch_isend_irecv``) and pairs in the schedule's order, so both sides match. It cannot run with
one GPU: NCCL refuses two ranks on one device ("Duplicate GPU detected"), so it was never run
here; see docs/architecture.md ("NCCL") for what is and is not known of its safety.

Used by adpsgd (every learner a member, changes applied by the thread) and hadpsgd (node leaders
are members; the changes are handed to the main thread to share inside the node).
:func:`drain_gossip` brings all members to the same round with nothing in flight, which
consensus, checkpoints and shutdown need, and makes every member's sample counters exact (the
exchanges alone miss a member's steps after its last one).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.comm import Comm, add_flat_, common_dtype, copy_flat_
from asrtrain.distributed.streams import NullStream
from asrtrain.distributed.topology import Schedule

#: How gossip messages travel: ``gloo`` (host memory; any device) or ``nccl`` (GPU memory).
WIRES = ("gloo", "nccl")


@dataclass
class _Posted:
    """The messages of one round in flight: one (partner, works, recv buffer) per exchange
    (``works`` is empty once waited for: a gloo Work must be waited on once only)."""

    round: int
    snapshot: torch.Tensor
    exchanges: list[tuple[int, list[dist.Work], torch.Tensor]]


def gossip_group_backend(kind: str, device: torch.device) -> str:
    """The process-group backend of a gossip group for learners on ``device``: ``kind`` (one of
    :data:`WIRES`, ``trainer.gossip_backend``) where it can run there."""
    if kind not in WIRES:
        raise AsrtrainError(f"trainer.gossip_backend={kind!r}: use one of {', '.join(WIRES)}")
    if kind == "nccl" and device.type != "cuda":
        raise AsrtrainError("trainer.gossip_backend=nccl needs learners on GPUs (this one is on "
                            f"{device}); use gloo")
    if kind == "nccl" and not dist.is_nccl_available():
        raise AsrtrainError("trainer.gossip_backend=nccl: this torch has no NCCL; use gloo")
    return kind


def start_gossip_group(comm: Comm, group: dist.ProcessGroup, kind: str) -> None:
    """Before the gossip thread starts, on every member's main thread: for NCCL, one collective
    of all members, because the first call of batched point-to-point operations in a group must
    involve all its ranks (torch's ``batch_isend_irecv``); it also builds the communicator."""
    if kind == "nccl":
        comm.wait(dist.all_reduce(torch.zeros(1, device=comm.device), group=group,
                                  async_op=True), "gossip group start")


class _Wire:
    """Where a gossip message lives and how a pair exchanges it (:data:`WIRES`)."""

    def __init__(self, kind: str, group: dist.ProcessGroup, streams: NullStream) -> None:
        if kind not in WIRES:
            raise AsrtrainError(f"gossip: unknown wire {kind!r} (one of {', '.join(WIRES)})")
        if kind == "nccl" and streams.device.type != "cuda":
            raise AsrtrainError("gossip: the nccl wire needs the model on a GPU")
        self.kind = kind
        self.group = group
        self.device = streams.device if kind == "nccl" else torch.device("cpu")
        self.pin_memory = kind == "gloo" and streams.pin_memory
        self._buffers: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The buffer ``name``, kept from round to round: a round is finished before the next is
        posted, so its buffers are free again. Reused, the messages of a 42.6M-parameter model
        (4 x 170 MB) cost no allocation (pinned memory's is slow) nor first-touch page faults."""
        buf = self._buffers.get(name)
        if buf is None or buf.numel() != numel or buf.dtype != dtype:
            buf = torch.empty(numel, dtype=dtype, device=self.device, pin_memory=self.pin_memory)
            self._buffers[name] = buf
        return buf

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int,
                 phase: int) -> list[dist.Work]:
        """Post one pair's send and receive; the works to wait for, the receive's first."""
        if self.kind == "gloo":
            ws = dist.isend(send, dst=peer, group=self.group, tag=phase)
            wr = dist.irecv(recv, src=peer, group=self.group, tag=phase)
            return [wr, ws]
        # NCCL has no tags and a lone send waits for its receive: both go in one group call,
        # and both partners post their pairs in the schedule's order.
        return dist.batch_isend_irecv([dist.P2POp(dist.irecv, recv, peer, self.group),
                                       dist.P2POp(dist.isend, send, peer, self.group)])


class Gossip:
    """The gossip thread of one learner (or one node leader) and its bookkeeping.

    Args:
        comm: this learner's communication (timeout, error naming).
        lock: the model lock, held by the main thread around optimizer steps.
        params: the parameters to average.
        group: a gloo process group used by this thread only.
        ranks: global rank of each gossip member, indexed by member number.
        me: this learner's member number.
        schedule: the shared round schedule over ``len(ranks)`` members.
        apply_in_thread: add a round's change to ``params`` at once (AD-PSGD); otherwise keep it
            in :meth:`take_pending` for the main thread to share inside the node (H-AD-PSGD).
        streams: how copies are ordered against the optimizer steps (:mod:`.streams`; the
            backend's, whose ``before_update``/``after_update`` bracket its steps); None: the
            null stream (CPU).
        wire: ``gloo`` (``group`` is gloo) or ``nccl`` (``group`` is NCCL; GPU models).
    """

    def __init__(self, comm: Comm, lock: threading.Lock, params: list[torch.Tensor],
                 group: dist.ProcessGroup, ranks: list[int], me: int, schedule: Schedule,
                 delay_by_one: bool, idle_s: float, apply_in_thread: bool,
                 streams: NullStream | None = None, wire: str = "gloo") -> None:
        self.comm = comm
        self.streams = streams if streams is not None else NullStream()
        self.wire = _Wire(wire, group, self.streams)
        self.lock = lock
        self.params = params
        self.group = group
        self.ranks = ranks
        self.me = me
        self.schedule = schedule
        self.timeout = comm.timeout
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
        self.arrived = False         # at an epoch's end, waiting for the others (drain_gossip)
        self.limit: int | None = None
        self.stop = False
        self.error: AsrtrainError | None = None
        self.exchanges = 0           # completed pairwise exchanges (for tests and logs)
        #: Seconds the thread spent copying the model out (lock and copy), waiting for its
        #: partners' messages, and computing and applying the changes (logs, bench/run.py).
        self.seconds = {"copy": 0.0, "wait": 0.0, "apply": 0.0}
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

    def own_count(self) -> int:
        """The samples of this member's own steps."""
        with self.cond:
            return int(self.counts[self.me])

    def merge_counts(self, counts: torch.Tensor) -> None:
        """Merge members' counts (indexed as ``ranks``) into the vector clock, by max."""
        with self.cond:
            torch.maximum(self.counts, counts.to(self.counts.dtype), out=self.counts)

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

    def arrive(self) -> None:
        """This learner's share of the epoch is done and it waits for the others: rounds go on
        at the idle pace, even if it took no step (a partner's rounds would wait for it)."""
        with self.cond:
            self.arrived = True
            self.cond.notify_all()

    def hold_and_count(self) -> int:
        """Stop starting rounds and return how many were started (first half of a drain)."""
        with self.cond:
            self.hold = True
            self.arrived = False
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
                    raise self.comm.fail(
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
        if self.hold or (self.steps == 0 and not self.arrived):
            return False  # before the first step the models are still as setup() left them
        return self.steps > last_steps or time.monotonic() - last_time >= self.idle_s

    def _run(self) -> None:
        try:
            with self.streams.thread():
                self._rounds()
        except Exception as e:  # noqa: BLE001 - handed to the main thread, which raises it
            bad = None
            if isinstance(e, _PeerError):
                bad, e = e.peer, e.cause
            err = self.comm.fail(f"gossip exchange (round {self.rounds - 1})", e, peer=bad)
            with self.cond:
                self.error = err
                self.idle = True
                self.cond.notify_all()

    def _rounds(self) -> None:
        posted: _Posted | None = None
        last_steps, last_time = 0, time.monotonic()
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

    def _snapshot(self, x: torch.Tensor) -> torch.Tensor:
        """Copy the model (with the change not yet shared, H-AD-PSGD) into ``x``; the counters.

        Under the model lock only the copy is queued (on a GPU: on the side stream, after the
        last step); the main thread's next step waits for it on the GPU, not on the host.
        """
        start = time.perf_counter()
        with self.lock:
            with self.streams.side():
                copy_flat_(self.params, x)
            pending = None if self.apply_in_thread else self.pending.clone()
        self.streams.synchronize()
        if pending is not None:
            x += pending.to(x.device)
        self.seconds["copy"] += time.perf_counter() - start
        with self.cond:
            return self.counts.clone()

    def _post(self, r: int) -> _Posted:
        n = len(self.ranks)
        # One message per exchange: the counters, then the parameters (8-byte aligned); the
        # snapshot is copied straight into it.
        size = 8 * n + self.numel * self.dtype.itemsize
        send = self.wire.buffer("send", size, torch.uint8)
        x = send[8 * n :].view(self.dtype)
        send[: 8 * n].view(torch.int64).copy_(self._snapshot(x))
        exchanges = []
        for phase, partner in enumerate(self.schedule.partners(self.me, r)):
            if partner is None:
                continue
            peer = self.ranks[partner]
            recv = self.wire.buffer(f"recv{phase}", size, torch.uint8)
            try:
                works = self.wire.exchange(send, recv, peer, phase)
            except Exception as e:  # noqa: BLE001
                raise _PeerError(peer, e) from e
            if not self.delay_by_one:
                # One neighbour at a time: this pair finishes before the next phase starts.
                self._wait(peer, works)
                works = []
            exchanges.append((peer, works, recv))
        return _Posted(r, x, exchanges)

    def _wait(self, peer: int, works: list[dist.Work]) -> None:
        start = time.perf_counter()
        try:
            for work in works:
                work.wait(timeout=self.timeout)
        except Exception as e:  # noqa: BLE001
            raise _PeerError(peer, e) from e
        self.seconds["wait"] += time.perf_counter() - start

    def _finish(self, posted: _Posted) -> None:
        start, waited = time.perf_counter(), self.seconds["wait"]
        n = len(self.ranks)
        received = []
        counts = None
        for peer, works, recv in posted.exchanges:
            self._wait(peer, works)
            received.append(recv[8 * n :].view(self.dtype))
            c = recv[: 8 * n].view(torch.int64).cpu()
            counts = c.clone() if counts is None else torch.maximum(counts, c)
        if posted.exchanges:
            self._apply(gossip_change(posted.snapshot, received, self.schedule.weight,
                                      out=self.wire.buffer("delta", self.numel, self.dtype),
                                      scratch=self.wire.buffer("diff", self.numel, self.dtype)))
        self.seconds["apply"] += time.perf_counter() - start - (self.seconds["wait"] - waited)
        with self.cond:
            if counts is not None:
                counts[self.me] = self.counts[self.me]  # our own count is always the newest
                torch.maximum(self.counts, counts, out=self.counts)
            self.exchanges += len(posted.exchanges)

    def _apply(self, delta: torch.Tensor) -> None:
        """Add a round's change to the model (AD-PSGD) or to the pending change (H-AD-PSGD).

        On a GPU the change is uploaded on the side stream before the model lock is taken; the
        addition is queued after the last step, and the next step waits for it on the GPU.
        """
        if self.apply_in_thread:
            delta = delta.to(self.streams.device, non_blocking=True)
            with self.lock, self.streams.side():
                add_flat_(self.params, delta)
        else:
            delta = delta.to(self.pending.device)
            with self.lock:
                self.pending += delta
                self.has_pending = True
        self.streams.synchronize()  # the buffers may go; the thread is idle only when done


def gossip_change(snapshot: torch.Tensor, received: list[torch.Tensor], weight: float,
                  out: torch.Tensor | None = None,
                  scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``w * sum_j (x_j^(r) - x_i^(r))``: the change one round makes to a member whose model was
    ``snapshot`` when the round started, from its partners' models of then (``received``, in
    the schedule's phase order). The one place this arithmetic lives: the gossip thread and the
    cluster simulator (:mod:`asrtrain.simulate`) both call it, so they cannot drift apart.
    ``out`` and ``scratch`` are reused buffers (allocated when None)."""
    delta = out.zero_() if out is not None else torch.zeros_like(snapshot)
    for x in received:
        delta += torch.sub(x, snapshot, out=scratch) if scratch is not None else x - snapshot
    delta *= weight
    return delta


@dataclass(frozen=True)
class DrainFigures:
    """What one :func:`drain_gossip` took (the epoch summary's ``gossip_*`` figures; the time
    model of :mod:`asrtrain.simulate.timing` takes ``hold_s`` from them).

    ``hold_s``: seconds from the last learner's arrival to the hold, the barrier's own time (the
    least any learner waited in it: the last to arrive waits only for the barrier). Arrived
    learners go on counting rounds until then. ``rounds``: the round every member ran up to (the
    maximum started at the hold). ``drain_s``: this learner's seconds from the hold until nothing
    was in flight."""

    hold_s: float
    rounds: int
    drain_s: float


def drain_summary(figures: DrainFigures | None) -> dict[str, float]:
    """A backend's :meth:`~asrtrain.distributed.backend.Backend.drain_figures` from its last
    drain (none yet: empty)."""
    if figures is None:
        return {}
    return {"gossip_hold_s": figures.hold_s, "gossip_rounds": float(figures.rounds),
            "gossip_drain_s": figures.drain_s}


class _PeerError(Exception):
    def __init__(self, peer: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.peer = peer
        self.cause = cause


def drain_gossip(comm: Comm, gossip: Gossip | None) -> DrainFigures:
    """Finish every round started anywhere and stop gossip until ``gossip.release()``;
    collective over all learners (a learner without a gossip thread passes None).

    First all learners arrive, their gossip still running: a learner whose share of the epoch
    is done keeps answering its partners' rounds (its thread's idle trigger) while the others
    finish theirs. Held at once, it would stall every round that pairs it, and with claimed
    epochs (a fast learner's share ends first) the others' averaging for the rest of the epoch
    (measured with a learner that claimed nothing: 8 hybrid learners, 0.4 exchanges/s, consensus
    distance 0.29-0.61, held-out loss 1.40; with the fix and blocks for all, 35-56 exchanges/s,
    0.04-0.06, 1.005). Then each member stops starting rounds and says how many it started; all run
    up to the maximum, so every exchange a partner posted is answered, and wait until nothing is
    in flight. Returns what it took (:class:`DrainFigures`, the same ``hold_s`` and ``rounds``
    on every learner).
    """
    if gossip is not None:
        gossip.arrive()
    arrived = time.monotonic()
    comm.barrier("gossip drain: every learner at the epoch's end")
    held = time.monotonic()
    started = gossip.hold_and_count() if gossip is not None else 0
    limit = comm.allreduce_int(started, "gossip drain", op=dist.ReduceOp.MAX)
    if gossip is not None:
        gossip.drain_to(limit, comm.timeout.total_seconds())
    drained = time.monotonic()
    # The sample counters ride along the exchanges, so a member's last steps after its last
    # exchange are unknown to the others: the drained learners (where an epoch ends) share
    # their own counts, and every member's global count is exact there. The same collective
    # carries the barrier's wait (negated, in microseconds: the maximum is the least wait).
    own = torch.zeros(comm.world_size + 1, dtype=torch.int64)
    if gossip is not None:
        own[comm.rank] = gossip.own_count()
    own[-1] = -round((held - arrived) * 1e6)
    own = comm.allreduce(own, "gossip sample counts", op=dist.ReduceOp.MAX)
    if gossip is not None:
        gossip.merge_counts(own[:-1][gossip.ranks])
    return DrainFigures(hold_s=-int(own[-1]) / 1e6, rounds=limit, drain_s=drained - held)
