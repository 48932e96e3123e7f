"""Learning-rate schedule driven by global progress (samples seen by all learners).

Linear warm-up from ``lr * warmup_start`` to ``lr`` over ``warmup_epochs``, constant until
``anneal_start_epoch``, then multiplied by ``anneal_factor`` per epoch (IBM's recipe: warm up, then
anneal by 1/sqrt(2) per epoch). Using global progress keeps asynchronous learners on one schedule
whatever their own step counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asrtrain.train.config import TrainerConfig


@dataclass(frozen=True)
class LRSchedule:
    """The schedule's settings (defaults: :class:`asrtrain.train.config.TrainerConfig`)."""

    lr: float
    samples_per_epoch: int
    warmup_epochs: float
    warmup_start: float
    anneal_start_epoch: float
    anneal_factor: float

    @classmethod
    def from_config(cls, cfg: TrainerConfig, samples_per_epoch: int) -> LRSchedule:
        return cls(lr=cfg.lr, samples_per_epoch=max(1, samples_per_epoch),
                   warmup_epochs=cfg.warmup_epochs, warmup_start=cfg.warmup_start,
                   anneal_start_epoch=cfg.anneal_start_epoch, anneal_factor=cfg.anneal_factor)

    def __call__(self, global_samples: int) -> float:
        epoch = global_samples / self.samples_per_epoch
        if epoch < self.warmup_epochs:
            frac = epoch / self.warmup_epochs
            return self.lr * (self.warmup_start + (1 - self.warmup_start) * frac)
        if epoch >= self.anneal_start_epoch:
            return self.lr * self.anneal_factor ** (epoch - self.anneal_start_epoch)
        return self.lr
