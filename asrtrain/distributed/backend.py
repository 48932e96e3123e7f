"""The Backend interface between the one training loop and the ways learners share what they learn.

The trainer calls, per run and per step (every call marked *collective* must be made by all
learners in the same order)::

    backend = build_backend(cfg.trainer)          # process group from the torchrun environment
    model.to(backend.device); optimizer = ...     # shard data with backend.data_rank/data_world
    steps = backend.agree_min(len(my_batches))    # ssgd/hadpsgd: equal steps everywhere
    backend.setup(model, optimizer, global_samples=resumed_samples)   # collective
    log(backend.describe())                       # backend, topology, spectral gap
    for step, batch in enumerate(batches):
        set_lr(optimizer, schedule(backend.global_samples()))
        loss = model(batch).mean(); loss.backward()
        backend.after_backward(step)              # ssgd/hadpsgd: gradient allreduce
        backend.optimizer_step(optimizer)         # optimizer.step() under the model lock
        optimizer.zero_grad()
        backend.after_step(step, len(batch))      # progress counters, gossip trigger, errors
        if time_to_eval: state = backend.consensus()          # collective
    final = backend.consensus(); backend.close()               # collective
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError

T = TypeVar("T")


class Backend(ABC):
    """How the learners of one run exchange information; the trainer loop is the same for all.

    Attributes:
        name: ``single``, ``ssgd``, ``adpsgd`` or ``hadpsgd``.
        rank, world_size: this learner and the number of learners.
        local_rank: this learner's index on its machine (selects the GPU).
        is_main: True on the learner that logs, evaluates and writes checkpoints (rank 0).
        data_rank, data_world: shard the training data as ``examples[data_rank::data_world]``.
        device: where the model and the batches live (``cuda:<local_rank>`` or ``cpu``).
    """

    name = "single"

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0,
                 device: torch.device | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.is_main = rank == 0
        self.data_rank = rank
        self.data_world = world_size
        self.device = device if device is not None else torch.device("cpu")
        self.model: torch.nn.Module | None = None
        self._local_samples = 0
        self.start_samples = 0

    @abstractmethod
    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              global_samples: int = 0) -> None:
        """Attach the model (already on ``device``) and its optimizer; collective.

        ``global_samples`` is the progress of a resumed run (saved with its checkpoint): the
        LR-schedule input :meth:`global_samples` continues from it on every learner.
        """

    def after_backward(self, step: int) -> None:  # noqa: B027 - most backends need nothing
        """Called after ``loss.backward()``: reduce gradients where the backend does so."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Run ``optimizer.step()`` (under the model lock where a gossip thread shares it)."""
        optimizer.step()

    @abstractmethod
    def after_step(self, step: int, batch_samples: int) -> None:
        """Called after the optimizer step with the number of samples this learner just used."""

    @abstractmethod
    def global_samples(self) -> int:
        """Samples used so far by all learners together: the input of the LR schedule."""

    @abstractmethod
    def consensus(self) -> dict[str, torch.Tensor]:
        """The average of all learners' models (state_dict on CPU); collective."""

    @abstractmethod
    def consensus_distance(self) -> float:
        """Mean over learners of ``||x_i - x_bar|| / ||x_bar||`` (parameters); collective."""

    @abstractmethod
    def reduce_mean(self, values: Mapping[str, float]) -> dict[str, float]:
        """Average scalar metrics over learners (same keys on every learner); collective."""

    def agree_min(self, value: int) -> int:
        """The smallest ``value`` over learners; collective. Synchronous backends need the same
        number of steps on every learner: ``steps = backend.agree_min(len(my_batches))``."""
        return int(value)

    def describe(self) -> str:
        """A one-line summary of the configuration for the start of the training log."""
        return f"backend {self.name}: {self.world_size} learner(s)"

    @abstractmethod
    def close(self) -> None:
        """Drain in-flight exchanges, stop threads, leave the process group; collective."""


