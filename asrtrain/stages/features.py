"""Stage ``features``: the neural models' fbank features and per-speaker CMVN stats of every
data set, in the data dirs themselves."""

from __future__ import annotations

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets


def feature_options(cfg: DictConfig, section: str):
    """The ``FeatureOptions`` of config section ``section`` (``features`` or ``mfcc``); audio
    at another rate is resampled only where the corpus says so (user data dirs)."""
    from asrtrain.features import FeatureOptions

    return FeatureOptions.from_config(
        {**cfg[section], "resample": bool(cfg.corpus.get("resample", False))})


def run(ctx: StageContext) -> None:
    from asrtrain.features import compute_features

    cfg, paths = ctx.cfg, ctx.paths
    compute_features([paths.data_set(name) for name in data_sets(cfg)], paths.feats,
                     feature_options(cfg, "features"), nj=int(cfg.nj))


STAGE = Stage("features", run, reads=("prepare",), config=("features", "corpus.resample"),
              doc="fbank features, per-speaker CMVN stats")
