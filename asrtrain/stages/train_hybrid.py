"""Stage ``train_hybrid``: the hybrid BLSTM (``hybrid.model``) on the last GMM pass's pdf
alignments, frame cross-entropy on chunks; ``hybrid.trainer`` overrides ``trainer``."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import Paths
from asrtrain.stages.align import final_alignments
from asrtrain.stages.train import check_trainer, final_model_damage, trainer_keys, trainer_settings


def hybrid_config(cfg: DictConfig, paths: Paths) -> DictConfig:
    """The recipe's config with the hybrid model and its trainer settings in place."""
    hcfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    hcfg.model = OmegaConf.merge(hcfg.hybrid.model, {"alignments": final_alignments(cfg, paths)})
    hcfg.trainer = _trainer(hcfg)
    return hcfg


def run(ctx: StageContext) -> None:
    from asrtrain.train.run import train_model

    hcfg = hybrid_config(ctx.cfg, ctx.paths)
    train_model(hcfg, ctx.paths.model_dir(str(hcfg.model.name)), ctx.paths.exp,
                ctx.resume_key, ctx.fresh)


def _trainer(cfg: DictConfig) -> DictConfig:
    """``trainer`` with ``hybrid.trainer`` over it; merged as plain data, so a key unknown to
    ``trainer`` reaches the check, which names it, instead of a struct error."""
    return OmegaConf.merge(OmegaConf.to_container(cfg.trainer, resolve=True),
                           OmegaConf.to_container(cfg.hybrid.get("trainer") or {}, resolve=True))


def _check(cfg: DictConfig) -> None:
    """``hybrid.trainer``'s own keys and values first, so an error names the key as it was
    given; then the settings in effect."""
    from asrtrain.train.config import TrainerConfig

    TrainerConfig.check_section(cfg.hybrid.get("trainer"), "hybrid.trainer")
    check_trainer(_trainer(cfg))


def _verify(cfg: DictConfig, paths: Paths) -> str | None:
    return final_model_damage(paths.model_dir(str(cfg.hybrid.model.name)))


def _settings(cfg: DictConfig) -> dict:
    """What the model depends on: the hybrid model and the trainer settings in effect."""
    return {"model": OmegaConf.to_container(cfg.hybrid.model, resolve=True),
            "trainer": trainer_settings(_trainer(cfg))}


STAGE = Stage("train_hybrid", run, reads=("align", "features"), config=_settings,
              ignored=trainer_keys("trainer")[0], resumable=trainer_keys("trainer")[1],
              check=_check, verify=_verify,
              doc="hybrid BLSTM, frame CE on chunks of the alignments' pdf ids")
