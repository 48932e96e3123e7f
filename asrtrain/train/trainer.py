"""The training loop: one loop for every backend (the backend decides how learners communicate).

Per step: forward, CTC loss, backward, ``backend.after_backward`` (gradient reduction for
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

import kaldialign
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from asrtrain import AsrtrainError
from asrtrain.decode.ctc import greedy_units
from asrtrain.lang.bpe import Units
from asrtrain.models import build_model
from asrtrain.train import checkpoint
from asrtrain.train.data import Batch, UtteranceSet, iterate, shard
from asrtrain.train.schedule import LRSchedule

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


def ctc_loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor,
                                                            torch.Tensor]:
    device = next(model.parameters()).device
    logits, out_lengths = model(batch.feats.to(device), batch.lengths)
    logp = F.log_softmax(logits, dim=-1).transpose(0, 1)
    loss = F.ctc_loss(logp, batch.targets.to(device), out_lengths, batch.target_lengths, blank=0,
                      reduction="sum", zero_infinity=True)
    return loss / len(batch.utts), logits, out_lengths


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


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: UtteranceSet, batches: list[list[int]]
             ) -> dict[str, float]:
    """Summed CTC loss and unit edit errors of ``model`` on ``batches`` of ``dataset``."""
    model.eval()
    loss = errors = units = utts = 0.0
    for batch in iterate(dataset, batches):
        batch_loss, logits, out_lengths = ctc_loss(model, batch)
        loss += float(batch_loss) * len(batch.utts)
        hyps = greedy_units(logits, out_lengths)
        offset = 0
        for hyp, n in zip(hyps, batch.target_lengths.tolist(), strict=True):
            ref = batch.targets[offset: offset + n].tolist()
            offset += n
            errors += kaldialign.edit_distance(ref, [u for u, _ in hyp])["total"]
            units += n
        utts += len(batch.utts)
    model.train()
    return {"loss": loss, "errors": errors, "units": units, "utts": utts}


def train(cfg: DictConfig, backend) -> Path:
    """Train the model of ``cfg`` with ``backend``; return the final model's path."""
    tcfg = cfg.trainer
    out_dir = Path(cfg.train_dir)
    exp = Path(cfg.exp_dir)
    units = Units(exp / "lang" / "units.model")
    feats = cfg.features
    train_set = UtteranceSet(exp / "data" / cfg.sets.train, units.encode,
                             delta_order=int(feats.delta_order), norm_vars=bool(feats.norm_vars),
                             subsample=int(cfg.model.get("stack_frames", 1)),
                             max_frames=int(tcfg.max_utt_frames))
    dev_set = UtteranceSet(exp / "data" / cfg.sets.dev, units.encode,
                           delta_order=int(feats.delta_order), norm_vars=bool(feats.norm_vars),
                           subsample=int(cfg.model.get("stack_frames", 1)),
                           max_frames=int(tcfg.max_utt_frames))
    torch.manual_seed(int(tcfg.seed))  # the same initial model on every learner
    model = build_model(cfg.model, train_set.dim, len(units)).to(backend.device)
    optimizer = build_optimizer(tcfg, model.parameters())
    start_epoch = checkpoint.latest_epoch(out_dir)
    if start_epoch:
        ckpt = checkpoint.load(checkpoint.model_path(out_dir, start_epoch))
        model.load_state_dict(ckpt["model"])
        optimizer = build_optimizer(tcfg, model.parameters())
        opt_path = checkpoint.optimizer_path(out_dir, start_epoch, backend.rank)
        if opt_path.is_file():
            optimizer.load_state_dict(checkpoint.load(opt_path))
        resumed_samples = int(ckpt["global_samples"])
        if backend.is_main:
            log.info("resuming after epoch %d from %s", start_epoch,
                     checkpoint.model_path(out_dir, start_epoch))
    else:
        resumed_samples = 0
    backend.setup(model, optimizer)

    def global_samples() -> int:  # samples of all learners, counting those before a resume
        return resumed_samples + backend.global_samples()

    epochs = int(tcfg.epochs)
    batch_frames = int(tcfg.batch_frames)
    per_epoch = len(shard(train_set.batches(batch_frames, 0), 0, backend.data_world))
    schedule = LRSchedule.from_config(tcfg, len(train_set))
    if backend.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        log.info("model: %s, %.2fM parameters, %d inputs, %d outputs; %d training utterances "
                 "(%.1f h), %d dev; %d steps per epoch per learner, %d learners",
                 OmegaConf.to_container(cfg.model), n_params / 1e6, train_set.dim, len(units),
                 len(train_set), train_set.total_frames / 360000, len(dev_set), per_epoch,
                 backend.world_size)
    gen = torch.Generator().manual_seed(int(tcfg.seed) * 1000 + backend.rank)
    log_every = int(tcfg.log_every)
    clip = float(tcfg.grad_clip)
    step = start_epoch * per_epoch
    for epoch in range(start_epoch + 1, epochs + 1):
        batches = shard(train_set.batches(batch_frames, int(tcfg.seed) + epoch),
                        backend.data_rank, backend.data_world)
        bar = tqdm(total=len(batches), desc=f"epoch {epoch}/{epochs}", unit="batch",
                   disable=not backend.is_main, leave=False)
        t0 = time.time()
        frames = 0
        loss_sum = 0.0
        for batch in iterate(train_set, batches):
            lr = schedule(global_samples())
            for group in optimizer.param_groups:
                group["lr"] = lr
            if tcfg.get("spec_augment"):
                batch.feats = spec_augment(batch.feats, batch.lengths, tcfg.spec_augment, gen)
            optimizer.zero_grad(set_to_none=False)
            loss, _, _ = ctc_loss(model, batch)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise AsrtrainError(
                    f"rank {backend.rank}: non-finite loss {loss_value} at epoch {epoch} step "
                    f"{step} (utterances {', '.join(batch.utts[:3])}...): lower trainer.lr or "
                    f"check the features of these utterances")
            loss.backward()
            backend.after_backward(step)
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            backend.optimizer_step(optimizer)
            backend.after_step(step, len(batch.utts))
            step += 1
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
        dev_batches = dev_set.batches(batch_frames, None)
        mine = dev_batches[backend.data_rank::backend.data_world]
        sums = evaluate(dev_model, dev_set, mine)
        sums["train_loss"] = loss_sum
        sums["train_steps"] = len(batches)
        sums["frames_per_second"] = frames / max(elapsed, 1e-9)
        means = backend.reduce_mean(sums)
        dev_loss = means["loss"] / max(means["utts"], 1)
        dev_uer = 100 * means["errors"] / max(means["units"], 1)
        summary = {"epoch": epoch, "train_loss": means["train_loss"] / max(means["train_steps"], 1),
                   "dev_loss": dev_loss, "dev_unit_error_rate": dev_uer,
                   "frames_per_second_per_learner": means["frames_per_second"],
                   "epoch_seconds": elapsed, "global_samples": global_samples()}
        ckpt = {"model": state, "epoch": epoch, "global_samples": global_samples(),
                "model_config": OmegaConf.to_container(cfg.model, resolve=True),
                "input_dim": train_set.dim, "output_dim": len(units),
                "features": OmegaConf.to_container(cfg.features, resolve=True),
                "metrics": summary}
        checkpoint.save(optimizer.state_dict(),
                        checkpoint.optimizer_path(out_dir, epoch, backend.rank))
        if backend.is_main:
            checkpoint.save(ckpt, checkpoint.model_path(out_dir, epoch))
            log.info("epoch %d: train loss %.4f, dev loss %.4f, dev unit error rate %.2f%%, "
                     "%.0f frames/s per learner, %.1f s", epoch, summary["train_loss"], dev_loss,
                     dev_uer, summary["frames_per_second_per_learner"], elapsed)
        del dev_model
    final = out_dir / "final.pt"
    if backend.is_main:
        last = checkpoint.load(checkpoint.model_path(out_dir, epochs))
        checkpoint.save(last, final)
    return final
