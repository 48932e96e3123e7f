"""The registry of distributed backends: a backend is one module that registers its name.

A backend lives in ``asrtrain/distributed/backends/<name>.py`` and registers its class under the
module's name with :func:`register_backend`::

    @register_backend("mybackend")
    class MyBackend(DistributedBackend): ...

:func:`backend_names` lists the modules of that package without importing them (so a config can
be checked without torch), plus any backend registered from elsewhere (a test, a plugin);
:func:`backend_class` imports a backend's module on first use. Nothing else lists backends: the
trainer config, :func:`asrtrain.distributed.learner.build_backend` and ``bench/run.py`` all ask
here. The contract a backend fulfils is :class:`asrtrain.distributed.backend.Backend`
(see docs/architecture.md, "Backend contract").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from asrtrain import AsrtrainError
from asrtrain.registry import claim

#: The package whose modules are the built-in backends, one per module, named as the module.
PACKAGE = "asrtrain.distributed.backends"

_REGISTRY: dict[str, type] = {}

#: The groups a :class:`SimShape` may name: who averages gradients every step.
SYNC_GROUPS = ("learner", "node", "all")


@dataclass(frozen=True)
class SimShape:
    """What ``asrtrain simulate`` needs to know of a backend (its class attribute ``sim_shape``).

    ``sync``: the learners that average their gradients every step and so step as one replica:
    ``"learner"`` (nobody: each learner is its own), ``"node"`` (the ``per_node`` learners of a
    node) or ``"all"``; such a group is one simulated *member*. ``gossip``: whether the members
    gossip with each other (the topology's pairwise averaging, :mod:`.gossip`); a backend whose
    members neither share gradients nor gossip has nothing to simulate. The time model
    (:mod:`asrtrain.simulate.timing`) charges a ``sync`` group a ring allreduce of the gradients
    every step and a gossiping member an exchange per partner per round.
    """

    sync: str
    gossip: bool

    def __post_init__(self) -> None:
        if self.sync not in SYNC_GROUPS:
            raise AsrtrainError(f"SimShape(sync={self.sync!r}): use one of "
                                f"{', '.join(SYNC_GROUPS)}")
        if self.sync != "all" and not self.gossip:
            raise AsrtrainError(f"SimShape(sync={self.sync!r}, gossip=False): members that "
                                "neither share gradients nor gossip never meet")

    def members(self, learners: int, per_node: int) -> int:
        """Simulated members among ``learners`` (``per_node`` a node)."""
        return {"learner": learners, "node": learners // max(per_node, 1), "all": 1}[self.sync]

    def group(self, learners: int, per_node: int) -> int:
        """Learners that step as one member."""
        return learners // self.members(learners, per_node)

C = TypeVar("C", bound=type)


def register_backend(name: str) -> Callable[[C], C]:
    """Class decorator: make the class the backend ``trainer.backend=<name>`` selects.

    The class is built as ``cls(comm, cfg)`` (an :class:`asrtrain.distributed.comm.Comm` and the
    :class:`asrtrain.train.config.TrainerConfig`) on every learner of a multi-learner run, and
    its ``name`` attribute is set to ``name``.
    """
    if not name.isidentifier():
        raise AsrtrainError(f"backend name {name!r} is not an identifier")

    def decorate(cls: C) -> C:
        claim(_REGISTRY, name, cls, f"backend {name!r}")
        cls.name = name
        return cls
    return decorate


def _builtin_names() -> list[str]:
    package = importlib.import_module(PACKAGE)  # its __init__ imports nothing heavy
    return [m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")]


def backend_names() -> tuple[str, ...]:
    """Every backend ``trainer.backend`` may name, sorted (no backend module is imported)."""
    return tuple(sorted(set(_builtin_names()) | set(_REGISTRY)))


def backend_class(name: str) -> type:
    """The class registered as ``name``, importing its module from the package if need be."""
    if name not in _REGISTRY and name in _builtin_names():
        importlib.import_module(f"{PACKAGE}.{name}")
        if name not in _REGISTRY:
            raise AsrtrainError(f"{PACKAGE}.{name} registers no backend named {name!r} "
                                f"(decorate its class with @register_backend({name!r}))")
    if name not in _REGISTRY:
        raise AsrtrainError(f"trainer.backend={name!r}: expected one of "
                            f"{', '.join(backend_names())}")
    return _REGISTRY[name]


def sim_shape(name: str) -> SimShape:
    """The simulation shape backend ``name`` declares (its class's ``sim_shape``)."""
    try:
        cls = backend_class(name)
    except AsrtrainError:
        raise AsrtrainError(f"simulate: backend {name!r} is not registered: use one of "
                            f"{', '.join(backend_names())}") from None
    shape = getattr(cls, "sim_shape", None)
    if not isinstance(shape, SimShape):
        raise AsrtrainError(f"simulate: backend {name!r} ({cls.__module__}) declares no "
                            "sim_shape (a registry.SimShape class attribute): it cannot be "
                            "simulated")
    return shape
