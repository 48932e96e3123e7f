"""Stage ``align``: the GMM-HMM passes in the recipe's order (Kaldi's train_mono.sh, then by
each pass's ``type``: train_deltas.sh, train_lda_mllt.sh, train_sat.sh), each decoded on the test
sets when ``align.decode`` is set (a SAT pass as decode_fmllr.sh: two passes, see
:mod:`asrtrain.decode.fmllr`), then the dev set aligned with the last pass (align_fmllr.sh when it
is SAT) for the hybrid model's held-out figures; or Kaldi's own alignments imported.

When the last pass is SAT, or ``align.kaldi_fmllr`` names a Kaldi experiment's ``final.mat`` and
``trans.*``, a last step writes the speaker-adapted feature dirs ``paths.fmllr_set(set)`` of the
train, dev and test sets (the hybrid model's ``append: [fmllr]`` input).

A pass trains on ``sets.train`` or, with ``align.passes.NAME.data``, on a subset of it cut by
Kaldi's rules (:func:`asrtrain.data.datadir.subset_data_dir`: ``shortest``, ``first``,
``evenly``, ``speakers``, ``max_dup`` ...; s5c's train_30kshort and train_100k_nodup) into
``paths.mfcc_subset``; a pass on other data than its ``from`` pass starts from that pass's
alignment of its own data (align_si.sh: ``align/<from>_ali_<data>``). The last pass trains on
all of ``sets.train``.

Each pass is an inner step keyed by the stage's resume key and the options of the passes up to
it (its ``data`` among them): a run killed in ``tri2`` resumes at ``tri2``, a change to
``tri2`` keeps ``mono`` and ``tri1``, and any change upstream (corpus, lang, MFCCs) reruns them
all.  Each pass's decoding is
a step of its own, keyed also by where its acoustic scale is chosen (``score.tune_on``: the test
set itself, or the dev set, decoded first), so changing that redecodes without retraining.

The trainer's per-iteration figures (a JSON line per iteration, about 100 a recipe) and the graph
sizes go to the stage log only (``log/align.log``); the console gets one line per pass and the
WER lines.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text
from asrtrain.pipeline import Stage, StageContext, select
from asrtrain.recipe import Paths

if TYPE_CHECKING:
    from asrtrain.jobs import JobConfig

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


#: ``align.passes.NAME.type``: the Kaldi script each pass type follows (the first pass, from
#: nothing, is a monophone pass whatever its type).
PASS_TYPES = {"deltas": "train_deltas.sh", "lda_mllt": "train_lda_mllt.sh",
              "sat": "train_sat.sh"}


def pass_type(opts: DictConfig | dict) -> str:
    """A pass's ``type`` (``deltas`` when not given)."""
    return opts.get("type") or "deltas"


def last_pass_is_sat(cfg: DictConfig) -> bool:
    """Whether the recipe trains its own passes and the last one is SAT (fMLLR)."""
    return (cfg.align.source == "train" and bool(cfg.align.passes)
            and pass_type(list(cfg.align.passes.values())[-1]) == "sat")


def pass_data(cfg: DictConfig, paths: Paths, name: str) -> Path:
    """The MFCC data dir pass ``name`` trains on: ``sets.train``, or its subset by the pass's
    ``data`` rules (Kaldi's train_30kshort, train_100k_nodup: see conf/align/swb.yaml)."""
    from asrtrain.data.datadir import check_subset_rules, subset_slug

    rules = check_subset_rules(_plain(cfg.align.passes[name].get("data")),
                               f"align.passes.{name}.data")
    return paths.mfcc_subset(str(cfg.sets.train), subset_slug(rules))


def _plain(value: object) -> object:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _write_pass_data(ctx: StageContext, name: str, out: Path) -> None:
    """Cut the pass's subset from ``sets.train``'s MFCC dir (subset_data_dir.sh and
    remove_dup_utts.sh, in the order the rules are given) and write it to ``out``."""
    from asrtrain.data.datadir import DataDir, check_subset_rules, subset_data_dir

    cfg, paths = ctx.cfg, ctx.paths
    rules = check_subset_rules(_plain(cfg.align.passes[name].get("data")),
                               f"align.passes.{name}.data")
    full = DataDir.read(paths.mfcc_set(str(cfg.sets.train)))
    subset = subset_data_dir(full, rules)
    subset.write(out)
    log.info("align %s: trains on %s, %d of %s's %d utterances", name, out.name,
             len(subset.utt2spk), cfg.sets.train, len(full.utt2spk))


