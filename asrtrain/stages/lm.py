"""Stage ``lm``: a Kneser-Ney n-gram of the training transcripts (ARPA) and its G.fst."""

from __future__ import annotations

from asrtrain.pipeline import Stage, StageContext


def run(ctx: StageContext) -> None:
    from asrtrain.data.datadir import DataDir
    from asrtrain.lang.ngram import train_lm

    cfg, paths = ctx.cfg, ctx.paths
    train = DataDir.read(paths.data_set(cfg.sets.train))
    train_lm([train.text[u] for u in train.utts], paths.lang, paths.lm, order=int(cfg.lm.order),
             prune_threshold=float(cfg.lm.prune_threshold))


STAGE = Stage("lm", run, reads=("prepare", "lang"), config=("lm",),
              doc="Kneser-Ney n-gram (ARPA) and G.fst")
