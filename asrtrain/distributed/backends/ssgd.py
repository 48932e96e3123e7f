"""Synchronous SGD: every learner applies the gradient averaged over all learners at every step.

    g_t = (1/N) sum_i grad f_i(x_t; batch_i),    x_{t+1} = x_t - lr_t * g_t   (identical on all)

Equivalent to one learner on the global batch (the union of the learners' batches), which is what
DistributedDataParallel does (Li et al., "PyTorch Distributed", VLDB 2020; gradient allreduce as in
Goyal et al., "Accurate, Large Minibatch SGD", 2017). Composes
:class:`asrtrain.distributed.allreduce.GradientAllreduce` over all learners (NCCL on GPUs, gloo on
CPUs); the samples of each step are summed exactly, so the LR schedule is the same everywhere.
"""

from __future__ import annotations

import torch.distributed as dist

from asrtrain.distributed.allreduce import GradientAllreduce
from asrtrain.distributed.backend import DistributedBackend
from asrtrain.distributed.registry import SimShape, register_backend


@register_backend("ssgd")
class SSGDBackend(DistributedBackend):
    """Synchronous SGD over all learners."""

    lockstep = "all"
    sim_shape = SimShape(sync="all", gossip=False)

    def attach(self) -> None:
        self.reduce = GradientAllreduce(self.comm, self.params, None, self.world_size)
        self._global = 0

    def after_backward(self, step: int) -> None:
        self.reduce()

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)
        # The exact sum keeps the LR schedule identical on all learners even with uneven batches.
        self._global += self.comm.allreduce_int(batch_samples, "sample count allreduce")

    def global_samples(self) -> int:
        return self.start_samples + self._global

    def describe(self) -> str:
        return (f"backend ssgd: {self.world_size} learners, gradient allreduce over "
                f"{dist.get_backend()} every step")
