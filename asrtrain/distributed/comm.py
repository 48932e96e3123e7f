"""Communication shared by every distributed backend: where tensors travel, blocking collectives
that fail with the name of the learner at fault, and flat parameter vectors.

A process group is NCCL when the learner's model is on a GPU and gloo otherwise
(:func:`group_backend`); a tensor crosses an NCCL group from the GPU and a gloo group from the
CPU (:func:`comm_device`). Gossip threads always use gloo groups of their own: one process group
must never be used from two threads. Every rank creates every group, in the same order
(``torch.distributed.new_group`` is collective over the default group; see docs/architecture.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.liveness import Liveness, first_line, record_error

T = TypeVar("T")


def cpu_threads(threads: int = 0) -> int:
    """Torch CPU threads for one learner: ``threads``, or one when it is 0.

    One, because the LSTM's per-frame steps are too small to share: on 2 cores a tiny-recipe
    epoch took 7 s with one thread and 20 s with two (OpenMP threads waiting passively), and
    threads that spin instead are 10-15x slower still as soon as another job shares the cores
    (measured here). Use the cores by running more learners; set ``trainer.threads`` for a
    model whose matrices are large enough.
    """
    return threads if threads > 0 else 1


def learner_device(local_rank: int, cpu: bool) -> torch.device:
    """``cuda:<local_rank>`` where CUDA is available and ``cpu`` is not asked for, else the CPU.

    With ``cpu`` CUDA is not even queried: ``torch.cuda.is_available()`` initialises the driver
    and marks the process, so that a child it forks cannot use CUDA. Learners are started by
    torchrun (new processes) or forked from a fork server that never touched CUDA
    (``bench/synthetic.py``), never forked from a process that used it.
    """
    if cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if local_rank >= gpus:
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): one learner per GPU.
        raise AsrtrainError(
            f"learner with local rank {local_rank} has no GPU of its own: this machine has "
            f"{gpus}; set trainer.learners to at most {gpus}, or trainer.cpu=true")
    return torch.device(f"cuda:{local_rank}")


def group_backend(device: torch.device) -> str:
    """The process-group backend for learners whose models live on ``device``."""
    return "nccl" if device.type == "cuda" else "gloo"


def comm_device(device: torch.device, group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a tensor must be to cross ``group`` (default: the default group)."""
    return device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def flat_params(params: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The parameters as one flat CPU tensor of ``dtype`` (a copy)."""
    return torch.cat([p.detach().reshape(-1).to("cpu", dtype) for p in params])


def copy_flat_(params: list[torch.Tensor], out: torch.Tensor) -> None:
    """Copy ``params`` into the flat ``out`` (in its dtype and on its device).

    The copies of GPU parameters are queued on the current stream (``non_blocking``): to host
    memory they are done only after that stream is synchronised.
    """
    offset = 0
    for p in params:
        n = p.numel()
        out[offset : offset + n].view_as(p).copy_(p.detach(), non_blocking=True)
        offset += n


def add_flat_(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """``params += flat`` (split to the shapes of ``params``), in place."""
    offset = 0
    for p in params:
        n = p.numel()
        p.data.add_(flat[offset : offset + n].view_as(p).to(p.device, p.dtype))
        offset += n


def common_dtype(params: list[torch.Tensor]) -> torch.dtype:
    """The dtype that holds every parameter exactly (float32 at least)."""
    dtype = torch.float32
    for p in params:
        dtype = torch.promote_types(dtype, p.dtype)
    return dtype


class Comm:
    """One learner's place among the learners and its blocking collectives (main thread only).

    Attributes:
        rank, world_size: this learner and the number of learners.
        local_rank, local_world_size: the same on this machine.
        device: where the model lives.
        timeout: every wait's limit.
        liveness: the heartbeats that name a dead learner (None: no names).
    """

    def __init__(self, rank: int, world_size: int, local_rank: int, local_world_size: int,
                 device: torch.device, timeout_s: float, liveness: Liveness | None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.liveness = liveness

    # -- failures --------------------------------------------------------------------------------
    def fail(self, what: str, error: BaseException, peer: int | None = None) -> AsrtrainError:
        """An AsrtrainError for a failed wait, naming the learner at fault."""
        if isinstance(error, AsrtrainError):
            return error
        # A partner may itself have failed because of a third learner: the heartbeats tell who
        # went silent first-hand.
        culprit = self.liveness.silent_ranks() if self.liveness is not None else ""
        if peer is not None:
            culprit = f"the exchange with rank {peer} broke" + (f"; {culprit}" if culprit else "")
        culprit = culprit or "no liveness information"
        cause = first_line(error)
        cause = cause.split(". This is typically")[0]  # gloo's generic advice adds nothing
        msg = (f"rank {self.rank}: {what} failed: {culprit}. Underlying error: {cause}. "
               "Check that learner's log, then resume the run from its last checkpoint.")
        error = AsrtrainError(msg)
        if self.liveness is not None:
            self.liveness.report_failure(msg)
            record_error(error)  # before the kill below makes the launcher stop everyone
            self.liveness.fence_hung()
        return error

    def guarded(self, what: str, fn: Callable[[], T]) -> T:
        """Run a blocking collective; turn a failure or timeout into an error naming the rank."""
        try:
            return fn()
        except AsrtrainError:
            raise
        except (RuntimeError, dist.DistError) as e:
            raise self.fail(what, e) from e

    def wait(self, work: dist.Work, what: str) -> None:
        """Wait for an async collective with the timeout."""
        self.guarded(what, lambda: work.wait(timeout=self.timeout))

    # -- collectives -----------------------------------------------------------------------------
    def new_group(self, ranks: list[int], backend: str | None = None) -> dist.ProcessGroup:
        """A process group of ``ranks`` (every rank must call this, in the same order)."""
        return dist.new_group(ranks, backend=backend or group_backend(self.device),
                              timeout=self.timeout)

    def allreduce(self, tensor: torch.Tensor, what: str, group: dist.ProcessGroup | None = None,
                  op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """``op`` of ``tensor`` over ``group`` (default: all learners); returns a CPU copy."""
        t = tensor.detach().to(comm_device(self.device, group), copy=True)
        self.wait(dist.all_reduce(t, op=op, group=group, async_op=True), what)
        return t.cpu()

    def allreduce_int(self, value: int, what: str, group: dist.ProcessGroup | None = None,
                      op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> int:
        """``op`` (sum, min, max) of one integer over ``group``."""
        return int(self.allreduce(torch.tensor([int(value)], dtype=torch.int64), what, group,
                                  op)[0])

    def broadcast_(self, tensors: Iterable[torch.Tensor], src: int,
                   group: dist.ProcessGroup | None, what: str) -> None:
        """Overwrite ``tensors`` in place with those of global rank ``src``."""
        dev = comm_device(self.device, group)
        for t in tensors:
            buf = t.detach().to(dev, copy=True)
            self.wait(dist.broadcast(buf, src=src, group=group, async_op=True), what)
            t.copy_(buf.to(t.device))

    def barrier(self, what: str) -> None:
        self.wait(dist.barrier(async_op=True), what)

    def close(self) -> None:
        """Stop the heartbeat, wait for the others, leave the process group."""
        if self.liveness is not None:
            self.liveness.stop()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                self.barrier("closing barrier")
            dist.destroy_process_group()
