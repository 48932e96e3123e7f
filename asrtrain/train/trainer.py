"""The training loop: one loop for every backend (the backend decides how learners communicate).

Per step: forward, the task's loss (CTC, or frame CE on chunks), backward,
``backend.after_backward`` (gradient reduction for
synchronous backends), gradient clipping, ``backend.optimizer_step``, ``backend.after_step``.
The learning rate follows the backend's count of samples seen by all learners. An epoch is the
training set once across all learners: in lockstep (``ssgd``, one learner) each learner takes its
shard, as many steps as every other; otherwise (``adpsgd``, ``hadpsgd``) each learner, or node,
claims the units of the epoch's one order from a shared counter (``backend.claims``), so a fast
learner takes more of it. At the end of each epoch, where the learners meet, the consensus model
(the average of the learners, after in-flight exchanges drained) and the learners' distance to it
are computed, the model is evaluated on the dev set by all learners together and checkpointed by
learner 0, which records the epoch's summary in ``epochs.json`` (every epoch's dev loss: what
``decode.checkpoint`` chooses by, :mod:`asrtrain.models.average`) and then deletes the checkpoints
``trainer.keep_checkpoints`` and ``trainer.keep_best`` no longer keep. With
``trainer.early_stop_patience`` N > 0, training ends after N epochs in a row without a new lowest
dev loss (every learner has the dev loss of every epoch, so all stop together, whatever the
backend); ``final.pt`` is then the last epoch trained.
Learner 0 also writes the training curves (:mod:`asrtrain.train.curves`: TensorBoard events in
the model dir, and ``curves.png`` at the end). Every ``log_every`` steps the lockstep backends
average the loss and rates over learners (an allreduce, where they meet anyway); the others keep
the hot path free of collectives: each learner writes its own figures (learner ``r`` > 0 into
``learner_<r>/`` of the model dir). The trainer's settings are read from
:class:`asrtrain.train.config.TrainerConfig` (defaults and checks there).

``trainer.precision=bf16`` runs the forward pass and the loss's inputs under autocast
(:func:`asrtrain.models.precision.autocast`; the model hands the loss fp32 logits), backward
outside it: weights, gradients, the optimizer state and the loss stay fp32. The dev set is
evaluated in fp32, as decoders run the model. A device whose kernels cannot train the model in
bf16 (a CPU without AVX-512, a GPU before Ampere) is refused in one line before anything is built
(:func:`asrtrain.models.precision.check_precision`). The precision is logged at the start and
recorded in every model checkpoint.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import Backend
from asrtrain.models import build_model
from asrtrain.models.average import read_record, write_record
from asrtrain.models.precision import autocast, check_precision
from asrtrain.progress import Bar
from asrtrain.train import checkpoint
from asrtrain.train.config import SpecAugment, TrainerConfig
from asrtrain.train.curves import Curves, plot_curves
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
    curves: Curves | None = None        # learner 0's event writer (every learner's: own)
    gossip: _GossipMeter | None = None  # this writer's gossip exchanges (adpsgd, hadpsgd)
    dev_losses: dict[int, float] = field(default_factory=dict)  # per epoch (every learner)
    record: dict[int, dict] = field(default_factory=dict)  # learner 0: each epoch's summary
    started: float = field(default_factory=time.monotonic)  # this process's training start


@dataclass
class _GossipMeter:
    """Learner 0's gossip exchanges between two points of the curves."""

    count: Callable[[], int | None]
    exchanges: int
    step: int
    time: float

    @classmethod
    def of(cls, backend: Backend, step: int) -> _GossipMeter | None:
        """A meter when this learner gossips (``gossip_exchanges()`` is not None), else None."""
        count = getattr(backend, "gossip_exchanges", None)
        if count is None or count() is None:
            return None
        return cls(count, int(count()), step, time.monotonic())

    def rates(self, step: int) -> dict[str, float]:
        """Exchanges per second and per step since the last call."""
        now, exchanges = time.monotonic(), int(self.count() or 0)
        n = exchanges - self.exchanges
        out = {"gossip/exchanges_per_s": n / max(now - self.time, 1e-9),
               "gossip/exchanges_per_step": n / max(step - self.step, 1)}
        self.exchanges, self.step, self.time = exchanges, step, now
        return out


