"""Stage ``align``: the GMM-HMM passes (Kaldi's train_mono.sh, train_deltas.sh) in the recipe's
order, each decoded on the test sets when ``align.decode`` is set, then the dev set aligned with
the last pass for the hybrid model's held-out figures; or Kaldi's own alignments imported.

Each pass is an inner step keyed by the stage's resume key and the options of the passes up to
it: a run killed in ``tri2`` resumes at ``tri2``, a change to ``tri2`` keeps ``mono`` and
``tri1``, and any change upstream (corpus, lang, MFCCs) reruns them all.  Each pass's decoding is
a step of its own, keyed also by where its acoustic scale is chosen (``score.tune_on``: the test
set itself, or the dev set, decoded first), so changing that redecodes without retraining.

The trainer's per-iteration figures (a JSON line per iteration, about 100 a recipe) and the graph
sizes go to the stage log only (``log/align.log``); the console gets one line per pass and the
WER lines.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text
from asrtrain.pipeline import Stage, StageContext, select
from asrtrain.recipe import Paths

log = logging.getLogger("asrtrain")


def final_alignments(cfg: DictConfig, paths: Paths) -> dict[str, str]:
    """The alignment dirs the hybrid model trains on: ``train`` and ``dev``."""
    if cfg.align.source == "kaldi":
        return {"train": str(paths.align_pass("kaldi").resolve()),
                "dev": str(paths.align_pass("kaldi").resolve())}
    last = list(cfg.align.passes)[-1]
    return {"train": str(paths.align_pass(last).resolve()),
            "dev": str(paths.align_pass(f"{last}_ali_{cfg.sets.dev}").resolve())}


def _step(ctx: StageContext, marker: Path, key: str, what: str, work) -> None:
    """Run ``work()`` unless ``marker`` holds the same ``key``; write it afterwards."""
    if ctx.step_done(marker, key):
        log.info("align %s: done already (%s), skipped", what, key)
        return
    marker.unlink(missing_ok=True)
    work()
    write_text(marker, key + "\n")


def _train_pass(ctx: StageContext, name: str, opts: DictConfig) -> None:
    from asrtrain.align import train_mono, train_tri

    cfg, paths = ctx.cfg, ctx.paths
    out = paths.align_pass(name)
    gmm = {k: v for k, v in OmegaConf.to_container(opts, resolve=True).items() if k != "from"}
    gmm.setdefault("nj", int(cfg.get("nj", 1)))   # same alignments whatever nj: not in the key
    if opts["from"] is None:
        summary = train_mono(paths.mfcc_set(cfg.sets.train), paths.lang, out, gmm)
    else:
        summary = train_tri(paths.mfcc_set(cfg.sets.train), paths.lang,
                            paths.align_pass(opts["from"]), out, gmm)
    log.info("align %s: %d pdfs, %d Gaussians, %d utterances (%d failed), log-likelihood %.2f "
             "per frame; every iteration in %s", name, summary["num_pdfs"], summary["num_gauss"],
             summary["utterances"], summary["failed"], summary["final_loglike_per_frame"],
             paths.logs / "align.log")


def _decode_pass(ctx: StageContext, name: str) -> None:
    """Decode the test sets with pass ``name``; when the acoustic scale is chosen on the dev
    set (``score.tune_on``), the dev set first, and its best scale is the test sets' one."""
    from asrtrain.decode import GmmDecodeConfig, check_tuning_set, tuning_set
    from asrtrain.decode.graph import make_graph
    from asrtrain.report import write_results

    cfg, paths = ctx.cfg, ctx.paths
    out = paths.align_pass(name)
    if not (out / "graph" / "HCLG.fst").is_file():
        make_graph(paths.lang, paths.lm, out, out / "graph")
    options: dict = {}
    dev = tuning_set(cfg)
    if dev and len(GmmDecodeConfig.from_config(options).acoustic_scales) > 1:
        check_tuning_set(paths.mfcc_set(dev), "acoustic scale")
        best = _decode_set(ctx, name, dev, options, None)["acoustic_scale"]
        options = {"acoustic_scales": [best]}
        log.info("align %s: acoustic scale %.4f chosen on %s (held out) for %s", name, best, dev,
                 ", ".join(cfg.sets.test))
    else:
        dev = None
    for test in cfg.sets.test:
        _decode_set(ctx, name, str(test), options, dev)
    write_results(paths.exp)


