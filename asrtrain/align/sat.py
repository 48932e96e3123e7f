"""Speaker-adaptive training with fMLLR (tri4): Kaldi's ``steps/train_sat.sh`` and
``steps/align_fmllr.sh``; the per-speaker transform estimation they (and the two-pass fMLLR
decode) use is :func:`asrtrain.align.frames.estimate_transforms`.

``train_sat`` starts from the previous pass (LDA+MLLT or Δ features, its ``final.mat`` kept):
initial transforms are the alignment dir's ``trans.*`` when it has them (an ``align_fmllr``
dir), else estimated with the previous model from its alignment; the tree is built on the
adapted features; the transforms are re-estimated at ``fmllr_iters`` on the current adapted
features and composed with the old ones.  At the end ``final.alimdl``, the speaker-independent
model of the first decoding pass, is one ML update of the final model from statistics of the
unadapted features with the posteriors of the adapted ones (``gmm-acc-stats-twofeats`` +
``gmm-est``).  ``align_fmllr`` aligns with that model on unadapted features, estimates the
transforms, and realigns with ``final.mdl`` on adapted features.

Silence frames get weight ``silence_weight`` (0: left out, Kaldi's ``weight-silence-post 0.0``);
a silence frame is one on a pdf of a silence phone's tree (every base phone has a root of its
own), so a best path of pdf ids is enough to estimate from.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.align.config import TRI_DEFAULTS, GmmConfig
from asrtrain.align.frames import (
    Moments,
    alimdl_stats,
)
from asrtrain.align.gmm import DiagGmmSet, GmmStats
from asrtrain.align.model import (
    AcousticModel,
    Utterance,
    check_failures,
    model_features,
    read_transforms,
)
from asrtrain.align.passes import (
    PassJobs,
    PassLog,
    align_result,
    aligned_utterances,
    pass_utterances,
    train_iters,
    tree_model,
    write_pass,
)
from asrtrain.align.passjobs import (
    AlignFmllrJob,
    Features,
    IterResult,
    align_fmllr_job,
    merge_fmllr_reports,
)
from asrtrain.jobs import JobConfig
from asrtrain.lang.lexicon import Lang


def train_sat(data_dir: Path, lang_dir: Path, ali_dir: Path, out_dir: Path,
              cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """SAT triphones on fMLLR-adapted features (tri4, see the module docstring); writes what
    ``train_tri`` writes plus ``trans.{ark,scp}`` (the training speakers) and
    ``final.alimdl``.  ``jobs``: how its jobs run (default ``nj`` of ``cfg``, here).  Returns
    the summary."""
    c = GmmConfig.from_config(cfg, **TRI_DEFAULTS, type="sat")
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    ali_dir, out_dir = Path(ali_dir), Path(out_dir)
    prev_model = AcousticModel.load(ali_dir)
    utts, skipped, data = pass_utterances(data_dir, lang)
    plog = PassLog(out_dir, out_dir.name)
    utts = aligned_utterances(utts, skipped, ali_dir, plog, c)
    with PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        pj.prev_ali = str(ali_dir.resolve() / "ali_phone_state.scp")
        prev_file = str(pj.work / "prev.mdl")
        prev_model.write(prev_file)
        t0 = time.time()
        if (ali_dir / "trans.scp").is_file():   # train_sat.sh: the alignment dir's trans.*
            found = read_transforms(ali_dir / "trans.scp", prev_model.gmm.dim)
            missing = sorted({data.utt2spk[u] for u in utts} - set(found))
            if missing:
                raise AsrtrainError(f"{ali_dir / 'trans.scp'}: no transform for speaker "
                                    f"{missing[0]} ({len(missing)} speakers missing)")
            transforms = {k: v.astype(np.float32) for k, v in found.items()}
            pj.write_transforms(transforms)
            plog(f"initial fMLLR transforms: {len(found)} from {ali_dir / 'trans.scp'}")
            model, tsum, _ = tree_model(pj, Features(model=prev_file, trans=pj.trans), lang,
                                         ali_dir, c, plog)
        else:   # else estimated with its model from its alignment, in the tree jobs
            model, tsum, parts = tree_model(pj, Features(model=prev_file), lang, ali_dir, c,
                                             plog, fmllr_model=prev_file)
            transforms = {}
            for r in parts:
                transforms.update(r.transforms)
            pj.write_transforms(transforms)
            rep = merge_fmllr_reports(r.fmllr for r in parts)
            plog(f"initial fMLLR transforms from {ali_dir.name}'s model and alignment: {rep} "
                 f"in {time.time() - t0:.1f} s")
        model.delta_order, model.splice = prev_model.delta_order, prev_model.splice
        model.lda_mllt, model.sat = prev_model.lda_mllt, True
        update = FmllrHook(transforms, plog)
        res, parts = train_iters(model, pj, c, c.num_gauss, plog, fmllr=update)
        t0 = time.time()
        # the blocks' sums (PassJobs.run adds them into the first result in block order)
        alimdl = alimdl_update(model, parts[0].alimdl, parts[0].alimdl_moments, c)
        plog(f"final.alimdl (speaker-independent) estimated in {time.time() - t0:.1f} s")
        summary = {"kind": "sat", "num_pdfs": model.num_pdfs,
                   "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
                   "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame, "tree": tsum,
                   "speakers": len(update.transforms),
                   "fmllr_objf_improvement": update.improvements}
        write_pass(out_dir, model, lang, pj, plog, summary, update.transforms, alimdl)
    return summary


class FmllrHook:
    """The SAT pass's update at ``fmllr_iters``: each job re-estimated its speakers'
    transforms on the current adapted features with the current model and alignment, composed
    them with the old ones and accumulated on the re-adapted features; here the transforms are
    gathered and written for the next iteration's jobs."""

    def __init__(self, transforms: dict[str, np.ndarray], plog: PassLog) -> None:
        self.transforms, self.plog = transforms, plog
        self.improvements: list[float] = []

    def __call__(self, it: int, pj: PassJobs, parts: list[IterResult], seconds: float
                 ) -> dict:
        for p in parts:
            self.transforms.update(p.transforms)
        pj.write_transforms(self.transforms)
        rep = merge_fmllr_reports(p.fmllr for p in parts)
        gain = rep["objf_improvement_per_frame"]
        self.improvements.append(gain)
        self.plog(f"iter {it}: fMLLR objective +{gain:.4f} per frame, {rep['speakers']} "
                  f"speakers ({rep['identity']} identity), in {seconds:.1f} s (with the "
                  "iteration's alignment and statistics)")
        return {"fmllr_objf_improvement": gain, "fmllr_seconds": round(seconds, 3)}


