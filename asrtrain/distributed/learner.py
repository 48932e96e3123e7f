"""Join the learners of a run: torchrun's environment, the device, the process group, liveness,
and the registered backend of ``trainer.backend``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import Backend, SingleProcessBackend
from asrtrain.distributed.comm import Comm, cpu_threads, group_backend, learner_device
from asrtrain.distributed.config import DistributedConfig
from asrtrain.distributed.liveness import Liveness, die_with_launcher
from asrtrain.distributed.registry import backend_class


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as e:
        raise AsrtrainError(f"environment variable {name}={value!r} is not an integer") from e


def build_backend(trainer_cfg: DistributedConfig | Mapping | None) -> Backend:
    """The backend of this learner, joining the process group described by torchrun's environment.

    ``trainer_cfg`` is a :class:`DistributedConfig` (a ``TrainerConfig`` is one) or a mapping of
    its settings (checked by :meth:`DistributedConfig.from_config`). Without ``WORLD_SIZE`` in the
    environment (or with 1) this is a :class:`SingleProcessBackend`; otherwise the class
    registered as ``trainer.backend``, built as ``cls(comm, cfg)``. The learner takes
    :func:`cpu_threads` torch CPU threads.
    """
    cfg = DistributedConfig.from_config(trainer_cfg)
    die_with_launcher()
    cls = backend_class(cfg.backend)  # an unknown backend fails before anyone waits for it
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    device = learner_device(local_rank, cfg.cpu)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # GPU learners too: their CPU work (data, gossip copies) is no more parallel than the LSTM's
    torch.set_num_threads(cpu_threads(cfg.threads))
    if world <= 1:
        return SingleProcessBackend(0, 1, 0, device)
    if check := getattr(cls, "check", None):  # DistributedBackend's; a user's class may lack it
        check(cfg, device)
    if not dist.is_initialized():
        try:
            dist.init_process_group(group_backend(device), init_method="env://", rank=rank,
                                    world_size=world, timeout=timedelta(seconds=cfg.timeout_s))
        except Exception as e:  # noqa: BLE001 - a rendezvous failure is the user's to fix
            raise AsrtrainError(
                f"rank {rank}: cannot join the process group of {world} learners at "
                f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}: {e}") from e
    liveness = Liveness(rank, world)
    liveness.start()
    return cls(Comm(rank, world, local_rank, local_world, device, cfg.timeout_s, liveness), cfg)
