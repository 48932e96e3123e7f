"""Stage ``train``: the CTC model (``model``, ``trainer``) on the fbank features and units."""

from __future__ import annotations

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext


def check_trainer(trainer: DictConfig) -> None:
    """Validate the trainer settings before anything is written (a bad value must not cost
    the checkpoints of a finished run)."""
    from asrtrain.train.config import TrainerConfig

    TrainerConfig.from_config(trainer)


def run(ctx: StageContext) -> None:
    from asrtrain.train.run import train_model

    train_model(ctx.cfg, ctx.paths.model_dir(str(ctx.cfg.model.name)), ctx.paths.exp,
                ctx.resume_key, ctx.fresh)


def trainer_keys(section: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from asrtrain.train.run import LAUNCH_ONLY, RESUMABLE

    return (tuple(f"{section}.{k}" for k in LAUNCH_ONLY),
            tuple(f"{section}.{k}" for k in RESUMABLE))


IGNORED, RESUMABLE_KEYS = trainer_keys("trainer")

STAGE = Stage("train", run, reads=("features", "lang"), config=("model", "trainer"),
              ignored=IGNORED, resumable=RESUMABLE_KEYS,
              check=lambda cfg: check_trainer(cfg.trainer),
              doc="acoustic model training (CTC)")
