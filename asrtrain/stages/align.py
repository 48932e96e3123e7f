"""Stage ``align``: the GMM-HMM passes in the recipe's order (Kaldi's train_mono.sh, then by
each pass's ``type``: train_deltas.sh, train_lda_mllt.sh, train_sat.sh), then the dev set aligned
with the last pass (align_fmllr.sh when it is SAT) for the hybrid model's held-out figures; or
Kaldi's own alignments imported. It reads ``mfcc`` and ``lang`` only: decoding the passes
(mkgraph, decode, score: stage ``decode_gmm``, which reads ``lm``) and the fMLLR feature dirs
(stage ``fmllr``) are stages of their own, so an ``lm.*`` change retrains no pass.

A pass trains on ``sets.train`` or, with ``align.passes.NAME.data``, on a subset of it cut by
Kaldi's rules (:func:`asrtrain.data.datadir.subset_data_dir`: ``shortest``, ``first``,
``evenly``, ``speakers``, ``max_dup`` ...; s5c's train_30kshort and train_100k_nodup) into
``paths.mfcc_subset``; a pass on other data than its ``from`` pass starts from that pass's
alignment of its own data (align_si.sh: ``align/<from>_ali_<data>``). The last pass trains on
all of ``sets.train``.

Each pass is an inner step keyed by the stage's resume key and the options of the passes up to
it (its ``data`` among them, :func:`pass_chain`): a run killed in ``tri2`` resumes at ``tri2``,
a change to ``tri2`` keeps ``mono`` and ``tri1``, and any change upstream (corpus, lang, MFCCs)
reruns them all.

The trainer's per-iteration figures (a JSON line per iteration, about 100 a recipe) go to the
stage log only (``log/align.log``); the console gets one line per pass.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from asrtrain import AsrtrainError
from asrtrain.align.config import PASS_KEYS, align_settings, pass_type
from asrtrain.fileio import write_text
from asrtrain.pipeline import Stage, StageContext, select
from asrtrain.recipe import Paths
from asrtrain.sections import sets_settings

log = logging.getLogger("asrtrain")


def final_alignments(cfg: DictConfig, paths: Paths) -> dict[str, str]:
    """The alignment dirs the hybrid model trains on: ``train`` and ``dev``."""
    align = align_settings(cfg)
    if align.source == "kaldi":
        return {"train": str(paths.align_pass("kaldi").resolve()),
                "dev": str(paths.align_pass("kaldi").resolve())}
    last = align.last
    return {"train": str(paths.align_pass(last).resolve()),
            "dev": str(paths.align_pass(f"{last}_ali_{sets_settings(cfg).dev}").resolve())}


def step(ctx: StageContext, marker: Path, key: str, what: str, work,
         whole_key: bool = False) -> None:
    """Run ``work()`` unless ``marker`` holds the same ``key``; write it afterwards.
    ``whole_key``: the key names everything the step's result is made from (not only through
    the stage's resume key), so it holds in a fresh start too (``decode_gmm``'s passes)."""
    if ctx.step_done(marker, key) or (whole_key and marker.is_file()
                                      and marker.read_text().strip() == key):
        log.info("%s %s: done already (%s), skipped", ctx.stage.name, what, key)
        return
    marker.unlink(missing_ok=True)
    work()
    write_text(marker, key + "\n")


def last_pass_is_sat(cfg: DictConfig) -> bool:
    """Whether the recipe trains its own passes and the last one is SAT (fMLLR)."""
    return align_settings(cfg).last_is_sat()


def pass_data(cfg: DictConfig, paths: Paths, name: str) -> Path:
    """The MFCC data dir pass ``name`` trains on: ``sets.train``, or its subset by the pass's
    ``data`` rules (Kaldi's train_30kshort, train_100k_nodup: see conf/align/swb.yaml)."""
    from asrtrain.data.datadir import check_subset_rules, subset_slug

    rules = check_subset_rules(align_settings(cfg).passes[name].get("data"),
                               f"align.passes.{name}.data")
    return paths.mfcc_subset(sets_settings(cfg).train, subset_slug(rules))


def _write_pass_data(ctx: StageContext, name: str, out: Path) -> None:
    """Cut the pass's subset from ``sets.train``'s MFCC dir (subset_data_dir.sh and
    remove_dup_utts.sh, in the order the rules are given) and write it to ``out``."""
    from asrtrain.data.datadir import DataDir, check_subset_rules, subset_data_dir

    cfg, paths = ctx.cfg, ctx.paths
    rules = check_subset_rules(align_settings(cfg).passes[name].get("data"),
                               f"align.passes.{name}.data")
    train = sets_settings(cfg).train
    full = DataDir.read(paths.mfcc_set(train))
    subset = subset_data_dir(full, rules)
    subset.write(out)
    log.info("align %s: trains on %s, %d of %s's %d utterances", name, out.name,
             len(subset.utt2spk), train, len(full.utt2spk))


def pass_alignments(cfg: DictConfig, paths: Paths, name: str) -> Path | None:
    """Where pass ``name`` reads its starting alignments: its ``from`` pass's dir when both
    train on the same data, else that pass's model's alignment of this pass's data (Kaldi's
    ``align_si.sh data/train_100k_nodup ... exp/mono exp/mono_ali`` before tri1); None for the
    first pass."""
    src = align_settings(cfg).passes[name].get("from")
    if src is None:
        return None
    data = pass_data(cfg, paths, name)
    if data == pass_data(cfg, paths, src):
        return paths.align_pass(src)
    return paths.align_pass(f"{src}_ali_{data.name.removesuffix('_mfcc')}")


def _train_pass(ctx: StageContext, name: str, opts: dict) -> None:
    from asrtrain import align

    cfg, paths = ctx.cfg, ctx.paths
    out = paths.align_pass(name)
    gmm = {k: v for k, v in opts.items() if k not in PASS_KEYS}
    gmm.setdefault("nj", int(cfg.get("nj", 1)))   # same alignments whatever nj: not in the key
    data = pass_data(cfg, paths, name)
    if opts.get("from") is None:
        summary = align.train_mono(data, paths.lang, out, gmm, jobs=ctx.jobs())
    else:
        train = {"deltas": align.train_tri, "lda_mllt": align.train_lda_mllt,
                 "sat": align.train_sat}[pass_type(opts)]
        summary = train(data, paths.lang, pass_alignments(cfg, paths, name), out, gmm,
                        jobs=ctx.jobs())
    log.info("align %s: %d pdfs, %d Gaussians, %d utterances (%d failed), log-likelihood %.2f "
             "per frame; every iteration in %s", name, summary["num_pdfs"], summary["num_gauss"],
             summary["utterances"], summary["failed"], summary["final_loglike_per_frame"],
             paths.logs / "align.log")


def _align_dev(ctx: StageContext, last: str, dev: Path, where: dict) -> None:
    """The dev set aligned with the last pass (align_fmllr.sh: with its own transforms when the
    pass is SAT), for the hybrid model's held-out figures and its fMLLR features."""
    _align_with(ctx, last, ctx.paths.mfcc_set(sets_settings(ctx.cfg).dev), dev, where)


def _align_with(ctx: StageContext, model: str, data: Path, out: Path, where: dict) -> None:
    """``data`` aligned with pass ``model`` into ``out`` (align_si.sh; align_fmllr.sh when the
    pass is SAT)."""
    from asrtrain.align import align_data, align_fmllr

    cfg, paths = ctx.cfg, ctx.paths
    aligner = align_fmllr if pass_type(align_settings(cfg).passes[model]) == "sat" \
        else align_data
    aligner(data, paths.lang, paths.align_pass(model), out, where, jobs=ctx.jobs())


def run(ctx: StageContext) -> None:
    from asrtrain.align import import_kaldi_alignment

    paths, align = ctx.paths, align_settings(ctx.cfg)
    if align.source == "kaldi":
        if not align.kaldi_dir:
            raise AsrtrainError("align.source=kaldi needs align.kaldi_dir (an ali-to-pdf dir)")
        import_kaldi_alignment(Path(align.kaldi_dir), paths.align_pass("kaldi"), align.num_pdfs)
    else:
        _run_passes(ctx)  # its per-iteration details go to the stage log only (STAGE_LOG_ONLY)


def pass_chain(cfg: DictConfig) -> list[tuple[str, list]]:
    """Each pass's name with the chain of passes up to it (``[name, options]`` each, its own
    last): what its inner step is keyed by (``StageContext.step_key("pass", chain)``), so a
    change to a pass redoes it and the passes after it, and keeps those before."""
    passes = align_settings(cfg).passes
    chain: list = []
    out = []
    for name, opts in passes.items():
        chain = [*chain, [name, opts]]
        out.append((name, chain))
    return out


def _run_passes(ctx: StageContext) -> None:
    cfg, paths = ctx.cfg, ctx.paths
    passes = align_settings(cfg).passes
    before: list = []
    for name, chain in pass_chain(cfg):
        opts = passes[name]
        data = pass_data(cfg, paths, name)
        if data != paths.mfcc_set(sets_settings(cfg).train):
            step(ctx, data / ".done", ctx.step_key("subset", passes[name].get("data")),
                  data.name, lambda name=name, data=data: _write_pass_data(ctx, name, data))
        ali = pass_alignments(cfg, paths, name)
        if ali is not None and ali != paths.align_pass(opts["from"]):
            # the from pass's model aligns this pass's data first (align_si.sh; align_fmllr.sh
            # from a SAT pass), keyed by the passes so far and this pass's data
            where = {"nj": int(cfg.get("nj", 1)),
                     "device": passes[opts["from"]].get("device", "cpu")}
            step(ctx, ali / ".done",
                  ctx.step_key("pass data", before, passes[name].get("data")), ali.name,
                  lambda name=name, opts=opts, data=data, ali=ali, where=where:
                  _align_with(ctx, opts["from"], data, ali, where))
        out = paths.align_pass(name)
        step(ctx, out / ".done", ctx.step_key("pass", chain), name,
              lambda name=name, opts=opts: _train_pass(ctx, name, opts))
        before = chain
    last = list(passes)[-1]
    dev = Path(final_alignments(cfg, paths)["dev"])
    where = {"nj": int(cfg.get("nj", 1)), "device": passes[last].get("device", "cpu")}
    step(ctx, dev / ".done", ctx.step_key("align dev", before), dev.name,
          lambda: _align_dev(ctx, last, dev, where))


def kaldi_files(cfg: DictConfig) -> list[Path]:
    """``align.source=kaldi``'s alignments: they enter the digest by content, so an edited one
    reruns the stage (``align.kaldi_fmllr``'s matrices are the ``fmllr`` and ``decode_gmm``
    stages' inputs: :func:`kaldi_fmllr_files`)."""
    out: list[Path] = []
    align = align_settings(cfg)
    if align.source == "kaldi" and align.kaldi_dir:
        where = Path(align.kaldi_dir)
        out += [where / "num_pdfs", *sorted(where.glob("*.scp")), *sorted(where.glob("*.ark"))]
    return out


def kaldi_fmllr_files(cfg: DictConfig) -> list[Path]:
    """``align.kaldi_fmllr``'s files, which the fMLLR feature dirs read (by content: an edited
    one rewrites them)."""
    out: list[Path] = []
    kaldi = align_settings(cfg).kaldi_fmllr
    if kaldi:
        out += [Path(str(p)) for p in (kaldi.get("final_mat"), kaldi.get("splice_opts")) if p]
        for where in (kaldi.get("trans") or {}).values():
            out += sorted(Path(str(where)).glob("trans.*")) if where else []
    return out


def fmllr_sets(cfg: DictConfig) -> list[str]:
    """The sets that get fMLLR feature dirs (``paths.fmllr_set``): train, dev and the test sets,
    when the last pass is SAT or ``align.kaldi_fmllr`` is given; none otherwise. The ``fmllr``
    stage writes train's and dev's, ``decode_gmm`` the test sets' (their transforms come from
    decoding, as Kaldi's nnet decoding takes them from decode_fmllr.sh's dir)."""
    if not (last_pass_is_sat(cfg) or align_settings(cfg).kaldi_fmllr):
        return []
    sets = sets_settings(cfg)
    return [sets.train, sets.dev, *sets.test]


def fmllr_options(opts: dict) -> dict:
    """The pass's options that say how its test-time transforms are estimated (Kaldi's
    decode_fmllr.sh reads them from the same config as train_sat.sh)."""
    from asrtrain.decode.fmllr import FMLLR_KEYS

    return {k: opts[k] for k in FMLLR_KEYS if k in opts}


def check(cfg: DictConfig) -> None:
    """The ``align`` section (:func:`asrtrain.align.config.align_settings`: unknown keys, types,
    the passes' order) and what the stage needs of it: a pass to train, or Kaldi's dir."""
    align = align_settings(cfg)
    if align.source == "kaldi" and not align.kaldi_dir:
        raise AsrtrainError("align.source=kaldi needs align.kaldi_dir (an ali-to-pdf dir)")
    if align.source == "train" and not align.passes:
        raise AsrtrainError("align.passes is empty: give at least a mono pass")


#: ``align``'s keys that only the stages after it read: ``decode`` and ``decode_options``
#: (``decode_gmm``) and ``kaldi_fmllr`` (``fmllr``, ``decode_gmm``).
LATER_KEYS = ("decode", "decode_options", "kaldi_fmllr")


def _config(cfg: DictConfig) -> dict:
    """``align`` less the keys of the stages after it (:data:`LATER_KEYS`), as the recipe gives
    it (defaults not filled in: a stage's digest holds what the recipe says). Read first by
    :func:`align_settings`: every plan computes the digests of all the recipe's stages, so an
    unknown key or a wrong type is refused in one line before any stage runs."""
    align_settings(cfg)
    align = select(cfg, "align")
    if isinstance(align, dict):
        align = {k: v for k, v in align.items() if k not in LATER_KEYS}
    return {"align": align}


STAGE = Stage("align", run, reads=("mfcc", "lang"), config=_config, files=kaldi_files,
              resumable=("align.passes",), check=check,
              doc="GMM-HMM passes (mono, tri1..tri4: deltas, LDA+MLLT, SAT), pdf alignments of "
                  "the train and dev sets")