def pass_alignments(cfg: DictConfig, paths: Paths, name: str) -> Path | None:
    """Where pass ``name`` reads its starting alignments: its ``from`` pass's dir when both
    train on the same data, else that pass's model's alignment of this pass's data (Kaldi's
    ``align_si.sh data/train_100k_nodup ... exp/mono exp/mono_ali`` before tri1); None for the
    first pass."""
    src = cfg.align.passes[name].get("from")
    if src is None:
        return None
    data = pass_data(cfg, paths, name)
    if data == pass_data(cfg, paths, src):
        return paths.align_pass(src)
    return paths.align_pass(f"{src}_ali_{data.name.removesuffix('_mfcc')}")


def _jobs(ctx: StageContext) -> JobConfig:
    """How the passes' jobs run: the recipe's ``nj``, ``cmd``, ``threads``, ``slurm`` (launch
    settings: top-level keys, outside the stage's digest, as the results do not depend on them)."""
    from asrtrain.jobs import JobConfig, job_log_dir

    return JobConfig.from_config(ctx.cfg, log_dir=job_log_dir(ctx.paths.exp))


def _train_pass(ctx: StageContext, name: str, opts: DictConfig) -> None:
    from asrtrain import align

    cfg, paths = ctx.cfg, ctx.paths
    out = paths.align_pass(name)
    gmm = {k: v for k, v in OmegaConf.to_container(opts, resolve=True).items()
           if k not in ("from", "data")}
    gmm.setdefault("nj", int(cfg.get("nj", 1)))   # same alignments whatever nj: not in the key
    data = pass_data(cfg, paths, name)
    if opts["from"] is None:
        summary = align.train_mono(data, paths.lang, out, gmm, jobs=_jobs(ctx))
    else:
        train = {"deltas": align.train_tri, "lda_mllt": align.train_lda_mllt,
                 "sat": align.train_sat}[pass_type(opts)]
        summary = train(data, paths.lang, pass_alignments(cfg, paths, name), out, gmm,
                        jobs=_jobs(ctx))
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
    log.info("align %s %s: %s", name, set_name, describe_scoring(data))
    opts = ctx.cfg.align.passes[name]
    if pass_type(opts) == "sat":
        summary = decode_fmllr(out, out / "graph", data, dec, options, nj=int(ctx.cfg.nj),
                               fmllr=_fmllr_options(opts))
        _log_first_pass(name, set_name, summary)
    else:
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


def _fmllr_options(opts: DictConfig) -> dict:
    """The pass's options that say how its test-time transforms are estimated (Kaldi's
    decode_fmllr.sh reads them from the same config as train_sat.sh)."""
    from asrtrain.decode.fmllr import FMLLR_KEYS

    return {k: opts[k] for k in FMLLR_KEYS if k in opts}


def _log_first_pass(name: str, set_name: str, summary: dict) -> None:
    first, final = summary.get("first_pass", {}).get("wer"), summary.get("wer")
    if first and final:
        log.info("align %s %s: WER %.2f%% with the speaker-independent model (first pass), "
                 "%.2f%% after fMLLR", name, set_name, first["all"]["wer"],
                 final["all"]["wer"])


def _align_dev(ctx: StageContext, last: str, dev: Path, where: dict) -> None:
    """The dev set aligned with the last pass (align_fmllr.sh: with its own transforms when the
    pass is SAT), for the hybrid model's held-out figures and its fMLLR features."""
    _align_with(ctx, last, ctx.paths.mfcc_set(ctx.cfg.sets.dev), dev, where)


def _align_with(ctx: StageContext, model: str, data: Path, out: Path, where: dict) -> None:
    """``data`` aligned with pass ``model`` into ``out`` (align_si.sh; align_fmllr.sh when the
    pass is SAT)."""
    from asrtrain.align import align_data, align_fmllr

    cfg, paths = ctx.cfg, ctx.paths
    aligner = align_fmllr if pass_type(cfg.align.passes[model]) == "sat" else align_data
    aligner(data, paths.lang, paths.align_pass(model), out, where, jobs=_jobs(ctx))


def run(ctx: StageContext) -> None:
    from asrtrain.align import import_kaldi_alignment

    cfg, paths = ctx.cfg, ctx.paths
    if cfg.align.source == "kaldi":
        if not cfg.align.kaldi_dir:
            raise AsrtrainError("align.source=kaldi needs align.kaldi_dir (an ali-to-pdf dir)")
        import_kaldi_alignment(Path(cfg.align.kaldi_dir), paths.align_pass("kaldi"),
                               cfg.align.num_pdfs)
    else:
        _run_passes(ctx)  # its per-iteration details go to the stage log only (STAGE_LOG_ONLY)
    _fmllr_sets(ctx)