def state_on_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``model.state_dict()``."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


class SingleProcessBackend(Backend):
    """One learner, no communication: the model is its own consensus."""

    name = "single"

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              global_samples: int = 0) -> None:
        self.model = model
        self.start_samples = int(global_samples)

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)

    def global_samples(self) -> int:
        return self.start_samples + self._local_samples

    def consensus(self) -> dict[str, torch.Tensor]:
        if self.model is None:
            raise AsrtrainError("backend: consensus() called before setup()")
        return state_on_cpu(self.model)

    def consensus_distance(self) -> float:
        return 0.0

    def reduce_mean(self, values: Mapping[str, float]) -> dict[str, float]:
        return {k: float(v) for k, v in values.items()}

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------
# Machinery shared by the distributed backends.


def flat_params(params: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The parameters as one flat CPU tensor of ``dtype`` (a copy)."""
    return torch.cat([p.detach().reshape(-1).to("cpu", dtype) for p in params])


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


class Liveness:
    """Heartbeats in the rendezvous store, to name the learner that died when a wait fails.

    Each learner bumps a counter every ``interval`` seconds from a daemon thread, on its own store
    connection (a store client is not shared between threads). A learner that fails because of a
    peer records it, so only learners that went silent without a word are blamed.
    """

    def __init__(self, rank: int, world_size: int, interval: float = 1.0) -> None:
        self.rank = rank
        self.world_size = world_size
        self.interval = interval
        self.prefix = f"asrtrain/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self._port = int(os.environ.get("MASTER_PORT", "0"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _client(self, timeout: float) -> dist.TCPStore:
        return dist.TCPStore(self._host, self._port, is_master=False,
                             timeout=timedelta(seconds=timeout), wait_for_workers=False)

    def start(self) -> None:
        store = self._client(30.0)
        key = f"{self.prefix}/hb/{self.rank}"
        store.add(key, 1)

        def beat() -> None:
            while not self._stop.wait(self.interval):
                try:
                    store.add(key, 1)
                except Exception:  # the store went away: nothing left to tell
                    return

        self._thread = threading.Thread(target=beat, name="asrtrain-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def report_failure(self, message: str) -> None:
        """Record that this learner fails because of someone else (so it is not blamed)."""
        with contextlib.suppress(Exception):
            self._client(5.0).set(f"{self.prefix}/failed/{self.rank}", message)

    def silent_ranks(self) -> str:
        """Name the learners whose heartbeat stopped without a recorded failure of their own."""
        try:
            store = self._client(5.0)
            keys = [f"{self.prefix}/hb/{r}" for r in range(self.world_size)]
            before = [store.add(k, 0) for k in keys]
            time.sleep(2.5 * self.interval)
            after = [store.add(k, 0) for k in keys]
            failed = {r for r in range(self.world_size)
                      if store.check([f"{self.prefix}/failed/{r}"])}
        except Exception as e:  # the store lives in the launcher or on rank 0
            return f"the rendezvous store is unreachable ({e}): rank 0 or the launcher died"
        silent = [r for r in range(self.world_size)
                  if after[r] == before[r] and r not in failed and r != self.rank]
        if not silent:
            return "every learner still has a heartbeat: one of them is hung or too slow"
        return ", ".join(f"rank {r}" for r in silent) + " stopped (died or was killed)"


class DistributedBackend(Backend):
    """Common parts of the multi-learner backends: process groups, failures, averaging."""

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device,
                 timeout_s: float, liveness: Liveness | None) -> None:
        super().__init__(rank, world_size, local_rank, device)
        self.timeout = timedelta(seconds=timeout_s)
        self.liveness = liveness
        self.params: list[torch.Tensor] = []
        #: Serialises optimizer steps and gossip updates of the model (see adpsgd).
        self.model_lock = threading.Lock()

    # -- failures ------------------------------------------------------------------------------
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
        cause = (str(error).splitlines() or [type(error).__name__])[0]
        cause = cause.split(". This is typically")[0]  # gloo's generic advice adds nothing
        msg = (f"rank {self.rank}: {what} failed: {culprit}. Underlying error: {cause}. "
               "Check that learner's log, then resume the run from its last checkpoint.")
        if self.liveness is not None:
            self.liveness.report_failure(msg)
        return AsrtrainError(msg)

    def guarded(self, what: str, fn: Callable[[], T]) -> T:
        """Run a blocking collective; turn a failure or timeout into an error naming the rank."""
        try:
            return fn()
        except AsrtrainError:
            raise
        except (RuntimeError, dist.DistError) as e:
            raise self.fail(what, e) from e

    def wait(self, work: dist.Work, what: str) -> None:
        """Wait for an async collective with the backend's timeout."""
        self.guarded(what, lambda: work.wait(timeout=self.timeout))

    # -- collectives on the default group (main thread only) -----------------------------------
    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def allreduce_sum(self, tensor: torch.Tensor, what: str,
                      group: dist.ProcessGroup | None = None) -> torch.Tensor:
        """Sum ``tensor`` over ``group`` (default: all learners); returns a CPU tensor."""
        dev = self.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
        t = tensor.detach().to(dev, copy=True)
        self.wait(dist.all_reduce(t, group=group, async_op=True), what)
        return t.cpu()

    def broadcast_params(self, src: int, group: dist.ProcessGroup | None, what: str) -> None:
        """Copy the model (parameters and buffers) of global rank ``src`` to ``group``."""
        assert self.model is not None
        tensors = [t for t in self.model.state_dict().values() if t.numel()]
        dev = self.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
        for t in tensors:
            buf = t.detach().to(dev, copy=True)
            self.wait(dist.broadcast(buf, src=src, group=group, async_op=True), what)
            t.copy_(buf.to(t.device))

    def average_state(self) -> dict[str, torch.Tensor]:
        """All-reduce the mean of every floating-point entry of the state dict (CPU copies)."""
        assert self.model is not None
        out: dict[str, torch.Tensor] = {}
        for k, v in self.model.state_dict().items():
            if v.is_floating_point() and v.numel():
                total = self.allreduce_sum(v, "consensus averaging")
                out[k] = (total / self.world_size).to(v.dtype)
            else:
                out[k] = v.detach().to("cpu", copy=True)
        return out

    def distance_to(self, avg: Mapping[str, torch.Tensor]) -> float:
        """Mean over learners of ``||x_i - x_bar|| / ||x_bar||`` over the trainable parameters."""
        assert self.model is not None
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        sd = self.model.state_dict()
        diff = sum(float((sd[n].detach().cpu().double() - avg[n].double()).pow(2).sum())
                   for n in names)
        norm = sum(float(avg[n].double().pow(2).sum()) for n in names) ** 0.5
        total = self.allreduce_sum(torch.tensor([diff**0.5], dtype=torch.float64),
                                   "consensus distance")
        return float(total[0]) / self.world_size / max(norm, 1e-30)

    def agree_min(self, value: int) -> int:
        t = torch.tensor([int(value)], dtype=torch.int64).to(self._comm_device())
        self.wait(dist.all_reduce(t, op=dist.ReduceOp.MIN, async_op=True), "step count agreement")
        return int(t.cpu()[0])

    def reduce_mean(self, values: Mapping[str, float]) -> dict[str, float]:
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        t = self.allreduce_sum(t, "metric averaging") / self.world_size
        return {k: float(x) for k, x in zip(keys, t.tolist(), strict=True)}

    def check_setup(self, model: torch.nn.Module) -> None:
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise AsrtrainError(f"rank {self.rank}: the model has no trainable parameters")

    def close_group(self) -> None:
        if self.liveness is not None:
            self.liveness.stop()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                self.wait(dist.barrier(async_op=True), "closing barrier")
            dist.destroy_process_group()
