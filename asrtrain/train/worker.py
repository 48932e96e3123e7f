"""One learner: the process torchrun starts (``asrtrain train CONFIG``), or the stage itself."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

from asrtrain import AsrtrainError

log = logging.getLogger(__name__)


def run_learner(config_path: str | Path) -> Path:
    """Train with the resolved config at ``config_path`` as this process's learner."""
    from asrtrain.distributed.learner import build_backend
    from asrtrain.train.config import TrainerConfig
    from asrtrain.train.trainer import train

    config_path = Path(config_path)
    if not config_path.is_file():
        raise AsrtrainError(f"{config_path}: no such training config")
    cfg = OmegaConf.load(config_path)
    tcfg = TrainerConfig.from_config(cfg.trainer)  # a bad setting fails before any rendezvous
    if int(os.environ.get("RANK", 0)):
        logging.getLogger().setLevel(logging.WARNING)
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        # Under torchrun, learner 0 also writes the stage's log (one process runs it already).
        handler = logging.FileHandler(Path(cfg.exp_dir) / "log" / "train.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logging.getLogger().addHandler(handler)
    backend = build_backend(tcfg)  # also sets trainer.threads CPU threads, one by default
    leave = backend.close
    try:
        return train(cfg, backend)
    except OSError as e:
        if "TORCHELASTIC_RUN_ID" not in os.environ:
            raise  # in the stage's own process: the stage says it (asrtrain.pipeline)
        from asrtrain.fileio import describe_os_error

        # A learner of several: one line (a full disk, a read-only dir) for the launcher to
        # quote; no closing collective, which the others, inside another one, would take for
        # theirs (gloo aborts them: "Received data size doesn't match"). The launcher stops them.
        leave = lambda: None  # noqa: E731
        raise AsrtrainError(describe_os_error(e, Path(cfg.train_dir))) from e
    finally:
        leave()
