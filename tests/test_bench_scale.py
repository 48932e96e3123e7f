"""bench/scale.py: a real run at two tiny sizes (generated corpora, every data stage through the
CLI, the alignment timing at a reduced model size) writes scale.json of the documented shape and
scale.png; the growth fits recover known laws."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import scale  # noqa: E402  (bench/scale.py)


@pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("sox")),
                    reason="the scale corpus needs Debian espeak-ng and sox")
def test_scale_bench_at_two_tiny_sizes_writes_json_and_png(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "bench/scale.py", "--sizes", "0.015", "0.03", "--speakers", "3",
         "--vocab", "400", "--nj", "2", "--align-frames", "2000", "--align-gaussians", "20000",
         "--cores", "8", "--results", str(results), "--work", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((results / "scale.json").read_text())
    assert data["features"]["rt_per_core"] > 0
    assert data["mfcc"]["rt_per_core"] > 0 and data["decode_hybrid"]["rt_per_core"] > 0
    assert data["align"]["gaussians"] == 20000 and data["align"]["frames_per_s_per_core"] > 0
    assert [s["requested_hours"] for s in data["sizes"]] == [0.015, 0.03]
    for size in data["sizes"]:
        assert size["hours"] > 0 and size["test_hours"] > 0
        assert set(size["stages"]) == set(scale.STAGES)
        for m in size["stages"].values():
            assert m["returncode"] == 0 and m["wall_s"] > 0 and m["peak_rss_mb"] > 10
        assert size["stages"]["align"]["frames"] > 0
    for name in ("swb300", "swb2000"):
        proj = data["projection"][name]
        assert set(proj["stage_hours"]) == set(scale.PROJECTED)
        assert all(h >= 0 for h in proj["stage_hours"].values())
        assert proj["dominant_stage"] == max(proj["stage_hours"], key=proj["stage_hours"].get)
        assert proj["cores"] == 8
    # 2,000 h cost more than 300 h in every stage that grows with the training set
    assert data["projection"]["swb2000"]["stage_hours"]["align"] > \
        data["projection"]["swb300"]["stage_hours"]["align"]
    assert (results / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| features |" in proc.stdout and "dominant:" in proc.stdout


def test_growth_fits_recover_known_laws() -> None:
    assert scale.exponent([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)
    assert scale.exponent([1, 2, 4], [5, 5, 5]) == pytest.approx(0.0)
    assert scale.exponent([1.0, 1.1], [1, 9]) is None      # sizes too close to fit
    fixed, per_hour = scale.linear([0.1, 0.25, 0.5], [7 + 40 * h for h in (0.1, 0.25, 0.5)])
    assert (fixed, per_hour) == (pytest.approx(7.0), pytest.approx(40.0))
    assert scale.linear([0.1, 0.2], [9.0, 8.0])[1] == 0.0  # cost that does not grow: no slope


def test_one_size_is_refused() -> None:
    proc = subprocess.run([sys.executable, "bench/scale.py", "--sizes", "0.1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "at least two positive sizes" in proc.stderr
