"""One learner: the process torchrun starts (``asrtrain train CONFIG``), or the stage itself."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from omegaconf import OmegaConf

from asrtrain import AsrtrainError

log = logging.getLogger(__name__)


def run_learner(config_path: str | Path) -> Path:
    """Train with the resolved config at ``config_path`` as this process's learner."""
    from asrtrain.distributed import build_backend
    from asrtrain.train.trainer import train

    config_path = Path(config_path)
    if not config_path.is_file():
        raise AsrtrainError(f"{config_path}: no such training config")
    cfg = OmegaConf.load(config_path)
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    threads = int(cfg.trainer.get("threads") or 0) or max(1, (os.cpu_count() or 1) // local)
    torch.set_num_threads(threads)
    if rank:
        logging.getLogger().setLevel(logging.WARNING)
    backend = build_backend(cfg.trainer)
    try:
        return train(cfg, backend)
    finally:
        backend.close()