def _run_passes(ctx: StageContext) -> None:
    from asrtrain.decode import tuning_set

    cfg, paths = ctx.cfg, ctx.paths
    passes = OmegaConf.to_container(cfg.align.passes, resolve=True)
    tests = [str(t) for t in cfg.sets.test]
    chain: list = []
    for name, opts in cfg.align.passes.items():
        data = pass_data(cfg, paths, name)
        if data != paths.mfcc_set(str(cfg.sets.train)):
            _step(ctx, data / ".done", ctx.step_key("subset", passes[name].get("data")),
                  data.name, lambda name=name, data=data: _write_pass_data(ctx, name, data))
        ali = pass_alignments(cfg, paths, name)
        if ali is not None and ali != paths.align_pass(opts["from"]):
            # the from pass's model aligns this pass's data first (align_si.sh; align_fmllr.sh
            # from a SAT pass), keyed by the passes so far and this pass's data
            where = {"nj": int(cfg.get("nj", 1)),
                     "device": passes[opts["from"]].get("device", "cpu")}
            _step(ctx, ali / ".done",
                  ctx.step_key("pass data", chain, passes[name].get("data")), ali.name,
                  lambda name=name, opts=opts, data=data, ali=ali, where=where:
                  _align_with(ctx, opts["from"], data, ali, where))
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
          lambda: _align_dev(ctx, last, dev, where))


def fmllr_sets(cfg: DictConfig) -> list[str]:
    """The sets whose fMLLR feature dirs the stage writes: train, dev and the test sets, when
    the last pass is SAT or ``align.kaldi_fmllr`` is given; none otherwise."""
    if not (last_pass_is_sat(cfg) or cfg.align.get("kaldi_fmllr")):
        return []
    return [str(cfg.sets.train), str(cfg.sets.dev), *(str(t) for t in cfg.sets.test)]


def _fmllr_sets(ctx: StageContext) -> None:
    """One inner step per set: ``paths.fmllr_set(set)``, from Kaldi's matrices when
    ``align.kaldi_fmllr`` is given, else from the last (SAT) pass's transforms (keyed by the
    passes and by how the test sets' transforms were made: decoded or not, the scale chosen
    where)."""
    from asrtrain.decode import tuning_set

    cfg, paths = ctx.cfg, ctx.paths
    kaldi = OmegaConf.to_container(cfg.align.kaldi_fmllr, resolve=True) \
        if cfg.align.get("kaldi_fmllr") else None
    passes = OmegaConf.to_container(cfg.align.passes, resolve=True) \
        if cfg.align.source == "train" else {}
    how = [bool(cfg.align.decode), tuning_set(cfg) if cfg.align.decode else None]
    for set_name in fmllr_sets(cfg):
        out = paths.fmllr_set(set_name)
        read = sorted((str(p), ctx.files.get(str(p))) for p in kaldi_fmllr_files(cfg))
        key = ctx.step_key("fmllr", set_name, kaldi or [list(p) for p in passes.items()], how,
                           *([read] if read else []))
        _step(ctx, out / ".done", key, out.name,
              lambda s=set_name, out=out: _write_fmllr_set(ctx, s, out, kaldi))


def _write_fmllr_set(ctx: StageContext, set_name: str, out: Path, kaldi: dict | None) -> None:
    from asrtrain.decode.fmllr import (
        import_kaldi_fmllr,
        read_transforms,
        undecoded_transforms,
        write_fmllr_set,
    )

    cfg, paths = ctx.cfg, ctx.paths
    data = paths.mfcc_set(set_name)
    if kaldi is not None:
        import_kaldi_fmllr(data, out, kaldi, set_name)
        return
    last = list(cfg.align.passes)[-1]
    model_dir = paths.align_pass(last)
    if set_name == str(cfg.sets.train):
        trans = read_transforms(model_dir)
    elif set_name == str(cfg.sets.dev):
        trans = read_transforms(Path(final_alignments(cfg, paths)["dev"]))
    elif cfg.align.decode:
        trans = read_transforms(paths.decode_dir(last, set_name))
    else:   # no decoding: the first pass and the estimation only, to get the transforms
        trans = undecoded_transforms(model_dir, model_dir / "graph", data, paths.lang,
                                    paths.lm, _fmllr_options(cfg.align.passes[last]),
                                    nj=int(cfg.nj))
    write_fmllr_set(model_dir, data, out, trans)


