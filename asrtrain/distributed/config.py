"""The distributed part of the trainer's settings (``cfg.trainer``): how learners are launched
and how they share what they learn.

:class:`DistributedConfig` is what :mod:`asrtrain.distributed` reads (``build_backend`` and the
backends); :class:`asrtrain.train.config.TrainerConfig` extends it with the training loop's
settings, so one ``trainer`` section, one object, and the distributed package never imports the
trainer (docs/architecture.md, "Layers"). Read by :func:`asrtrain.settings.read`; imports
neither torch nor the backends' modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from asrtrain.settings import bad, boolean, choice, integer, number, opt, optional, read


def _endpoint(key: str, value: object) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise bad(key, value, "host:port of node 0")
    return value


def _backends() -> tuple[str, ...]:
    from asrtrain.distributed.registry import backend_names

    return backend_names()


def _topologies() -> tuple[str, ...]:
    from asrtrain.distributed.topology import SCHEMES

    return SCHEMES


@dataclass(frozen=True)
class DistributedConfig:
    """Launch: ``learners`` per node (torchrun ``--nproc-per-node``), ``nnodes`` machines, this
    machine's ``node_rank`` and node 0's ``rdzv_endpoint`` (host:port) for multi-node runs.
    Backend: ``backend`` (a registered name), ``per_node`` (hadpsgd: learners per super-learner;
    None: the learners of a machine), the gossip ``topology``, ``delay_by_one``,
    ``gossip_idle_s`` (the pause between gossip rounds when no step was taken),
    ``gossip_backend`` (``gloo``; ``nccl``: between GPUs, never run here, docs/architecture.md),
    ``timeout_s`` (every blocking wait), ``sync_init`` (start all learners from learner 0's
    model), ``threads`` (torch CPU threads per learner; 0: one), ``cpu`` (train on CPU even where
    CUDA is available), ``seed`` (the initial model, the batch order, SpecAugment draws and the
    randomized gossip ring)."""

    backend: str = opt("ssgd", choice(known=_backends))
    learners: int = opt(1, integer(1))
    nnodes: int = opt(1, integer(1))
    node_rank: int = opt(0, integer(0))
    rdzv_endpoint: str | None = opt(None, optional(_endpoint))
    per_node: int | None = opt(None, optional(integer(1)))
    topology: str = opt("random_ring", choice(known=_topologies))
    delay_by_one: bool = opt(False, boolean)
    timeout_s: float = opt(60.0, number(0.0, low_open=True))
    gossip_idle_s: float = opt(0.1, number(0.0, low_open=True))
    gossip_backend: str = opt("gloo", choice("gloo", "nccl"))
    sync_init: bool = opt(True, boolean)
    threads: int = opt(0, integer(0))
    cpu: bool = opt(False, boolean)
    seed: int = opt(1, integer(0))

    def __post_init__(self) -> None:
        if self.node_rank >= self.nnodes:
            raise bad("trainer.node_rank", self.node_rank,
                      f"a node number below trainer.nnodes={self.nnodes}")

    @classmethod
    def from_config(cls, cfg: Mapping | DistributedConfig | None) -> DistributedConfig:
        """The settings of ``cfg`` (a ``trainer`` section or an object of this class or a
        subclass, e.g. a TrainerConfig), the defaults for the keys it lacks."""
        if isinstance(cfg, DistributedConfig):
            return cfg
        return read(cls, cfg, "trainer")
