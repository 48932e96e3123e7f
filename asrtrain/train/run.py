"""Starting a training run: which checkpoints it may resume, its resolved config, and the
launch (in this process for one learner, else under torchrun).

A training directory holds the checkpoints of one run. The stage that trains gives a resume key
(``asrtrain.pipeline.StageContext.resume_key``: its settings and the digests of everything it
reads, less the settings a run may change and still continue, such as ``trainer.epochs``). The
directory remembers the key it was trained with; checkpoints of another key, or any when the
stage asks for a fresh run, are moved aside (never deleted) and training starts afresh.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text
from asrtrain.train.config import TrainerConfig

log = logging.getLogger("asrtrain")

#: Trainer settings that only say how a run is launched or logged, or which checkpoints it
#: keeps: they never change the model.
LAUNCH_ONLY = ("log_every", "threads", "timeout_s", "nnodes", "node_rank", "rdzv_endpoint",
               "gossip_idle_s", "gossip_backend", "cpu", "keep_checkpoints", "keep_best",
               "chunk_data")
#: What a learner's error says of a full disk (``asrtrain.fileio.describe_os_error``).
NO_SPACE = "no space left on the device of "
#: Trainer settings a run may change and still continue from its checkpoints.
RESUMABLE = ("epochs", "learners")


def prepare_dir(out: Path, resume_key: str, fresh: bool) -> None:
    """Make ``out`` hold only checkpoints that a run with ``resume_key`` may continue."""
    stamp = out / "resume_key"
    if out.is_dir() and any(out.glob("epoch-*.pt")):
        same = stamp.is_file() and stamp.read_text().strip() == resume_key
        if fresh or not same:
            old = out.with_name(f"{out.name}.before-{time.strftime('%Y%m%d-%H%M%S')}")
            out.rename(old)
            why = "a fresh run was asked for" if same else "they are of other settings or data"
            log.warning("%s: its checkpoints moved to %s (%s); training afresh", out, old, why)
    out.mkdir(parents=True, exist_ok=True)
    write_text(stamp, resume_key + "\n")


def disk_full(out: Path) -> bool:
    """Whether ``out``'s file system lacks the room of one more epoch (the files of its last,
    or 1 MiB): why learners failed when the one that ran out of space was not the first to go
    (the others may abort in a collective it left)."""
    from asrtrain.train.checkpoint import EPOCH_FILE, latest_epoch

    last = latest_epoch(out)
    need = sum(p.stat().st_size for p in out.iterdir()
               if (m := EPOCH_FILE.match(p.name)) and int(m.group(1)) == last) if last else 0
    try:
        return shutil.disk_usage(out).free < max(need, 1 << 20)
    except OSError:
        return False


def train_model(cfg: DictConfig, out: Path, exp: Path, resume_key: str, fresh: bool,
                started: Callable[[], None] | None = None) -> Path:
    """Train ``cfg.model`` with ``cfg.trainer`` into ``out``; return the final model's path.

    Everything the learners read is checked first (:func:`asrtrain.train.inputs.check_inputs`);
    only then is ``started`` called (the pipeline's ``StageContext.start``: the stage's old
    record goes) and are checkpoints of other settings moved aside, so a run refused for its
    inputs leaves a finished model, and its record, as they were."""
    from asrtrain.train.inputs import check_inputs

    run_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    run_cfg.train_dir = str(out.resolve())
    run_cfg.exp_dir = str(exp.resolve())
    check_inputs(run_cfg)
    if started is not None:
        started()
    prepare_dir(out, resume_key, fresh)
    config_path = out / "config.yaml"
    write_text(config_path, OmegaConf.to_yaml(run_cfg))
    t = TrainerConfig.from_config(cfg.trainer)
    if t.learners == 1 and t.nnodes == 1:
        from asrtrain.train.worker import run_learner

        run_learner(config_path)
    else:
        from asrtrain.distributed.launch import launch

        try:
            launch([str(config_path)], learners=t.learners, nnodes=t.nnodes,
                   node_rank=t.node_rank, rdzv_endpoint=t.rdzv_endpoint, threads=t.threads)
        except AsrtrainError as e:
            if NO_SPACE not in str(e) and not disk_full(out):
                raise
            # a learner's full disk (asrtrain.train.worker): the stage says it as the data
            # stages do, once, not as each learner did
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out)) from e
    if not (out / "final.pt").is_file():
        raise AsrtrainError(f"{out}/final.pt: training ended without a final model "
                            f"(see {exp / 'log' / 'train.log'})")
    return out / "final.pt"
