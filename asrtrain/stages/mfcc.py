"""Stage ``mfcc``: MFCCs for the GMMs, in a copy of each data set (``data/<set>_mfcc``), as
Kaldi keeps a second data dir for them."""

from __future__ import annotations

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets
from asrtrain.stages.features import feature_options


def run(ctx: StageContext) -> None:
    from asrtrain.data.datadir import DataDir
    from asrtrain.features import compute_features

    cfg, paths = ctx.cfg, ctx.paths
    copies = []
    for name in data_sets(cfg):
        DataDir.read(paths.data_set(name)).copy_without_features(
            paths.mfcc_set(name), source=paths.data_set(name))
        copies.append(paths.mfcc_set(name))
    compute_features(copies, paths.feats, feature_options(cfg, "mfcc"), nj=int(cfg.nj))


STAGE = Stage("mfcc", run, reads=("prepare",), config=("mfcc", "corpus.resample"),
              doc="MFCC copies of the data sets for the GMMs")
