"""Stage ``decode_gmm``: the GMM passes' graphs and decoding, as Kaldi's ``utils/mkgraph.sh`` and
``steps/decode.sh`` (``steps/decode_fmllr.sh`` for a SAT pass: two passes, see
:mod:`asrtrain.decode.fmllr`) after each ``train_*.sh``, and the test sets' fMLLR feature dirs.

It reads the passes (``align``), ``lang`` and ``lm``: an ``lm.*`` change rebuilds the graphs and
redecodes here, and retrains no pass. When ``align.decode`` is set every pass is decoded on the
test sets and scored, with ``align.decode_options`` (decode.sh's ``--beam``, ``--max-active``,
the acoustic scales tried: :class:`asrtrain.decode.GmmDecodeConfig`; a change redecodes and keeps
the graphs); when the acoustic scale is chosen on the dev set (``score.tune_on``), the
dev set is decoded first and its best scale is the test sets' one. Each pass's graph and decoding
are inner steps: a run killed after ``tri2``'s decoding resumes at ``tri3``'s. Their keys name all
they are made of (:func:`pass_keys`), so when a ``tri4`` change reruns ``align`` the other passes'
graphs and decodes are kept, fresh start or not.

The last pass's graph is built whatever ``align.decode`` says: the hybrid model decodes through
it (``decode_hybrid``). When the last pass is SAT (or ``align.kaldi_fmllr`` is given), the test
sets' speaker transforms come from decoding (Kaldi's nnet decoding takes them from
decode_fmllr.sh's dir with ``--transform-dir``): this stage writes the test sets' fMLLR feature
dirs from them (without ``align.decode``: from the first pass and the estimation only). The
train and dev sets' are the ``fmllr`` stage's.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from omegaconf import DictConfig

from asrtrain.align.config import align_settings
from asrtrain.pipeline import Stage, StageContext
from asrtrain.sections import sets_settings
from asrtrain.stages.align import (
    final_alignments,
    fmllr_options,
    fmllr_sets,
    kaldi_fmllr_files,
    pass_chain,
    pass_type,
    step,
)

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.stages.fmllr import write_fmllr_sets

    cfg, paths = ctx.cfg, ctx.paths
    if align_settings(cfg).source == "train":
        for name, (graph, decode) in pass_keys(ctx).items():
            out = paths.align_pass(name)
            if graph is not None:
                _graph(ctx, out, graph)
            if decode is not None:
                step(ctx, out / ".decoded", decode, f"{name} decoding",
                     lambda name=name: _decode_pass(ctx, name), whole_key=not ctx.forced)
    elif "decode_hybrid" in cfg.stages:   # Kaldi's model beside its alignments
        last = Path(final_alignments(cfg, paths)["train"])
        _graph(ctx, last, ctx.step_key("graph", "kaldi"))
    write_fmllr_sets(ctx, list(sets_settings(cfg).test))


def pass_keys(ctx: StageContext) -> dict[str, tuple[str | None, str | None]]:
    """Each pass's graph and decoding keys (None: not made), as the inner steps record them:
    the graph of every pass that is decoded (``align.decode``) and of the last (the hybrid
    model's), the decoding of each when ``align.decode``."""
    from asrtrain.decode import tuning_set

    cfg = ctx.cfg
    tests = list(sets_settings(cfg).test)
    decoded = align_settings(cfg).decode
    chains = pass_chain(cfg)
    out = {}
    for name, chain in chains:
        model_dir = ctx.paths.align_pass(name)
        graph = _pass_key(ctx, model_dir, "graph", chain) \
            if decoded or name == chains[-1][0] else None
        decode = _pass_key(ctx, model_dir, "decode", chain, tuning_set(cfg), tests,
                           decode_options(cfg)) if decoded else None
        out[name] = (graph, decode)
    return out


def _pass_key(ctx: StageContext, model_dir: Path, *what: object) -> str:
    """The key of a pass's graph or decoding: the pass as trained (its ``.done`` key, which
    names everything it was made from), ``lang`` and ``lm`` as they are, and ``what``. So a
    change to ``tri4`` (align reruns, and this stage starts fresh) keeps the other passes'
    graphs and decodes, while a new LM or lexicon redoes them all. A forced run redoes all (its
    key is of its own generation)."""
    if ctx.forced:
        return ctx.step_key(*what)
    done = model_dir / ".done"
    trained = done.read_text().strip() if done.is_file() else None
    blob = json.dumps({"pass": trained, "lang": ctx.inputs.get("lang"),
                       "lm": ctx.inputs.get("lm"), "step": what}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _graph(ctx: StageContext, model_dir: Path, key: str) -> None:
    """``model_dir/graph`` (mkgraph.sh), keyed by the pass, lang and lm (:func:`_pass_key`):
    a new LM rebuilds it."""
    from asrtrain.decode.graph import make_graph

    graph = model_dir / "graph"
    step(ctx, graph / ".done", key, f"{model_dir.name} graph",
         lambda: make_graph(ctx.paths.lang, ctx.paths.lm, model_dir, graph),
         whole_key=not ctx.forced)


def _decode_pass(ctx: StageContext, name: str) -> None:
    """Decode the test sets with pass ``name``; when the acoustic scale is chosen on the dev
    set (``score.tune_on``), the dev set first, and its best scale is the test sets' one."""
    from asrtrain.decode import GmmDecodeConfig, check_tuning_set, tuning_set
    from asrtrain.report import write_results

    cfg, paths = ctx.cfg, ctx.paths
    options = decode_options(cfg)
    dev = tuning_set(cfg)
    if dev and len(GmmDecodeConfig.from_config(options).acoustic_scales) > 1:
        check_tuning_set(paths.mfcc_set(dev), "acoustic scale")
        best = _decode_set(ctx, name, dev, options, None)["acoustic_scale"]
        options = {**options, "acoustic_scales": [best]}
        log.info("decode_gmm %s: acoustic scale %.4f chosen on %s (held out) for %s", name, best,
                 dev, ", ".join(sets_settings(cfg).test))
    else:
        dev = None
    for test in sets_settings(cfg).test:
        _decode_set(ctx, name, test, options, dev)
    write_results(paths.exp)


def _decode_set(ctx: StageContext, name: str, set_name: str, options: dict,
                tuned_on: str | None) -> dict:
    """Decode and score one set with pass ``name`` (a SAT pass in two passes, fMLLR between);
    report and record its WER (Hub5 scoring, as every system's); return the decoder's summary."""
    from asrtrain.decode import GmmDecodeConfig, note_tuned_on
    from asrtrain.decode.fmllr import decode_fmllr
    from asrtrain.decode.graph import decode_gmm
    from asrtrain.report import chosen_on, record_result
    from asrtrain.score import describe_scoring, report_wer

    paths = ctx.paths
    out, data, dec = (paths.align_pass(name), paths.mfcc_set(set_name),
                      paths.decode_dir(name, set_name))
    log.info("decode_gmm %s %s: %s", name, set_name, describe_scoring(data))
    opts = align_settings(ctx.cfg).passes[name]
    if pass_type(opts) == "sat":
        summary = decode_fmllr(out, out / "graph", data, dec, options, nj=ctx.jobs(),
                               fmllr=fmllr_options(opts))
        _log_first_pass(name, set_name, summary)
    else:
        summary = decode_gmm(out, out / "graph", data, dec, options, nj=ctx.jobs())
    if tuned_on:
        note_tuned_on(dec, tuned_on)
    if summary["counts"]:
        report_wer(set_name, name, summary["counts"], dec / "score")
        n = len(GmmDecodeConfig.from_config(options).acoustic_scales)
        record_result(ctx, dec, name, "GMM", set_name, summary["counts"], data,
                      {"acoustic_scale": summary["acoustic_scale"]},
                      chosen_on(n, set_name, tuned_on))
    return summary


def _log_first_pass(name: str, set_name: str, summary: dict) -> None:
    first, final = summary.get("first_pass", {}).get("wer"), summary.get("wer")
    if first and final:
        log.info("decode_gmm %s %s: WER %.2f%% with the speaker-independent model (first "
                 "pass), %.2f%% after fMLLR", name, set_name, first["all"]["wer"],
                 final["all"]["wer"])


def decode_options(cfg: DictConfig) -> dict:
    """``align.decode_options`` as given, checked (:class:`asrtrain.decode.GmmDecodeConfig`:
    types, ranges, unknown keys in one line naming ``align.decode_options.<key>``)."""
    from asrtrain.decode import GmmDecodeConfig

    options = align_settings(cfg).decode_options
    GmmDecodeConfig.from_config(options, "align.decode_options")
    return options


def check(cfg: DictConfig) -> None:
    from asrtrain.stages.fmllr import check_kaldi_fmllr

    check_kaldi_fmllr(cfg)
    decode_options(cfg)
    if align_settings(cfg).decode:
        from asrtrain.decode import tuning_set

        tuning_set(cfg)


def _config(cfg: DictConfig) -> dict:
    """``align.decode``, the dev set the passes' acoustic scale is chosen on when it is held out
    there (``align.tune_on``), ``align.decode_options`` when given (the decoding, and the first
    pass of a test set's transforms when it is not decoded), and ``align.kaldi_fmllr`` when the
    test sets' fMLLR dirs come from Kaldi's transforms."""
    from asrtrain.decode import tuning_set

    align = align_settings(cfg)
    decode = align.decode
    out: dict = {"align.decode": decode}
    if options := decode_options(cfg):
        out["align.decode_options"] = options
    if decode and (dev := tuning_set(cfg)):
        out["align.tune_on"] = dev
    if fmllr_sets(cfg) and align.kaldi_fmllr:
        out["align.kaldi_fmllr"] = align.kaldi_fmllr
    return out


STAGE = Stage("decode_gmm", run, reads=("align", "lang", "lm"), config=_config,
              files=kaldi_fmllr_files,
              resumable=("align.decode", "align.tune_on", "align.decode_options"), check=check,
              doc="HCLG graphs of the GMM passes, their decoding and scoring (align.decode), "
                  "the test sets' fMLLR features")
