"""Distributed training: one Backend interface, chosen by ``trainer.backend`` (ssgd, adpsgd,
hadpsgd), with a single-process backend when there is one learner.

Trainer config keys read here (all optional except under torchrun ``backend``):
    backend: ssgd | adpsgd | hadpsgd              (default ssgd)
    per_node: learners per node for hadpsgd       (default LOCAL_WORLD_SIZE from torchrun)
    topology: ring | random_ring | exponential    (default random_ring)
    delay_by_one: bool                            (default false)
    seed: shared seed of the randomized ring      (default 0)
    timeout_s: every blocking wait's limit        (default 60)
    gossip_idle_s: gossip round interval when no step was taken  (default 0.1)
    sync_init: start all learners from rank 0's model  (default true)
    threads: CPU threads per learner               (default 0: one; see cpu_threads)
    cpu: train on CPU even where CUDA is available (default false)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import Backend, Liveness, SingleProcessBackend

BACKENDS = ("ssgd", "adpsgd", "hadpsgd")

__all__ = ["BACKENDS", "Backend", "build_backend", "cpu_threads"]


def cpu_threads(threads: int = 0) -> int:
    """Torch CPU threads for one learner: ``threads``, or one when it is 0.

    One, because the LSTM's per-frame steps are too small to share: on 2 cores a tiny-recipe
    epoch took 7 s with one thread and 20 s with two (OpenMP threads waiting passively), and
    threads that spin instead are 10-15x slower still as soon as another job shares the cores
    (measured here). Use the cores by running more learners; set ``trainer.threads`` for a
    model whose matrices are large enough.
    """
    return threads if threads > 0 else 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as e:
        raise AsrtrainError(f"environment variable {name}={value!r} is not an integer") from e


def build_backend(trainer_cfg: Mapping) -> Backend:
    """The backend of this learner, joining the process group described by torchrun's environment.

    Without ``WORLD_SIZE`` in the environment (or with 1) this is a :class:`SingleProcessBackend`.
    The learner takes :func:`cpu_threads` torch CPU threads.
    """
    cfg = dict(trainer_cfg or {})
    name = str(cfg.get("backend", "ssgd"))
    if name not in BACKENDS:
        raise AsrtrainError(f"trainer.backend={name!r} is not one of {', '.join(BACKENDS)}")
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    use_cuda = torch.cuda.is_available() and not cfg.get("cpu", False)
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    # GPU learners too: their CPU work (data, gossip copies) is no more parallel than the LSTM's
    torch.set_num_threads(cpu_threads(int(cfg.get("threads") or 0)))
    if world <= 1:
        return SingleProcessBackend(0, 1, 0, device)
    timeout_s = float(cfg.get("timeout_s", 60))
    if not dist.is_initialized():
        try:
            dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://",
                                    rank=rank, world_size=world,
                                    timeout=timedelta(seconds=timeout_s))
        except Exception as e:  # noqa: BLE001 - a rendezvous failure is the user's to fix
            raise AsrtrainError(
                f"rank {rank}: cannot join the process group of {world} learners at "
                f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}: {e}") from e
    liveness = Liveness(rank, world)
    liveness.start()
    common = dict(rank=rank, world_size=world, local_rank=local_rank, device=device,
                  timeout_s=timeout_s, liveness=liveness)
    sync_init = bool(cfg.get("sync_init", True))
    gossip = dict(topology=str(cfg.get("topology", "random_ring")), seed=int(cfg.get("seed", 0)),
                  delay_by_one=bool(cfg.get("delay_by_one", False)),
                  idle_s=float(cfg.get("gossip_idle_s", 0.1)), sync_init=sync_init)
    if name == "ssgd":
        from asrtrain.distributed.ssgd import SSGDBackend

        return SSGDBackend(**common, sync_init=sync_init)
    if name == "adpsgd":
        from asrtrain.distributed.adpsgd import ADPSGDBackend

        return ADPSGDBackend(**common, **gossip)
    from asrtrain.distributed.hadpsgd import HADPSGDBackend

    per_node = cfg.get("per_node")
    per_node = local_world if per_node in (None, "", 0) else int(per_node)
    return HADPSGDBackend(**common, per_node=per_node, **gossip)