def _decode_set(ctx: StageContext, name: str, set_name: str, options: dict,
                tuned_on: str | None) -> dict:
    """Decode and score one set with pass ``name``; report and record its WER (Hub5 scoring,
    as every system's); return the decoder's summary."""
    from asrtrain.decode import GmmDecodeConfig, note_tuned_on
    from asrtrain.decode.graph import decode_gmm
    from asrtrain.report import chosen_on, record_result
    from asrtrain.score import describe_scoring, report_wer

    paths = ctx.paths
    out, data, dec = (paths.align_pass(name), paths.mfcc_set(set_name),
                      paths.decode_dir(name, set_name))
    log.info("align %s %s: %s", name, set_name, describe_scoring(data))
    summary = decode_gmm(out, out / "graph", data, dec, options, nj=int(ctx.cfg.nj))
    if tuned_on:
        note_tuned_on(dec, tuned_on)
    if summary["counts"]:
        report_wer(set_name, name, summary["counts"], dec / "score")
        n = len(GmmDecodeConfig.from_config(options).acoustic_scales)
        record_result(ctx, dec, name, "GMM", set_name, summary["counts"], data,
                      {"acoustic_scale": summary["acoustic_scale"]},
                      chosen_on(n, set_name, tuned_on))
    return summary




def run(ctx: StageContext) -> None:
    from asrtrain.align import import_kaldi_alignment

    cfg, paths = ctx.cfg, ctx.paths
    if cfg.align.source == "kaldi":
        if not cfg.align.kaldi_dir:
            raise AsrtrainError("align.source=kaldi needs align.kaldi_dir (an ali-to-pdf dir)")
        import_kaldi_alignment(Path(cfg.align.kaldi_dir), paths.align_pass("kaldi"),
                               cfg.align.num_pdfs)
        return
    _run_passes(ctx)  # its per-iteration details go to the stage log only (STAGE_LOG_ONLY)


def _run_passes(ctx: StageContext) -> None:
    from asrtrain.align import align_data
    from asrtrain.decode import tuning_set

    cfg, paths = ctx.cfg, ctx.paths
    passes = OmegaConf.to_container(cfg.align.passes, resolve=True)
    tests = [str(t) for t in cfg.sets.test]
    chain: list = []
    for name, opts in cfg.align.passes.items():
        chain.append([name, passes[name]])
        out = paths.align_pass(name)
        _step(ctx, out / ".done", ctx.step_key("pass", chain), name,
              lambda name=name, opts=opts: _train_pass(ctx, name, opts))
        if cfg.align.decode:
            _step(ctx, out / ".decoded", ctx.step_key("decode", chain, tuning_set(cfg), tests),
                  f"{name} decoding", lambda name=name: _decode_pass(ctx, name))
    last = list(passes)[-1]
    dev = Path(final_alignments(cfg, paths)["dev"])
    where = {"nj": int(cfg.get("nj", 1)), "device": passes[last].get("device", "cpu")}
    _step(ctx, dev / ".done", ctx.step_key("align dev", chain), dev.name,
          lambda: align_data(paths.mfcc_set(cfg.sets.dev), paths.lang, paths.align_pass(last),
                             dev, where))


def check(cfg: DictConfig) -> None:
    if cfg.align.source not in ("train", "kaldi"):
        raise AsrtrainError(f"align.source={cfg.align.source!r}: expected train or kaldi")
    if cfg.align.source == "train":
        if not cfg.align.passes:
            raise AsrtrainError("align.passes is empty: give at least a mono pass")
        names = list(cfg.align.passes)
        for i, (name, opts) in enumerate(cfg.align.passes.items()):
            src = opts.get("from")
            if (src is None) != (i == 0) or (src is not None and src not in names[:i]):
                raise AsrtrainError(f"align.passes.{name}.from={src!r}: the first pass starts "
                                    "from nothing (null), every later one from an earlier pass")
    if cfg.align.decode:
        from asrtrain.decode import tuning_set

        tuning_set(cfg)


def _config(cfg: DictConfig) -> dict:
    """``align``, with the dev set the passes' acoustic scale is chosen on when it is held out
    there (``align.tune_on``, resumable: changing it redecodes, it does not retrain)."""
    from asrtrain.decode import tuning_set

    align = select(cfg, "align")
    dev = tuning_set(cfg) if isinstance(align, dict) and align.get("decode") else None
    return {"align": {**align, "tune_on": dev} if dev else align}


STAGE = Stage("align", run, reads=("mfcc", "lang", "lm"), config=_config,
              resumable=("align.passes", "align.tune_on"), check=check,
              doc="GMM-HMM passes (mono, tri1, tri2), pdf alignments, HCLG decoding of each")
