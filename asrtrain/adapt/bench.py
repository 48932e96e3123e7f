"""Time and peak memory of i-vector extractor training on synthetic data.

``python -m asrtrain.adapt.bench [--frames 100000 --dim 40 --gauss 128 --ivector-dim 100
--iters 5 --device cpu]`` prints one JSON line: seconds of the UBM training, of the statistics
pass and of the EM iterations, and peak memory: the process's peak RSS; the peak RSS of the
extractor phase alone (the high-water mark reset before it) next to the RSS it started from;
on CUDA, the allocator's peak.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from asrtrain.adapt.ivector import (
    ExtractorConfig,
    IvectorExtractor,
    PosteriorOptions,
    accumulate_extractor,
    train_diag_ubm,
    update_extractor,
    utterance_stats,
)


def synthetic_utterances(frames: int, dim: int, utt_frames: int = 500, factors: int = 10,
                         seed: int = 0) -> list[torch.Tensor]:
    """Utterances from a 64-component GMM whose means move with a per-utterance speaker
    factor (``factors`` dims), in float32 as features are stored."""
    g = torch.Generator().manual_seed(seed)
    means = 3.0 * torch.randn(64, dim, generator=g)
    basis = torch.randn(64, dim, factors, generator=g) / factors ** 0.5
    out = []
    for start in range(0, frames, utt_frames):
        n = min(utt_frames, frames - start)
        c = torch.randint(0, 64, (n,), generator=g)
        y = torch.randn(factors, generator=g)
        out.append(means[c] + basis[c] @ y + torch.randn(n, dim, generator=g))
    return out


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mb(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status`` (Linux), else -1."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return -1.0


def _reset_peak_rss() -> None:
    """Reset ``VmHWM`` to the current RSS (``clear_refs`` 5, Linux >= 4.0), so the peak of
    the extractor phase is measured apart from the UBM training before it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run(frames: int, dim: int, gauss: int, ivector_dim: int, iters: int, device: str,
        posterior_scale: float = 1.0) -> dict:
    dev = torch.device(device)
    utts = [u.to(dev) for u in synthetic_utterances(frames, dim)]
    t0 = time.time()
    ubm, _ = train_diag_ubm(torch.cat(utts), num_gauss=gauss, num_iters_init=10, num_iters=2)
    t_ubm = time.time() - t0
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    _reset_peak_rss()
    rss0 = _status_mb("VmRSS")
    cfg = ExtractorConfig(ivector_dim=ivector_dim, num_iters=iters,
                          posteriors=PosteriorOptions(posterior_scale=posterior_scale))
    t0 = time.time()
    stats, s = utterance_stats(ubm, utts, cfg.posteriors, second_order=True)
    t_stats = time.time() - t0
    ext = IvectorExtractor.init_from_ubm(ubm, ivector_dim)
    gamma = stats.gamma.sum(0)
    t0 = time.time()
    history = []
    for _ in range(iters):
        history.append(update_extractor(ext, accumulate_extractor(ext, stats), gamma, s))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t_em = time.time() - t0
    out = {"posterior_scale": posterior_scale, "frames": frames, "dim": dim,
           "gauss": ubm.num_gauss, "ivector_dim": ivector_dim,
           "utterances": len(utts), "iters": iters, "device": str(dev),
           "threads": torch.get_num_threads(), "ubm_seconds": round(t_ubm, 2),
           "stats_seconds": round(t_stats, 2), "em_seconds": round(t_em, 2),
           "seconds_per_iter": round(t_em / iters, 3),
           "auxf_per_frame": [round(h["auxf_per_frame"], 4) for h in history],
           "process_peak_rss_mb": round(_peak_rss_mb(), 1),
           "rss_before_extractor_mb": round(rss0, 1),
           "extractor_peak_rss_mb": round(_status_mb("VmHWM"), 1)}
    if dev.type == "cuda":
        out["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=100000)
    p.add_argument("--dim", type=int, default=40)
    p.add_argument("--gauss", type=int, default=128)
    p.add_argument("--ivector-dim", type=int, default=100)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--posterior-scale", type=float, default=1.0,
                   help="Kaldi's online recipe uses 0.1 (then gaussian_min_count=100 leaves "
                        "components of less than 1000 frames unupdated)")
    a = p.parse_args()
    print(json.dumps(run(a.frames, a.dim, a.gauss, a.ivector_dim, a.iters, a.device,
                         a.posterior_scale)))


if __name__ == "__main__":
    main()
