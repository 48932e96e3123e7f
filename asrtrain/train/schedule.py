"""Learning-rate schedule driven by global progress (samples seen by all learners).

Linear warm-up from ``lr * warmup_start`` to ``lr`` over ``warmup_epochs``, constant until
``anneal_start_epoch``, then multiplied by ``anneal_factor`` per epoch (IBM's recipe: warm up, then
anneal by 1/sqrt(2) per epoch). Using global progress keeps asynchronous learners on one schedule
whatever their own step counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    samples_per_epoch: int
    warmup_epochs: float = 0.0
    warmup_start: float = 0.1
    anneal_start_epoch: float = 1e9
    anneal_factor: float = 0.7071

    @classmethod
    def from_config(cls, cfg: Mapping, samples_per_epoch: int) -> LRSchedule:
        return cls(lr=float(cfg["lr"]), samples_per_epoch=max(1, samples_per_epoch),
                   warmup_epochs=float(cfg.get("warmup_epochs", 0.0)),
                   warmup_start=float(cfg.get("warmup_start", 0.1)),
                   anneal_start_epoch=float(cfg.get("anneal_start_epoch", 1e9)),
                   anneal_factor=float(cfg.get("anneal_factor", 0.7071)))

    def __call__(self, global_samples: int) -> float:
        epoch = global_samples / self.samples_per_epoch
        if epoch < self.warmup_epochs:
            frac = epoch / self.warmup_epochs
            return self.lr * (self.warmup_start + (1 - self.warmup_start) * frac)
        if epoch >= self.anneal_start_epoch:
            return self.lr * self.anneal_factor ** (epoch - self.anneal_start_epoch)
        return self.lr
