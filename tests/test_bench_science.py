"""bench/science.py end to end at its smallest size (``--size small``: the committed tiny corpus,
4-8 simulated learners, one epoch, the real multi-process points with 2 gloo learners), run as a
script in a process of its own; and its GMM overrides against a recipe with more passes."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import science  # bench/science.py (conftest puts bench/ on the path)

from asrtrain.recipe import compose_recipe

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("batch", "gap", "delay", "hier", "real")


def test_align_overrides_delete_every_pass_after_tri1() -> None:
    """A recipe that gains passes (tri3, tri4) still gets mono and tri1 only."""
    more = ["+align.passes.tri3={from: tri2, num_leaves: 20, num_gauss: 40}",
            "+align.passes.tri4={from: tri3, num_leaves: 20, num_gauss: 40}"]
    overrides = science.align_overrides(more)
    assert {"~align.passes.tri2", "~align.passes.tri3", "~align.passes.tri4"} <= set(overrides)
    cfg = compose_recipe(REPO / "recipes" / "tiny", [*more, *overrides])
    assert list(cfg.align.passes) == ["mono", "tri1"]
    assert cfg.align.passes.tri1.num_leaves == 60


def test_the_hybrid_input_needs_no_pass_or_stage_the_experiments_leave_out() -> None:
    """No fMLLR (of a SAT pass deleted above) or i-vectors (a stage not run) in its input."""
    cfg = compose_recipe(REPO / "recipes" / "tiny", science.recipe_overrides([]))
    features = cfg.hybrid.get("features") or cfg.features
    assert not features.get("append")


def finite(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory, tiny_tri1: Path) -> Path:
    """The experiments on a copy of the session's tiny exp dir with features and small GMM
    alignments (conftest's tiny_tri1: the GMM passes science.py makes when its --exp has none)."""
    out = tmp_path_factory.mktemp("science")
    shutil.copytree(tiny_tri1, out / "exp", symlinks=True)
    proc = subprocess.run([sys.executable, "bench/science.py", "--size", "small", "--out",
                           str(out / "results"), "--exp", str(out / "exp"), "--docs",
                           str(out / "docs")],  # never the repository's docs/
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "results"


@pytest.mark.timeout(1800)
def test_small_size_writes_every_experiment(small_run: Path) -> None:
    for name in EXPERIMENTS:
        result = json.loads((small_run / f"science_{name}.json").read_text())
        assert result["plan"]["name"] == "small" and result["rows"], name
        assert (small_run / f"science_{name}.png").stat().st_size > 1000, name
        trained = [r for r in result["rows"] if "skipped" not in r]
        assert trained, name
        for row in trained:
            losses = [v for run in row["runs"] for v in (run["real"]["heldout_loss"],
                                                         run["simulated"]["heldout_loss"])] \
                if name == "real" else [row["heldout_loss"], *(e["heldout_loss"]
                                                                for e in row["epochs"])]
            assert all(finite(v) and v > 0 for v in losses), (name, row)
        assert finite(result["label_prior_loss"]) and result["label_prior_loss"] > 0, name
    summary = json.loads((small_run / "science_summary.json").read_text())
    assert set(summary["experiment_wall_s"]) == set(EXPERIMENTS)


@pytest.mark.timeout(1800)
def test_small_size_results_mean_what_they_say(small_run: Path) -> None:
    batch = json.loads((small_run / "science_batch.json").read_text())["rows"]
    plan = science.SMALL
    assert {(r["optimizer"], r["global_batch"], r["backend"]) for r in batch} == {
        (o, b, k) for o in plan.batch_optimizers for b in plan.global_batches
        for k in ("ssgd", "adpsgd")}
    assert all(r["rounds"] == 0 for r in batch if r["backend"] == "ssgd")
    assert all(r["rounds"] > 0 for r in batch if r["backend"] == "adpsgd")
    gap = json.loads((small_run / "science_gap.json").read_text())["rows"]
    for row in gap:  # zero-LR gossip contracts, and the gap is the topology module's
        mix = row["mixing"]
        assert 0 <= mix["measured_rate"] < 1 and 0 < mix["spectral_gap"] <= 1
        assert mix["distance"][-1] < mix["distance"][0]
    fixed = {r["learners"]: r["mixing"]["spectral_gap"] for r in gap if r["topology"] == "ring"}
    assert fixed[8] < fixed[4]  # the fixed ring's gap shrinks as learners are added
    hier = json.loads((small_run / "science_hier.json").read_text())
    assert [r["members"] for r in hier["rows"]] == [8, 2]  # 8 flat learners; 2 nodes of 4
    delay = json.loads((small_run / "science_delay.json").read_text())["rows"]
    for row in [*gap, *delay, *hier["rows"], hier["ssgd"]]:  # the plan's seeds, each kept
        assert [run["seed"] for run in row["seeds"]] == list(range(1, plan.seeds + 1)), row
        assert row["heldout_loss"] == row["seeds"][0]["heldout_loss"]  # one seed: its run
    # SSGD beside them: no point of (a) at 8 learners in the small plan, so simulated there
    assert hier["ssgd"]["members"] == 1 and hier["ssgd"]["from"] == "hier"
    assert hier["ssgd"]["global_batch"] == plan.hier_learners * plan.per_learner
    real = json.loads((small_run / "science_real.json").read_text())["rows"]
    assert [(r["experiment"], r["backend"], r.get("delay_by_one", False)) for r in real] == [
        ("batch", "ssgd", False), ("delay", "adpsgd", True), ("hier", "hadpsgd", False)]
    assert all(len(r["runs"]) == plan.real_runs for r in real)
    runs = [run for r in real for run in r["runs"]]
    assert all(run["real"]["frames_per_s"] > 0 and run["pace"]["step_s"] > 0 for run in runs)
    for run in runs:  # each epoch's shares of the work, from the run's epoch record
        for epoch in run["real"]["epochs"]:
            assert len(epoch["samples_per_learner"]) == plan.real_learners, epoch
            assert sum(epoch["samples_per_learner"]) > 0, epoch
    # SSGD: the simulator is the real trainer's arithmetic (tests/test_simulate.py: to 1e-5)
    for run in real[0]["runs"]:
        assert run["simulated"]["heldout_loss"] == pytest.approx(run["real"]["heldout_loss"],
                                                                 abs=2e-3)
    # the steps an epoch of (a)'s table: every learner the same, SSGD and AD-PSGD alike
    assert all(r["epoch_steps"] and min(r["epoch_steps"]) > 0 for r in batch)


def table_rows(table: str) -> list[str]:
    lines = table.splitlines()
    assert lines[1].startswith("|---"), table
    return lines[2:]


@pytest.mark.timeout(1800)
def test_every_table_renders_the_small_run_and_its_compact_copy(small_run: Path) -> None:
    """docs/science.md's table of each experiment (science.table_<name>) has a row per point
    of the run, and renders the same from the compact copy written to --docs (what is
    committed), which keeps no long trajectory and says how it was made."""
    docs = small_run.parent / "docs"
    expected_rows = {"batch": lambda r: len({(x["optimizer"], x["learners"], x["global_batch"])
                                             for x in r["rows"]}),
                     "gap": lambda r: len(r["rows"]), "delay": lambda r: len(r["rows"]),
                     "hier": lambda r: len(r["rows"]) + 1,  # and SSGD at the same batch
                     "real": lambda r: len(r["rows"])}
    for name in EXPERIMENTS:
        result = json.loads((small_run / f"science_{name}.json").read_text())
        table = science.TABLES[name](result)
        rows = table_rows(table)
        assert len(rows) == expected_rows[name](result), (name, table)
        assert all(row.startswith("| ") and row.endswith(" |") for row in rows), table
        path = docs / "science" / f"science_{name}.json"
        assert path.stat().st_size < 64_000, (name, path.stat().st_size)
        committed = json.loads(path.read_text())
        assert science.TABLES[name](committed) == table, name
        assert "--size small" in committed["command"] and committed["wall_s"] > 0
        assert committed["label_prior_loss"] == result["label_prior_loss"]
        assert str(REPO) not in path.read_text()  # paths relative to the checkout
        assert not any(len(v) > science.KEEP for v in lists_named(committed, science.LONG))
        assert (docs / "img" / f"science_{name}.png").stat().st_size > 1000, name
        pairs = science.TABLES.get(f"{name}_pairs")
        if pairs is not None:  # the compared pairs' differences: from the compact copy too
            assert pairs(committed) == pairs(result) and table_rows(pairs(result)), name


def lists_named(x: object, keys: tuple[str, ...]) -> list[list]:
    """Every list in ``x`` under one of ``keys``, however deep."""
    if isinstance(x, dict):
        return [v for k, v in x.items() if k in keys and isinstance(v, list)] + [
            found for v in x.values() for found in lists_named(v, keys)]
    if isinstance(x, list):
        return [found for v in x for found in lists_named(v, keys)]
    return []


@pytest.mark.timeout(600)
def test_the_seed_reaches_the_simulation(small_run: Path, one_thread: None) -> None:
    """A training point's seed is the trainer's and the simulator's: the same seed gives the
    same run, another seed another run (gap / delay / hier run each point with every seed).
    The first run is the small run's own (batch's AD-PSGD point at 4 learners, seed 1, made in
    science.py's process): the same point simulated here again gives its loss to the bit. In
    one thread, as science.py's main simulates (conftest's one_thread)."""
    base = science.ensure_exp(small_run.parent / "exp")
    plan = science.SMALL
    batch = json.loads((small_run / "science_batch.json").read_text())["rows"]
    row = next(r for r in batch if (r["optimizer"], r["learners"], r["global_batch"],
                                    r["backend"]) == (plan.optimizer, 4, 4 * plan.per_learner,
                                                      "adpsgd"))
    assert row["seeds"][0]["seed"] == 1
    first = row["seeds"][0]["heldout_loss"]

    def loss(seed: int) -> float:
        return science.training_point(base, plan, 4, plan.per_learner, plan.optimizer,
                                      seed=seed, backend="adpsgd")["heldout_loss"]
    assert loss(1) == first
    assert loss(2) != first


@pytest.mark.timeout(600)
def test_an_experiment_done_for_the_same_plan_is_not_run_again(small_run: Path) -> None:
    before = (small_run / "science_hier.json").read_bytes()
    proc = subprocess.run([sys.executable, "bench/science.py", "--size", "small", "--only", "hier",
                           "--out", str(small_run), "--exp", str(small_run.parent / "exp"),
                           "--no-docs"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hier: done before" in proc.stdout
    assert (small_run / "science_hier.json").read_bytes() == before
    assert (small_run / "science_hier.png").is_file()
