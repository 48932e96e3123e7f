"""Stage ``align``: the GMM-HMM passes (Kaldi's train_mono.sh, train_deltas.sh) in the recipe's
order, each decoded on the test sets when ``align.decode`` is set, then the dev set aligned with
the last pass for the hybrid model's held-out figures; or Kaldi's own alignments imported.

Each pass is an inner step keyed by the stage's resume key and the options of the passes up to
it: a run killed in ``tri2`` resumes at ``tri2``, a change to ``tri2`` keeps ``mono`` and
``tri1``, and any change upstream (corpus, lang, MFCCs) reruns them all.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text
from asrtrain.pipeline import Stage, StageContext
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


def _step(ctx: StageContext, out: Path, key: str, what: str, work) -> None:
    """Run ``work()`` unless ``out`` holds the marker of the same ``key``; mark it afterwards."""
    marker = out / ".done"
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
    if opts["from"] is None:
        train_mono(paths.mfcc_set(cfg.sets.train), paths.lang, out, gmm)
    else:
        train_tri(paths.mfcc_set(cfg.sets.train), paths.lang, paths.align_pass(opts["from"]),
                  out, gmm)
    if cfg.align.decode:
        from asrtrain.decode.graph import decode_gmm, make_graph
        from asrtrain.score import report_wer

        make_graph(paths.lang, paths.lm, out, out / "graph")
        for test in cfg.sets.test:
            dec = paths.decode_dir(name, test)
            summary = decode_gmm(out, out / "graph", paths.mfcc_set(test), dec, {})
            report_wer(test, name, summary["counts"], dec / "score")


def run(ctx: StageContext) -> None:
    from asrtrain.align import align_data, import_kaldi_alignment

    cfg, paths = ctx.cfg, ctx.paths
    if cfg.align.source == "kaldi":
        if not cfg.align.kaldi_dir:
            raise AsrtrainError("align.source=kaldi needs align.kaldi_dir (an ali-to-pdf dir)")
        import_kaldi_alignment(Path(cfg.align.kaldi_dir), paths.align_pass("kaldi"),
                               cfg.align.num_pdfs)
        return
    passes = OmegaConf.to_container(cfg.align.passes, resolve=True)
    chain: list = []
    for name, opts in cfg.align.passes.items():
        chain.append([name, passes[name]])
        _step(ctx, paths.align_pass(name), ctx.step_key("pass", chain), name,
              lambda name=name, opts=opts: _train_pass(ctx, name, opts))
    last = list(passes)[-1]
    dev = Path(final_alignments(cfg, paths)["dev"])
    _step(ctx, dev, ctx.step_key("align dev", chain), dev.name,
          lambda: align_data(paths.mfcc_set(cfg.sets.dev), paths.lang, paths.align_pass(last),
                             dev, {}))


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


STAGE = Stage("align", run, reads=("mfcc", "lang", "lm"), config=("align",),
              resumable=("align.passes",), check=check,
              doc="GMM-HMM passes (mono, tri1, tri2), pdf alignments, HCLG decoding of each")
