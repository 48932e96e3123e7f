"""Checkpoints: the consensus model once per epoch; beside it each learner's optimizer state and
SpecAugment random state (``{"optimizer": ..., "spec_augment_rng": ...}``).

What a model checkpoint holds is :class:`asrtrain.models.checkpoint.ModelCheckpoint`; ``save`` and
``load`` (atomic write, read with errors naming the file) live there too, beside the schema, so
that decoding needs nothing from ``train``.
"""

from __future__ import annotations

import re
from pathlib import Path

from asrtrain.models.checkpoint import ModelCheckpoint, load, save

__all__ = ["EPOCH", "ModelCheckpoint", "latest_epoch", "load", "model_path", "optimizer_path",
           "save"]

EPOCH = re.compile(r"^epoch-(\d+)\.pt$")


def latest_epoch(out_dir: str | Path) -> int:
    """The last completed epoch with a checkpoint in ``out_dir`` (0 if none)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return 0
    epochs = [int(m.group(1)) for p in out_dir.iterdir() if (m := EPOCH.match(p.name))]
    return max(epochs, default=0)


def model_path(out_dir: str | Path, epoch: int) -> Path:
    return Path(out_dir) / f"epoch-{epoch}.pt"


def optimizer_path(out_dir: str | Path, epoch: int, rank: int) -> Path:
    return Path(out_dir) / f"epoch-{epoch}.optim.rank{rank}.pt"
