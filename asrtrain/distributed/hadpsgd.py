"""Hierarchical AD-PSGD: synchronous SGD inside a node, AD-PSGD gossip between node leaders.

    inside node k:   x_k <- x_k - lr(s) * (1/G) sum_{i in k} grad_i          (all G replicas equal)
    between nodes:   x_k <- x_k + w * sum_{l in round r} (x_l^(r) - x_k^(r))   (leader's thread)

Zhang, Cui, Kingsbury et al., "A highly efficient distributed deep learning system for automatic
speech recognition", INTERSPEECH 2019. The ``per_node`` learners of a node form a super-learner by
all-reducing gradients every step on the main thread (NCCL on GPUs); the node's first learner,
its leader, runs the AD-PSGD gossip thread (:class:`asrtrain.distributed.adpsgd.Gossip`) with the
other leaders over gloo. The leader's gossip changes are broadcast inside the node at the next step
boundary, so the replicas of a node stay bit-identical. One node is plain SSGD; one learner per
node is plain AD-PSGD. ``per_node`` need not match the machines: one machine can emulate nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.adpsgd import Gossip
from asrtrain.distributed.backend import DistributedBackend, Liveness, add_flat_, common_dtype
from asrtrain.distributed.ssgd import GradientAllreduce
from asrtrain.distributed.topology import Schedule, describe


class HADPSGDBackend(DistributedBackend):
    """Super-learners of ``per_node`` learners (gradient allreduce) gossiping through leaders."""

    name = "hadpsgd"

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device,
                 timeout_s: float, liveness: Liveness | None, per_node: int,
                 topology: str = "random_ring", seed: int = 0, delay_by_one: bool = False,
                 idle_s: float = 0.1, sync_init: bool = True) -> None:
        super().__init__(rank, world_size, local_rank, device, timeout_s, liveness)
        if per_node < 1 or world_size % per_node:
            raise AsrtrainError(
                f"rank {rank}: trainer.per_node={per_node} does not divide the {world_size} "
                "learners into nodes; set it to the number of learners per node")
        self.per_node = per_node
        self.nodes = world_size // per_node
        self.node = rank // per_node
        self.leader = self.node * per_node
        self.is_leader = rank == self.leader
        self.topology = topology
        self.schedule = Schedule(self.nodes, topology, seed)
        self.delay_by_one = delay_by_one
        self.idle_s = idle_s
        self.sync_init = sync_init
        # Every rank creates every group, in the same order (see DESIGN.md on new_group).
        self.node_group: dist.ProcessGroup | None = None
        if per_node > 1:
            node_backend = "nccl" if device.type == "cuda" else "gloo"
            for k in range(self.nodes):
                g = dist.new_group(list(range(k * per_node, (k + 1) * per_node)),
                                   backend=node_backend, timeout=self.timeout)
                if k == self.node:
                    self.node_group = g
        self.leaders = [k * per_node for k in range(self.nodes)]
        self.leader_group = None
        if self.nodes > 1:
            self.leader_group = dist.new_group(self.leaders, backend="gloo", timeout=self.timeout)
        self.gossip: Gossip | None = None
        self._global = 0

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              global_samples: int = 0) -> None:
        self.check_setup(model)
        self.start_samples = int(global_samples)
        if self.sync_init:
            self.broadcast_params(0, None, "initial model broadcast")
        elif self.node_group is not None:
            self.broadcast_params(self.leader, self.node_group, "node model broadcast")
        self.reduce = (GradientAllreduce(self, self.params, self.node_group, self.per_node)
                       if self.node_group is not None else None)
        self.wait(dist.barrier(async_op=True), "setup barrier")
        if self.is_leader and self.leader_group is not None:
            self.gossip = Gossip(self, self.params, self.leader_group, self.leaders, self.node,
                                 self.schedule, self.timeout, self.delay_by_one, self.idle_s,
                                 apply_in_thread=self.per_node == 1)
            self.gossip.start()
        self._dtype = common_dtype(self.params)
        self._numel = sum(p.numel() for p in self.params)

    def after_backward(self, step: int) -> None:
        if self.gossip is not None:
            self.gossip.check()
        if self.reduce is not None:
            self.reduce()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        with self.model_lock:
            optimizer.step()

    def _node_sum(self, value: int) -> int:
        if self.node_group is None:
            return value
        t = self.allreduce_sum(torch.tensor([value], dtype=torch.int64), "node sample count",
                               self.node_group)
        return int(t[0])

    def _share_in_node(self, batch_samples: int) -> int:
        """One node allreduce of (samples, leader's gossip flag, leader's global count), then the
        leader's gossip change if it has one; returns the node's samples of this step."""
        head = torch.zeros(3, dtype=torch.int64)
        head[0] = int(batch_samples)
        delta = None
        if self.gossip is not None:
            with self.model_lock:
                delta = self.gossip.take_pending()
            head[1] = int(delta is not None)
            head[2] = self.gossip.global_samples()
        assert self.node_group is not None
        nccl = dist.get_backend(self.node_group) == "nccl"
        dev = self.device if nccl else torch.device("cpu")
        head = self.allreduce_sum(head, "node progress allreduce", self.node_group)
        node_samples, flag, samples = (int(x) for x in head)
        self._global = samples
        if flag:
            buf = (delta if delta is not None
                   else torch.empty(self._numel, dtype=self._dtype)).to(dev)
            self.wait(dist.broadcast(buf, src=self.leader, group=self.node_group, async_op=True),
                      "node gossip broadcast")
            with self.model_lock:
                add_flat_(self.params, buf)
        return node_samples

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)
        if self.nodes == 1:
            self._global += self._node_sum(int(batch_samples))
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

    def drain(self) -> None:
        """Finish in-flight gossip everywhere (see ADPSGDBackend.drain) and share it in nodes."""
        if self.nodes == 1:
            return
        started = self.gossip.hold_and_count() if self.gossip is not None else 0
        t = torch.tensor([started], dtype=torch.int64).to(self._comm_device())
        self.wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True), "gossip drain")
        if self.gossip is not None:
            self.gossip.drain_to(int(t.cpu()[0]), self.timeout.total_seconds())
        if self.per_node > 1:
            self._share_in_node(0)

    def _release(self) -> None:
        if self.gossip is not None:
            self.gossip.release()

    def consensus(self) -> dict[str, torch.Tensor]:
        self.drain()
        try:
            return self.average_state()
        finally:
            self._release()

    def consensus_distance(self) -> float:
        self.drain()
        try:
            return self.distance_to(self.average_state())
        finally:
            self._release()

    def reduce_mean(self, values: Mapping[str, float]) -> dict[str, float]:
        return super().reduce_mean(values)

    def describe(self) -> str:
        mode = ", delay-by-one" if self.delay_by_one else ""
        inner = dist.get_backend(self.node_group) if self.node_group is not None else "none"
        return (f"backend hadpsgd{mode}: gradient allreduce inside nodes over {inner}, "
                f"leaders gossip over gloo; "
                + describe(self.world_size, self.topology, self.per_node, self.schedule.seed))

    def close(self) -> None:
        self.drain()
        if self.gossip is not None:
            self.gossip.shutdown()
            self.gossip = None
        self.close_group()
