"""Kaldi's online i-vector recipe on data dirs: the diagonal UBM and the extractor trained on a
set's stored features, online i-vectors of every utterance written as arks, and the import of
Kaldi's own ``ivector_online.scp``. The estimators are :mod:`asrtrain.adapt.ivector`'s; this
module splits the sets into jobs (:mod:`asrtrain.jobs`, whole speakers per job as
``split_data.sh``), whose module-level functions read their part's features and return
statistics or write their ark, and sums what they return in job order, so that no result
depends on ``nj`` or on where the jobs ran (``asrtrain/stages/ivectors.py`` says which steps
run).

The features are the data dir's stored ones as ``FeatureReader`` gives them, by default with no
per-speaker CMVN (``cmvn: false``): Kaldi's online i-vectors see no per-speaker statistics at
test time (the extractor reads un-normalised features, ``train_ivector_extractor.sh``: "the
appropriate offset should be learned by the iVector extractor itself"), and the speaker's mean
is exactly what an i-vector should carry to the network.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.adapt.ivector import (
    DiagUbm,
    ExtractorAccs,
    ExtractorConfig,
    IvectorExtractor,
    PosteriorOptions,
    UbmAccs,
    accumulate_extractor,
    accumulate_ubm,
    add_accs,
    check_totals,
    online_ivectors_batch,
    train_diag_ubm,
    update_extractor,
    update_ubm,
    utterance_stats,
)
from asrtrain.data.datadir import read_table
from asrtrain.features.ark import load_matrix
from asrtrain.features.reader import FeatureReader, ivector_rows
from asrtrain.fileio import atomic_ark, atomic_open, write_text
from asrtrain.jobs import JobConfig, run_jobs, split_by_speaker

log = logging.getLogger("asrtrain")

#: The utterances whose frames are read and turned into statistics at a time, in a job.
BLOCK_UTTS = 200


@dataclass(frozen=True)
class FrameSource:
    """Where a job reads its frames: a data dir's stored features, with the per-speaker CMVN of
    ``cmvn.scp`` when ``cmvn`` (else none). Small and picklable: a job (perhaps a fresh
    interpreter on another machine) opens the data dir itself."""

    data_dir: Path
    cmvn: bool = False
    norm_vars: bool = False

    def open(self) -> SetFrames:
        return SetFrames(self.data_dir, self.cmvn, self.norm_vars)


@dataclass
class SetFrames:
    """The frames of one data dir as the i-vector models see them: stored features, with the
    per-speaker CMVN of ``cmvn.scp`` when ``cmvn`` (else none), every ``subsample``-th frame."""

    data_dir: Path
    cmvn: bool = False
    norm_vars: bool = False

    def __post_init__(self) -> None:
        self.reader = FeatureReader(self.data_dir, 0, self.norm_vars,
                                    require_cmvn=self.cmvn, need_num_frames=True)

    @property
    def source(self) -> FrameSource:
        return FrameSource(Path(self.data_dir), self.cmvn, self.norm_vars)

    @property
    def utts(self) -> list[str]:
        return self.reader.utts

    @property
    def num_frames(self) -> dict[str, int]:
        return self.reader.num_frames

    def __call__(self, utt: str, subsample: int = 1) -> torch.Tensor:
        m = self.reader[utt] if self.cmvn else np.asarray(self.reader.raw(utt), np.float32)
        if m.ndim != 2 or not np.isfinite(m).all():
            raise AsrtrainError(f"{self.reader.feats_scp}: utterance {utt}: features of shape "
                                f"{m.shape} with non-finite values, or not a matrix")
        return torch.from_numpy(np.array(m[::subsample], dtype=np.float32))   # a writable copy

    def frames_of(self, utts: Sequence[str]) -> int:
        return sum(self.reader.num_frames[u] for u in utts)

    def spk2utt(self, utts: Sequence[str] | None = None) -> dict[str, list[str]]:
        """The data dir's ``spk2utt``, restricted to ``utts`` when given."""
        full = self.reader.data.spk2utt
        if utts is None:
            return full
        keep = set(utts)
        out = {s: [u for u in us if u in keep] for s, us in full.items()}
        return {s: us for s, us in out.items() if us}


