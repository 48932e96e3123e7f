"""bench/scale.py: a real run at two tiny sizes (generated corpora, every stage of the hybrid
recipe through the CLI with nj=2, each GMM pass with two iterations and one realignment, small
i-vectors, the alignment timing at a reduced model size) writes scale.json
of the documented shape and scale.png; the projection follows its rule (a stage process's part
is not divided by cores, the jobs' part is divided by min(cores, jobs); align per pass on its
subset; train_hybrid from a GPU row or marked as having none); the growth fits recover known
laws. No wall-clock assertions."""

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

REF = {"cores": 64, "memory_gb": 512, "gpus": 8}
#: Recipe overrides of the run at two tiny sizes: what the assertions read is there with less
#: work (recipes/tiny/small.yaml's passes have 4 iterations and up to 3 realignments; each pass
#: here 2 and 1, tri4's fMLLR estimated once with 5 row sweeps; the i-vectors' UBM of 8
#: Gaussians, an extractor of 10 dims, one EM iteration each). The jobs still do most of align.
FEWER = ["ivector.ubm.num_gauss=8", "ivector.ubm.num_iters_init=2", "ivector.ubm.num_iters=1",
         "ivector.extractor.num_iters=1", "ivector.extractor.ivector_dim=10",
         "align.passes.mono.num_iters=2", "align.passes.mono.realign_iters=[1]",
         *(f"align.passes.{p}.{k}" for p in ("tri1", "tri3", "tri4")
           for k in ("num_iters=2", "realign_iters=[1]")),
         "align.passes.tri3.mllt_iters=[1]", "align.passes.tri4.fmllr_iters=[1]",
         "+align.passes.tri4.fmllr_num_iters=5"]


@pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("sox")),
                    reason="the scale corpus needs Debian espeak-ng and sox")
