"""Synchronous SGD: every learner applies the gradient averaged over all learners at every step.

    g_t = (1/N) sum_i grad f_i(x_t; batch_i),    x_{t+1} = x_t - lr_t * g_t   (identical on all)

Equivalent to one learner on the global batch (the union of the learners' batches), which is what
DistributedDataParallel does (Li et al., "PyTorch Distributed", VLDB 2020; gradient allreduce
as in Goyal et al., 2017). Gradients are flattened into buckets and all-reduced over NCCL on GPUs
and gloo on CPUs; H-AD-PSGD reuses this class on the learners of one node.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from asrtrain.distributed.backend import DistributedBackend, Liveness

#: Gradients are all-reduced in buckets of about this many bytes (as DDP's default 25 MiB).
BUCKET_BYTES = 25 * 2**20


class GradientAllreduce:
    """Average the gradients of ``params`` over ``group`` in flat buckets."""

    def __init__(self, backend: DistributedBackend, params: list[torch.Tensor],
                 group: dist.ProcessGroup | None, size: int) -> None:
        self.backend = backend
        self.params = params
        self.group = group
        self.size = size
        self.nccl = dist.get_backend(group) == "nccl"
        self.buckets: list[list[torch.Tensor]] = [[]]
        nbytes = 0
        for p in params:
            if self.buckets[-1] and nbytes + p.numel() * p.element_size() > BUCKET_BYTES:
                self.buckets.append([])
                nbytes = 0
            self.buckets[-1].append(p)
            nbytes += p.numel() * p.element_size()

    def __call__(self) -> None:
        for bucket in self.buckets:
            # A parameter unused in this step has no gradient; it still takes part with zeros so
            # that every learner reduces tensors of the same size.
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in bucket])
            if not self.nccl:
                flat = flat.cpu()
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self.backend.wait(work, "gradient allreduce")
            flat /= self.size
            offset = 0
            for p in bucket:
                n = p.numel()
                g = flat[offset : offset + n].view_as(p).to(p.device)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
                offset += n


class SSGDBackend(DistributedBackend):
    """Synchronous SGD over all learners."""

    name = "ssgd"

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device,
                 timeout_s: float, liveness: Liveness | None, sync_init: bool = True) -> None:
        super().__init__(rank, world_size, local_rank, device, timeout_s, liveness)
        self.sync_init = sync_init
        self._global = 0

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              global_samples: int = 0) -> None:
        self.check_setup(model)
        self.start_samples = int(global_samples)
        if self.sync_init:
            self.broadcast_params(0, None, "initial model broadcast")
        self.reduce = GradientAllreduce(self, self.params, None, self.world_size)

    def after_backward(self, step: int) -> None:
        self.reduce()

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)
        # The exact sum keeps the LR schedule identical on all learners even with uneven batches.
        n = self.allreduce_sum(torch.tensor([int(batch_samples)], dtype=torch.int64),
                               "sample count allreduce")
        self._global += int(n[0])

    def global_samples(self) -> int:
        return self.start_samples + self._global

    def consensus(self) -> dict[str, torch.Tensor]:
        return self.average_state()

    def consensus_distance(self) -> float:
        return self.distance_to(self.average_state())

    def reduce_mean(self, values: Mapping[str, float]) -> dict[str, float]:
        return super().reduce_mean(values)

    def describe(self) -> str:
        return (f"backend ssgd: {self.world_size} learners, gradient allreduce over "
                f"{dist.get_backend()} every step")

    def close(self) -> None:
        self.close_group()
