"""Kaldi's online i-vector recipe on data dirs: the diagonal UBM and the extractor trained on a
set's stored features, online i-vectors of every utterance written as arks, and the import of
Kaldi's own ``ivector_online.scp``. The estimators are :mod:`asrtrain.adapt.ivector`'s; this
module reads the features, keeps memory bounded and writes the files
(``asrtrain/stages/ivectors.py`` says which steps run).

The features are the data dir's stored ones as ``FeatureReader`` gives them, by default with no
per-speaker CMVN (``cmvn: false``): Kaldi's online i-vectors see no per-speaker statistics at
test time (the extractor reads un-normalised features, ``train_ivector_extractor.sh``: "the
appropriate offset should be learned by the iVector extractor itself"), and the speaker's mean
is exactly what an i-vector should carry to the network.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import kaldiio
import numpy as np
import torch
from tqdm import tqdm

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.adapt.ivector import (
    DiagUbm,
    ExtractorConfig,
    IvectorExtractor,
    PosteriorOptions,
    UttStats,
    carry_state,
    online_ivectors,
    train_diag_ubm,
    train_ivector_extractor,
    utterance_stats,
)
from asrtrain.data.datadir import read_table
from asrtrain.features.reader import FeatureReader, ivector_rows
from asrtrain.fileio import atomic_ark, atomic_open, write_text

log = logging.getLogger("asrtrain")

#: The utterances whose frames are read and turned into statistics at a time.
BLOCK_UTTS = 200


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
    def utts(self) -> list[str]:
        return self.reader.utts

    def __call__(self, utt: str, subsample: int = 1) -> torch.Tensor:
        m = self.reader[utt] if self.cmvn else np.asarray(self.reader.raw(utt), np.float32)
        if m.ndim != 2 or not np.isfinite(m).all():
            raise AsrtrainError(f"{self.reader.feats_scp}: utterance {utt}: features of shape "
                                f"{m.shape} with non-finite values, or not a matrix")
        return torch.from_numpy(np.array(m[::subsample], dtype=np.float32))   # a writable copy

    def frames_of(self, utts: Sequence[str]) -> int:
        return sum(self.reader.num_frames[u] for u in utts)


def _resources() -> dict:
    """The process's current and peak resident memory (MB, ``/proc/self/status``)."""
    from asrtrain.adapt.bench import _status_mb

    return {"rss_mb": round(_status_mb("VmRSS"), 1), "peak_rss_mb": round(_status_mb("VmHWM"), 1)}


# ---------------------------------------------------------------------------- UBM
def ubm_utterances(frames: SetFrames, max_frames: int, seed: int) -> list[str]:
    """Utterances in a seeded random order, as many as hold ``max_frames`` frames (0: all):
    the UBM is trained on a subset, as Kaldi's swbd recipe trains it on 30k utterances."""
    order = torch.randperm(len(frames.utts), generator=torch.Generator().manual_seed(seed))
    utts, total = [], 0
    for i in order.tolist():
        if max_frames and total >= max_frames:
            break
        utts.append(frames.utts[i])
        total += frames.reader.num_frames[frames.utts[i]]
    return sorted(utts)