def kaldi_files(cfg: DictConfig) -> list[Path]:
    """A Kaldi import's files (``align.source=kaldi``'s alignments, ``align.kaldi_fmllr``'s
    matrices): they enter the digest by content, so an edited one reruns the stage."""
    out: list[Path] = []
    if cfg.align.get("source") == "kaldi" and cfg.align.get("kaldi_dir"):
        where = Path(str(cfg.align.kaldi_dir))
        out += [where / "num_pdfs", *sorted(where.glob("*.scp")), *sorted(where.glob("*.ark"))]
    return out + kaldi_fmllr_files(cfg)


def kaldi_fmllr_files(cfg: DictConfig) -> list[Path]:
    """``align.kaldi_fmllr``'s files: only the fMLLR feature dirs read them, so they key those
    steps (``_fmllr_sets``), not the GMM passes (``Stage.step_files``)."""
    out: list[Path] = []
    kaldi = cfg.align.get("kaldi_fmllr")
    if kaldi:
        out += [Path(str(p)) for p in (kaldi.get("final_mat"), kaldi.get("splice_opts")) if p]
        for where in (kaldi.get("trans") or {}).values():
            out += sorted(Path(str(where)).glob("trans.*")) if where else []
    return out


def check(cfg: DictConfig) -> None:
    if cfg.align.source not in ("train", "kaldi"):
        raise AsrtrainError(f"align.source={cfg.align.source!r}: expected train or kaldi")
    if cfg.align.source == "train":
        _check_passes(cfg)
    if cfg.align.get("kaldi_fmllr"):
        from asrtrain.decode.fmllr import check_kaldi_fmllr

        check_kaldi_fmllr(OmegaConf.to_container(cfg.align.kaldi_fmllr, resolve=True),
                          fmllr_sets(cfg))
    if cfg.align.decode:
        from asrtrain.decode import tuning_set

        tuning_set(cfg)


def _check_passes(cfg: DictConfig) -> None:
    """Every pass after the first starts from an earlier one; its type is known; a SAT pass
    starts from an LDA+MLLT or SAT pass (train_sat.sh needs the ``final.mat`` it adapts)."""
    from asrtrain.data.datadir import check_subset_rules

    if not cfg.align.passes:
        raise AsrtrainError("align.passes is empty: give at least a mono pass")
    names = list(cfg.align.passes)
    for i, (name, opts) in enumerate(cfg.align.passes.items()):
        src = opts.get("from")
        if (src is None) != (i == 0) or (src is not None and src not in names[:i]):
            raise AsrtrainError(f"align.passes.{name}.from={src!r}: the first pass starts "
                                "from nothing (null), every later one from an earlier pass")
        kind = pass_type(opts)
        if kind not in PASS_TYPES:
            raise AsrtrainError(f"align.passes.{name}.type={kind!r}: expected one of "
                                f"{', '.join(PASS_TYPES)}")
        check_subset_rules(_plain(opts.get("data")), f"align.passes.{name}.data")
        if opts.get("data") and i == len(names) - 1:
            raise AsrtrainError(f"align.passes.{name}.data: the last pass trains on all of "
                                f"sets.train ({cfg.sets.train}): the hybrid model and the fMLLR "
                                "feature dirs take its alignments and transforms; give the "
                                "subset to an earlier pass (as s5c's tri1, tri2)")
        if kind == "sat" and src is not None and \
                pass_type(cfg.align.passes[src]) not in ("lda_mllt", "sat"):
            raise AsrtrainError(f"align.passes.{name}.type=sat: its from pass {src!r} is of "
                                f"type {pass_type(cfg.align.passes[src])!r}; SAT adapts "
                                "LDA+MLLT features: start it from an lda_mllt or sat pass")


def _config(cfg: DictConfig) -> dict:
    """``align``, with the dev set the passes' acoustic scale is chosen on when it is held out
    there (``align.tune_on``, resumable: changing it redecodes, it does not retrain)."""
    from asrtrain.decode import tuning_set

    align = select(cfg, "align")
    dev = tuning_set(cfg) if isinstance(align, dict) and align.get("decode") else None
    return {"align": {**align, "tune_on": dev} if dev else align}


STAGE = Stage("align", run, reads=("mfcc", "lang", "lm"), config=_config, files=kaldi_files,
              step_files=kaldi_fmllr_files,
              resumable=("align.passes", "align.tune_on", "align.kaldi_fmllr"), check=check,
              doc="GMM-HMM passes (mono, tri1..tri4: deltas, LDA+MLLT, SAT), pdf alignments, "
                  "HCLG decoding of each, fMLLR feature dirs")
