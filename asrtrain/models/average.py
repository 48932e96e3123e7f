"""Which of a training run's models a decoder reads: ``checkpoint: best | last | average``.

``last`` is the last epoch (``final.pt``); ``best`` the epoch of the lowest dev loss; ``average``
the element-wise mean of the weights of the ``average_n`` epochs of the lowest dev loss, as
ESPnet's ``average_nbest_models`` (``valid.loss.ave_Nbest.pth``) and icefall's ``--avg`` do. The
dev losses come from the run's record, ``epochs.json`` in the model dir (the trainer writes each
epoch's summary there), or, for runs older than the record, from the kept checkpoints' metrics.
The trainer keeps the models of the ``trainer.keep_best`` best epochs
(:func:`asrtrain.train.checkpoint.prune`), so ``average_n`` up to that is always there.

Usage::

    choice = CheckpointChoice.from_config(cfg.decode, "decode")
    path, info = choose_model(model_dir, choice, exp / "decode" / "tiny_ctc")
    info["description"]   # 'average of epochs 7, 9, 10 (dev loss 1.20, 1.22, 1.31)'
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asrtrain import AsrtrainError

if TYPE_CHECKING:  # torch is imported where a checkpoint is read: a plan (--dry-run) needs none
    from asrtrain.models.checkpoint import ModelCheckpoint

log = logging.getLogger(__name__)

CHOICES = ("best", "last", "average")
#: The trainer's record of every epoch's summary (``dev_loss`` among them), in the model dir.
RECORD = "epochs.json"
#: The averaged model a decode stage writes into its system's decode dir.
AVERAGED = "model.pt"


@dataclass(frozen=True)
class CheckpointChoice:
    """``checkpoint``: best | last | average; ``average_n``: how many best epochs to average."""

    checkpoint: str = "average"
    average_n: int = 5

    def __post_init__(self) -> None:
        if self.checkpoint not in CHOICES:
            raise AsrtrainError(f"decode.checkpoint={self.checkpoint!r}: expected one of "
                                f"{', '.join(CHOICES)}")
        if isinstance(self.average_n, bool) or not isinstance(self.average_n, int) or (
                self.average_n < 1):
            raise AsrtrainError(f"decode.average_n={self.average_n!r}: expected a whole number "
                                "of epochs, at least 1")

    @classmethod
    def from_config(cls, cfg: Mapping | None, section: str = "decode") -> CheckpointChoice:
        """The choice in ``cfg`` (a decode section), the defaults for missing keys; errors name
        ``section``."""
        cfg = cfg or {}
        try:
            return cls(str(cfg.get("checkpoint", cls.checkpoint)),
                       cfg.get("average_n", cls.average_n))
        except AsrtrainError as e:
            raise AsrtrainError(str(e).replace("decode.", f"{section}.", 1)) from None

    def check_kept(self, trainer: Mapping, section: str, trainer_section: str) -> None:
        """``average_n`` must not exceed the best epochs the trainer keeps."""
        keep_all = int(trainer.get("keep_checkpoints", 2)) == 0
        keep_best = int(trainer.get("keep_best", 5))
        if self.checkpoint == "average" and not keep_all and self.average_n > max(keep_best, 1):
            raise AsrtrainError(
                f"{section}.average_n={self.average_n}: the trainer keeps the models of only "
                f"{max(keep_best, 1)} best epochs ({trainer_section}.keep_best); raise "
                f"{trainer_section}.keep_best (before training) or lower {section}.average_n")


def dev_losses(model_dir: Path) -> dict[int, float]:
    """{epoch: dev loss} of a run: its record, else the metrics of the checkpoints kept."""
    record = read_record(model_dir)
    if record:
        return {e: float(s["dev_loss"]) for e, s in record.items() if "dev_loss" in s}
    from asrtrain.models.checkpoint import load

    out = {}
    for path in sorted(Path(model_dir).glob("epoch-*.pt")):
        if ".optim." in path.name:
            continue
        try:
            metrics = load(path).get("metrics") or {}
        except AsrtrainError:
            continue
        if "dev_loss" in metrics:
            out[int(path.stem.split("-")[1])] = float(metrics["dev_loss"])
    return out


def _epoch_path(model_dir: Path, epoch: int) -> Path:
    return Path(model_dir) / f"epoch-{epoch}.pt"


def _losses(epochs: list[int], losses: Mapping[int, float]) -> str:
    return ", ".join(f"{losses[e]:.4g}" for e in epochs)


def choose_model(model_dir: Path, choice: CheckpointChoice,
                 out_dir: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The path of the model ``choice`` names in ``model_dir`` and what it is::

        {"checkpoint": "average", "epochs": [7, 9, 10], "dev_losses": [...],
         "description": "average of epochs 7, 9, 10 (dev loss ...)"}

    ``average`` of more than one epoch writes the averaged model to ``out_dir/model.pt``.
    Epochs among the best whose model is gone (a run older than ``trainer.keep_best``) are
    left out with a warning naming them."""
    from asrtrain.models.checkpoint import ModelCheckpoint, load

    model_dir = Path(model_dir)
    final = model_dir / "final.pt"
    if not final.is_file():
        raise AsrtrainError(f"{final}: no trained model; run the training stage first")
    losses = dev_losses(model_dir)
    last = max(losses, default=None)
    if choice.checkpoint == "last" or not losses:
        if choice.checkpoint != "last":
            log.warning("%s: no dev loss recorded for any epoch; decoding the last epoch",
                        model_dir)
        ckpt_epoch = ModelCheckpoint.from_dict(load(final), final).epoch
        epoch = int(ckpt_epoch) if ckpt_epoch is not None else last
        loss = f" (dev loss {losses[epoch]:.4g})" if epoch in losses else ""
        return final, {"checkpoint": "last", "epochs": [epoch] if epoch else [],
                       "dev_losses": [losses[epoch]] if epoch in losses else [],
                       "path": str(final), "description": f"last epoch, {epoch}{loss}"}
    ranked = sorted(losses, key=lambda e: (losses[e], -e))  # ties: the later epoch
    want = ranked[:1] if choice.checkpoint == "best" else ranked[:choice.average_n]
    have = [e for e in want if _epoch_path(model_dir, e).is_file()]
    missing = [e for e in want if e not in have]
    if missing:
        log.warning("%s: the models of epochs %s (among the %d best by dev loss) are not kept "
                    "(trained before trainer.keep_best, or deleted); using %s", model_dir,
                    ", ".join(map(str, missing)), len(want),
                    ", ".join(map(str, have)) or "the last epoch")
    if not have:
        return choose_model(model_dir, CheckpointChoice("last"), out_dir)
    if len(have) == 1:
        path = _epoch_path(model_dir, have[0])
        loss = f"dev loss {losses[have[0]]:.4g}"
        return path, {"checkpoint": choice.checkpoint, "epochs": have,
                      "dev_losses": [losses[have[0]]], "path": str(path),
                      "description": f"best epoch {have[0]} ({loss}, the lowest)"
                      if choice.checkpoint == "best" else
                      f"average of the {choice.average_n} best epochs: only epoch {have[0]} "
                      f"({loss})"}
    if out_dir is None:
        raise AsrtrainError("choose_model: an average needs out_dir to write the model to")
    epochs = sorted(have)
    ckpt = average_checkpoints([_epoch_path(model_dir, e) for e in epochs])
    description = (f"average of epochs {', '.join(map(str, epochs))} (dev loss "
                   f"{_losses(epochs, losses)}; the {len(epochs)} lowest)")
    ckpt.extra["averaged"] = {"epochs": epochs, "description": description}
    path = Path(out_dir) / AVERAGED
    path.parent.mkdir(parents=True, exist_ok=True)
    ckpt.save(path)
    return path, {"checkpoint": "average", "epochs": epochs,
                  "dev_losses": [losses[e] for e in epochs], "path": str(path),
                  "description": description}