def train_ubm(frames: SetFrames, opts: dict, subsample: int, device: str
              ) -> tuple[DiagUbm, dict]:
    """``train_diag_ubm.sh`` on the set: returns the UBM and what it took."""
    utts = ubm_utterances(frames, int(opts.get("max_frames", 0)), int(opts.get("seed", 0)))
    x = torch.cat([frames(u, subsample) for u in tqdm(
        utts, desc="diag UBM: reading", unit="utt", file=sys.stderr, disable=None,
        leave=False)]).to(device)
    t0 = time.time()
    ubm, history = train_diag_ubm(
        x, num_gauss=int(opts["num_gauss"]), num_frames=int(opts["num_frames"]),
        num_iters_init=int(opts["num_iters_init"]), num_iters=int(opts["num_iters"]),
        min_gaussian_weight=float(opts["min_gaussian_weight"]), seed=int(opts.get("seed", 0)))
    seconds = time.time() - t0
    # frames processed: the initial iterations see the num_frames subset, the last ones all
    work = (min(int(opts["num_frames"]), len(x)) * int(opts["num_iters_init"])
            + len(x) * int(opts["num_iters"]))
    info = {"utterances": len(utts), "frames": len(x), "num_gauss": ubm.num_gauss,
            "iterations": int(opts["num_iters_init"]) + int(opts["num_iters"]),
            "seconds": round(seconds, 2), "frames_per_s": round(work / max(seconds, 1e-9)),
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


def _blocks(frames: SetFrames, subsample: int, device: str, desc: str
            ) -> Iterator[list[torch.Tensor]]:
    utts = frames.utts
    bar = tqdm(total=len(utts), desc=desc, unit="utt", file=sys.stderr, disable=None,
               leave=False)
    for i in range(0, len(utts), BLOCK_UTTS):
        block = utts[i:i + BLOCK_UTTS]
        yield [frames(u, subsample).to(device) for u in block]
        bar.update(len(block))
    bar.close()


def stats_bytes(num_utts: int, ubm: DiagUbm) -> int:
    """Memory of the kept Baum-Welch statistics of ``num_utts`` utterances (float64)."""
    c, d = ubm.num_gauss, ubm.dim
    return 8 * (num_utts * c * (d + 1) + c * d * d)


def _cached_stats(frames: SetFrames, ubm: DiagUbm, cfg: ExtractorConfig, subsample: int,
                  device: str) -> tuple[UttStats, torch.Tensor]:
    """Every utterance's statistics, computed block by block from the arks (the frames of one
    block in memory at a time)."""
    parts, s = [], None
    for block in _blocks(frames, subsample, device, "i-vector stats"):
        st, sb = utterance_stats(ubm, block, cfg.posteriors, second_order=True)
        parts.append(st)
        s = sb if s is None else s + sb
    return UttStats(torch.cat([p.gamma for p in parts]), torch.cat([p.X for p in parts])), s


def train_extractor(frames: SetFrames, ubm: DiagUbm, opts: dict, subsample: int,
                    device: str) -> tuple[IvectorExtractor, dict]:
    """``train_ivector_extractor.sh`` on the set's utterances: the statistics are kept when
    they fit in ``max_cache_mb``, else recomputed from the arks every iteration (Kaldi's way);
    the same extractor either way. Returns it and what it took, with the peak memory of this
    phase (the process's high-water mark reset before it, as ``asrtrain.adapt.bench``)."""
    from asrtrain.adapt.bench import _reset_peak_rss

    cfg = extractor_config(opts, subsample)
    ubm = ubm.to(device)
    cached = stats_bytes(len(frames.utts), ubm) <= float(opts["max_cache_mb"]) * 2 ** 20
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    _reset_peak_rss()
    before = _resources()
    t0 = time.time()
    if cached:
        stats, s = _cached_stats(frames, ubm, cfg, subsample, device)
        ext, history = train_ivector_extractor(ubm, lambda: [(stats, s)], cfg)
        del stats, s
    else:
        ext, history = train_ivector_extractor(
            ubm, lambda: _blocks(frames, subsample, device, "i-vector stats"), cfg)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.time() - t0
    used = frames.frames_of(frames.utts) // subsample
    info = {"utterances": len(frames.utts), "frames": used, "iterations": cfg.num_iters,
            "ivector_dim": cfg.ivector_dim, "statistics": "kept" if cached else "recomputed",
            "seconds": round(seconds, 2),
            "frames_per_s": round(used * cfg.num_iters / max(seconds, 1e-9)),
            "rss_before_mb": before["rss_mb"], "peak_rss_mb": _resources()["peak_rss_mb"],
            "auxf_per_frame": [round(h["auxf_per_frame"], 4) for h in history]}
    if device.startswith("cuda"):
        info["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)
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


def extract_set(frames: SetFrames, ubm: DiagUbm, ext: IvectorExtractor, opts: dict,
                posteriors: PosteriorOptions, out: Path, device: str) -> dict:
    """``extract_ivectors_online.sh`` on one set: ``out/ivector_online.{ark,scp}`` (float32
    ``[ceil(T / period), R]`` per utterance) and ``out/ivector_period``. Returns what it took."""
    period = int(opts["period"])
    ubm = ubm.to(device)
    ext = IvectorExtractor(ext.M.to(device), ext.sigma_inv.to(device), ext.prior_offset)
    groups = pseudo_speakers(frames.reader.data.spk2utt, int(opts["utts_per_spk_max"]))
    rows: dict[str, np.ndarray] = {}
    t0 = time.time()
    with tqdm(total=len(frames.utts), desc=f"i-vectors {frames.data_dir.name}", unit="utt",
              file=sys.stderr, disable=None, leave=False) as bar:
        for group in groups:
            state = None
            for utt in group:
                ivs, last = online_ivectors(ext, ubm, frames(utt), posteriors, period, state)
                rows[utt] = ivs.float().cpu().numpy()
                state = carry_state(last, float(opts["max_remembered_frames"]),
                                    posteriors.posterior_scale)
                bar.update()
    seconds = time.time() - t0
    out.mkdir(parents=True, exist_ok=True)
    with atomic_ark(out / "ivector_online.ark", out / "ivector_online.scp") as writer:
        for utt in frames.utts:
            writer(utt, rows[utt])
    write_text(out / "ivector_period", f"{period}\n")
    total = frames.frames_of(frames.utts)
    return {"utterances": len(rows), "frames": total, "seconds": round(seconds, 2),
            "frames_per_s": round(total / max(seconds, 1e-9)), "period": period,
            "groups": len(groups)}


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
    try:
        m = np.asarray(kaldiio.load_mat(spec), dtype=np.float32)
    except Exception as e:
        raise AsrtrainError(f"{scp}: utterance {utt}: cannot read {table[utt]}: {e}") from e
    if m.ndim != 2:
        raise AsrtrainError(f"{scp}: utterance {utt}: a {m.ndim}-dim array, expected a matrix "
                            "[rows, dim]")
    if not np.isfinite(m).all():
        raise AsrtrainError(f"{scp}: utterance {utt} has NaN or infinite i-vector values")
    return m


def log_info(what: str, info: dict) -> None:
    log.info("ivectors %s: %s", what, json.dumps(info), extra=STAGE_LOG_ONLY)
