"""bench/gpu.py --quick: the real script on real arks through the trainer's epoch loop, and
two gloo processes for the gossip exchange; its JSON has one row per batch size and precision
the CPU trains in (the trainer's probe), and says why any other was left out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_precision import NO_AVX512, onednn_cap_breaks_bf16_lstm

from asrtrain.models.precision import precision_refusal

REPO = Path(__file__).resolve().parents[1]


def quick_bench(out: Path, *args: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/gpu.py", "--quick", "--out", str(out), *args],
                          cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=600)


def test_quick_bench_writes_rows_gossip_and_png(tmp_path: Path) -> None:
    """Both input layouts: one 260-dim ark, and the recipe's fbank | fMLLR | i-vector tables
    assembled by the loader into the same 260 dims."""
    proc = quick_bench(tmp_path, "--inputs", "flat", "ibm260")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert result["complete"] is True
    rows = result["rows"]
    refusals = {p: precision_refusal(p, torch.device("cpu")) for p in ("fp32", "bf16")}
    assert refusals["fp32"] is None
    assert [(r["inputs"], r["chunks"], r["precision"]) for r in rows] == [
        (i, c, p) for i in ("flat", "ibm260") for p, why in refusals.items() if why is None
        for c in (8, 32)]
    assert result["precisions_left_out"] == {p: why for p, why in refusals.items() if why}
    for p, why in result["precisions_left_out"].items():
        assert f"precision {p} left out: {why}" in proc.stdout
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


def test_quick_bench_without_avx512_leaves_bf16_out(tmp_path: Path) -> None:
    """oneDNN capped at AVX2 (an AMD EPYC without AVX-512): fp32 rows only, bf16 left out with
    the CPU and oneDNN's missing kernel named; asked for bf16 alone, one line and no JSON."""
    if not onednn_cap_breaks_bf16_lstm():
        pytest.skip("torch's bf16 LSTM runs under ONEDNN_MAX_CPU_ISA=AVX2 here: nothing to "
                    "leave out")
    # one batch size (the other test times both): the rows left out do not depend on it
    proc = quick_bench(tmp_path, "--chunks", "8", env=NO_AVX512)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert [(r["chunks"], r["precision"]) for r in result["rows"]] == [(8, "fp32")]
    why = result["precisions_left_out"]["bf16"]
    assert list(result["precisions_left_out"]) == ["bf16"]
    assert why.startswith("this CPU (") and "ONEDNN_MAX_CPU_ISA=AVX2" in why
    assert "has no bf16 LSTM kernel (oneDNN: " in why
    assert f"precision bf16 left out: {why}" in proc.stdout
    alone = quick_bench(tmp_path / "alone", "--precisions", "bf16", env=NO_AVX512)
    assert alone.returncode == 1 and "Traceback" not in alone.stderr
    assert alone.stderr.strip().splitlines()[-1] == f"bench/gpu.py: no precision to measure: {why}"
    assert not (tmp_path / "alone" / "gpu.json").exists()
