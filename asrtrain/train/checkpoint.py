"""Checkpoints: the consensus model once per epoch; beside it each learner's optimizer state and
SpecAugment random state (``{"optimizer": ..., "spec_augment_rng": ...}``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from asrtrain import AsrtrainError

EPOCH = re.compile(r"^epoch-(\d+)\.pt$")


def save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through a temporary name, so a crash never leaves a torn checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise AsrtrainError(f"{path}: no such checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise AsrtrainError(f"{path}: cannot read the checkpoint ({e}); remove it to resume "
                            "from the one before") from e


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
