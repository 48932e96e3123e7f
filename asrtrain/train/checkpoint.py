"""Checkpoints: the consensus model once per epoch; beside it each learner's optimizer state and
SpecAugment random state (``{"optimizer": ..., "spec_augment_rng": ...}``).

What a model checkpoint holds is :class:`asrtrain.models.checkpoint.ModelCheckpoint`; ``save`` and
``load`` (atomic write with a sha256 sidecar, read with errors naming the file) live there too,
beside the schema, so that decoding needs nothing from ``train``.

Every epoch's model and optimizer states add up (1.4 GB for the tiny recipe's 30 epochs), so
:func:`prune` keeps the last ``trainer.keep_checkpoints`` epochs (what a resume needs), the models
of the ``trainer.keep_best`` best epochs by dev loss, and ``final.pt``; :func:`last_good_epoch`
skips checkpoints cut short or altered, so a run resumes from the last one it can trust.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.models import checksum
from asrtrain.models.checkpoint import ModelCheckpoint, load, save

__all__ = ["EPOCH", "ModelCheckpoint", "dev_losses", "epochs", "last_good_epoch",
           "latest_epoch", "load", "model_path", "optimizer_path", "prune", "save"]

log = logging.getLogger(__name__)

EPOCH = re.compile(r"^epoch-(\d+)\.pt$")
#: Any file of an epoch: its model, or a learner's optimizer state.
EPOCH_FILE = re.compile(r"^epoch-(\d+)(?:\.optim\.rank\d+)?\.pt$")


def epochs(out_dir: str | Path) -> list[int]:
    """The epochs with a model checkpoint in ``out_dir``, in order."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in out_dir.iterdir() if (m := EPOCH.match(p.name)))


def latest_epoch(out_dir: str | Path) -> int:
    """The last completed epoch with a checkpoint in ``out_dir`` (0 if none)."""
    return max(epochs(out_dir), default=0)


def model_path(out_dir: str | Path, epoch: int) -> Path:
    return Path(out_dir) / f"epoch-{epoch}.pt"


def optimizer_path(out_dir: str | Path, epoch: int, rank: int) -> Path:
    return Path(out_dir) / f"epoch-{epoch}.optim.rank{rank}.pt"


def last_good_epoch(out_dir: str | Path, upto: int) -> tuple[int, ModelCheckpoint | None]:
    """The last epoch up to ``upto`` whose model checkpoint reads back whole (its checksum, its
    keys, finite weights) and that checkpoint; (0, None) if none does. Each one skipped is
    logged, naming the file and what is wrong with it (every learner reads the same files, so
    all agree on the epoch)."""
    for epoch in reversed([e for e in epochs(out_dir) if e <= upto]):
        path = model_path(out_dir, epoch)
        try:
            return epoch, ModelCheckpoint.from_dict(load(path), path)
        except AsrtrainError as e:
            log.warning("%s; resuming from an earlier epoch", e)
    return 0, None


def dev_losses(out_dir: str | Path, upto: int) -> dict[int, float]:
    """{epoch: dev loss} of the model checkpoints up to ``upto`` that read back whole (what a
    resumed run needs to know which one is the best)."""
    out: dict[int, float] = {}
    for epoch in epochs(out_dir):
        if epoch <= upto:
            try:
                metrics = load(model_path(out_dir, epoch)).get("metrics") or {}
            except AsrtrainError:
                continue
            if "dev_loss" in metrics:
                out[epoch] = float(metrics["dev_loss"])
    return out


def prune(out_dir: str | Path, keep: int, newest: int,
          best: int | Collection[int] | None = None) -> list[Path]:
    """Delete the files of the epochs before the last ``keep`` model checkpoints up to
    ``newest`` (just written whole), except the models of epochs ``best`` (one or several:
    ``trainer.keep_best``; their optimizer states go);
    ``keep`` 0 keeps all. Files of epochs after ``newest`` (left by an earlier run, to be
    written again) are not touched. Returns what was deleted."""
    done = [e for e in epochs(out_dir) if e <= newest]
    if keep <= 0 or len(done) <= keep:
        return []
    oldest_kept = done[-keep]
    kept = {best} if isinstance(best, int) else set(best or ())
    removed = []
    for p in sorted(Path(out_dir).iterdir()):
        m = EPOCH_FILE.match(p.name)
        if not m or int(m.group(1)) >= oldest_kept:
            continue
        if int(m.group(1)) in kept and EPOCH.match(p.name):
            continue
        checksum.remove(p)
        removed.append(p)
    return removed