@dataclass
class _Epoch:
    """One learner's figures of one epoch."""

    steps: int
    frames: int
    samples: int
    loss_sum: float
    seconds: float


def train(cfg: DictConfig, backend: Backend) -> Path:
    """Train the model of ``cfg`` with ``backend``; return the final model's path."""
    tcfg = TrainerConfig.from_config(cfg.trainer)
    check_precision(tcfg.precision, backend.device)
    task = build_task(cfg)
    torch.manual_seed(tcfg.seed)  # the same initial model on every learner
    model = build_model(cfg.model, task.input_dim, task.output_dim).to(backend.device)
    run = _Run(cfg, tcfg, backend, task, model, build_optimizer(tcfg, model.parameters()),
               torch.Generator().manual_seed(tcfg.seed * 1000 + backend.rank),
               Path(cfg.train_dir))
    start_epoch, resumed_samples = _resume(run)
    backend.setup(model, run.optimizer, global_samples=resumed_samples)
    per_epoch = task.steps_per_epoch(backend.data_world)  # claiming learners: the mean
    schedule = LRSchedule.from_config(tcfg, task.samples_per_epoch)
    if backend.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        log.info("%s", backend.describe())
        log.info("model: %s, %.2fM parameters, %d inputs, %d outputs",
                 OmegaConf.to_container(cfg.model), n_params / 1e6, task.input_dim,
                 task.output_dim)
        log.info("%s; about %d steps per epoch per learner%s", task.describe(), per_epoch,
                 "" if _shared_figures(backend) else " (claimed from the epoch's one order: a "
                 "faster learner takes more)")
        log.info("precision %s%s", tcfg.precision,
                 f" (autocast on {backend.device.type}; weights, gradients, optimizer state and "
                 "loss in fp32)" if tcfg.precision == "bf16" else "")
    step = start_epoch * per_epoch
    if backend.is_main:
        run.curves = Curves(run.out_dir, step)
    elif not _shared_figures(backend):
        run.curves = Curves(run.out_dir / f"learner_{backend.rank}", step)
    if run.curves is not None:
        run.gossip = _GossipMeter.of(backend, step)
    run.started = time.monotonic()
    last = start_epoch
    try:
        for epoch in range(start_epoch + 1, tcfg.epochs + 1):
            if _early_stop(run, epoch - 1):
                break
            figures = _train_epoch(run, epoch, step, per_epoch, schedule)
            step += figures.steps
            _end_epoch(run, epoch, step, figures)
            last = epoch
    finally:
        if run.curves is not None:
            run.curves.close()
    if backend.is_main:
        _write_final(run, last)
    return run.out_dir / "final.pt"


def _early_stop(run: _Run, epoch: int) -> bool:
    """Whether training ends after ``epoch``: ``trainer.early_stop_patience`` epochs in a row
    without a new lowest dev loss (collective: every learner holds the same dev losses, and
    they agree on the answer all the same)."""
    patience = run.tcfg.early_stop_patience
    if patience <= 0 or epoch < 1 or not run.dev_losses:
        return False
    best = min(run.dev_losses, key=lambda e: (run.dev_losses[e], e))
    stop = epoch - best >= patience
    stop = run.backend.agree_min(int(stop)) == 1
    if stop and run.backend.is_main:
        log.info("early stop after epoch %d of %d: the dev loss was lowest at epoch %d (%.4g), "
                 "%d epochs ago (trainer.early_stop_patience=%d)", epoch, run.tcfg.epochs, best,
                 run.dev_losses[best], epoch - best, patience)
    return stop


def _write_final(run: _Run, last: int) -> None:
    """``final.pt`` (the last epoch's model, checked as it is read) and ``curves.png``."""
    final = run.out_dir / "final.pt"
    checkpoint.save(checkpoint.load(checkpoint.model_path(run.out_dir, last)), final)
    png = plot_curves(run.out_dir, run.out_dir / "curves.png",
                      f"{run.cfg.model.name}: {run.backend.name}, "
                      f"{run.backend.world_size} learner(s)")
    log.info("training curves: %s; tensorboard --logdir %s", png, run.out_dir.parent)


