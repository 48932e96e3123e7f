"""Stage ``features``: the neural models' fbank features and per-speaker CMVN stats of every
data set, in the data dirs themselves.

When the recipe also runs ``mfcc``, the same pass over the audio makes the GMMs' MFCCs too (the
audio is decoded once, not twice): their arks wait, with a record of the options and audio they
were made from, for the ``mfcc`` stage, which only writes its data dirs' tables from them when
the record matches its config, and computes them itself otherwise (``finish_pass``). So the
digests stay as they were: changing ``mfcc.*`` reruns ``mfcc`` alone, which then recomputes.
"""

from __future__ import annotations

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets
from asrtrain.sections import corpus_settings

#: The suffix of the MFCC copy of a data set (``Paths.mfcc_set``).
MFCC_SUFFIX = "_mfcc"


def feature_options(cfg: DictConfig, section: str):
    """The ``FeatureOptions`` of config section ``section`` (``features`` or ``mfcc``); audio
    at another rate is resampled only where the corpus says so (user data dirs)."""
    from asrtrain.features import FeatureOptions

    return FeatureOptions.from_config(
        {**cfg[section], "resample": corpus_settings(cfg).resample}, section)


def check(cfg: DictConfig) -> None:
    """The ``features`` section read by :func:`asrtrain.settings.read` (unknown keys, types)."""
    feature_options(cfg, "features")


def shared_mfcc(ctx: StageContext):
    """The MFCC options to make in the features stage's audio pass, or None: when the recipe
    runs ``mfcc`` at the same sample rate and its arks are not already there for this audio."""
    from asrtrain.features.extract import pass_arks

    cfg, paths = ctx.cfg, ctx.paths
    if "mfcc" not in [str(s) for s in cfg.stages] or "mfcc" not in cfg:
        return None
    mfcc, fbank = feature_options(cfg, "mfcc"), feature_options(cfg, "features")
    if mfcc.sample_rate != fbank.sample_rate:
        return None
    done = all(pass_arks(paths.data_set(name), paths.mfcc_set(name).name, paths.feats, mfcc)
               for name in data_sets(cfg))
    return None if done else mfcc


def run(ctx: StageContext) -> None:
    from asrtrain.features import compute_features

    cfg, paths = ctx.cfg, ctx.paths
    mfcc = shared_mfcc(ctx)
    compute_features([paths.data_set(name) for name in data_sets(cfg)], paths.feats,
                     feature_options(cfg, "features"),
                     nj=ctx.jobs(),
                     extra=[(mfcc, MFCC_SUFFIX)] if mfcc else [])


STAGE = Stage("features", run, reads=("prepare",), config=("features", "corpus.resample"),
              check=check, doc="fbank features, per-speaker CMVN stats")