def average_checkpoints(paths: list[Path]) -> ModelCheckpoint:
    """The element-wise mean of the models at ``paths`` (computed in float64, stored in each
    weight's own type); weights that are not floating point (counters) are the last one's.
    Everything else (config, priors, metrics) is the last checkpoint's; ``epoch`` is None."""
    import torch

    from asrtrain.models.checkpoint import ModelCheckpoint, load

    if not paths:
        raise AsrtrainError("average_checkpoints: no checkpoint to average")
    ckpts = [ModelCheckpoint.from_dict(load(p), p) for p in paths]
    base = ckpts[-1]
    for ckpt, path in zip(ckpts, paths, strict=True):
        if ckpt.model.keys() != base.model.keys():
            raise AsrtrainError(f"{path}: its weights {sorted(set(ckpt.model) ^ set(base.model))}"
                                f" are not in both it and {paths[-1]}; these are not epochs of "
                                "one run")
    state: dict[str, Any] = {}
    for key, value in base.model.items():
        for ckpt, path in zip(ckpts, paths, strict=True):
            other = ckpt.model.get(key)
            if other is None or other.shape != value.shape:
                raise AsrtrainError(f"{path}: weight {key!r} is missing or of another shape "
                                    f"than in {paths[-1]}; these are not epochs of one run")
        if value.is_floating_point():
            total = sum(c.model[key].to(torch.float64) for c in ckpts)
            state[key] = (total / len(ckpts)).to(value.dtype)
        else:
            state[key] = value.clone()
    return ModelCheckpoint(state, base.model_config, base.input_dim, base.output_dim,
                           base.features, log_priors=base.log_priors, chunk=base.chunk,
                           epoch=None, global_samples=base.global_samples, metrics=None,
                           precision=base.precision, extra=dict(base.extra))


def read_record(model_dir: Path) -> dict[int, dict[str, float]]:
    """{epoch: summary} of ``model_dir/epochs.json``; {} when there is none (older runs)."""
    path = Path(model_dir) / RECORD
    if not path.is_file():
        return {}
    try:
        return {int(e): dict(s) for e, s in json.loads(path.read_text()).items()}
    except (ValueError, TypeError, AttributeError) as e:
        raise AsrtrainError(f"{path}: not a record of epochs ({e}); delete it to read the dev "
                            "losses from the checkpoints") from e


def describe_epochs(losses: Mapping[int, float]) -> str:
    """One line of a run's dev losses, best first (for logs)."""
    ranked = sorted(losses, key=lambda e: (losses[e], -e))
    return ", ".join(f"epoch {e} {losses[e]:.4g}" for e in ranked)


def write_record(model_dir: Path, record: Mapping[int, Mapping[str, float]]) -> None:
    """Write the epochs' summaries to ``model_dir/epochs.json`` (atomically)."""
    from asrtrain.fileio import write_text

    write_text(Path(model_dir) / RECORD, json.dumps(
        {str(e): dict(s) for e, s in sorted(record.items())}, indent=1) + "\n")
