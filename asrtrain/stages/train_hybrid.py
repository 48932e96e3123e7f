"""Stage ``train_hybrid``: the hybrid BLSTM (``hybrid.model``) on the last GMM pass's pdf
alignments, frame cross-entropy on chunks; ``hybrid.trainer`` overrides ``trainer``."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import Paths
from asrtrain.stages.align import final_alignments
from asrtrain.stages.train import check_trainer, trainer_keys


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
    return OmegaConf.merge(cfg.trainer, cfg.hybrid.get("trainer") or {})


def _settings(cfg: DictConfig) -> dict:
    """What the model depends on: the hybrid model and the trainer settings in effect."""
    return {"model": OmegaConf.to_container(cfg.hybrid.model, resolve=True),
            "trainer": OmegaConf.to_container(_trainer(cfg), resolve=True)}


STAGE = Stage("train_hybrid", run, reads=("align", "features"), config=_settings,
              ignored=trainer_keys("trainer")[0], resumable=trainer_keys("trainer")[1],
              check=lambda cfg: check_trainer(_trainer(cfg)),
              doc="hybrid BLSTM, frame CE on chunks of the alignments' pdf ids")
