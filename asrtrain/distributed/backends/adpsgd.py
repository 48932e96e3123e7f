"""Asynchronous decentralized parallel SGD (AD-PSGD): local steps plus background pairwise gossip.

    compute thread:   x_i <- x_i - lr(s) * m_i,   m_i the learner's own (local) momentum buffer
    gossip thread:    x_i <- x_i + w * sum_{j in round r} (x_j^(r) - x_i^(r))

Lian et al., "Asynchronous Decentralized Parallel Stochastic Gradient Descent", ICML 2018; for
speech, Zhang et al., "Distributed deep learning strategies for automatic speech recognition",
ICASSP 2019, and Zhang, Cui, Kingsbury et al., ICASSP 2020 / TASLP 2021 (randomized ring,
delay-by-one). Every learner is a member of one :class:`asrtrain.distributed.gossip.Gossip` over
all learners, whose thread applies each round's change to the model itself (under the model
lock). The LR schedule follows ``s``, the samples of all learners, known through the counters
that ride along every exchange.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import DistributedBackend
from asrtrain.distributed.claims import EpochClaims, default_store
from asrtrain.distributed.gossip import (
    DrainFigures,
    Gossip,
    drain_gossip,
    drain_summary,
    gossip_group_backend,
    start_gossip_group,
)
from asrtrain.distributed.registry import SimShape, register_backend
from asrtrain.distributed.streams import streams_for
from asrtrain.distributed.topology import Schedule, describe

if TYPE_CHECKING:
    import torch

    from asrtrain.distributed.config import DistributedConfig


@register_backend("adpsgd")
class ADPSGDBackend(DistributedBackend):
    """AD-PSGD over all learners (one gossip member per learner)."""

    lockstep = "none"
    sim_shape = SimShape(sync="learner", gossip=True)
    gossip: Gossip | None = None
    last_drain: DrainFigures | None = None

    @classmethod
    def check(cls, cfg: DistributedConfig, device: torch.device) -> None:
        gossip_group_backend(cfg.gossip_backend, device)

    def create_groups(self) -> None:
        self.wire = gossip_group_backend(self.cfg.gossip_backend, self.device)
        self.gossip_group = self.comm.new_group(list(range(self.world_size)), self.wire)

    def attach(self) -> None:
        # Everyone is set up before anyone gossips (a partner's first round waits otherwise).
        self.comm.barrier("setup barrier")
        start_gossip_group(self.comm, self.gossip_group, self.wire)
        schedule = Schedule(self.world_size, self.cfg.topology, self.cfg.seed)
        self.streams = streams_for(self.params)
        self.gossip = Gossip(self.comm, self.model_lock, self.params, self.gossip_group,
                             list(range(self.world_size)), self.rank, schedule,
                             self.cfg.delay_by_one, self.cfg.gossip_idle_s, apply_in_thread=True,
                             streams=self.streams, wire=self.wire)
        self.gossip.start()

    def _gossip(self) -> Gossip:
        if self.gossip is None:
            raise AsrtrainError(f"rank {self.rank}: backend used before setup()")
        return self.gossip

    def after_backward(self, step: int) -> None:
        self._gossip().check()

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)
        g = self._gossip()
        g.check()
        g.notify_step(batch_samples)

    def global_samples(self) -> int:
        return self.start_samples + self._gossip().global_samples()

    def claims(self, epoch: int) -> EpochClaims:
        return EpochClaims(default_store(), epoch, guard=self.comm.guarded)

    def gossip_exchanges(self) -> int | None:
        """Pairwise exchanges this learner's gossip finished (None: it does not gossip); read
        for the training curves' gossip rate."""
        return self.gossip.exchanges if self.gossip is not None else None

    def drain(self) -> None:
        self.last_drain = drain_gossip(self.comm, self._gossip())

    def drain_figures(self) -> dict[str, float]:
        return drain_summary(self.last_drain)

    def release(self) -> None:
        self._gossip().release()

    def stop(self) -> None:
        self._gossip().shutdown()

    def describe(self) -> str:
        mode = ", delay-by-one" if self.cfg.delay_by_one else ""
        return (f"backend adpsgd{mode}, gossip over {self.wire}: "
                + describe(self.world_size, self.cfg.topology, 1, self.cfg.seed))