def _resources() -> dict:
    """The process's current and peak resident memory (MB, ``/proc/self/status``)."""
    from asrtrain.adapt.bench import _status_mb

    return {"rss_mb": round(_status_mb("VmRSS"), 1), "peak_rss_mb": round(_status_mb("VmHWM"), 1)}


def subset_utterances(utts: Sequence[str], num_utts: int) -> list[str]:
    """``utils/subset_data_dir.sh DATA num_utts``: ``num_utts`` utterances evenly spaced over
    the sorted list (0, or more than there are: all). Evenly spaced rather than ``--first``
    (which the swbd recipe uses): the first N of a corpus combined from two (Fisher and
    Switchboard) would be one of them."""
    utts = sorted(utts)
    if num_utts <= 0 or num_utts >= len(utts):
        return utts
    return [utts[i * len(utts) // num_utts] for i in range(num_utts)]


def _parts(frames: SetFrames, utts: Sequence[str], jobs: JobConfig) -> list[list[str]]:
    """``utils/split_data.sh``: ``utts`` in at most ``jobs.nj`` parts of whole speakers,
    balanced by frames."""
    return split_by_speaker(frames.spk2utt(utts), jobs.nj, frames.num_frames)


def _seconds(t0: float, c0: float) -> dict:
    return {"seconds": round(time.time() - t0, 3),
            "cpu_seconds": round(time.process_time() - c0, 3)}


# ---------------------------------------------------------------------------- UBM
def _frame_sample(utt: str, num_frames: int, rate: float, seed: int) -> torch.Tensor:
    """The frames of ``utt`` kept for the UBM's initialisation: each with probability
    ``rate``, drawn from a generator seeded by the seed and the utterance's name, so that the
    sample is the same whichever job reads the utterance."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(utt.encode()))
    return torch.nonzero(torch.rand(num_frames, generator=g) < rate)[:, 0]


@dataclass
class UbmSampleJob:
    source: FrameSource
    utts: list[str]
    rate: float
    seed: int


def ubm_sample_job(job: UbmSampleJob) -> tuple[torch.Tensor, list[int], dict]:
    """One job of ``gmm-global-init-from-feats``'s reading: its utterances' sampled frames
    (in its utterances' order), how many of each, and what it took."""
    t0, c0 = time.time(), time.process_time()
    frames = job.source.open()
    out = []
    for utt in job.utts:
        x = frames(utt)
        out.append(x[_frame_sample(utt, len(x), job.rate, job.seed)])
    return torch.cat(out), [len(x) for x in out], _seconds(t0, c0)


@dataclass
class UbmAccJob:
    source: FrameSource
    utts: list[str]
    subsample: int
    ubm: DiagUbm
    gselect: DiagUbm
    num_gselect: int


def ubm_acc_job(job: UbmAccJob) -> tuple[UbmAccs, dict]:
    """One job of an EM iteration of ``train_diag_ubm.sh``: ``gmm-global-acc-stats`` on its
    utterances (every ``subsample``-th frame), Gaussian selection by the initial UBM."""
    t0, c0 = time.time(), time.process_time()
    frames = job.source.open()
    acc = None
    for i in range(0, len(job.utts), BLOCK_UTTS):
        x = torch.cat([frames(u, job.subsample) for u in job.utts[i:i + BLOCK_UTTS]])
        part = accumulate_ubm(job.ubm, x, job.gselect, job.num_gselect)
        acc = part if acc is None else acc.add(part)
    return acc, _seconds(t0, c0)


def train_ubm(frames: SetFrames, opts: dict, subsample: int, jobs: JobConfig, device: str
              ) -> tuple[DiagUbm, dict]:
    """``train_diag_ubm.sh`` on ``ubm.num_utts`` utterances of the set: the jobs read a sample
    of about ``num_frames`` frames, the UBM is initialised on it here
    (``gmm-global-init-from-feats``: ``num_iters_init`` iterations, mixing up from half the
    components), then ``num_iters`` EM iterations whose statistics the jobs compute on every
    ``subsample``-th frame of their part (posteriors over the ``num_gselect`` components the
    initial UBM selects) and this process sums in job order. Returns the UBM and what it
    took."""
    seed, num_gauss = int(opts.get("seed", 0)), int(opts["num_gauss"])
    utts = subset_utterances(frames.utts, int(opts.get("num_utts", 0)))
    parts = _parts(frames, utts, jobs)
    total = frames.frames_of(utts)
    rate = min(1.0, int(opts["num_frames"]) / max(total, 1))
    t0 = time.time()
    got = run_jobs(ubm_sample_job, [UbmSampleJob(frames.source, p, rate, seed) for p in parts],
                   jobs, "diag UBM: sampling frames")
    # the sample in sorted utterance order whatever the split: the same initial UBM for any nj
    by_utt: dict[str, torch.Tensor] = {}
    for part, (x, sizes, _) in zip(parts, got, strict=True):
        by_utt.update(zip(part, x.split(sizes), strict=True))
    sample = torch.cat([by_utt[u] for u in sorted(by_utt)]).to(device)
    t_init = time.time()
    ubm, history = train_diag_ubm(
        sample, num_gauss=num_gauss, num_frames=len(sample),
        num_iters_init=int(opts["num_iters_init"]), num_iters=0,
        min_gaussian_weight=float(opts["min_gaussian_weight"]), seed=seed)
    init_seconds = time.time() - t_init
    ubm = ubm.to("cpu")
    gselect, num_iters = ubm, int(opts["num_iters"])
    cpu = sum(info["cpu_seconds"] for _, _, info in got)
    removed = 0
    for it in range(num_iters):
        results = run_jobs(ubm_acc_job, [
            UbmAccJob(frames.source, p, subsample, ubm, gselect, int(opts["num_gselect"]))
            for p in parts], jobs, f"diag UBM: iteration {it + 1} of {num_iters}")
        acc = results[0][0]
        for part_acc, _ in results[1:]:
            acc = acc.add(part_acc)
        cpu += sum(info["cpu_seconds"] for _, info in results)
        ubm, removed = update_ubm(ubm, acc, float(opts["min_gaussian_weight"]),
                                  remove_low_count=it == num_iters - 1)
        history.append({"iter": int(opts["num_iters_init"]) + it,
                        "loglike_per_frame": acc.loglike / acc.frames,
                        "num_gauss": ubm.num_gauss})
        log.info("diag UBM iteration %d: %.4f per frame, %d components", it,
                 acc.loglike / acc.frames, ubm.num_gauss, extra=STAGE_LOG_ONLY)
    seconds = time.time() - t0
    used = total // subsample
    work = len(sample) * int(opts["num_iters_init"]) + used * num_iters
    info = {"utterances": len(utts), "frames": used, "init_frames": len(sample),
            "num_gauss": ubm.num_gauss, "removed": removed, "jobs": len(parts),
            "iterations": int(opts["num_iters_init"]) + num_iters,
            "seconds": round(seconds, 2), "init_seconds": round(init_seconds, 2),
            "job_cpu_seconds": round(cpu, 2),
            "frames_per_s": round(work / max(seconds, 1e-9)),
            "loglike_per_frame": round(history[-1]["loglike_per_frame"], 4)}
    return ubm, info


# ---------------------------------------------------------------------------- extractor
def extractor_config(opts: dict, subsample: int) -> ExtractorConfig:
    """``train_ivector_extractor.sh``'s options; the posterior scale is multiplied by
    ``subsample`` as the script does, so that the counts are those of all frames."""
    post = PosteriorOptions(int(opts["num_gselect"]), float(opts["min_post"]),
                            float(opts["posterior_scale"]) * subsample)
    return ExtractorConfig(ivector_dim=int(opts["ivector_dim"]), num_iters=int(opts["num_iters"]),
                           variance_floor_factor=float(opts["variance_floor_factor"]),
                           gaussian_min_count=float(opts["gaussian_min_count"]),
                           seed=int(opts.get("seed", 0)), posteriors=post)


@dataclass
class ExtractorAccJob:
    source: FrameSource
    utts: list[str]
    subsample: int
    ubm: DiagUbm
    extractor: IvectorExtractor
    posteriors: PosteriorOptions
    second_order: bool      # also the totals gamma_c and S_c (the first iteration)


def extractor_acc_job(job: ExtractorAccJob
                      ) -> tuple[ExtractorAccs, torch.Tensor | None, torch.Tensor | None, dict]:
    """One job of an EM iteration of ``train_ivector_extractor.sh``: the UBM's posteriors
    (``gmm-global-get-post``) and ``ivector-extractor-acc-stats`` on its utterances, in blocks;
    on the first iteration also ``gamma_c`` and ``S_c``."""
    t0, c0 = time.time(), time.process_time()
    frames = job.source.open()
    acc = gamma = s = None
    for i in range(0, len(job.utts), BLOCK_UTTS):
        block = [frames(u, job.subsample) for u in job.utts[i:i + BLOCK_UTTS]]
        stats, s_b = utterance_stats(job.ubm, block, job.posteriors, job.second_order)
        part = accumulate_extractor(job.extractor, stats)
        acc = part if acc is None else add_accs(acc, part)
        if job.second_order:
            g_b = stats.gamma.sum(0)
            gamma = g_b if gamma is None else gamma + g_b
            s = s_b if s is None else s + s_b
    return acc, gamma, s, _seconds(t0, c0)


def train_extractor(frames: SetFrames, ubm: DiagUbm, opts: dict, subsample: int,
                    jobs: JobConfig, device: str) -> tuple[IvectorExtractor, dict]:
    """``train_ivector_extractor.sh`` on ``extractor.num_utts`` utterances of the set: every
    iteration the jobs read their part's frames and return the E step's statistics, which this
    process sums in job order for the M step (on ``device``). Returns the extractor and what it
    took, with the peak memory of this process in this phase (the high-water mark reset before
    it, as ``asrtrain.adapt.bench``)."""
    from asrtrain.adapt.bench import _reset_peak_rss

    cfg = extractor_config(opts, subsample)
    utts = subset_utterances(frames.utts, int(opts.get("num_utts", 0)))
    parts = _parts(frames, utts, jobs)
    ubm = ubm.to("cpu")
    _reset_peak_rss()
    before = _resources()
    t0 = time.time()
    ext = IvectorExtractor.init_from_ubm(ubm, cfg.ivector_dim, cfg.seed)
    totals, history, cpu = None, [], 0.0
    for it in range(cfg.num_iters):
        t_it = time.time()
        job_ext = IvectorExtractor(ext.M.cpu(), ext.sigma_inv.cpu(), ext.prior_offset)
        results = run_jobs(extractor_acc_job, [
            ExtractorAccJob(frames.source, p, subsample, ubm, job_ext, cfg.posteriors,
                            totals is None) for p in parts],
            jobs, f"i-vector extractor: iteration {it + 1} of {cfg.num_iters}")
        acc = results[0][0]
        for r in results[1:]:
            acc = add_accs(acc, r[0])
        cpu += sum(r[3]["cpu_seconds"] for r in results)
        if totals is None:
            gamma, s = results[0][1], results[0][2]
            for r in results[1:]:
                gamma, s = gamma + r[1], s + r[2]
            totals = check_totals((gamma, s), ubm)
        gamma, s = totals
        ext.M, ext.sigma_inv = ext.M.to(device), ext.sigma_inv.to(device)
        ext._derived = None
        acc = ExtractorAccs(acc.Y.to(device), acc.R.to(device), acc.ivector_sum.to(device),
                            acc.ivector_scatter.to(device), acc.num_ivectors)
        entry = {"iter": it, **update_extractor(ext, acc, gamma.to(device), s.to(device),
                                                cfg.variance_floor_factor,
                                                cfg.gaussian_min_count)}
        ext = IvectorExtractor(ext.M.cpu(), ext.sigma_inv.cpu(), ext.prior_offset)
        entry["seconds"] = round(time.time() - t_it, 3)
        history.append(entry)
        log.info("i-vector extractor: %s", entry, extra=STAGE_LOG_ONLY)
    seconds = time.time() - t0
    used = frames.frames_of(utts) // subsample
    info = {"utterances": len(utts), "frames": used, "iterations": cfg.num_iters,
            "ivector_dim": cfg.ivector_dim, "jobs": len(parts), "seconds": round(seconds, 2),
            "job_cpu_seconds": round(cpu, 2),
            "frames_per_s": round(used * cfg.num_iters / max(seconds, 1e-9)),
            "rss_before_mb": before["rss_mb"], "peak_rss_mb": _resources()["peak_rss_mb"],
            "auxf_per_frame": [round(h["auxf_per_frame"], 4) for h in history]}
    return ext, info


# ---------------------------------------------------------------------------- files
def save_ubm(ubm: DiagUbm, path: Path) -> None:
    with atomic_open(path, "wb") as f:
        torch.save({"log_weights": ubm.log_weights.cpu(), "means": ubm.means.cpu(),
                    "vars": ubm.vars.cpu()}, f)


def load_ubm(path: Path) -> DiagUbm:
    d = _load(path, ("log_weights", "means", "vars"))
    return DiagUbm(d["log_weights"], d["means"], d["vars"])


def save_extractor(ext: IvectorExtractor, path: Path) -> None:
    with atomic_open(path, "wb") as f:
        torch.save({"M": ext.M.cpu(), "sigma_inv": ext.sigma_inv.cpu(),
                    "prior_offset": float(ext.prior_offset)}, f)


def load_extractor(path: Path) -> IvectorExtractor:
    d = _load(path, ("M", "sigma_inv", "prior_offset"))
    return IvectorExtractor(d["M"], d["sigma_inv"], float(d["prior_offset"]))


def _load(path: Path, keys: tuple[str, ...]) -> dict:
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:   # a truncated or foreign file: say which
        raise AsrtrainError(f"{path}: cannot read it ({e}); rerun the ivectors stage") from e
    if not isinstance(d, dict) or any(k not in d for k in keys):
        raise AsrtrainError(f"{path}: expected the keys {', '.join(keys)}")
    return d


def write_info(path: Path, info: dict) -> None:
    write_text(path, json.dumps(info, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------- extraction
def pseudo_speakers(spk2utt: dict[str, list[str]], utts_per_spk_max: int
                    ) -> list[list[str]]:
    """The utterance groups that share adaptation state: each speaker's utterances in order,
    cut into runs of at most ``utts_per_spk_max`` (``extract_ivectors_online.sh
    --utts-per-spk-max``; 0 or less: the whole speaker), so that an utterance's i-vector does
    not depend on a long history that test data would not have."""
    groups = []
    for utts in spk2utt.values():
        n = utts_per_spk_max if utts_per_spk_max > 0 else len(utts)
        groups += [utts[i:i + n] for i in range(0, len(utts), n)]
    return groups


@dataclass
class ExtractJob:
    source: FrameSource
    groups: list[list[str]]           # pseudo-speakers: utterances sharing adaptation state
    ubm: DiagUbm
    extractor: IvectorExtractor
    posteriors: PosteriorOptions
    period: int
    max_remembered_frames: float
    ark: Path                         # this job's ivector_online.JOB.ark
    scp: Path                         # and its scp, merged by the parent
    batch_frames: int = 20000


def extract_job(job: ExtractJob) -> dict:
    """One job of ``extract_ivectors_online.sh``: the online i-vectors of its utterances, many
    utterances per tensor op (:func:`asrtrain.adapt.ivector.online_ivectors_batch`: whole
    pseudo-speakers per batch of about ``batch_frames`` frames), written to its own ark."""
    t0, c0 = time.time(), time.process_time()
    frames = job.source.open()
    batches, batch, size = [], [], 0
    for group in job.groups:
        batch.append(group)
        size += frames.frames_of(group)
        if size >= job.batch_frames:
            batches.append(batch)
            batch, size = [], 0
    if batch:
        batches.append(batch)
    done = 0
    with atomic_ark(job.ark, job.scp) as writer:
        for batch in batches:
            utts = [u for group in batch for u in group]
            follows = [i > 0 for group in batch for i in range(len(group))]
            rows = online_ivectors_batch(job.extractor, job.ubm, [frames(u) for u in utts],
                                         follows, job.posteriors, job.period,
                                         job.max_remembered_frames)
            for utt, m in zip(utts, rows, strict=True):
                writer(utt, m.float().numpy())
            done += len(utts)
    return {"utterances": done, "frames": frames.frames_of([u for g in job.groups for u in g]),
            **_seconds(t0, c0)}


def extract_set(frames: SetFrames, ubm: DiagUbm, ext: IvectorExtractor, opts: dict,
                posteriors: PosteriorOptions, out: Path, jobs: JobConfig) -> dict:
    """``extract_ivectors_online.sh`` on one set: ``out/ivector_online.JOB.ark`` (one per job,
    float32 ``[ceil(T / period), R]`` per utterance), ``out/ivector_online.scp`` over them
    (written here, atomically, once every job is done) and ``out/ivector_period``. Returns
    what it took."""
    period = int(opts["period"])
    parts = _parts(frames, frames.utts, jobs)
    ubm = ubm.to("cpu")
    ext = IvectorExtractor(ext.M.cpu(), ext.sigma_inv.cpu(), ext.prior_offset)
    out.mkdir(parents=True, exist_ok=True)
    args = []
    for j, part in enumerate(parts, 1):
        args.append(ExtractJob(
            frames.source, pseudo_speakers(frames.spk2utt(part), int(opts["utts_per_spk_max"])),
            ubm, ext, posteriors, period, float(opts["max_remembered_frames"]),
            (out / f"ivector_online.{j}.ark").absolute(), out / f"ivector_online.{j}.scp",
            int(opts.get("batch_frames", 20000))))
    t0 = time.time()
    results = run_jobs(extract_job, args, jobs, f"i-vectors {frames.data_dir.name}")
    seconds = time.time() - t0
    lines: dict[str, str] = {}
    for a in args:
        for line in a.scp.read_text(encoding="utf-8").splitlines():
            utt, spec = line.split(maxsplit=1)
            lines[utt] = spec
    missing = sorted(set(frames.utts) - set(lines))
    if missing:
        raise AsrtrainError(f"{out}: the jobs wrote no i-vectors for {len(missing)} "
                            f"utterances, e.g. {missing[0]}")
    write_text(out / "ivector_online.scp", "".join(f"{u} {lines[u]}\n" for u in sorted(lines)))
    write_text(out / "ivector_period", f"{period}\n")
    for a in args:
        a.scp.unlink(missing_ok=True)
    _remove_stale_arks(out, {a.ark.name for a in args})
    total = frames.frames_of(frames.utts)
    cpu = sum(r["cpu_seconds"] for r in results)
    return {"utterances": len(lines), "frames": total, "seconds": round(seconds, 2),
            "frames_per_s": round(total / max(seconds, 1e-9)), "job_cpu_seconds": round(cpu, 2),
            "frames_per_cpu_s": round(total / max(cpu, 1e-9)), "period": period,
            "jobs": len(args), "groups": sum(len(a.groups) for a in args)}


def _remove_stale_arks(out: Path, keep: set[str]) -> None:
    """The arks an earlier run left in ``out`` that the new scp does not name (more jobs then,
    or one ark of an import)."""
    for ark in out.glob("ivector_online*.ark"):
        if ark.name not in keep:
            ark.unlink()


# ---------------------------------------------------------------------------- Kaldi import
def import_kaldi_ivectors(kaldi_dir: Path, data_dir: Path, out: Path) -> dict:
    """Copy Kaldi's ``ivector_online.scp`` (and ``ivector_period``) of one set into ``out``,
    checked against the set's data dir: every utterance present, ``ceil(frames / period)``
    rows, one dimension, finite values. Errors name the file and the utterance."""
    scp, period_file = kaldi_dir / "ivector_online.scp", kaldi_dir / "ivector_period"
    for p in (scp, period_file):
        if not p.is_file():
            raise AsrtrainError(f"{p}: missing (expected Kaldi's extract_ivectors_online.sh "
                                "output dir, e.g. exp/nnet3/ivectors_SET)")
    period = _read_period(period_file)
    table = read_table(scp)
    frames = FeatureReader(data_dir, need_num_frames=True).num_frames
    dim = None
    out.mkdir(parents=True, exist_ok=True)
    with atomic_ark(out / "ivector_online.ark", out / "ivector_online.scp") as writer:
        for utt in sorted(frames):
            m = _kaldi_matrix(scp, table, utt)
            need = ivector_rows(frames[utt], period)
            if m.shape[0] != need:
                raise AsrtrainError(f"{scp}: utterance {utt} has {m.shape[0]} i-vector rows; "
                                    f"its {frames[utt]} frames ({data_dir / 'utt2num_frames'}) "
                                    f"at period {period} need ceil({frames[utt]}/{period}) = "
                                    f"{need}")
            if dim is not None and m.shape[1] != dim:
                raise AsrtrainError(f"{scp}: utterance {utt} has {m.shape[1]}-dim i-vectors, "
                                    f"the others {dim}")
            dim = m.shape[1]
            writer(utt, m)
    write_text(out / "ivector_period", f"{period}\n")
    _remove_stale_arks(out, {"ivector_online.ark"})
    return {"utterances": len(frames), "period": period, "dim": dim, "source": str(kaldi_dir)}


def _read_period(path: Path) -> int:
    text = path.read_text().strip()
    if not text.isdigit() or int(text) < 1:
        raise AsrtrainError(f"{path}: expected a positive number of frames, got {text!r}")
    return int(text)


def _kaldi_matrix(scp: Path, table: dict[str, str], utt: str) -> np.ndarray:
    if utt not in table:
        raise AsrtrainError(f"{scp}: no i-vectors for utterance {utt} of the data dir")
    spec = table[utt]
    ark = Path(spec.rsplit(":", 1)[0])
    if not ark.is_absolute() and not ark.exists():
        # Kaldi writes absolute paths; a relative one is tried from here, then beside the scp
        spec = str(scp.parent / spec)
    m = load_matrix(spec, f"{scp}: utterance {utt}").astype(np.float32)
    if m.ndim != 2:
        raise AsrtrainError(f"{scp}: utterance {utt}: a {m.ndim}-dim array, expected a matrix "
                            "[rows, dim]")
    if not np.isfinite(m).all():
        raise AsrtrainError(f"{scp}: utterance {utt} has NaN or infinite i-vector values")
    return m


def log_info(what: str, info: dict) -> None:
    log.info("ivectors %s: %s", what, json.dumps(info), extra=STAGE_LOG_ONLY)
