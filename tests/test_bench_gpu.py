"""bench/gpu.py --quick: the real script on real arks through the trainer's epoch loop, and
two gloo processes for the gossip exchange; its JSON has one row per batch size and precision."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def test_quick_bench_writes_rows_gossip_and_png(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "bench/gpu.py", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    rows = result["rows"]
    assert [(r["chunks"], r["precision"]) for r in rows] == [
        (8, "fp32"), (32, "fp32"), (8, "bf16"), (32, "bf16")]
    for r in rows:
        assert r["device"].startswith("cpu") and r["chunk_data"] == "resident"
        assert r["model_only_fps"] > 0 and r["end_to_end_fps"] > 0
        assert abs(r["end_to_end_share"] - r["end_to_end_fps"] / r["model_only_fps"]) < 1e-2
        # the synthetic task holds at least 8 steps of the largest batch; one learner runs
        # every full batch of the epoch
        assert r["epoch_chunks"] >= 8 * 32
        assert r["end_to_end_steps"] == r["epoch_chunks"] // r["chunks"]
        assert r["parameters"] == rows[0]["parameters"] > 0
    gossip = result["gossip"]
    assert gossip["parameters"] == rows[0]["parameters"]
    assert gossip["exchange_s"] > 0 and gossip["megabytes_per_s"] > 0
    assert "end to end" in proc.stdout and "gossip:" in proc.stdout
    with Image.open(tmp_path / "gpu.png") as im:
        assert im.format == "PNG" and im.size == (700, 400)