def _resume(run: _Run) -> tuple[int, int]:
    """Load the last good checkpoint of ``run.out_dir`` up to ``trainer.epochs`` if there is
    one (those cut short or altered are skipped, with a warning): (its epoch, its samples).
    Fewer epochs than a run trained go on from the last kept epoch up to them (the schedule
    does not depend on the number of epochs, so the model is the one such a run gives)."""
    epochs = run.tcfg.epochs
    start_epoch, ckpt = checkpoint.last_good_epoch(run.out_dir, epochs)
    trained = checkpoint.latest_epoch(run.out_dir)
    if run.backend.is_main and trained > epochs:
        log.info("%s: %d epochs trained already, more than trainer.epochs=%d: going on from "
                 "epoch %d", run.out_dir, trained, epochs, start_epoch)
    if ckpt is None:
        return 0, 0
    run.model.load_state_dict(ckpt.model)
    _load_learner_state(run, start_epoch)
    trained_in = ckpt.precision or "fp32"  # older checkpoints: fp32, the only one then
    if run.backend.is_main and trained_in != run.tcfg.precision:
        log.warning("epochs up to %d were trained with trainer.precision=%s; the epochs from "
                    "here train with trainer.precision=%s", start_epoch, trained_in,
                    run.tcfg.precision)
    if run.backend.is_main:
        log.info("resuming after epoch %d from %s", start_epoch,
                 checkpoint.model_path(run.out_dir, start_epoch))
    # every learner reads the same files: which kept ones are the best, when to stop early
    record = {e: s for e, s in read_record(run.out_dir).items() if e <= start_epoch}
    if record and start_epoch not in record and ckpt.metrics:  # killed before it was recorded
        record[start_epoch] = dict(ckpt.metrics)
    if run.backend.is_main:
        run.record = record
    run.dev_losses = {e: float(s["dev_loss"]) for e, s in record.items() if "dev_loss" in s}
    if not run.dev_losses:  # a run older than the record: the kept checkpoints' metrics
        run.dev_losses = checkpoint.dev_losses(run.out_dir, start_epoch)
    return start_epoch, int(ckpt.global_samples or 0)


def _load_learner_state(run: _Run, epoch: int) -> None:
    """This learner's optimizer and SpecAugment states of ``epoch``, where they were kept and
    read back whole (else the optimizer starts afresh, with a warning)."""
    path = checkpoint.optimizer_path(run.out_dir, epoch, run.backend.rank)
    if not path.is_file():
        return
    try:
        learner = checkpoint.load(path)
    except AsrtrainError as e:
        log.warning("%s; this learner's optimizer state starts afresh", e)
        return
    if "optimizer" in learner:
        run.optimizer.load_state_dict(learner["optimizer"])
        run.gen.set_state(learner["spec_augment_rng"])
    else:  # written before the SpecAugment state was kept: the optimizer state alone
        run.optimizer.load_state_dict(learner)


def _train_epoch(run: _Run, epoch: int, step: int, per_epoch: int,
                 schedule: LRSchedule) -> _Epoch:
    """The steps of one epoch, from global step ``step``."""
    backend, model, optimizer, tcfg = run.backend, run.model, run.optimizer, run.tcfg
    bar = Bar(total=per_epoch, desc=f"epoch {epoch}/{tcfg.epochs}", unit="batch",
               disable=None if backend.is_main else True, leave=False)  # no bar off a TTY
    t0 = time.time()
    steps = frames = samples = 0
    loss_sum = 0.0
    claim = backend.claims(epoch)
    batches = (run.task.epoch(epoch, backend.data_rank, backend.data_world) if claim is None
               else run.task.epoch(epoch, backend.data_rank, backend.data_world, claim=claim))
    for batch in batches:
        lr = schedule(backend.global_samples())  # all learners' samples, before a resume too
        for group in optimizer.param_groups:
            group["lr"] = lr
        if tcfg.spec_augment is not None:
            batch.feats = spec_augment(batch.feats, batch.lengths, tcfg.spec_augment, run.gen)
        optimizer.zero_grad(set_to_none=False)
        with autocast(backend.device, tcfg.precision):
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
        samples += run.task.samples(batch)
        loss_sum += loss_value
        bar.update()
        if step % tcfg.log_every == 0:
            rate = frames / max(time.time() - t0, 1e-9)
            bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", fps=f"{rate:.0f}")
            _log_point(run, epoch, step, loss_value, lr, rate)
    bar.close()
    return _Epoch(steps, frames, samples, loss_sum, time.time() - t0)