def alimdl_update(model: AcousticModel, stats: GmmStats, moments: Moments,
                  c: GmmConfig) -> AcousticModel:
    """``gmm-est`` of ``final.alimdl`` from the final model and the summed
    :func:`alimdl_stats` (low-count Gaussians kept, the variance floor from the unadapted
    features' global variance), same tree and transitions."""
    device = stats.occ.device
    gmm = model.gmm.to(device)
    var_floor = c.var_floor_factor * moments.mean_var()[1]
    si_gmm = DiagGmmSet(gmm.means.clone(), gmm.vars.clone(), gmm.log_weights.clone())
    si_gmm.update(stats, torch.from_numpy(var_floor).to(device), c.min_gaussian_occupancy)
    return AcousticModel(model.tree, si_gmm.to("cpu"), model.log_trans, model.delta_order,
                         var_floor, model.splice, model.lda_mllt, sat=False)


def alignment_model(model: AcousticModel, utts: list[Utterance], base: Mapping[str, np.ndarray],
                    phone_state: Mapping[str, np.ndarray], c: GmmConfig) -> AcousticModel:
    """``final.alimdl`` of utterances in memory: :func:`alimdl_stats` (the unadapted
    features made from the CMN'd MFCCs ``base``) and :func:`alimdl_update`."""
    unadapted = {u.utt: model_features(model, base[u.utt]) for u in utts}
    stats, moments = alimdl_stats(model, utts, unadapted, phone_state, c.device)
    return alimdl_update(model, stats, moments, c)


def align_fmllr(data_dir: Path, lang_dir: Path, model_dir: Path, out_dir: Path,
                cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """Align a data dir with fMLLR (Kaldi's ``steps/align_fmllr.sh``): first pass with the
    alignment model (``final.alimdl``, else ``final.mdl``) on unadapted features, transforms
    estimated from it, second pass with ``final.mdl`` on adapted features, all three in each
    job for its speakers.  ``out_dir`` gets the model(s), ``ali*.{ark,scp}``,
    ``trans.{ark,scp}``, ``log.txt``, ``passes.json``."""
    c = GmmConfig.from_config(cfg)
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir)
    model = AcousticModel.load(model_dir)
    alimdl = AcousticModel.load(model_dir, alignment_model=True)
    has_alimdl = (model_dir / "final.alimdl").is_file()
    utts, skipped, data = pass_utterances(data_dir, lang)
    plog = PassLog(out_dir, f"align_fmllr {model_dir.name}")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    with PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        t0 = time.time()
        parts = pj.run(align_fmllr_job, lambda p: AlignFmllrJob(
            p, str(model_dir / "final.mdl"),
            str(model_dir / ("final.alimdl" if has_alimdl else "final.mdl")), pj.cfg),
            "align, fMLLR, align")
        seconds = time.time() - t0
        first = align_result([p.first for p in parts])
        check_failures(first, len(utts), c.max_fail_fraction,
                       f"aligning {data_dir} (first pass)")
        plog.record(0, first, first.loglike_per_frame, first.frames, first.seconds,
                    alimdl.gmm.num_gauss(), {"features": "speaker-independent"})
        transforms: dict[str, np.ndarray] = {}
        for p in parts:
            transforms.update(p.transforms)
        rep = merge_fmllr_reports(p.fmllr for p in parts)
        plog(f"fMLLR transforms: {rep}")
        res = align_result([p.second for p in parts])
        check_failures(res, len(utts), c.max_fail_fraction, f"aligning {data_dir}")
        for utt, why in sorted(res.failed.items()):
            plog(f"failed {utt}: {why}")
        plog.record(1, res, res.loglike_per_frame, res.frames, res.seconds,
                    model.gmm.num_gauss(),
                    {"features": "fmllr", "jobs_seconds": round(seconds, 3),
                     "fmllr_objf_improvement": rep["objf_improvement_per_frame"]})
        summary = {"kind": "align_fmllr", "model": str(model_dir), "num_pdfs": model.num_pdfs,
                   "utterances": len(utts), "skipped": len(skipped), "failed": len(res.failed),
                   "si_loglike_per_frame": first.loglike_per_frame,
                   "final_loglike_per_frame": res.loglike_per_frame, "fmllr": rep}
        write_pass(out_dir, model, lang, pj, plog, summary, transforms,
               alimdl if has_alimdl else None)
    return summary
