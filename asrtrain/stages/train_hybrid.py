"""Stage ``train_hybrid``: the hybrid BLSTM (``hybrid.model``) on the last GMM pass's pdf
alignments, frame cross-entropy on chunks; ``hybrid.trainer`` overrides ``trainer``, and
``hybrid.features`` (when the recipe sets it, e.g. ``- features@hybrid.features: ibm260``) says
how the model's input is read from the features stage's fbank features and the streams it
appends (fMLLR features of the align stage's SAT pass, online i-vectors of the ivectors
stage); else the model reads ``features`` as the CTC model does."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import Paths
from asrtrain.stages.align import final_alignments
from asrtrain.stages.train import (
    check_trainer,
    final_model_damage,
    starter,
    trainer_keys,
    trainer_settings,
)

#: The settings of a features config that say how stored fbank features are read (all others
#: say how they are made, and must be the ``features`` group's, whose features the stage made).
READ_KEYS = ("delta_order", "norm_vars", "append")


def hybrid_features(cfg: DictConfig) -> DictConfig:
    """The hybrid model's input config: ``hybrid.features`` when set, else ``features``."""
    hybrid = cfg.get("hybrid") or {}
    return hybrid["features"] if hybrid.get("features") is not None else cfg.features


def hybrid_config(cfg: DictConfig, paths: Paths) -> DictConfig:
    """The recipe's config with the hybrid model, its input and its trainer settings in
    place."""
    hcfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    hcfg.model = OmegaConf.merge(hcfg.hybrid.model, {"alignments": final_alignments(cfg, paths)})
    hcfg.features = hybrid_features(hcfg)
    hcfg.trainer = _trainer(hcfg)
    return hcfg


def run(ctx: StageContext) -> None:
    from asrtrain.train.run import train_model

    hcfg = hybrid_config(ctx.cfg, ctx.paths)
    name = str(hcfg.model.name)
    train_model(hcfg, ctx.paths.model_dir(name), ctx.paths.exp, ctx.resume_key, ctx.fresh,
                started=starter(ctx, name))


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
    check_trainer(_trainer(cfg), cfg.hybrid.model, "hybrid.model")
    check_hybrid_features(cfg)


def check_hybrid_features(cfg: DictConfig) -> None:
    """``hybrid.features`` may change how the fbank features are read (``READ_KEYS``), not how
    they are made: the features stage makes them from ``features``."""
    from asrtrain.features.reader import appended_streams

    if (cfg.get("hybrid") or {}).get("features") is None:
        appended_streams(cfg.features)
        return
    mine, theirs = (OmegaConf.to_container(c, resolve=True)
                    for c in (cfg.hybrid.features, cfg.features))
    appended_streams(mine, "hybrid.features")
    for key in sorted(set(mine) | set(theirs)):
        if key not in READ_KEYS and mine.get(key) != theirs.get(key):
            raise AsrtrainError(f"hybrid.features.{key}={mine.get(key)!r} but features.{key}="
                                f"{theirs.get(key)!r}: the hybrid model reads the fbank "
                                "features the features stage makes from features; only "
                                f"{', '.join(READ_KEYS)} may differ")


def _verify(cfg: DictConfig, paths: Paths) -> str | None:
    return final_model_damage(paths.model_dir(str(cfg.hybrid.model.name)))


def _settings(cfg: DictConfig) -> dict:
    """What the model depends on: the hybrid model and the trainer settings in effect."""
    out = {"model": OmegaConf.to_container(cfg.hybrid.model, resolve=True),
           "trainer": trainer_settings(_trainer(cfg))}
    if (cfg.get("hybrid") or {}).get("features") is not None:
        # its own input (``features`` is in the digest of the features stage, read here)
        out["features"] = OmegaConf.to_container(cfg.hybrid.features, resolve=True)
    return out


# ``ivectors``: the input's i-vectors, read when the recipe runs the stage (a stage absent from a
# recipe counts as absent); ``fmllr``: the train and dev sets' fMLLR features, likewise.
STAGE = Stage("train_hybrid", run, reads=("align", "fmllr", "features", "ivectors"),
              config=_settings,
              ignored=trainer_keys("trainer")[0], resumable=trainer_keys("trainer")[1],
              check=_check, verify=_verify, checks_first=True,
              doc="hybrid BLSTM, frame CE on chunks of the alignments' pdf ids")