def _shared_figures(backend: Backend) -> bool:
    """Whether the step figures are averaged over learners (lockstep: they meet every step
    anyway) rather than written by each learner for itself."""
    return backend.lockstep == "all" or backend.world_size == 1


def _log_point(run: _Run, epoch: int, step: int, loss: float, lr: float, rate: float) -> None:
    """Every ``log_every`` steps: the log line and a point of every step curve; collective in
    lockstep (:func:`_shared_figures`), this learner's own figures otherwise."""
    backend = run.backend
    if not _shared_figures(backend):
        _own_point(run, epoch, step, loss, lr, rate)
        return
    distance = backend.consensus_distance()
    # Each learner's rate under its own key: the mean of the others' zeros times the learners.
    shared = backend.reduce_mean({"loss": loss, **{
        f"rate{r}": rate if r == backend.rank else 0.0 for r in range(backend.world_size)}})
    if not backend.is_main:
        return
    rates = [shared[f"rate{r}"] * backend.world_size for r in range(backend.world_size)]
    mean_rate = sum(rates) / len(rates)
    scalars = {"loss/train": shared["loss"], "lr": lr, "frames_per_s/mean": mean_rate,
               **{f"frames_per_s/learner_{r}": v for r, v in enumerate(rates)}}
    if run.gossip is not None:
        scalars.update({"consensus/distance": distance, **run.gossip.rates(step)})
    # the distance only where learners can differ (lockstep learners are one model: always 0)
    log.info("epoch %d step %d: loss %.4f lr %.3e %.0f frames/s per learner%s", epoch, step,
             shared["loss"], lr, mean_rate,
             f", consensus distance {distance:.2e}, "
             f"{scalars['gossip/exchanges_per_s']:.1f} gossip exchanges/s"
             if run.gossip is not None else "")
    if run.curves is not None:
        run.curves.add(step, scalars)


def _own_point(run: _Run, epoch: int, step: int, loss: float, lr: float, rate: float) -> None:
    """This learner's figures, with no collective: its log line (learner 0) and curves."""
    backend = run.backend
    scalars = {"loss/train": loss, "lr": lr, f"frames_per_s/learner_{backend.rank}": rate}
    if run.gossip is not None:
        scalars.update(run.gossip.rates(step))
    if backend.is_main:
        log.info("epoch %d step %d: learner 0: loss %.4f lr %.3e %.0f frames/s%s", epoch, step,
                 loss, lr, rate, f", {scalars['gossip/exchanges_per_s']:.1f} gossip exchanges/s"
                 if run.gossip is not None else "")
    if run.curves is not None:
        run.curves.add(step, scalars)


def _end_epoch(run: _Run, epoch: int, step: int, figures: _Epoch) -> None:
    """Evaluate the consensus model on the dev set (all learners) and write the checkpoints;
    where learners do not keep in step, measure their distance to the consensus here, where they
    meet anyway, and record each one's share of the epoch."""
    backend, task = run.backend, run.task
    # Gossip drained and held until the epoch's figures are shared: the metrics' collective does
    # not queue behind exchanges on the links, and the sample counts stay exact.
    with backend.meeting():
        state, summary = _epoch_summary(run, epoch, figures)
    if backend.is_main:
        ckpt = task.model_checkpoint(run.cfg, state, epoch=epoch,
                                     global_samples=summary["global_samples"], metrics=summary)
        ckpt.precision = run.tcfg.precision
        ckpt.save(checkpoint.model_path(run.out_dir, epoch))
        log.info("epoch %d: %s", epoch, ", ".join(
            f"{k} {v:.4g}" for k, v in summary.items() if k != "epoch"))
        run.record[epoch] = summary
        write_record(run.out_dir, run.record)
    run.dev_losses[epoch] = summary["dev_loss"]
    if backend.is_main:
        _keep_checkpoints(run, epoch)
        _epoch_curves(run, step, summary)


