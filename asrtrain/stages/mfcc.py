"""Stage ``mfcc``: MFCCs for the GMMs, in a copy of each data set (``data/<set>_mfcc``), as
Kaldi keeps a second data dir for them.

The ``features`` stage usually made them already, in its one pass over the audio; this stage
then only writes the copies' tables (CMVN stats included) from those arks, after checking that
they were made with this stage's ``mfcc`` config from the same audio. Otherwise (another config,
``--stage mfcc`` on its own, a recipe without ``features``) it decodes the audio itself."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets
from asrtrain.stages.features import feature_options

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.data.datadir import DataDir
    from asrtrain.features import compute_features, finish_pass

    cfg, paths = ctx.cfg, ctx.paths
    opts = feature_options(cfg, "mfcc")
    todo = []
    for name in data_sets(cfg):
        source, copy = paths.data_set(name), paths.mfcc_set(name)
        DataDir.read(source).copy_without_features(copy, source=source)
        if not finish_pass(source, copy, paths.feats, opts):
            todo.append(copy)
    if todo:
        log.info("mfcc: decoding the audio of %s (no matching MFCCs from the features stage)",
                 ", ".join(d.name for d in todo))
        compute_features(todo, paths.feats, opts, nj=ctx.jobs())


def check(cfg: DictConfig) -> None:
    """The ``mfcc`` section read by :func:`asrtrain.settings.read` (unknown keys, types)."""
    feature_options(cfg, "mfcc")


STAGE = Stage("mfcc", run, reads=("prepare",), config=("mfcc", "corpus.resample"),
              check=check, doc="MFCC copies of the data sets for the GMMs")
