"""Distributed training: one Backend interface, one registered backend per ``trainer.backend``
(ssgd, adpsgd, hadpsgd, ...), a single-process backend when there is one learner.

Modules (the backend contract is in docs/architecture.md):
    backend      the Backend interface, SingleProcessBackend, DistributedBackend (shared base)
    registry     register_backend / backend_names / backend_class (no torch import)
    learner      build_backend: torchrun environment, device, process group, liveness
    comm         Comm (collectives naming the failed learner), the comm device, flat params
    allreduce    GradientAllreduce (synchronous SGD in a group)
    gossip       Gossip thread and drain_gossip (AD-PSGD)
    liveness     heartbeats that name a dead learner
    topology     gossip schedules and spectral gaps
    launch       torchrun launcher
    backends/    one module per backend: the policy, composing the pieces above

The settings they read are :class:`asrtrain.train.config.TrainerConfig` (defaults there). This
package's import is light (no torch): ``build_backend`` and ``cpu_threads`` load on first use.
"""

from __future__ import annotations

from typing import Any

from asrtrain.distributed.registry import backend_names, register_backend

__all__ = ["backend_names", "build_backend", "cpu_threads", "register_backend"]


def __getattr__(name: str) -> Any:
    if name == "build_backend":
        from asrtrain.distributed.learner import build_backend

        return build_backend
    if name == "cpu_threads":
        from asrtrain.distributed.comm import cpu_threads

        return cpu_threads
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
