"""How fast the hybrid model's chunk loaders deliver frames: streaming from the arks against
device-resident data (asrtrain.train.resident), with and without Δ/ΔΔ.

    OMP_NUM_THREADS=1 python bench/loader.py [EXP_DIR] [--set train_nodup] [--align tri2]
        [--batch 128] [--synthetic-frames 2000000] [--repeats 3]

EXP_DIR (e.g. a copy of a finished tiny experiment) gives real features and tri2 alignments;
``--synthetic-frames`` adds a bigger synthetic shard (40-dim features, SWB-like utterance
lengths, per-speaker CMVN statistics, 3,000 pdfs) written under ``--work``. For each data set,
Δ/ΔΔ order (0, 2) and loader it times one epoch of batches (seed 1, one learner) without
training, on one torch thread: ``stream`` reads, normalises and collates every epoch as the
streaming loader does; ``resident_fp32`` / ``resident_fp16`` load once (``load_seconds``, not in
the rate) and then only gather (best of ``--repeats`` epochs). Compare with the
``frames_per_second_per_learner`` of a training log. Writes bench/results/loader.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import kaldiio  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from asrtrain.data.datadir import DataDir  # noqa: E402
from asrtrain.features.transform import cmvn_stats  # noqa: E402
from asrtrain.fileio import write_text  # noqa: E402
from asrtrain.train.chunks import ChunkSet  # noqa: E402
from asrtrain.train.resident import ResidentChunks  # noqa: E402


def synthetic_set(root: Path, frames: int, dim: int = 40, pdfs: int = 3000,
                  seed: int = 0) -> tuple[Path, Path]:
    """A data dir (feats.scp, cmvn.scp, utt2num_frames) and an align dir of about ``frames``
    frames, utterances of 100-1,500 frames, 20 utterances per speaker; kept for the next run."""
    data, ali = root / f"data_{frames}", root / f"ali_{frames}"
    if (ali / "num_pdfs").is_file():
        return data, ali
    rng = np.random.default_rng(seed)
    data.mkdir(parents=True, exist_ok=True)
    ali.mkdir(parents=True, exist_ok=True)
    d, per_spk, total, i = DataDir(), {}, 0, 0
    with kaldiio.WriteHelper(f"ark,scp:{data}/feats.ark,{data}/feats.scp") as wf, \
            kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as wa:
        while total < frames:
            n, spk = int(rng.integers(100, 1500)), f"spk{i // 20:05d}"
            utt = f"{spk}-u{i:07d}"
            m = (rng.normal(size=(n, dim)) * 3 + rng.normal(size=dim) * 5).astype(np.float32)
            wf(utt, m)
            wa(utt, rng.integers(0, pdfs, n).astype(np.int32))
            per_spk.setdefault(spk, []).append(m)
            d.wav[utt], d.text[utt], d.utt2spk[utt], d.utt2num_frames[utt] = \
                "/dev/null", "x", spk, n
            total, i = total + n, i + 1
    with kaldiio.WriteHelper(f"ark,scp:{data}/cmvn.ark,{data}/cmvn.scp") as wc:
        for spk, mats in per_spk.items():
            wc(spk, cmvn_stats(mats))
    for table, name in ((d.feats, "feats.scp"), (d.cmvn, "cmvn.scp")):
        for line in (data / name).read_text().splitlines():
            key, value = line.split(maxsplit=1)
            table[key] = value
    d.write(data)
    write_text(ali / "num_pdfs", f"{pdfs}\n")
    return data, ali


def epoch_rate(batches) -> tuple[int, float]:
    """Frames of one epoch's batches and the seconds they took."""
    t0, frames = time.perf_counter(), 0
    for batch in batches:
        frames += batch.frames
    return frames, time.perf_counter() - t0


def bench_set(name: str, data: Path, ali: Path, batch: int, repeats: int) -> list[dict]:
    rows = []
    for order in (0, 2):
        cs = ChunkSet(data, ali, delta_order=order, norm_vars=True)
        frames, seconds = epoch_rate(cs.batches(1, 0, 1, batch))
        rows.append({"data": name, "delta_order": order, "loader": "stream", "frames": frames,
                     "seconds": round(seconds, 3), "frames_per_second": round(frames / seconds)})
        print(f"{name} Δ{order} stream: {frames / seconds:,.0f} frames/s", flush=True)
        for dtype in (torch.float32, torch.float16):
            t0 = time.perf_counter()
            rc = ResidentChunks(cs, "cpu", dtype)
            load = time.perf_counter() - t0
            frames, seconds = min((epoch_rate(rc.batches(1, 0, 1, batch))
                                   for _ in range(repeats)), key=lambda r: r[1])
            label = f"resident_{str(dtype).replace('torch.float', 'fp')}"
            rows.append({"data": name, "delta_order": order, "loader": label, "frames": frames,
                         "seconds": round(seconds, 3),
                         "frames_per_second": round(frames / seconds),
                         "load_seconds": round(load, 3),
                         "bytes_per_frame": round(rc.bytes_per_frame, 2)})
            print(f"{name} Δ{order} {label}: {frames / seconds:,.0f} frames/s "
                  f"(loaded in {load:.2f} s, {rc.bytes_per_frame:.1f} bytes/frame)", flush=True)
            del rc
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("exp", type=Path, nargs="?")
    ap.add_argument("--set", default="train_nodup")
    ap.add_argument("--align", default="tri2")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--synthetic-frames", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/asrtrain-bench-loader"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    rows = []
    if args.exp is not None:
        rows += bench_set(f"{args.exp.name}:{args.set}", args.exp / "data" / args.set,
                          args.exp / "align" / args.align, args.batch, args.repeats)
    if args.synthetic_frames:
        data, ali = synthetic_set(args.work, args.synthetic_frames)
        rows += bench_set(f"synthetic:{args.synthetic_frames}", data, ali, args.batch,
                          args.repeats)
    result = {"host": platform.node(), "cpus": os.cpu_count(), "torch_threads": 1,
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "batch_chunks": args.batch,
              "load_average_1min": [load_before, os.getloadavg()[0]],  # other jobs' share
              "rows": rows}
    out = REPO / "bench" / "results" / "loader.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
