"""Stage ``decode_hybrid``: the hybrid model's pseudo log-likelihoods through the last GMM
pass's HCLG, Kaldi's LM-weight x insertion-penalty sweep, and the WER of each test set."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain.pipeline import Stage, StageContext
from asrtrain.stages.train_hybrid import hybrid_config


def run(ctx: StageContext) -> None:
    from asrtrain.decode.graph import make_graph
    from asrtrain.decode.hybrid import decode_hybrid
    from asrtrain.score import report_wer

    cfg, paths = ctx.cfg, ctx.paths
    hcfg = hybrid_config(cfg, paths)
    system = str(hcfg.model.name)
    last = Path(hcfg.model.alignments.train)
    graph = last / "graph"
    if not (graph / "HCLG.fst").is_file():
        make_graph(paths.lang, paths.lm, last, graph)
    options = _options(hcfg.hybrid)
    for name in cfg.sets.test:
        dec = paths.decode_dir(system, name)
        summary = decode_hybrid(paths.model_dir(system) / "final.pt", graph,
                                paths.data_set(name), dec, options)
        if "counts" in summary:
            report_wer(str(name), system, summary["counts"], dec / "score")


def check(cfg: DictConfig) -> None:
    from asrtrain.decode import HybridDecodeConfig

    HybridDecodeConfig.from_config(_options(cfg.hybrid))


def _options(hybrid: DictConfig) -> dict:
    return OmegaConf.to_container(hybrid.decode, resolve=True) if "decode" in hybrid else {}


STAGE = Stage("decode_hybrid", run, reads=("train_hybrid", "align", "lm", "lang", "features"),
              config=("hybrid.decode",), check=check,
              doc="hybrid decoding through HCLG, LM-weight sweep, Hub5 scoring")
