"""The cluster simulator: N learners in one process, in simulated time.

Each gossip member (a learner; for H-AD-PSGD a node of ``per_node`` learners, whose replicas are
equal; for SSGD one member holding all) is a flat parameter vector with an optimizer of its own;
one shared model object computes every gradient, the member's vector copied in first. The
averaging is the backends' own code: gradients are averaged with
:func:`asrtrain.distributed.allreduce.flatten_grads` / :func:`~asrtrain.distributed.allreduce.
mean_of_sum_`, gossip changes are :func:`asrtrain.distributed.gossip.gossip_change`, and rounds
follow :class:`asrtrain.distributed.topology.Schedule`. The times of steps and rounds come from
the speed model (:mod:`.speeds`) and the gossip thread's rules (:mod:`.timing`); events are
applied in time order.

A step takes its gradient at its member's model when it starts and applies it when it ends, as
on a real learner, so gossip that lands during a step is kept under the step's update. What is
simplified, and why: an exchange reads both partners' models when both reached it (the real
thread sends the model it had at the round's start, the lag being the partner's wait), which
keeps N model copies, plus per member its optimizer state, the change of its round in flight (as
the real thread holds) and the gradient of its step under way; with zero learning rate this does
not matter and a round is exactly the backends' ``W_r``. docs/science.md measures the rest.
The learning rate follows each member's count of global samples, known through the counters that
ride along every exchange (a vector clock, as the real gossip does), made exact at each drain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from asrtrain import AsrtrainError
from asrtrain.distributed.allreduce import flatten_grads, mean_of_sum_
from asrtrain.distributed.gossip import gossip_change
from asrtrain.distributed.registry import SimShape, sim_shape
from asrtrain.distributed.topology import Schedule, spectral_gap
from asrtrain.simulate import speeds
from asrtrain.simulate.timing import (
    APPLY,
    EXCHANGE,
    LOG,
    START,
    STEP,
    GossipClock,
    LinkCosts,
    Network,
    StepTime,
    gossip_events,
    placement,
    step_events,
    step_starts,
    step_time,
    sync_segments,
)

log = logging.getLogger(__name__)


class Workload(Protocol):
    """What is trained: the real task (:mod:`.workload`) or a synthetic one (tests)."""

    model: torch.nn.Module

    def epoch_steps(self, epoch: int, world: int) -> int: ...

    def batches(self, epoch: int, rank: int, world: int) -> Iterator[Any]: ...

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor: ...

    def samples(self, batch: Any) -> int: ...

    def heldout_loss(self, model: torch.nn.Module) -> float: ...

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer: ...

    def lr(self, global_samples: int) -> float: ...


@dataclass(frozen=True)
class SimConfig:
    """A simulated cluster: ``learners`` running ``backend`` (``per_node`` learners a node for
    hadpsgd) with the gossip ``topology``, for ``epochs`` epochs, at the speeds of ``speed``
    (:mod:`.speeds`: ``step_s`` seconds a step, ±``jitter``); a pairwise exchange takes
    ``exchange_s``, an idle gossip thread starts a round every ``idle_s``. A point of the
    trajectory every ``log_every`` rounds (SSGD: steps). ``sync_every`` > 0: all learners wait
    for each other and drain gossip every ``sync_every`` global steps (the real trainer did so at
    each ``trainer.log_every`` before issue 23); 0: at epoch ends only, as the real trainer
    does. ``read_at_start``: a step's gradient is taken at the model its member has when the
    step starts, and applied when it ends, as on a real learner (one more vector per member);
    False: both when it ends."""

    learners: int
    backend: str = "adpsgd"
    per_node: int = 1
    topology: str = "random_ring"
    delay_by_one: bool = False
    epochs: int = 1
    seed: int = 1
    speed: str = "equal"
    step_s: float = 1.0
    jitter: float = 0.0
    exchange_s: float = 0.0
    idle_s: float = 0.1
    grad_clip: float = 0.0
    log_every: int = 1
    sync_every: int = 0
    read_at_start: bool = True
    bandwidth: float = 0.0
    latency_s: float = 0.0
    nodes: int = 0

    def time_model(self, model_bytes: float) -> StepTime | None:
        """With ``bandwidth`` > 0 (bytes/s of a node's NIC; ``latency_s`` a message) the time
        model of :func:`~asrtrain.simulate.timing.step_time` sets the times: ``step_s`` is the
        compute, the sync group's allreduce is added to every step and an exchange costs what
        ``model_bytes`` cost on the network (``exchange_s`` is then unused). ``nodes``: the
        machines (default: one per member of a node-synchronous backend, else one per learner).
        None without a bandwidth."""
        if not self.bandwidth > 0:
            return None
        shape = self.shape()
        members = self.members()
        phases = len(Schedule(members, self.topology, self.seed).phases(0)) if members > 1 else 0
        return step_time(shape, self.learners, self.per_node, self.machines(), self.step_s,
                         model_bytes, self.network(), phases, self.delay_by_one)

    def network(self) -> Network:
        return Network(self.bandwidth, self.latency_s)

    def machines(self) -> int:
        """``nodes``, or one machine per member of a node-synchronous backend, else one per
        learner."""
        return self.nodes or (self.members() if self.shape().sync == "node" else self.learners)

    def link_costs(self, model_bytes: float) -> LinkCosts | None:
        """Each gossip exchange's seconds from where its pair sits (:class:`~asrtrain.simulate.
        timing.LinkCosts`), with the time model; None without it."""
        if not self.bandwidth > 0:
            return None
        return LinkCosts(self.network(), model_bytes,
                         placement(self.members(), self.machines()))

    def shape(self) -> SimShape:
        """What the backend declares to the registry (:class:`~asrtrain.distributed.registry.
        SimShape`); an unregistered backend is refused naming the registered ones."""
        return sim_shape(self.backend)

    def members(self) -> int:
        """Simulated members: learners (adpsgd), nodes (hadpsgd), one (ssgd), as the backend's
        shape says."""
        return self.shape().members(self.learners, self.per_node)

    def per_member(self) -> int:
        return self.learners // self.members()

    def check(self) -> None:
        shape = self.shape()
        if self.learners < 1:
            raise AsrtrainError(f"simulate: learners={self.learners}: need at least one")
        if shape.sync == "node" and (self.per_node < 1 or self.learners % self.per_node):
            raise AsrtrainError(f"simulate: per_node={self.per_node} does not divide the "
                                f"{self.learners} learners into nodes")
        for key in ("step_s", "idle_s"):
            if not getattr(self, key) > 0:
                raise AsrtrainError(f"simulate: {key}={getattr(self, key)}: must be positive")
        for key in ("bandwidth", "latency_s", "nodes"):
            if getattr(self, key) < 0:
                raise AsrtrainError(f"simulate: {key}={getattr(self, key)}: must not be "
                                    "negative")
        speeds.learner_factors(self.speed, self.learners, self.seed)  # a bad spec, before any work


@dataclass
class Trajectory:
    """What a simulation logs: a point per ``log_every`` rounds (or steps), one per epoch."""

    config: dict
    points: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


class Simulator:
    """Runs :class:`SimConfig` on a :class:`Workload`; :meth:`run` returns the trajectory.

    ``initial(member)`` gives a member's starting vector (default: every member starts from the
    workload's model, as ``trainer.sync_init`` does)."""

    def __init__(self, cfg: SimConfig, work: Workload,
                 initial: Callable[[int], torch.Tensor] | None = None) -> None:
        cfg.check()
        self.cfg, self.work = cfg, work
        self.params = [p for p in work.model.parameters() if p.requires_grad]
        start = torch.nn.utils.parameters_to_vector(self.params).detach()
        g = cfg.members()
        self.x = [torch.nn.Parameter((initial(m) if initial else start).detach().clone())
                  for m in range(g)]
        self.optimizers = [work.make_optimizer([x]) for x in self.x]
        self.pending = [torch.zeros_like(start) if g > 1 else None for _ in range(g)]
        self.scratch = torch.empty_like(start)
        self.counts = np.zeros((g, g), dtype=np.int64)  # member i's knowledge of j's samples
        self.schedule = Schedule(g, cfg.topology, cfg.seed)
        self.factors = speeds.learner_factors(cfg.speed, cfg.learners, cfg.seed)
        self.clock = GossipClock()
        self.now = 0.0
        self.steps_done = 0  # steps every member took in the epochs before
        self.samples = 0
        self.losses: list[float] = []
        self.grads: dict[int, tuple[torch.Tensor, int, float]] = {}  # steps under way
        nbytes = sum(p.numel() * p.element_size() for p in self.params)
        self.timing = cfg.time_model(nbytes)
        self.step_s = cfg.step_s + (self.timing.allreduce_s if self.timing else 0.0)
        self.exchange_s = cfg.link_costs(nbytes) or cfg.exchange_s
        self.traj = Trajectory(config={**asdict(cfg), "members": g,
                                       "spectral_gap": self._gap(),
                                       "time_model": asdict(self.timing) if self.timing
                                       else None})

    def _gap(self) -> float | None:
        if self.cfg.members() < 2:
            return None
        return spectral_gap(self.cfg.learners, self.cfg.topology, self.cfg.per_member(),
                            self.cfg.seed)

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> Trajectory:
        cfg = self.cfg
        steps = [self.work.epoch_steps(e, cfg.learners) for e in range(1, cfg.epochs + 1)]
        bar = tqdm(total=sum(steps) * cfg.members(), desc="simulate", unit="step",
                   disable=None, leave=False)
        wall = time.perf_counter()
        for epoch in range(1, cfg.epochs + 1):
            self._epoch(epoch, steps[epoch - 1], bar)
        bar.close()
        self.traj.config["wall_s"] = time.perf_counter() - wall
        return self.traj

    def _epoch(self, epoch: int, steps: int, bar: tqdm) -> None:
        cfg, k = self.cfg, self.cfg.per_member()
        times = speeds.step_times(self.factors, steps, self.step_s, cfg.jitter, cfg.seed, epoch)
        # A member's step waits for the slowest of its learners (their gradient allreduce).
        member_times = times.reshape(cfg.members(), k, steps).max(axis=1)
        iters = [self.work.batches(epoch, r, cfg.learners) for r in range(cfg.learners)]
        for lo, hi in sync_segments(steps, self.steps_done, cfg.sync_every):
            ends = [self.now + np.cumsum(row[lo:hi]) for row in member_times]
            starts = [np.concatenate(([self.now], e[:-1])) for e in ends]  # exactly the ends
            self._segment(ends, starts, lo, iters, bar)
        self.steps_done += steps
        self._end_epoch(epoch)

    def _segment(self, ends: list[np.ndarray], starts: list[np.ndarray], first: int,
                 iters: list[Iterator], bar: tqdm) -> None:
        """The steps between two points where all learners wait (drained gossip), in order."""
        cfg, k = self.cfg, self.cfg.per_member()
        events = step_events(ends, first)
        if cfg.read_at_start:
            events += step_starts(starts, first)
        end = max(float(e[-1]) for e in ends)
        if cfg.members() > 1:
            gossip, end = gossip_events(self.schedule, ends, self.now, self.clock,
                                        cfg.delay_by_one, cfg.idle_s, self.exchange_s,
                                        cfg.log_every)
            events += gossip
        events.sort()
        for t, _r, _p, kind, a, b in events:
            if kind == START:
                self._gradient(a, iters[a * k:(a + 1) * k])
            elif kind == STEP:
                if not cfg.read_at_start:
                    self._gradient(a, iters[a * k:(a + 1) * k])
                self._update(a, t, b)
                bar.update()
            elif kind == EXCHANGE:
                self._exchange(a, b)
            elif kind == APPLY:
                self._apply(a)
            elif kind == LOG:
                self._point(t, rounds=a)
        # The drain also shares every member's own count (drain_gossip): all know them exactly.
        self.counts[:] = np.diag(self.counts).copy()
        self.now = end

    # -- events ----------------------------------------------------------------------------------
    def _load(self, member: int) -> None:
        """Put the member's vector into the shared model."""
        torch.nn.utils.vector_to_parameters(self.x[member].detach(), self.params)

    def _gradient(self, m: int, learners: list[Iterator]) -> None:
        """The gradient of member ``m``'s step at its model now: its learners' gradients
        averaged (the allreduce's arithmetic), and the learning rate at its own count of global
        samples (the trainer sets it before the forward pass); kept until :meth:`_update`."""
        model = self.work.model
        self._load(m)
        total, samples = None, 0
        for it in learners:
            batch = next(it)
            model.zero_grad(set_to_none=False)
            loss = self.work.loss(model, batch)
            loss.backward()
            grad = flatten_grads(self.params)
            total = grad if total is None else total.add_(grad)
            self.losses.append(float(loss.detach()))
            samples += int(self.work.samples(batch))
        self.grads[m] = (mean_of_sum_(total, len(learners)), samples,
                         self.work.lr(int(self.counts[m].sum())))

    def _update(self, m: int, t: float, index: int) -> None:
        """The end of member ``m``'s step: its gradient clipped and its own optimizer's step,
        applied to its model as it is now (gossip may have changed it since the gradient)."""
        x = self.x[m]
        x.grad, samples, lr = self.grads.pop(m)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([x], self.cfg.grad_clip)
        opt = self.optimizers[m]
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        x.grad = None
        self.counts[m, m] += samples
        self.samples += samples
        if self.cfg.members() == 1 and (index + 1) % self.cfg.log_every == 0:
            self._point(t, steps=index + 1, lr=lr)

    def _exchange(self, i: int, j: int) -> None:
        """A pairwise exchange of a round: each side's change (the gossip thread's arithmetic)
        joins its round's pending change; the sample counters merge."""
        xi, xj = self.x[i].detach(), self.x[j].detach()
        self.pending[i] += gossip_change(xi, [xj], self.schedule.weight, scratch=self.scratch)
        self.pending[j] += gossip_change(xj, [xi], self.schedule.weight, scratch=self.scratch)
        merged = np.maximum(self.counts[i], self.counts[j])
        self.counts[i], self.counts[j] = merged, merged

    def _apply(self, m: int) -> None:
        with torch.no_grad():
            self.x[m].add_(self.pending[m])
        self.pending[m].zero_()

    # -- measurements ----------------------------------------------------------------------------
    def consensus(self) -> torch.Tensor:
        """The average model (every member stands for the same number of learners)."""
        return torch.stack([x.detach().double() for x in self.x]).mean(0)

    def distance(self) -> float:
        """Mean over learners of ``||x_i - x_bar|| / ||x_bar||`` (as the backends report)."""
        avg = self.consensus()
        norm = float(avg.norm())
        dists = [float((x.detach().double() - avg).norm()) for x in self.x]
        return sum(dists) / len(dists) / max(norm, 1e-30)

    def _point(self, t: float, **extra: float) -> None:
        loss = float(np.mean(self.losses)) if self.losses else None  # none since the last
        self.losses = []
        point = {"time": t, "samples": self.samples, "loss": loss, "distance": self.distance(),
                 **extra}
        self.traj.points.append(point)
        log.debug("simulate: %s", point)

    def _end_epoch(self, epoch: int) -> None:
        distance = self.distance()
        state = self.consensus().to(self.x[0].dtype)
        torch.nn.utils.vector_to_parameters(state, self.params)
        self.work.model.eval()
        with torch.no_grad():
            heldout = self.work.heldout_loss(self.work.model)
        self.work.model.train()
        row = {"epoch": epoch, "time": self.now, "samples": self.samples,
               "heldout_loss": heldout, "distance": distance, "rounds": self.clock.rounds}
        self.traj.epochs.append(row)
        log.info("simulate epoch %d: held-out loss %.4f, consensus distance %.2e, "
                 "simulated time %.1f s, %d samples, %d gossip rounds", epoch, heldout, distance,
                 self.now, self.samples, self.clock.rounds)

    def final_state(self) -> dict[str, torch.Tensor]:
        """The consensus model's state dict (after :meth:`run`)."""
        torch.nn.utils.vector_to_parameters(self.consensus().to(self.x[0].dtype), self.params)
        return {k: v.detach().clone() for k, v in self.work.model.state_dict().items()}
