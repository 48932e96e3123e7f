"""The Backend interface between the one training loop and the ways learners share what they learn.

The trainer calls, per run and per step (every call marked *collective* must be made by all
learners in the same order)::

    backend = build_backend(TrainerConfig.from_config(cfg.trainer))   # joins the torchrun group
    model.to(backend.device); optimizer = ...     # shard data with backend.data_rank/data_world
    steps = backend.agree_min(len(my_batches))    # ssgd/hadpsgd: equal steps everywhere
    claim = backend.claims(epoch)                 # or (adpsgd, hadpsgd) claim units of one order
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

A multi-learner backend is a :class:`DistributedBackend` registered in
:mod:`asrtrain.distributed.registry`; it composes the shared pieces (:mod:`.comm`,
:mod:`.allreduce`, :mod:`.gossip`) and implements only its policy: :meth:`Backend.after_step`,
:meth:`Backend.global_samples` and, where it has them, :meth:`DistributedBackend.create_groups`,
:meth:`DistributedBackend.attach`, :meth:`Backend.after_backward` and the drain hooks.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.streams import NullStream

if TYPE_CHECKING:
    from asrtrain.distributed.claims import EpochClaims
    from asrtrain.distributed.comm import Comm
    from asrtrain.distributed.config import DistributedConfig


class Backend(ABC):
    """How the learners of one run exchange information; the trainer loop is the same for all.

    Attributes:
        name: ``single``, or the name the backend is registered under.
        lockstep: which learners must take the same number of steps (they wait for each other
            every step): ``all``, ``node`` (those of a node) or ``none``.
        rank, world_size: this learner and the number of learners.
        local_rank: this learner's index on its machine (selects the GPU).
        is_main: True on the learner that logs, evaluates and writes checkpoints (rank 0).
        data_rank, data_world: shard the training data as ``examples[data_rank::data_world]``.
        device: where the model and the batches live (``cuda:<local_rank>`` or ``cpu``).
    """

    name = "single"
    lockstep = "none"

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

    @contextlib.contextmanager
    def meeting(self) -> Iterator[None]:
        """A point where all learners meet (collective): what runs in the background is drained
        and held until the block ends, so the collectives inside it (the consensus, the epoch's
        metrics) do not queue behind background exchanges on the links. Nothing to hold by
        default."""
        yield

    def agree_min(self, value: int) -> int:
        """The smallest ``value`` over learners; collective. Synchronous backends need the same
        number of steps on every learner: ``steps = backend.agree_min(len(my_batches))``."""
        return int(value)

    def claims(self, epoch: int) -> EpochClaims | None:
        """How this learner takes its part of epoch ``epoch``: None, a fixed shard with as many
        steps as every other learner (lockstep, and one learner); or claims of the units of the
        epoch's one order from a shared counter (:mod:`asrtrain.distributed.claims`), so that a
        fast learner takes more of the epoch."""
        return None

    def consensus_with_distance(self) -> tuple[dict[str, torch.Tensor], float]:
        """:meth:`consensus` and the learners' distance to it (:meth:`consensus_distance`), from
        one drain; collective."""
        return self.consensus(), 0.0

    def drain_figures(self) -> dict[str, float]:
        """What this learner's last drain of background exchanges took, as the epoch summary's
        figures (``gossip_hold_s``, ``gossip_rounds``, ``gossip_drain_s``: see
        :class:`asrtrain.distributed.gossip.DrainFigures`); empty where nothing runs in the
        background."""
        return {}

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
# The base of the multi-learner backends.


class DistributedBackend(Backend):
    """What every multi-learner backend shares: setup with the initial model broadcast, model
    averaging (consensus), metrics, step-count agreement and closing; all through ``comm``.

    A subclass is built as ``cls(comm, cfg)`` and implements :meth:`after_step` and
    :meth:`global_samples`; it may add :meth:`create_groups` (its process groups, at
    construction), :meth:`attach` (after the initial broadcast), :meth:`after_backward`, and
    :meth:`drain` / :meth:`release` / :meth:`stop` when it exchanges in the background.
    Optimizer steps run under :attr:`model_lock`, which background exchanges also take, and
    are ordered on the GPU against them by :attr:`streams` (:meth:`updating_model`).
    """

    def __init__(self, comm: Comm, cfg: DistributedConfig) -> None:
        super().__init__(comm.rank, comm.world_size, comm.local_rank, comm.device)
        self.comm = comm
        self.cfg = cfg
        self.params: list[torch.Tensor] = []
        #: Serialises optimizer steps and background (gossip) updates of the model.
        self.model_lock = threading.Lock()
        #: Orders the main stream's model updates against a gossip thread's copies; a backend
        #: that gossips sets it from its parameters (``streams.streams_for``) in attach.
        self.streams = NullStream()
        self._met = False  # inside meeting(): drained, held until it ends
        self.create_groups()

    # -- hooks -----------------------------------------------------------------------------------
    @classmethod
    def check(cls, cfg: DistributedConfig, device: torch.device) -> None:  # noqa: B027
        """Raise the :class:`AsrtrainError` of a setting that cannot run on ``device``. Called
        on every learner before it joins the process group, so that each says so and none waits
        for (or holds the store of) another that gave up."""

    def create_groups(self) -> None:  # noqa: B027 - the default group is enough by default
        """Create this backend's process groups (:meth:`Comm.new_group`). Called at construction,
        on every rank, before any collective: every rank creates every group in the same order
        (docs/architecture.md, "gloo")."""

    def attach(self) -> None:  # noqa: B027 - a backend without per-run state needs nothing
        """Called by :meth:`setup` once the model is known and synchronised; collective."""

    def drain(self) -> None:  # noqa: B027 - nothing runs in the background by default
        """Bring every learner to rest, no exchange in flight, until :meth:`release`; collective."""

    def release(self) -> None:  # noqa: B027
        """Let background exchanges go on after :meth:`drain`."""

    def stop(self) -> None:  # noqa: B027
        """Stop this backend's threads (called after :meth:`drain` by :meth:`close`)."""

    # -- the interface ---------------------------------------------------------------------------
    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              global_samples: int = 0) -> None:
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise AsrtrainError(f"rank {self.rank}: the model has no trainable parameters")
        self.start_samples = int(global_samples)
        if self.cfg.sync_init:
            self.broadcast_model(0, None, "initial model broadcast")
        self.attach()

    @contextlib.contextmanager
    def updating_model(self) -> Iterator[None]:
        """Hold the model lock and order the update against gossip's GPU copies: it waits (on
        the GPU) for their last, and their next waits for it."""
        with self.model_lock:
            self.streams.before_update()
            yield
            self.streams.after_update()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        with self.updating_model():
            optimizer.step()

    @contextlib.contextmanager
    def meeting(self) -> Iterator[None]:
        """:meth:`drain` on entry, :meth:`release` at the end; inside one, a nested meeting (the
        consensus methods') is part of it: it neither drains again nor releases early."""
        if self._met:
            yield
            return
        self.drain()
        self._met = True
        try:
            yield
        finally:
            self._met = False
            self.release()

    def consensus(self) -> dict[str, torch.Tensor]:
        with self.meeting():
            return self.average_state()

    def consensus_distance(self) -> float:
        with self.meeting():
            return self.distance_to(self.average_state())

    def consensus_with_distance(self) -> tuple[dict[str, torch.Tensor], float]:
        with self.meeting():
            state = self.average_state()
            return state, self.distance_to(state)

    def agree_min(self, value: int) -> int:
        return self.comm.allreduce_int(value, "step count agreement", op=dist.ReduceOp.MIN)

    def reduce_mean(self, values: Mapping[str, float]) -> dict[str, float]:
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        t = self.comm.allreduce(t, "metric averaging") / self.world_size
        return {k: float(x) for k, x in zip(keys, t.tolist(), strict=True)}

    def close(self) -> None:
        if self.model is not None:
            self.drain()
            self.stop()
        self.comm.close()

    # -- model collectives -----------------------------------------------------------------------
    def broadcast_model(self, src: int, group: dist.ProcessGroup | None, what: str) -> None:
        """Copy the model (parameters and buffers) of global rank ``src`` to ``group``."""
        assert self.model is not None
        self.comm.broadcast_([t for t in self.model.state_dict().values() if t.numel()], src,
                             group, what)

    def average_state(self) -> dict[str, torch.Tensor]:
        """All-reduce the mean of every floating-point entry of the state dict (CPU copies)."""
        assert self.model is not None
        out: dict[str, torch.Tensor] = {}
        for k, v in self.model.state_dict().items():
            if v.is_floating_point() and v.numel():
                total = self.comm.allreduce(v, "consensus averaging")
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
        total = self.comm.allreduce(torch.tensor([diff**0.5], dtype=torch.float64),
                                    "consensus distance")
        return float(total[0]) / self.world_size / max(norm, 1e-30)
