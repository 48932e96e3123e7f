"""Stage ``prepare``: the corpus (LDC layout, or the user's Kaldi data dirs) to Kaldi data dirs."""

from __future__ import annotations

import logging

from asrtrain import AsrtrainError
from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.data.corpora import prepare_corpus
    from asrtrain.data.datadir import DataDir

    cfg, paths = ctx.cfg, ctx.paths
    written = prepare_corpus(cfg.corpus, paths.data)
    missing = [s for s in data_sets(cfg) if s not in written]
    if missing:
        raise AsrtrainError(f"corpus {cfg.corpus.kind} gave the sets {written}, but the recipe "
                            f"needs {missing} (see sets: in the recipe)")
    for name in written:
        d = DataDir.read(paths.data_set(name))
        log.info("%s: %d utterances, %d speakers, %d recordings", paths.data_set(name),
                 len(d.utt2spk), len(d.spk2utt), len(d.wav))


STAGE = Stage("prepare", run, reads=(), config=("corpus", "sets"),
              doc="corpus -> Kaldi data dirs (wav.scp segments text utt2spk spk2utt; stm glm)")
