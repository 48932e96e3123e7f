"""Stage ``train``: the CTC model (``model``, ``trainer``) on the fbank features and units."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain.pipeline import Stage, StageContext, read_marker
from asrtrain.recipe import Paths


def check_trainer(trainer: DictConfig, model: DictConfig | None = None,
                  model_key: str = "model") -> None:
    """Validate the trainer settings (and the numbers of ``model``, the config at
    ``model_key``) before anything is written (a bad value must not cost the checkpoints of a
    finished run)."""
    from asrtrain.train.config import TrainerConfig
    from asrtrain.train.inputs import check_finite

    t = TrainerConfig.from_config(trainer)
    if model is not None:
        from asrtrain.models.registry import check_model_config

        check_finite(model, model_key)
        check_model_config(model, model_key)
    if t.precision != "fp32":  # a CPU that cannot train in it is refused before any stage runs
        import torch

        from asrtrain.models.precision import check_precision

        if t.cpu or not torch.cuda.is_available():  # GPUs: the trainer checks its own
            check_precision(t.precision, torch.device("cpu"))


def trainer_settings(trainer: DictConfig) -> dict:
    """The trainer settings in a train stage's digest (all of them; the stage leaves out the
    launch settings, ``IGNORED``)."""
    return OmegaConf.to_container(trainer, resolve=True)


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


def starter(ctx: StageContext, model_name: str):
    """What the training run calls once its inputs are checked: ``ctx.start``, keeping the
    stage's record when it is another model's (this run does not touch that model's dir, so a
    failed run must not make a finished model look undone)."""
    record = read_marker(ctx.paths.markers / ctx.stage.name) or {}
    recorded = ((record.get("config") or {}).get("model") or {}).get("name")
    return lambda: ctx.start(keep_record=recorded is not None and recorded != model_name)


def run(ctx: StageContext) -> None:
    from asrtrain.train.run import train_model

    name = str(ctx.cfg.model.name)
    train_model(ctx.cfg, ctx.paths.model_dir(name), ctx.paths.exp, ctx.resume_key, ctx.fresh,
                started=starter(ctx, name))


def trainer_keys(section: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from asrtrain.train.run import LAUNCH_ONLY, RESUMABLE

    return (tuple(f"{section}.{k}" for k in LAUNCH_ONLY),
            tuple(f"{section}.{k}" for k in RESUMABLE))


IGNORED, RESUMABLE_KEYS = trainer_keys("trainer")

STAGE = Stage("train", run, reads=("features", "lang:units"), config=_settings,
              ignored=IGNORED, resumable=RESUMABLE_KEYS,
              check=lambda cfg: check_trainer(cfg.trainer, cfg.model), verify=_verify,
              checks_first=True, doc="acoustic model training (CTC)")
