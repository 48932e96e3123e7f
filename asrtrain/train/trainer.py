"""The training loop: one loop for every backend (the backend decides how learners communicate).

Per step: forward, the task's loss (CTC, or frame CE on chunks), backward,
``backend.after_backward`` (gradient reduction for
synchronous backends), gradient clipping, ``backend.optimizer_step``, ``backend.after_step``.
The learning rate follows the backend's count of samples seen by all learners. At the end of
each epoch the consensus model (the average of the learners, after in-flight exchanges drained)
is evaluated on the dev set by all learners together and checkpointed by learner 0. The trainer's
settings are read from :class:`asrtrain.train.config.TrainerConfig` (defaults and checks there).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import Backend
from asrtrain.models import build_model
from asrtrain.train import checkpoint
from asrtrain.train.config import SpecAugment, TrainerConfig
from asrtrain.train.schedule import LRSchedule
from asrtrain.train.tasks import build_task

log = logging.getLogger(__name__)


def build_optimizer(cfg: TrainerConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay)
    raise AsrtrainError(f"trainer.optimizer={cfg.optimizer!r}: expected adam or sgd")


def spec_augment(feats: torch.Tensor, lengths: torch.Tensor, cfg: SpecAugment,
                 gen: torch.Generator) -> torch.Tensor:
    """SpecAugment's frequency and time masks (Park et al., 2019), in place on a copy."""
    feats = feats.clone()
    b, _, d = feats.shape
    for i in range(b):
        for _ in range(cfg.freq_masks):
            w = int(torch.randint(0, cfg.freq_width + 1, (1,), generator=gen))
            f0 = int(torch.randint(0, max(1, d - w), (1,), generator=gen))
            feats[i, :, f0:f0 + w] = 0
        n = int(lengths[i])
        for _ in range(cfg.time_masks):
            w = int(torch.randint(0, min(cfg.time_width, n // 5) + 1, (1,), generator=gen))
            t0 = int(torch.randint(0, max(1, n - w), (1,), generator=gen))
            feats[i, t0:t0 + w] = 0
    return feats


@dataclass
class _Run:
    """What the parts of one training run share."""

    cfg: DictConfig
    tcfg: TrainerConfig
    backend: Backend
    task: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    gen: torch.Generator  # this learner's SpecAugment draws (saved with its optimizer)
    out_dir: Path


@dataclass
class _Epoch:
    """One learner's figures of one epoch."""

    steps: int
    frames: int
    loss_sum: float
    seconds: float


def train(cfg: DictConfig, backend: Backend) -> Path:
    """Train the model of ``cfg`` with ``backend``; return the final model's path."""
    tcfg = TrainerConfig.from_config(cfg.trainer)
    task = build_task(cfg)
    torch.manual_seed(tcfg.seed)  # the same initial model on every learner
    model = build_model(cfg.model, task.input_dim, task.output_dim).to(backend.device)
    run = _Run(cfg, tcfg, backend, task, model, build_optimizer(tcfg, model.parameters()),
               torch.Generator().manual_seed(tcfg.seed * 1000 + backend.rank),
               Path(cfg.train_dir))
    start_epoch, resumed_samples = _resume(run)
    backend.setup(model, run.optimizer, global_samples=resumed_samples)
    per_epoch = task.steps_per_epoch(backend.data_world)
    schedule = LRSchedule.from_config(tcfg, task.samples_per_epoch)
    if backend.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        log.info("%s", backend.describe())
        log.info("model: %s, %.2fM parameters, %d inputs, %d outputs",
                 OmegaConf.to_container(cfg.model), n_params / 1e6, task.input_dim,
                 task.output_dim)
        log.info("%s; about %d steps per epoch per learner", task.describe(), per_epoch)
    step = start_epoch * per_epoch
    for epoch in range(start_epoch + 1, tcfg.epochs + 1):
        figures = _train_epoch(run, epoch, step, per_epoch, schedule)
        step += figures.steps
        _end_epoch(run, epoch, figures)
    final = run.out_dir / "final.pt"
    if backend.is_main:
        checkpoint.save(checkpoint.load(checkpoint.model_path(run.out_dir, tcfg.epochs)), final)
    return final


def _resume(run: _Run) -> tuple[int, int]:
    """Load the last checkpoint of ``run.out_dir`` if there is one: (its epoch, its samples)."""
    start_epoch = checkpoint.latest_epoch(run.out_dir)
    if not start_epoch:
        return 0, 0
    ckpt = checkpoint.load(checkpoint.model_path(run.out_dir, start_epoch))
    run.model.load_state_dict(ckpt["model"])
    opt_path = checkpoint.optimizer_path(run.out_dir, start_epoch, run.backend.rank)
    if opt_path.is_file():
        learner = checkpoint.load(opt_path)
        if "optimizer" in learner:
            run.optimizer.load_state_dict(learner["optimizer"])
            run.gen.set_state(learner["spec_augment_rng"])
        else:  # written before the SpecAugment state was kept: the optimizer state alone
            run.optimizer.load_state_dict(learner)
    if run.backend.is_main:
        log.info("resuming after epoch %d from %s", start_epoch,
                 checkpoint.model_path(run.out_dir, start_epoch))
    return start_epoch, int(ckpt["global_samples"])


def _train_epoch(run: _Run, epoch: int, step: int, per_epoch: int,
                 schedule: LRSchedule) -> _Epoch:
    """The steps of one epoch, from global step ``step``."""
    backend, model, optimizer, tcfg = run.backend, run.model, run.optimizer, run.tcfg
    bar = tqdm(total=per_epoch, desc=f"epoch {epoch}/{tcfg.epochs}", unit="batch",
               disable=not backend.is_main, leave=False)
    t0 = time.time()
    steps = frames = 0
    loss_sum = 0.0
    for batch in run.task.epoch(epoch, backend.data_rank, backend.data_world):
        lr = schedule(backend.global_samples())  # all learners' samples, before a resume too
        for group in optimizer.param_groups:
            group["lr"] = lr
        if tcfg.spec_augment is not None:
            batch.feats = spec_augment(batch.feats, batch.lengths, tcfg.spec_augment, run.gen)
        optimizer.zero_grad(set_to_none=False)
        loss = run.task.loss(model, batch)
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise AsrtrainError(
                f"rank {backend.rank}: non-finite loss {loss_value} at epoch {epoch} step "
                f"{step}{_batch_names(batch)}: lower trainer.lr or check the features")
        loss.backward()
        backend.after_backward(step)
        if tcfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        backend.optimizer_step(optimizer)
        backend.after_step(step, run.task.samples(batch))
        step += 1
        steps += 1
        frames += batch.frames
        loss_sum += loss_value
        bar.update()
        if step % tcfg.log_every == 0:
            rate = frames / max(time.time() - t0, 1e-9)
            bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", fps=f"{rate:.0f}")
            distance = backend.consensus_distance()
            if backend.is_main:
                log.info("epoch %d step %d: loss %.4f lr %.3e %.0f frames/s per learner, "
                         "consensus distance %.2e", epoch, step, loss_value, lr, rate, distance)
    bar.close()
    return _Epoch(steps, frames, loss_sum, time.time() - t0)


def _end_epoch(run: _Run, epoch: int, figures: _Epoch) -> None:
    """Evaluate the consensus model on the dev set (all learners) and write the checkpoints."""
    backend, task = run.backend, run.task
    state = backend.consensus()
    dev_model = copy.deepcopy(run.model)
    dev_model.load_state_dict(state)
    dev_model.eval()
    sums = task.evaluate(dev_model, backend.data_rank, backend.data_world)
    del dev_model
    sums.update(train_loss=figures.loss_sum, train_steps=figures.steps,
                frames_per_second=figures.frames / max(figures.seconds, 1e-9))
    means = backend.reduce_mean(sums)
    summary = {"epoch": epoch, "train_loss": means["train_loss"] / max(means["train_steps"], 1),
               **task.summarize(means),
               "frames_per_second_per_learner": means["frames_per_second"],
               "epoch_seconds": figures.seconds, "global_samples": backend.global_samples()}
    checkpoint.save({"optimizer": run.optimizer.state_dict(),
                     "spec_augment_rng": run.gen.get_state()},
                    checkpoint.optimizer_path(run.out_dir, epoch, backend.rank))
    if backend.is_main:
        task.model_checkpoint(run.cfg, state, epoch=epoch,
                              global_samples=backend.global_samples(),
                              metrics=summary).save(checkpoint.model_path(run.out_dir, epoch))
        log.info("epoch %d: %s", epoch, ", ".join(
            f"{k} {v:.4g}" for k, v in summary.items() if k != "epoch"))


def _batch_names(batch) -> str:
    utts = getattr(batch, "utts", None)
    return f" (utterances {', '.join(utts[:3])}...)" if utts else ""
