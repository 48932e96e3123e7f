"""Hierarchical AD-PSGD: synchronous SGD inside a node, AD-PSGD gossip between node leaders.

    inside node k:   x_k <- x_k - lr(s) * (1/G) sum_{i in k} grad_i          (all G replicas equal)
    between nodes:   x_k <- x_k + w * sum_{l in round r} (x_l^(r) - x_k^(r))   (leader's thread)

Zhang, Cui, Kingsbury et al., "A highly efficient distributed deep learning system for automatic
speech recognition", INTERSPEECH 2019. Composes the two shared pieces: the ``per_node`` learners
of a node form a super-learner through :class:`asrtrain.distributed.allreduce.GradientAllreduce`
over the node's group (NCCL on GPUs) every step, and the node's first learner, its leader, is a
member of a :class:`asrtrain.distributed.gossip.Gossip` among the leaders (gloo). The leader's
gossip changes are broadcast inside the node at the next step boundary, so the replicas of a node
stay bit-identical. One node is plain SSGD; one learner per node is plain AD-PSGD. ``per_node``
(default: the learners of a machine) need not match the machines: one machine can emulate nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.allreduce import GradientAllreduce
from asrtrain.distributed.backend import DistributedBackend
from asrtrain.distributed.claims import EpochClaims, default_store
from asrtrain.distributed.comm import add_flat_, common_dtype
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
    from asrtrain.distributed.config import DistributedConfig


@register_backend("hadpsgd")
class HADPSGDBackend(DistributedBackend):
    """Super-learners of ``per_node`` learners (gradient allreduce) gossiping through leaders."""

    lockstep = "node"
    sim_shape = SimShape(sync="node", gossip=True)
    gossip: Gossip | None = None
    last_drain: DrainFigures | None = None
    reduce: GradientAllreduce | None = None

    @classmethod
    def check(cls, cfg: DistributedConfig, device: torch.device) -> None:
        gossip_group_backend(cfg.gossip_backend, device)

    def create_groups(self) -> None:
        per_node = self.cfg.per_node or self.comm.local_world_size
        if self.world_size % per_node:
            raise AsrtrainError(
                f"rank {self.rank}: trainer.per_node={per_node} does not divide the "
                f"{self.world_size} learners into nodes; set it to the number of learners per "
                "node")
        self.per_node = per_node
        self.nodes = self.world_size // per_node
        self.node = self.rank // per_node
        self.leader = self.node * per_node
        self.schedule = Schedule(self.nodes, self.cfg.topology, self.cfg.seed)
        # Every rank creates every group, in the same order.
        self.node_group: dist.ProcessGroup | None = None
        if per_node > 1:
            for k in range(self.nodes):
                g = self.comm.new_group(list(range(k * per_node, (k + 1) * per_node)))
                if k == self.node:
                    self.node_group = g
        self.leaders = [k * per_node for k in range(self.nodes)]
        self.wire = gossip_group_backend(self.cfg.gossip_backend, self.device)
        self.leader_group = (self.comm.new_group(self.leaders, self.wire) if self.nodes > 1
                             else None)
        self._global = 0

    def attach(self) -> None:
        if not self.cfg.sync_init and self.node_group is not None:
            self.broadcast_model(self.leader, self.node_group, "node model broadcast")
        if self.node_group is not None:
            self.reduce = GradientAllreduce(self.comm, self.params, self.node_group,
                                            self.per_node)
        self.comm.barrier("setup barrier")
        if self.rank == self.leader and self.leader_group is not None:
            start_gossip_group(self.comm, self.leader_group, self.wire)
            self.streams = streams_for(self.params)
            self.gossip = Gossip(self.comm, self.model_lock, self.params, self.leader_group,
                                 self.leaders, self.node, self.schedule, self.cfg.delay_by_one,
                                 self.cfg.gossip_idle_s, apply_in_thread=self.per_node == 1,
                                 streams=self.streams, wire=self.wire)
            self.gossip.start()
        self._dtype = common_dtype(self.params)
        self._numel = sum(p.numel() for p in self.params)

    def after_backward(self, step: int) -> None:
        if self.gossip is not None:
            self.gossip.check()
        if self.reduce is not None:
            self.reduce()

    def _share_in_node(self, batch_samples: int) -> int:
        """One node allreduce of (samples, leader's gossip flag, leader's global count), then the
        leader's gossip change if it has one; returns the node's samples of this step."""
        head = torch.zeros(3, dtype=torch.int64)
        head[0] = int(batch_samples)
        delta = None
        if self.gossip is not None:
            # Taken and added under one hold of the lock: a snapshot of the gossip thread
            # (model + pending) in between would miss the change.
            with self.updating_model():
                delta = self.gossip.take_pending()
                if delta is not None:
                    add_flat_(self.params, delta)
            head[1] = int(delta is not None)
            head[2] = self.gossip.global_samples()
        head = self.comm.allreduce(head, "node progress allreduce", self.node_group)
        node_samples, flag, samples = (int(x) for x in head)
        self._global = samples
        if flag:
            buf = delta if delta is not None else torch.empty(self._numel, dtype=self._dtype)
            self.comm.broadcast_([buf], self.leader, self.node_group, "node gossip broadcast")
            if delta is None:  # the leader added it already
                with self.updating_model():
                    add_flat_(self.params, buf)
        return node_samples

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)
        if self.nodes == 1:
            self._global += self.comm.allreduce_int(batch_samples, "node sample count",
                                                    self.node_group)
            return
        if self.per_node == 1:
            node_samples = int(batch_samples)  # the gossip thread applies its changes itself
        else:
            # Members learn the leader's count as of the previous step: one collective less.
            node_samples = self._share_in_node(int(batch_samples))
        if self.gossip is not None:
            self.gossip.check()
            self.gossip.notify_step(node_samples)

    def global_samples(self) -> int:
        if self.nodes > 1 and self.per_node == 1:
            assert self.gossip is not None
            return self.start_samples + self.gossip.global_samples()
        return self.start_samples + self._global

    def claims(self, epoch: int) -> EpochClaims | None:
        """A node claims together (its members step in lockstep); one node is SSGD: shards."""
        if self.nodes == 1:
            return None
        return EpochClaims(default_store(), epoch, self.per_node, self.rank - self.leader,
                           self.node, guard=self.comm.guarded)

    def drain(self) -> None:
        """Finish in-flight gossip everywhere (:func:`drain_gossip`) and share it in nodes."""
        if self.nodes == 1:
            return
        self.last_drain = drain_gossip(self.comm, self.gossip)
        if self.per_node > 1:
            self._share_in_node(0)

    def drain_figures(self) -> dict[str, float]:
        return drain_summary(self.last_drain)

    def release(self) -> None:
        if self.gossip is not None:
            self.gossip.release()

    def gossip_exchanges(self) -> int | None:
        """Pairwise exchanges this learner's gossip finished (None: it does not gossip); read
        for the training curves' gossip rate."""
        return self.gossip.exchanges if self.gossip is not None else None

    def stop(self) -> None:
        if self.gossip is not None:
            self.gossip.shutdown()

    def describe(self) -> str:
        mode = ", delay-by-one" if self.cfg.delay_by_one else ""
        inner = dist.get_backend(self.node_group) if self.node_group is not None else "none"
        return (f"backend hadpsgd{mode}: gradient allreduce inside nodes over {inner}, "
                f"leaders gossip over {self.wire}; "
                + describe(self.world_size, self.cfg.topology, self.per_node, self.schedule.seed))
