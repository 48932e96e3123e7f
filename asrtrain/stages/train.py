"""Stage ``train``: the CTC model (``model``, ``trainer``) on the fbank features and units."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import Paths


def check_trainer(trainer: DictConfig) -> None:
    """Validate the trainer settings before anything is written (a bad value must not cost
    the checkpoints of a finished run)."""
    from asrtrain.train.config import TrainerConfig

    t = TrainerConfig.from_config(trainer)
    if t.precision != "fp32":  # a CPU that cannot train in it is refused before any stage runs
        import torch

        from asrtrain.models.precision import check_precision

        if t.cpu or not torch.cuda.is_available():  # GPUs: the trainer checks its own
            check_precision(t.precision, torch.device("cpu"))


def trainer_settings(trainer: DictConfig) -> dict:
    """The trainer settings in a train stage's digest. ``precision: fp32``, the only precision
    before ``trainer.precision`` existed, is left out, so runs finished before it keep their
    digests and are not retrained; any other precision is in."""
    out = OmegaConf.to_container(trainer, resolve=True)
    if out.get("precision") == "fp32":
        del out["precision"]
    return out


def _settings(cfg: DictConfig) -> dict:
    return {"model": OmegaConf.to_container(cfg.model, resolve=True),
            "trainer": trainer_settings(cfg.trainer)}


def final_model_damage(model_dir: Path) -> str | None:
    """Why a finished run's ``final.pt`` cannot be used (missing, cut short, altered), or None.
    The rerun then resumes: from the last good epoch checkpoint, writing ``final.pt`` again."""
    from asrtrain.models.checksum import damage

    final = model_dir / "final.pt"
    why = damage(final)
    if why is None:
        return None
    return f"{final} is missing" if why == "missing" else f"{final}: {why}"


def _verify(cfg: DictConfig, paths: Paths) -> str | None:
    return final_model_damage(paths.model_dir(str(cfg.model.name)))


def run(ctx: StageContext) -> None:
    from asrtrain.train.run import train_model

    train_model(ctx.cfg, ctx.paths.model_dir(str(ctx.cfg.model.name)), ctx.paths.exp,
                ctx.resume_key, ctx.fresh)


def trainer_keys(section: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from asrtrain.train.run import LAUNCH_ONLY, RESUMABLE

    return (tuple(f"{section}.{k}" for k in LAUNCH_ONLY),
            tuple(f"{section}.{k}" for k in RESUMABLE))


IGNORED, RESUMABLE_KEYS = trainer_keys("trainer")

STAGE = Stage("train", run, reads=("features", "lang"), config=_settings,
              ignored=IGNORED, resumable=RESUMABLE_KEYS,
              check=lambda cfg: check_trainer(cfg.trainer), verify=_verify,
              doc="acoustic model training (CTC)")
