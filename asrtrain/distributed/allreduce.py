"""Gradient allreduce: average the gradients of a group of learners in flat buckets, so that the
group steps as one learner on the union of its batches (as DistributedDataParallel: Li et al.,
"PyTorch Distributed", VLDB 2020; Goyal et al., 2017). Used by ssgd over all learners and by
hadpsgd inside a node.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from asrtrain.distributed.comm import Comm, comm_device

#: Gradients are all-reduced in buckets of about this many bytes (as DDP's default 25 MiB).
BUCKET_BYTES = 25 * 2**20


class GradientAllreduce:
    """Average the gradients of ``params`` over ``group`` (``size`` learners) in flat buckets."""

    def __init__(self, comm: Comm, params: list[torch.Tensor], group: dist.ProcessGroup | None,
                 size: int) -> None:
        self.comm = comm
        self.params = params
        self.group = group
        self.size = size
        self.device = comm_device(comm.device, group)
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
            flat = flatten_grads(bucket).to(self.device)
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self.comm.wait(work, "gradient allreduce")
            set_grads_(bucket, mean_of_sum_(flat, self.size))


# The arithmetic of a gradient allreduce as plain functions: GradientAllreduce and the cluster
# simulator (asrtrain.simulate) both call them, so the two cannot drift apart.


def flatten_grads(params: list[torch.Tensor]) -> torch.Tensor:
    """The gradients of ``params`` as one flat tensor (a copy). A parameter unused in this step
    has no gradient; it still takes part with zeros so that every learner reduces tensors of the
    same size."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])


def mean_of_sum_(flat: torch.Tensor, size: int) -> torch.Tensor:
    """The mean of ``size`` learners' gradients from their sum (the allreduce's result), in
    place."""
    flat /= size
    return flat


def set_grads_(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Give ``params`` the gradients in ``flat`` (split to their shapes)."""
    offset = 0
    for p in params:
        n = p.numel()
        g = flat[offset : offset + n].view_as(p).to(p.device)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        offset += n
