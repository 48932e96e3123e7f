"""GMM-HMM training stages: flat-start monophones, triphones with a decision tree, Kaldi import.

``train_mono`` follows Kaldi's ``steps/train_mono.sh``: every pdf starts as the global Gaussian,
the first statistics come from an equal alignment, then ``num_iters`` passes of ML re-estimation
with Viterbi realignment at ``realign_iters`` and Gaussian splitting up to ``totgauss``.
``train_tri`` follows ``steps/train_deltas.sh``: context statistics from the previous pass's
alignment, questions from phone clustering plus the extra questions, a tree of ``num_leaves``
leaves, one Gaussian per leaf, then training with realignment and mixing up to ``num_gauss``.
A second triphone pass (tri2) is ``train_tri`` again on tri1's alignment with more leaves.
``train_lda_mllt`` follows ``steps/train_lda_mllt.sh`` (tri3): LDA of spliced frames on the
previous pass's pdf alignment, a tree on the LDA features, MLLT estimated at ``mllt_iters``.
``train_sat`` and ``align_fmllr`` (tri4, ``steps/train_sat.sh``, ``steps/align_fmllr.sh``) are in
:mod:`asrtrain.align.sat`, which builds on the same machinery, never on this module: all
pass types share :mod:`asrtrain.align.passes` (one training loop,
:func:`~asrtrain.align.passes.train_iters`, with a hook per iteration for the MLLT and fMLLR
updates) and :mod:`asrtrain.align.frames`.  Each stage writes ``final.mdl``, ``tree.txt``,
``num_pdfs``, ``ali.{ark,scp}``, ``ali_phone_state.{ark,scp}``, ``log.txt`` and
``passes.json`` (log-likelihood, frames/s and seconds of each iteration) into its output
directory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import kaldiio
import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.adapt.lda import estimate_lda
from asrtrain.adapt.mllt import compose, estimate_mllt, transform_means
from asrtrain.align.config import TRI_DEFAULTS, GmmConfig
from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.model import (
    AcousticModel,
    AlignResult,
    check_failures,
    estimate_log_trans,
    initial_log_trans,
    write_alignments,
)
from asrtrain.align.passes import (
    PassJobs,
    PassLog,
    align_result,
    aligned_utterances,
    existing_file,
    num_states,
    pass_utterances,
    train_iters,
    tree_model,
    write_pass,
)
from asrtrain.align.passjobs import (
    Features,
    IterJob,
    IterResult,
    iter_job,
    sum_gmm,
)
from asrtrain.align.tree import mono_tree
from asrtrain.fileio import atomic_dir, write_text
from asrtrain.jobs import JobConfig
from asrtrain.lang.lexicon import Lang

log = logging.getLogger(__name__)


def train_mono(data_dir: Path, lang_dir: Path, out_dir: Path,
               cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """Flat-start monophone training (see the module docstring); returns the summary.
    ``jobs``: how its jobs run (default ``nj`` of ``cfg`` on this machine)."""
    c = GmmConfig.from_config(cfg)
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    utts, skipped, data = pass_utterances(data_dir, lang)
    if not utts:
        raise AsrtrainError(f"{data_dir}: no utterance to train on")
    if c.num_utts:
        missing = [u for u in utts if u not in data.utt2num_frames]
        if missing:
            raise AsrtrainError(f"{Path(data_dir) / 'utt2num_frames'}: no length for {missing[0]}"
                                " (num_utts picks the shortest); run the mfcc stage again")
        utts = sorted(utts, key=lambda u: (data.utt2num_frames[u], u))[:c.num_utts]
    out_dir = Path(out_dir)
    plog = PassLog(out_dir, "mono")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    with PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, "mono") as pj:
        moments = pj.setup(Features(delta_order=c.delta_order), "global mean and variance",
                           moments=True)[0].moments   # the blocks' sum (PassJobs.run)
        mean, var = moments.mean_var()
        var_floor = c.var_floor_factor * var
        tree = mono_tree(lang.phones.root_of(), num_states(lang))
        p = tree.num_pdfs
        gmm = DiagGmmSet(torch.from_numpy(np.tile(mean, (p, 1, 1))),
                         torch.from_numpy(np.tile(var, (p, 1, 1))), torch.zeros(p, 1))
        model = AcousticModel(tree, gmm, initial_log_trans(lang), c.delta_order, var_floor)

        # iteration 0: equal alignment (Kaldi align-equal-compiled, then gmm-est)
        t0 = time.time()
        parts = pj.iterate(model, "equal", ("gmm",), "equal alignment")
        impossible = {k: v for part in parts for k, v in part.failed.items()}
        for utt in sorted(impossible):
            plog(f"{impossible[utt]} for {utt}")
        if len(impossible) > c.max_fail_fraction * len(utts):
            raise AsrtrainError(f"{data_dir}: {len(impossible)} of {len(utts)} utterances are "
                                "too short for an equal alignment")
        device = torch.device(c.device)
        stats, counts = sum_gmm(parts)
        g = model.gmm.to(device)
        g.update(stats, torch.from_numpy(var_floor).to(device), min_gaussian_occupancy=3.0)
        model.gmm = g.to("cpu")
        model.log_trans = estimate_log_trans(counts, model.log_trans)
        plog.record(0, None, stats.loglike / max(stats.frames, 1), stats.frames,
                    time.time() - t0, model.gmm.num_gauss())

        res, _ = train_iters(model, pj, c, c.totgauss, plog)
        summary = {"kind": "mono", "num_pdfs": model.num_pdfs,
                   "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
                   "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame}
        write_pass(out_dir, model, lang, pj, plog, summary)
    return summary


def train_tri(data_dir: Path, lang_dir: Path, ali_dir: Path, out_dir: Path,
              cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """Triphone training on the alignment of a previous pass in ``ali_dir``."""
    c = GmmConfig.from_config(cfg, **TRI_DEFAULTS)
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    utts, skipped, data = pass_utterances(data_dir, lang)
    ali_dir, out_dir = Path(ali_dir), Path(out_dir)
    plog = PassLog(out_dir, out_dir.name)
    utts = aligned_utterances(utts, skipped, ali_dir, plog, c)
    with PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        pj.prev_ali = str(ali_dir.resolve() / "ali_phone_state.scp")
        model, tsum, _ = tree_model(pj, Features(delta_order=c.delta_order), lang, ali_dir, c,
                                     plog)
        res, _ = train_iters(model, pj, c, c.num_gauss, plog)
        summary = {"kind": "tri", "num_pdfs": model.num_pdfs,
                   "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
                   "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame, "tree": tsum}
        write_pass(out_dir, model, lang, pj, plog, summary)
    return summary


def train_lda_mllt(data_dir: Path, lang_dir: Path, ali_dir: Path, out_dir: Path,
                   cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """LDA+MLLT triphones (tri3, Kaldi's ``steps/train_lda_mllt.sh``): LDA of CMN'd MFCCs
    spliced ±``left/right_context`` to ``dim`` on the previous pass's pdf alignment (silence
    weighted ``silence_weight``), a tree on the LDA features, then the shared loop with MLLT
    at ``mllt_iters``; the model's ``lda_mllt`` is Kaldi's ``final.mat``."""
    c = GmmConfig.from_config(cfg, **TRI_DEFAULTS, type="lda_mllt")
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    utts, skipped, data = pass_utterances(data_dir, lang)
    ali_dir, out_dir = Path(ali_dir), Path(out_dir)
    plog = PassLog(out_dir, out_dir.name)
    utts = aligned_utterances(utts, skipped, ali_dir, plog, c)
    splice = (c.left_context, c.right_context)
    with PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        pj.prev_ali = str(ali_dir.resolve() / "ali_phone_state.scp")
        lda, lda_info = _estimate_lda(pj, ali_dir, splice, c, plog)
        np.save(pj.work / "lda.npy", lda)
        model, tsum, _ = tree_model(pj, Features(splice=splice,
                                                  matrix=str(pj.work / "lda.npy")),
                                     lang, ali_dir, c, plog)
        model.splice, model.lda_mllt = splice, lda
        mllt = MlltUpdate(c, plog)
        res, _ = train_iters(model, pj, c, c.num_gauss, plog, mllt=mllt)
        summary = {"kind": "lda_mllt", "num_pdfs": model.num_pdfs,
                   "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
                   "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame, "tree": tsum,
                   "lda": lda_info, "mllt_objf_improvement": mllt.improvements}
        write_pass(out_dir, model, lang, pj, plog, summary)
    return summary


def _estimate_lda(pj: PassJobs, ali_dir: Path, splice: tuple[int, int], c: GmmConfig,
                  plog: PassLog) -> tuple[np.ndarray, dict]:
    """``acc-lda`` in jobs (classes: the previous pass's pdf ids, silence weighted; summed in
    job order as ``sum-lda-accs``) and ``est-lda --dim``: the ``[dim, D*(L+1+R)]`` matrix (no
    offset column, as Kaldi's ``0.mat``) and its figures for the summary."""
    t0 = time.time()
    num_classes = int((ali_dir / "num_pdfs").read_text().split()[0])
    parts = pj.setup(Features(), "LDA statistics", lda=(num_classes, *splice),
                     pdf_ali=str(existing_file(ali_dir / "ali.scp").resolve()))
    stats = parts[0].lda   # the blocks' sum (PassJobs.run)
    res = estimate_lda(stats, c.dim)
    spliced_dim = stats.dim
    info = {"dim": c.dim, "spliced_dim": spliced_dim, "classes": int((stats.count > 0).sum()),
            "frames": float(stats.count.sum()), "seconds": round(time.time() - t0, 3),
            "top_eigenvalues": [round(float(v), 4) for v in res.eigenvalues[:5].tolist()]}
    plog(f"LDA: {spliced_dim} -> {c.dim} dims on {info['classes']} classes, "
         f"{info['frames']:.0f} frames (silence weight {c.silence_weight}) in "
         f"{info['seconds']} s")
    return res.matrix.cpu().numpy(), info


class MlltUpdate:
    """The LDA+MLLT pass's update at ``mllt_iters`` (``est-mllt``, ``gmm-transform-means``,
    ``compose-transforms``) from the jobs' ``gmm-acc-mllt`` statistics (summed in job order):
    the transform composed into the model's ``lda_mllt`` and applied to its means; the jobs
    then accumulate on the new features and give their moments for the variance floor."""

    def __init__(self, c: GmmConfig, plog: PassLog) -> None:
        self.c, self.plog = c, plog
        self.improvements: list[float] = []

    def __call__(self, it: int, model: AcousticModel, parts: list[IterResult]) -> dict:
        t0 = time.time()
        stats = parts[0].mllt   # the blocks' sum (PassJobs.run)
        est = estimate_mllt(stats)
        m = est.matrix.cpu()
        g = model.gmm
        model.gmm = DiagGmmSet(transform_means(g.means, m), g.vars, g.log_weights)
        model.lda_mllt = compose(m, torch.from_numpy(model.lda_mllt)).numpy()
        self.improvements.append(est.improvement)
        logdet = float(torch.linalg.slogdet(m)[1])
        self.plog(f"iter {it}: MLLT objective +{est.improvement:.4f} per frame over "
                  f"{stats.beta:.0f} frames (log|det| {logdet:.3f}) in {time.time() - t0:.1f} s")
        return {"mllt_objf_improvement": est.improvement, "mllt_logdet": logdet,
                "mllt_seconds": round(time.time() - t0, 3)}


def align_data(data_dir: Path, lang_dir: Path, model_dir: Path, out_dir: Path,
               cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """Align a data dir with a trained model (Kaldi's ``steps/align_si.sh``): ``out_dir`` gets
    the model (copied), ``ali.{ark,scp}``, ``ali_phone_state.{ark,scp}``, ``log.txt``,
    ``passes.json``; the next ``train_tri`` can start from it.  A SAT model is aligned with
    fMLLR (:func:`asrtrain.align.sat.align_fmllr`, Kaldi's ``steps/align_fmllr.sh``)."""
    c = GmmConfig.from_config(cfg)
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    model = AcousticModel.load(model_dir)
    if model.sat:
        from asrtrain.align.sat import align_fmllr  # sat builds on this module

        return align_fmllr(data_dir, lang_dir, model_dir, out_dir, cfg, jobs)
    utts, skipped, data = pass_utterances(data_dir, lang)
    out_dir = Path(out_dir)
    plog = PassLog(out_dir, f"align {Path(model_dir).name}")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    with PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        model_file = str(Path(model_dir).resolve() / "final.mdl")
        parts = pj.run(iter_job, lambda p: IterJob(p, model_file, "viterbi", what=("final",),
                                                   cfg=pj.cfg), f"align {Path(data_dir).name}")
        res = align_result(parts)
        check_failures(res, len(utts), c.max_fail_fraction, f"aligning {data_dir}")
        for utt, why in sorted(res.failed.items()):
            plog(f"failed {utt}: {why}")
        plog.record(0, res, res.loglike_per_frame, res.frames, res.seconds,
                    model.gmm.num_gauss())
        summary = {"kind": "align", "model": str(model_dir), "num_pdfs": model.num_pdfs,
                   "utterances": len(utts), "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame}
        write_pass(out_dir, model, lang, pj, plog, summary)
    return summary


def train_pass(data_dir: Path, lang_dir: Path, ali_dir: Path | None, out_dir: Path,
               cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """One pass of ``align.passes``: mono when it starts from nothing (``ali_dir`` None),
    else by its ``type``: ``deltas`` (train_deltas.sh), ``lda_mllt`` (train_lda_mllt.sh),
    ``sat`` (train_sat.sh).  ``jobs``: how its jobs run (default: ``nj`` of ``cfg``, here).
    Returns the pass's summary."""
    if ali_dir is None:
        return train_mono(data_dir, lang_dir, out_dir, cfg, jobs)
    kind = GmmConfig.from_config(cfg).type
    if kind == "lda_mllt":
        return train_lda_mllt(data_dir, lang_dir, ali_dir, out_dir, cfg, jobs)
    if kind == "sat":
        from asrtrain.align.sat import train_sat  # sat builds on this module

        return train_sat(data_dir, lang_dir, ali_dir, out_dir, cfg, jobs)
    return train_tri(data_dir, lang_dir, ali_dir, out_dir, cfg, jobs)


def import_kaldi_alignment(kaldi_dir: Path, out_dir: Path, num_pdfs: int | None = None) -> int:
    """``align.source=kaldi``: copy pdf-id alignments (``ali-to-pdf`` output: ``pdf.*.ark``,
    ``ali.*.ark`` or ``*.scp`` int32-vector tables) into ``out_dir/ali.{ark,scp}``; ``num_pdfs``
    comes from the argument or ``kaldi_dir/num_pdfs``.  Returns the number of utterances."""

    kaldi_dir, out_dir = Path(kaldi_dir), Path(out_dir)
    if num_pdfs is None:
        f = kaldi_dir / "num_pdfs"
        if not f.is_file():
            raise AsrtrainError(f"{f}: missing; give num_pdfs (e.g. from `tree-info` or "
                                "`am-info`) in the config")
        num_pdfs = int(f.read_text().split()[0])
    files = sorted(kaldi_dir.glob("*.scp")) or sorted(kaldi_dir.glob("*.ark"))
    if not files:
        raise AsrtrainError(f"{kaldi_dir}: no .scp or .ark pdf alignments")
    table: dict[str, np.ndarray] = {}
    for f in files:
        reader = kaldiio.load_scp(str(f)) if f.suffix == ".scp" else kaldiio.load_ark(str(f))
        items = reader.items() if f.suffix == ".scp" else reader
        for utt, vec in items:
            vec = np.asarray(vec)
            if vec.ndim != 1 or not np.issubdtype(vec.dtype, np.integer):
                raise AsrtrainError(f"{f}: {utt} is not an int32 vector (run ali-to-pdf)")
            if len(vec) and (vec.min() < 0 or vec.max() >= num_pdfs):
                raise AsrtrainError(f"{f}: {utt} has pdf ids outside 0..{num_pdfs - 1}")
            table[utt] = vec.astype(np.int32)
    res = AlignResult({}, table, {}, {}, 0.0, sum(map(len, table.values())), 0.0)
    with atomic_dir(out_dir) as tmp:
        write_alignments(tmp, res)
        (tmp / "ali_phone_state.ark").unlink()
        (tmp / "ali_phone_state.scp").unlink()
        write_text(tmp / "num_pdfs", f"{num_pdfs}\n")
    p = out_dir / "ali.scp"
    write_text(p, p.read_text().replace(str(tmp.resolve()), str(out_dir.resolve())))
    return len(table)
