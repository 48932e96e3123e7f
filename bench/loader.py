"""How fast the hybrid model's chunk loader runs against how fast training consumes chunks.

    python bench/loader.py EXP_DIR [--set train_nodup] [--align tri2] [--batch 64]

Reads the chunks of one epoch (features + CMVN + deltas from the arks, pdf targets from the
alignment, block shuffling, collation) without training and prints frames/s; compare with the
``frames_per_second_per_learner`` of the training log. Writes bench/results/loader.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from asrtrain.train.chunks import ChunkSet, prefetch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("exp", type=Path)
    ap.add_argument("--set", default="train_nodup")
    ap.add_argument("--align", default="tri2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--delta-order", type=int, default=0)
    args = ap.parse_args()
    cs = ChunkSet(args.exp / "data" / args.set, args.exp / "align" / args.align,
                  delta_order=args.delta_order, norm_vars=True)
    result = {}
    for name, wrap in (("direct", iter), ("prefetch_thread", prefetch)):
        t0 = time.time()
        frames = 0
        for batch in wrap(cs.batches(1, 0, 1, args.batch)):
            frames += batch.frames
        seconds = time.time() - t0
        result[name] = {"frames": frames, "seconds": round(seconds, 3),
                        "frames_per_second": round(frames / seconds)}
        print(f"{name}: {frames} frames in {seconds:.2f} s = {frames / seconds:.0f} frames/s")
    out = REPO / "bench" / "results" / "loader.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
