"""Stage ``lm``: a Kneser-Ney n-gram of the training transcripts (ARPA) and its G.fst."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext
from asrtrain.sections import sets_settings
from asrtrain.settings import integer, number, opt, read


@dataclass(frozen=True)
class LmConfig:
    """The ``lm`` section (``conf/lm/tg.yaml``): the n-gram ``order`` and the relative-entropy
    ``prune_threshold`` (0: no pruning), read by :func:`asrtrain.settings.read`."""

    order: int = opt(3, integer(1))
    prune_threshold: float = opt(0.0, number(0.0))


def check(cfg: DictConfig) -> None:
    read(LmConfig, cfg.get("lm"), "lm")


def run(ctx: StageContext) -> None:
    from asrtrain.data.datadir import DataDir
    from asrtrain.lang.ngram import train_lm

    cfg, paths = ctx.cfg, ctx.paths
    train = DataDir.read(paths.data_set(sets_settings(cfg).train))
    train_lm([train.text[u] for u in train.utts], paths.lang, paths.lm, order=int(cfg.lm.order),
             prune_threshold=float(cfg.lm.prune_threshold))


STAGE = Stage("lm", run, reads=("prepare", "lang"), config=("lm",), check=check,
              doc="Kneser-Ney n-gram (ARPA) and G.fst")