def _epoch_summary(run: _Run, epoch: int,
                   figures: _Epoch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The consensus model and the epoch's summary; collective."""
    backend, task = run.backend, run.task
    shared = _shared_figures(backend)
    state, distance = (backend.consensus(), 0.0) if shared else backend.consensus_with_distance()
    dev_model = copy.deepcopy(run.model)
    dev_model.load_state_dict(state)
    dev_model.eval()
    sums = task.evaluate(dev_model, backend.data_rank, backend.data_world)
    del dev_model
    sums.update(train_loss=figures.loss_sum, train_steps=figures.steps,
                frames_per_second=figures.frames / max(figures.seconds, 1e-9))
    drain = backend.drain_figures()  # gossiping backends: what the epoch's drain took
    sums.update(drain)
    if backend.world_size > 1:  # each learner's samples under its own key: zeros but one
        sums.update({f"samples_learner_{r}": figures.samples if r == backend.rank else 0
                     for r in range(backend.world_size)})
    # Every learner writes its state before the collective below: once learner 0 is past it,
    # this epoch is on disk whole, and older checkpoints may go.
    checkpoint.save({"optimizer": run.optimizer.state_dict(),
                     "spec_augment_rng": run.gen.get_state()},
                    checkpoint.optimizer_path(run.out_dir, epoch, backend.rank))
    means = backend.reduce_mean(sums)
    summary = {"epoch": epoch, "train_loss": means["train_loss"] / max(means["train_steps"], 1),
               **task.summarize(means),
               "frames_per_second_per_learner": means["frames_per_second"],
               "epoch_seconds": figures.seconds, "global_samples": backend.global_samples(),
               # all learners are past this epoch's training here: the run's time so far
               "run_seconds": time.monotonic() - run.started}
    if not shared:
        summary["consensus_distance"] = distance
    summary.update({k: means[k] for k in drain})  # the hold and rounds agree; drain_s: a mean
    if backend.world_size > 1:
        summary.update({f"samples_learner_{r}": round(means[f"samples_learner_{r}"] *
                                                      backend.world_size)
                        for r in range(backend.world_size)})
    return state, summary


def _keep_checkpoints(run: _Run, epoch: int) -> None:
    """Delete the checkpoints ``trainer.keep_checkpoints`` and ``trainer.keep_best`` no longer
    keep (learner 0): the models of the ``keep_best`` epochs of the lowest dev loss stay, for
    ``decode.checkpoint`` best or average."""
    ranked = sorted(run.dev_losses, key=lambda e: (run.dev_losses[e], -e))
    best = ranked[:max(run.tcfg.keep_best, 1)]
    removed = checkpoint.prune(run.out_dir, run.tcfg.keep_checkpoints, epoch, best)
    if removed:
        log.info("removed %d checkpoint file(s) of epochs before %d (kept: the last %d epochs, "
                 "the models of the %d best by dev loss: epochs %s)", len(removed), epoch,
                 run.tcfg.keep_checkpoints, len(best), ", ".join(map(str, sorted(best))))


def _epoch_curves(run: _Run, step: int, summary: dict[str, float]) -> None:
    """The epoch's points of the curves: dev loss and metric, the epoch's train loss, and the
    consensus distance where it is measured."""
    if run.curves is None:
        return
    dev = {f"dev/{k[len('dev_'):]}": v for k, v in summary.items()
           if k.startswith("dev_") and k != "dev_loss"}
    if "consensus_distance" in summary:  # measured at the epoch's end (gossiping backends)
        dev["consensus/distance"] = summary["consensus_distance"]
    run.curves.add(step, {"loss/dev": summary["dev_loss"],
                          "loss/train_epoch": summary["train_loss"], **dev})
    run.curves.flush()


def _batch_names(batch) -> str:
    utts = getattr(batch, "utts", None)
    return f" (utterances {', '.join(utts[:3])}...)" if utts else ""