def test_scale_bench_at_two_tiny_sizes_writes_json_and_png(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "bench/scale.py", "--sizes", "0.03", "0.045", "--speakers", "4",
         "--vocab", "200", "--nj", "2", "--align-frames", "500", "--align-gaussians", "2000",
         *(a for o in FEWER for a in ("--override", o)), "--gpu-json", str(tmp_path / "none.json"),
         "--results", str(results), "--work", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((results / "scale.json").read_text())
    assert len(data["hours"]) == 2 and data["hours"][0] < data["hours"][1]
    assert set(data["stages"]) == set(scale.STAGES)
    for stage, m in data["stages"].items():
        assert set(m) == {"cpu_s", "wall_s", "peak_rss_mb", "peak_anon_mb", "parallel_fraction"}
        for key in m:
            assert len(m[key]) == 2, (stage, key)
        assert all(c > 0 for c in m["cpu_s"]) and all(w > 0 for w in m["wall_s"])
        assert all(r > 10 for r in m["peak_rss_mb"])
        # the private part, sampled: never above the peak RSS (ru_maxrss, which counts file pages)
        assert all(0 <= a <= r + 1 for a, r in zip(m["peak_anon_mb"], m["peak_rss_mb"],
                                                     strict=True))
        assert all(0 <= f <= 1 for f in m["parallel_fraction"])
    # align's iterations run in the nj jobs: most of its CPU time is the jobs'
    assert min(data["stages"]["align"]["parallel_fraction"]) > 0.3
    for name in ("swb300", "swb2000"):
        proj = data["projection"][name]
        assert set(proj) >= {"stage_hours", "peak_process_gb", "data_stages_hours"}
        assert set(proj["stage_hours"]) == set(proj["peak_process_gb"]) == set(scale.STAGES)
        assert set(proj["peak_process_anon_gb"]) == set(scale.STAGES)
        assert proj["stage_hours"]["train_hybrid"] is None          # no GPU row given
        assert "no GPU figure" in proj["basis"]["train_hybrid"]
        assert proj["data_stages_hours"] == pytest.approx(
            sum(proj["stage_hours"][s] for s in scale.DATA_STAGES), abs=0.01)
        assert set(proj["basis"]["align"]["passes"]) == set(scale.PASS_HOURS[name])
    assert data["projection"]["swb2000"]["stage_hours"]["align"] > \
        data["projection"]["swb300"]["stage_hours"]["align"]
    assert (results / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| align |" in proc.stdout and "no GPU figure" in proc.stdout


def fitted(own: float, jobs: float, rss_mb: float = 100.0) -> dict:
    """A stage's fit: ``own`` and ``jobs`` CPU seconds per hour, nothing fixed."""
    return {"self_cpu_s": {"fixed": 0.0, "per_hour": own},
            "children_cpu_s": {"fixed": 0.0, "per_hour": jobs},
            "peak_rss_mb": {"fixed": rss_mb, "per_hour": 1.0},
            "self_rss_mb": {"fixed": rss_mb, "per_hour": 1.0},
            "children_rss_mb": {"fixed": 50.0, "per_hour": 0.5}}


def test_projection_divides_only_the_jobs_part() -> None:
    hours = 300.0
    serial = fitted(36.0, 0.0)                 # parallel fraction 0
    assert scale.stage_seconds(serial, hours, 64, 32) == pytest.approx(36.0 * hours)
    parallel = fitted(0.0, 36.0)
    assert scale.stage_seconds(parallel, hours, 64, 32) == pytest.approx(36.0 * hours / 32)
    assert scale.stage_seconds(parallel, hours, 8, 32) == pytest.approx(36.0 * hours / 8)
    half = fitted(18.0, 18.0)
    assert scale.stage_seconds(half, hours, 64, 32) == pytest.approx(18.0 * hours * (1 + 1 / 32))
    assert scale.parallel_share(half) == pytest.approx(0.5)

    fit = {s: fitted(0.0, 0.0) for s in scale.STAGES}
    fit["lm"], fit["features"] = serial, parallel
    proj = scale.project(fit, {}, None, REF, 32)
    assert proj["swb300"]["stage_hours"]["lm"] == pytest.approx(36.0 * 300 / 3600, abs=1e-3)
    assert proj["swb300"]["stage_hours"]["features"] == pytest.approx(
        36.0 * 300 / 32 / 3600, abs=1e-3)
    assert proj["swb2000"]["stage_hours"]["lm"] == pytest.approx(36.0 * 2000 / 3600, abs=1e-3)
    # peak GB per process from the fitted growth of the largest process's peak RSS
    assert proj["swb2000"]["peak_process_gb"]["lm"] == pytest.approx((100 + 2000) / 1024,
                                                                     abs=0.01)
    assert proj["swb300"]["stage_hours"]["train_hybrid"] is None


def test_align_is_projected_per_pass_on_its_subset() -> None:
    costs = {"likelihoods": 1e-4, "viterbi": 5e-5, "accumulate": 2e-5, "gauss_per_pdf": 10.0}
    plan = [{"pass": "mono", "gauss_per_pdf": 10.0, "realignments": 2, "iterations": 4},
            {"pass": "tri1", "gauss_per_pdf": 20.0, "realignments": 1, "iterations": 3}]
    hours = {"mono": 10.0, "tri1": 100.0}
    seconds, per_pass = scale.align_seconds(plan, hours, costs, 0.0, 64, 32)
    mono = 10 * 360000 * (2 * (1e-4 + 5e-5) + 4 * 2e-5)
    tri1 = 100 * 360000 * (1 * (2e-4 + 5e-5) + 3 * 4e-5)
    assert seconds == pytest.approx(mono + tri1)
    assert per_pass["mono"]["cpu_h"] == pytest.approx(mono / 3600, abs=1e-3)
    # the mono subset at twice the hours costs mono twice, nothing else
    seconds2, _ = scale.align_seconds(plan, {**hours, "mono": 20.0}, costs, 0.0, 64, 32)
    assert seconds2 == pytest.approx(2 * mono + tri1)
    # all in jobs: divided by min(cores, jobs)
    assert scale.align_seconds(plan, hours, costs, 1.0, 64, 32)[0] == \
        pytest.approx((mono + tri1) / 32)
    # the recipes' plans: their passes, s5c's subsets (mono realigned often, on ~12 h)
    plans = {name: scale.pass_plan(name) for name in scale.TARGET_HOURS}
    for name, p in plans.items():
        assert [x["pass"] for x in p] == list(scale.PASS_HOURS[name])
    assert plans["swb300"][0]["data"] == [{"shortest": 100000}, {"evenly": 30000}]
    # tri1 trains on other data than mono: one alignment more (align_si.sh)
    assert plans["swb300"][1]["realignments"] == 3 + 1


def test_train_hybrid_from_a_gpu_row(tmp_path: Path) -> None:
    """Rows as bench/gpu.py writes them: a GPU named as torch names it, both loaders."""
    gpu = tmp_path / "gpu.json"
    h100 = "NVIDIA H100 80GB HBM3"
    gpu.write_text(json.dumps({"rows": [
        {"device": "cpu (1 thread(s), 2 cores)", "chunks": 128, "precision": "fp32",
         "end_to_end_fps": 5000.0},
        {"device": h100, "chunks": 2048, "precision": "bf16", "chunk_data": "resident",
         "end_to_end_fps": 600000.0},
        {"device": h100, "chunks": 128, "precision": "fp32", "chunk_data": "stream",
         "end_to_end_fps": 70000.0},
        {"device": h100, "chunks": 128, "precision": "fp32", "chunk_data": "resident",
         "end_to_end_fps": 80000.0}]}))
    row = scale.gpu_rate(gpu)
    assert (row["chunks"], row["precision"], row["chunk_data"]) == (128, "fp32", "resident")
    fit = {s: fitted(0.0, 0.0) for s in scale.STAGES}
    proj = scale.project(fit, {}, row, REF, 32)
    epochs = scale.recipe_setting("swb300", "trainer.epochs")
    assert proj["swb300"]["stage_hours"]["train_hybrid"] == pytest.approx(
        300 * 360000 * epochs / (80000 * 8) / 3600, abs=1e-3)
    assert h100 in proj["swb300"]["basis"]["train_hybrid"]
    gpu.write_text(json.dumps({"rows": [{"device": "cpu (1 thread(s), 2 cores)",
                                         "end_to_end_fps": 5000.0}]}))
    assert scale.gpu_rate(gpu) is None
    # the committed H100 run (docs/results/gpu) is the default, and has such a row
    committed = scale.gpu_rate(scale.GPU_JSON)
    assert committed["device"] == h100 and committed["chunks"] == 128


def test_reproject_changes_only_what_the_gpu_row_gives(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    """--reproject measures nothing: the committed run's projection, made again with no GPU
    row, equals it but for train_hybrid (bench/scale.py's main, in this process)."""
    none = tmp_path / "none.json"
    scale.main(["--reproject", str(REPO / "docs" / "results" / "scale.json"), "--gpu-json",
                str(none), "--results", str(tmp_path)])
    stdout = capsys.readouterr().out
    before = json.loads((REPO / "docs" / "results" / "scale.json").read_text())["projection"]
    after = json.loads((tmp_path / "scale.json").read_text())["projection"]
    for name in scale.TARGET_HOURS:
        hours = dict(before[name]["stage_hours"])
        assert hours.pop("train_hybrid") > 0
        assert after[name]["stage_hours"].pop("train_hybrid") is None
        assert after[name]["stage_hours"] == hours
    assert "train_hybrid no GPU figure" in stdout


def test_growth_fits_recover_known_laws() -> None:
    assert scale.exponent([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)
    assert scale.exponent([1, 2, 4], [5, 5, 5]) == pytest.approx(0.0)
    assert scale.exponent([1.0, 1.1], [1, 9]) is None      # sizes too close to fit
    fixed, per_hour = scale.linear([1, 4, 16], [7 + 40 * h for h in (1, 4, 16)])
    assert (fixed, per_hour) == (pytest.approx(7.0), pytest.approx(40.0))
    assert scale.linear([1, 2], [9.0, 8.0])[1] == 0.0  # cost that does not grow: no slope


def test_one_size_is_refused() -> None:
    proc = subprocess.run([sys.executable, "bench/scale.py", "--sizes", "0.1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "at least two positive sizes" in proc.stderr
