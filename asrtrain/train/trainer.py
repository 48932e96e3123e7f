"""The training loop: one loop for every backend (the backend decides how learners communicate).

Per step: forward, the task's loss (CTC, or frame CE on chunks), backward,
``backend.after_backward`` (gradient reduction for
synchronous backends), gradient clipping, ``backend.optimizer_step``, ``backend.after_step``.
The learning rate follows the backend's count of samples seen by all learners. At the end of
each epoch the consensus model (the average of the learners, after in-flight exchanges drained)
is evaluated on the dev set by all learners together and checkpointed by learner 0.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from asrtrain import AsrtrainError
from asrtrain.models import build_model
from asrtrain.train import checkpoint
from asrtrain.train.schedule import LRSchedule
from asrtrain.train.tasks import build_task

log = logging.getLogger(__name__)


def build_optimizer(cfg: Mapping, params) -> torch.optim.Optimizer:
    name = cfg.get("optimizer", "adam")
    if name == "adam":
        return torch.optim.Adam(params, lr=float(cfg["lr"]),
                                weight_decay=float(cfg.get("weight_decay", 0.0)))
    if name == "sgd":
        return torch.optim.SGD(params, lr=float(cfg["lr"]),
                               momentum=float(cfg.get("momentum", 0.9)),
                               nesterov=bool(cfg.get("nesterov", False)),
                               weight_decay=float(cfg.get("weight_decay", 0.0)))
    raise AsrtrainError(f"trainer.optimizer={name!r}: expected adam or sgd")


def spec_augment(feats: torch.Tensor, lengths: torch.Tensor, cfg: Mapping,
                 gen: torch.Generator) -> torch.Tensor:
    """SpecAugment's frequency and time masks (Park et al., 2019), in place on a copy."""
    feats = feats.clone()
    b, _, d = feats.shape
    for i in range(b):
        for _ in range(int(cfg.get("freq_masks", 2))):
            w = int(torch.randint(0, int(cfg.get("freq_width", 8)) + 1, (1,), generator=gen))
            f0 = int(torch.randint(0, max(1, d - w), (1,), generator=gen))
            feats[i, :, f0:f0 + w] = 0
        n = int(lengths[i])
        for _ in range(int(cfg.get("time_masks", 2))):
            w = int(torch.randint(0, min(int(cfg.get("time_width", 20)), n // 5) + 1, (1,),
                                  generator=gen))
            t0 = int(torch.randint(0, max(1, n - w), (1,), generator=gen))
            feats[i, t0:t0 + w] = 0
    return feats


def train(cfg: DictConfig, backend) -> Path:
    """Train the model of ``cfg`` with ``backend``; return the final model's path."""
    tcfg = cfg.trainer
    out_dir = Path(cfg.train_dir)
    task = build_task(cfg)
    torch.manual_seed(int(tcfg.seed))  # the same initial model on every learner
    model = build_model(cfg.model, task.input_dim, task.output_dim).to(backend.device)
    optimizer = build_optimizer(tcfg, model.parameters())
    # this learner's SpecAugment draws; saved with its optimizer so a resumed run is the same
    gen = torch.Generator().manual_seed(int(tcfg.seed) * 1000 + backend.rank)
    start_epoch = checkpoint.latest_epoch(out_dir)
    resumed_samples = 0
    if start_epoch:
        ckpt = checkpoint.load(checkpoint.model_path(out_dir, start_epoch))
        model.load_state_dict(ckpt["model"])
        opt_path = checkpoint.optimizer_path(out_dir, start_epoch, backend.rank)
        if opt_path.is_file():
            learner = checkpoint.load(opt_path)
            if "optimizer" in learner:
                optimizer.load_state_dict(learner["optimizer"])
                gen.set_state(learner["spec_augment_rng"])
            else:  # written before the SpecAugment state was kept: the optimizer state alone
                optimizer.load_state_dict(learner)
        resumed_samples = int(ckpt["global_samples"])
        if backend.is_main:
            log.info("resuming after epoch %d from %s", start_epoch,
                     checkpoint.model_path(out_dir, start_epoch))
    backend.setup(model, optimizer, global_samples=resumed_samples)
    global_samples = backend.global_samples  # all learners' samples, those before a resume too

    epochs = int(tcfg.epochs)
    per_epoch = task.steps_per_epoch(backend.data_world)
    schedule = LRSchedule.from_config(tcfg, task.samples_per_epoch)
    if backend.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        log.info("%s", backend.describe())
        log.info("model: %s, %.2fM parameters, %d inputs, %d outputs",
                 OmegaConf.to_container(cfg.model), n_params / 1e6, task.input_dim,
                 task.output_dim)
        log.info("%s; about %d steps per epoch per learner", task.describe(), per_epoch)
    log_every = int(tcfg.log_every)
    clip = float(tcfg.grad_clip)
    step = start_epoch * per_epoch
    for epoch in range(start_epoch + 1, epochs + 1):
        bar = tqdm(total=per_epoch, desc=f"epoch {epoch}/{epochs}", unit="batch",
                   disable=not backend.is_main, leave=False)
        t0 = time.time()
        frames = steps = 0
        loss_sum = 0.0
        for batch in task.epoch(epoch, backend.data_rank, backend.data_world):
            lr = schedule(global_samples())
            for group in optimizer.param_groups:
                group["lr"] = lr
            if tcfg.get("spec_augment"):
                batch.feats = spec_augment(batch.feats, batch.lengths, tcfg.spec_augment, gen)
            optimizer.zero_grad(set_to_none=False)
            loss = task.loss(model, batch)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise AsrtrainError(
                    f"rank {backend.rank}: non-finite loss {loss_value} at epoch {epoch} step "
                    f"{step}{_batch_names(batch)}: lower trainer.lr or check the features")
            loss.backward()
            backend.after_backward(step)
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            backend.optimizer_step(optimizer)
            backend.after_step(step, task.samples(batch))
            step += 1
            steps += 1
            frames += batch.frames
            loss_sum += loss_value
            bar.update()
            if step % log_every == 0:
                rate = frames / max(time.time() - t0, 1e-9)
                bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", fps=f"{rate:.0f}")
                dist = backend.consensus_distance()
                if backend.is_main:
                    log.info("epoch %d step %d: loss %.4f lr %.3e %.0f frames/s per learner, "
                             "consensus distance %.2e", epoch, step, loss_value, lr, rate, dist)
        bar.close()
        elapsed = time.time() - t0
        state = backend.consensus()
        dev_model = copy.deepcopy(model)
        dev_model.load_state_dict(state)
        dev_model.eval()
        sums = task.evaluate(dev_model, backend.data_rank, backend.data_world)
        del dev_model
        sums.update(train_loss=loss_sum, train_steps=steps,
                    frames_per_second=frames / max(elapsed, 1e-9))
        means = backend.reduce_mean(sums)
        summary = {"epoch": epoch, "train_loss": means["train_loss"] / max(means["train_steps"], 1),
                   **task.summarize(means),
                   "frames_per_second_per_learner": means["frames_per_second"],
                   "epoch_seconds": elapsed, "global_samples": global_samples()}
        checkpoint.save({"optimizer": optimizer.state_dict(), "spec_augment_rng": gen.get_state()},
                        checkpoint.optimizer_path(out_dir, epoch, backend.rank))
        if backend.is_main:
            ckpt = {"model": state, "epoch": epoch, "global_samples": global_samples(),
                    "model_config": OmegaConf.to_container(cfg.model, resolve=True),
                    "input_dim": task.input_dim, "output_dim": task.output_dim,
                    "features": OmegaConf.to_container(cfg.features, resolve=True),
                    "metrics": summary, **task.checkpoint_extra()}
            checkpoint.save(ckpt, checkpoint.model_path(out_dir, epoch))
            log.info("epoch %d: %s", epoch, ", ".join(
                f"{k} {v:.4g}" for k, v in summary.items() if k != "epoch"))
    final = out_dir / "final.pt"
    if backend.is_main:
        checkpoint.save(checkpoint.load(checkpoint.model_path(out_dir, epochs)), final)
    return final


def _batch_names(batch) -> str:
    utts = getattr(batch, "utts", None)
    return f" (utterances {', '.join(utts[:3])}...)" if utts else ""
