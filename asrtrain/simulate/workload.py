"""The real workload of a recipe for the simulator: its task (hybrid frame CE on chunks, or CTC),
data pipeline, model, optimizer and learning-rate schedule, exactly as the train stages build them
(:func:`asrtrain.train.tasks.build_task`, :func:`asrtrain.models.build_model`,
:func:`asrtrain.train.trainer.build_optimizer`, :class:`asrtrain.train.schedule.LRSchedule`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from asrtrain import AsrtrainError
from asrtrain.models import build_model
from asrtrain.train.config import TrainerConfig
from asrtrain.train.data import shard
from asrtrain.train.schedule import LRSchedule
from asrtrain.train.tasks import FrameCETask, build_task
from asrtrain.train.trainer import build_optimizer, spec_augment

SYSTEMS = ("hybrid", "ctc")


def system_config(cfg: DictConfig, system: str) -> DictConfig:
    """The config the train stage of ``system`` trains with (``hybrid``: the hybrid model with
    ``hybrid.trainer`` over ``trainer`` and the last GMM pass's alignments; ``ctc``: as is)."""
    from asrtrain.recipe import Paths

    if system not in SYSTEMS:
        raise AsrtrainError(f"simulate --system {system!r}: use one of {', '.join(SYSTEMS)}")
    if system == "ctc":
        return cfg
    from asrtrain.stages.train_hybrid import hybrid_config

    return hybrid_config(cfg, Paths(Path(cfg.exp_dir)))


class TaskWorkload:
    """A recipe's task for :class:`asrtrain.simulate.engine.Simulator`; SpecAugment (where the
    trainer settings have it) is drawn per learner from the generator the trainer seeds for that
    rank."""

    def __init__(self, cfg: DictConfig) -> None:
        self.tcfg = TrainerConfig.from_config(cfg.trainer)
        self.task = build_task(cfg)
        torch.manual_seed(self.tcfg.seed)  # the initial model of every learner, as the trainer
        self.model = build_model(cfg.model, self.task.input_dim, self.task.output_dim)
        self.schedule = LRSchedule.from_config(self.tcfg, self.task.samples_per_epoch)
        self._gens: dict[int, torch.Generator] = {}  # each learner's SpecAugment draws

    def epoch_steps(self, epoch: int, world: int) -> int:
        """Steps every learner takes in ``epoch`` (the epoch's seed deals the shards)."""
        task, seed = self.task, self.task.seed + epoch
        if isinstance(task, FrameCETask):
            return task.train_set.steps(seed, world, task.batch_size)
        return len(shard(task.train_set.batches(task.batch_frames, seed), 0, world))

    def batches(self, epoch: int, rank: int, world: int) -> Iterator[Any]:
        masks = self.tcfg.spec_augment
        gen = self._gens.setdefault(rank, torch.Generator().manual_seed(
            self.tcfg.seed * 1000 + rank))
        for batch in self.task.epoch(epoch, rank, world):
            if masks is not None:
                batch.feats = spec_augment(batch.feats, batch.lengths, masks, gen)
            yield batch

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return self.task.loss(model, batch)

    def samples(self, batch: Any) -> int:
        return int(self.task.samples(batch))

    def heldout_loss(self, model: torch.nn.Module) -> float:
        return float(self.task.summarize(self.task.evaluate(model, 0, 1))["dev_loss"])

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return build_optimizer(self.tcfg, params)

    def lr(self, global_samples: int) -> float:
        return self.schedule(global_samples)
