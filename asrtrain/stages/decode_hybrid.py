"""Stage ``decode_hybrid``: the hybrid model's pseudo log-likelihoods through the last GMM
pass's HCLG, Kaldi's LM-weight x insertion-penalty sweep, and the WER of each test set.

Where the sweep's best setting is chosen is ``score.tune_on`` (``asrtrain.decode.tuning_set``):
on each test set itself, as Kaldi's scoring does, or on the dev set, which is decoded first and
whose best setting every test set is then decoded with (a held-out figure).

Which of the training run's models is decoded is ``hybrid.decode.checkpoint`` (``best``,
``last``, or the ``average`` of the ``average_n`` epochs of lowest dev loss:
asrtrain.models.average); the log, each set's ``decode.json`` and RESULTS.md name it."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain.pipeline import Stage, StageContext, select
from asrtrain.sections import sets_settings
from asrtrain.stages.train_hybrid import hybrid_config

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.decode import HybridDecodeConfig, check_tuning_set, tuning_set
    from asrtrain.decode.graph import make_graph
    from asrtrain.report import write_results

    cfg, paths = ctx.cfg, ctx.paths
    hcfg = hybrid_config(cfg, paths)
    last = Path(hcfg.model.alignments.train)
    graph = last / "graph"
    if not (graph / "HCLG.fst").is_file():
        make_graph(paths.lang, paths.lm, last, graph)
    options = _options(hcfg.hybrid)
    model = _choose_model(paths, str(hcfg.model.name), options)
    dev = tuning_set(cfg)
    if dev and len(HybridDecodeConfig.from_config(options).settings()) > 1:
        check_tuning_set(paths.data_set(dev), "LM weight and insertion penalty")
        best = _decode_set(ctx, hcfg, graph, dev, options, None, model)
        options = {**options, "lmwt": best["lmwt"], "wip": best["wip"]}
        log.info("decode_hybrid: LM weight %d, insertion penalty %.1f chosen on %s (held out) "
                 "for %s", best["lmwt"], best["wip"], dev, ", ".join(sets_settings(cfg).test))
    else:
        dev = None
    for name in sets_settings(cfg).test:
        _decode_set(ctx, hcfg, graph, str(name), options, dev, model)
    write_results(paths.exp)


def _choose_model(paths, system: str, options: dict) -> tuple[Path, dict]:
    """The model ``hybrid.decode.checkpoint`` names, and its description (logged)."""
    from asrtrain.models.average import CheckpointChoice, choose_model

    model, chosen = choose_model(paths.model_dir(system), CheckpointChoice.from_config(
        options, "hybrid.decode"), paths.exp / "decode" / system)
    log.info("decode_hybrid %s: the model decoded is the %s (hybrid.decode.checkpoint=%s)",
             system, chosen["description"], chosen["checkpoint"])
    return model, chosen


def _decode_set(ctx: StageContext, hcfg: DictConfig, graph: Path, name: str, options: dict,
                tuned_on: str | None, model: tuple[Path, dict]) -> dict:
    """Decode and score one set; report and record its WER; return the decoder's summary."""
    from asrtrain.decode import HybridDecodeConfig, note_tuned_on
    from asrtrain.decode.hybrid import decode_hybrid
    from asrtrain.features.reader import appended_streams, stream_dirs
    from asrtrain.report import chosen_on, record_result
    from asrtrain.score import describe_scoring, report_wer

    paths = ctx.paths
    system = str(hcfg.model.name)
    data, dec = paths.data_set(name), paths.decode_dir(system, name)
    log.info("decode_hybrid %s %s: %s", system, name, describe_scoring(data))
    streams = stream_dirs(paths, name, appended_streams(hcfg.features))
    summary = decode_hybrid(model[0], graph, data, dec, options,
                            nj=ctx.jobs(),
                            streams=streams, checkpoint=model[1])
    if tuned_on:
        note_tuned_on(dec, tuned_on)
    if summary.get("counts"):
        report_wer(name, system, summary["counts"], dec / "score")
        n = len(HybridDecodeConfig.from_config(options).settings())
        record_result(ctx, dec, system, "hybrid", name, summary["counts"], data,
                      {"lmwt": summary["lmwt"], "wip": summary["wip"]},
                      chosen_on(n, name, tuned_on))
    return summary


def check(cfg: DictConfig) -> None:
    from asrtrain.decode import HybridDecodeConfig, tuning_set
    from asrtrain.models.average import CheckpointChoice

    options = _options(cfg.hybrid)
    HybridDecodeConfig.from_config(options, "hybrid.decode")
    trainer = OmegaConf.merge(cfg.trainer, cfg.hybrid.get("trainer") or {})
    CheckpointChoice.from_config(options, "hybrid.decode").check_kept(
        trainer, "hybrid.decode", "hybrid.trainer")
    tuning_set(cfg)


def _options(hybrid: DictConfig) -> dict:
    return OmegaConf.to_container(hybrid.decode, resolve=True) if "decode" in hybrid else {}


def _config(cfg: DictConfig) -> dict:
    """``hybrid.decode``, which model it decodes (``checkpoint`` and ``average_n``, defaults
    included: the default is not what decodes before the setting existed, the last epoch, did),
    and the dev set when the sweep's choice is held out there."""
    from asrtrain.decode import tuning_config
    from asrtrain.models.average import CheckpointChoice

    choice = CheckpointChoice.from_config(_options(cfg.hybrid), "hybrid.decode")
    return {"hybrid.decode": select(cfg, "hybrid.decode"),
            "hybrid.decode.checkpoint": choice.checkpoint,
            "hybrid.decode.average_n": choice.average_n, **tuning_config(cfg)}


# ``ivectors``: the test sets' i-vectors, when the recipe runs the stage; ``decode_gmm``: the
# last pass's graph (HCLG of the LM now) and the test sets' fMLLR features
STAGE = Stage("decode_hybrid", run,
              reads=("train_hybrid", "align", "decode_gmm", "lm", "lang", "features",
                     "ivectors"),
              config=_config, check=check,
              doc="hybrid decoding through HCLG, LM-weight sweep, scoring of the test sets")
