"""Frames per CPU-second of online i-vector extraction (``ivector-extract-online2``) on synthetic
data, one thread by default: ``python -m asrtrain.adapt.bench_ivector [--gauss 512 --dim 40
--ivector-dim 100 --frames 200000 --threads 1 --dtype float32 --batch-frames 20000
--per-utterance]`` prints one JSON line. ``--per-utterance`` also times the one-utterance-at-a-time
estimator (:func:`asrtrain.adapt.ivector.online_ivectors`) on a tenth of the frames, the
float32 rows' largest difference from float64 ones, and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch

from asrtrain.adapt.ivector import (
    DiagUbm,
    IvectorExtractor,
    PosteriorOptions,
    carry_state,
    online_ivectors,
    online_ivectors_batch,
)


def synthetic_model(gauss: int, dim: int, ivector_dim: int, seed: int = 0
                    ) -> tuple[DiagUbm, IvectorExtractor]:
    """A diagonal UBM with well-separated random means and an extractor as
    ``ivector-extractor-init`` makes it from the UBM, with its columns scaled down (a trained
    extractor's i-vectors move the means by about a standard deviation)."""
    g = torch.Generator().manual_seed(seed)
    ubm = DiagUbm(torch.full((gauss,), -math.log(gauss), dtype=torch.float64),
                  2.0 * torch.randn(gauss, dim, generator=g, dtype=torch.float64),
                  0.5 + torch.rand(gauss, dim, generator=g, dtype=torch.float64))
    ext = IvectorExtractor.init_from_ubm(ubm, ivector_dim, seed)
    ext.M[:, :, 1:] *= 0.1
    ext._derived = None
    return ubm, ext


def synthetic_utterances(ubm: DiagUbm, frames: int, seed: int = 0, mean_frames: int = 400
                         ) -> list[torch.Tensor]:
    """Float32 utterances of 100 to ``2 * mean_frames - 100`` frames drawn from the UBM's
    components in runs of 10 frames (as phones last)."""
    g = torch.Generator().manual_seed(seed)
    out, total = [], 0
    while total < frames:
        n = min(int(torch.randint(100, 2 * mean_frames - 100, (1,), generator=g)),
                frames - total)
        comp = torch.randint(0, ubm.num_gauss, ((n + 9) // 10,), generator=g)
        comp = comp.repeat_interleave(10)[:n]
        x = ubm.means[comp] + ubm.vars[comp].sqrt() * torch.randn(n, ubm.dim, generator=g,
                                                                  dtype=torch.float64)
        out.append(x.float())
        total += n
    return out


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gauss", type=int, default=512)
    p.add_argument("--dim", type=int, default=40)
    p.add_argument("--ivector-dim", type=int, default=100)
    p.add_argument("--frames", type=int, default=200000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--batch-frames", type=int, default=20000)
    p.add_argument("--per-utterance", action="store_true")
    a = p.parse_args()
    from asrtrain.jobs import set_threads

    set_threads(a.threads)
    ubm, ext = synthetic_model(a.gauss, a.dim, a.ivector_dim)
    utts = synthetic_utterances(ubm, a.frames)
    follows = [i % 2 == 1 for i in range(len(utts))]      # pairs: utts_per_spk_max 2
    opts = PosteriorOptions(5, 0.025, 0.1)
    dtype = getattr(torch, a.dtype)
    online_ivectors_batch(ext, ubm, utts[:4], follows[:4], opts, dtype=dtype)   # warm up
    batches, start, size = [], 0, 0
    for i, x in enumerate(utts):
        size += len(x)
        if size >= a.batch_frames and not (i + 1 < len(utts) and follows[i + 1]):
            batches.append((start, i + 1))
            start, size = i + 1, 0
    if start < len(utts):
        batches.append((start, len(utts)))
    wall, cpu = time.perf_counter(), _cpu()
    out = []
    for s, e in batches:
        out += online_ivectors_batch(ext, ubm, utts[s:e], follows[s:e], opts, dtype=dtype)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    frames = sum(len(x) for x in utts)
    result = {"what": "online i-vector extraction, batched", "frames": frames,
              "utterances": len(utts), "gauss": a.gauss, "dim": a.dim,
              "ivector_dim": a.ivector_dim, "dtype": a.dtype, "threads": a.threads,
              "batch_frames": a.batch_frames, "seconds": round(wall, 3),
              "cpu_seconds": round(cpu, 3), "frames_per_cpu_s": round(frames / max(cpu, 1e-9)),
              "frames_per_s": round(frames / max(wall, 1e-9)),
              "load_avg_1min": os.getloadavg()[0]}
    if a.per_utterance:
        few = utts[: max(2, len(utts) // 10)]
        ref = online_ivectors_batch(ext, ubm, few, follows[:len(few)], opts,
                                    dtype=torch.float64)
        wall, cpu = time.perf_counter(), _cpu()
        state, rows = None, []
        for x, f in zip(few, follows[:len(few)], strict=True):
            w, last = online_ivectors(ext, ubm, x, opts, 10, state if f else None)
            state = carry_state(last, 1000.0, opts.posterior_scale)
            rows.append(w)
        wall, cpu = time.perf_counter() - wall, _cpu() - cpu
        n = sum(len(x) for x in few)
        result["per_utterance_frames_per_cpu_s"] = round(n / max(cpu, 1e-9))
        result["max_abs_diff_vs_float64"] = float(max(
            (o.double() - q).abs().max() for o, q in zip(out[:len(ref)], ref, strict=True)))
        result["max_abs_ivector"] = float(max(q.abs().max() for q in ref))
        result["per_utterance_max_abs_diff"] = float(max(
            (o - q).abs().max() for o, q in zip(rows, ref, strict=True)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
