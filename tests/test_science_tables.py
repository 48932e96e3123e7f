"""docs/science.md's tables of bench/science.py's experiments are that script's table_<name> of
the committed compact results, docs/science/science_<name>.json (written by `python
bench/science.py --full` and `--quick`), and its table "Agreement with the real backends" is
bench/sim_agreement.py's of docs/science/sim_agreement.json: a figure in those tables can be
checked without a rerun. A missing JSON fails: the doc's tables have nothing behind them then."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import science  # bench/science.py (conftest puts bench/ on the path)
import sim_agreement  # bench/sim_agreement.py

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "science.md"
COMMITTED = REPO / "docs" / "science"

# (the JSON's name, the table, the heading the table follows in the doc, which table after it)
CASES = [
    ("batch", "batch", "### (a) Batch tolerance", 0),
    ("batch", "batch_pairs", "### (a) Batch tolerance", 1),
    ("gap", "gap", "### (b) Spectral gap, randomized ring, exponential graph", 0),
    ("gap", "gap_pairs", "### (b) Spectral gap, randomized ring, exponential graph", 1),
    ("delay", "delay", "### Delay-by-one, with and without a straggler", 0),
    ("delay", "delay_pairs", "### Delay-by-one, with and without a straggler", 1),
    ("hier", "hier", "### (c) H-AD-PSGD", 0),
    ("hier", "hier_pairs", "### (c) H-AD-PSGD", 1),
    ("real", "real", "### Real multi-process confirmation at 8 learners", 0),
    ("quick", "quick_batch", "## Quick experiments", 0),
    ("quick", "quick_gap", "## Quick experiments", 1),
]


def section_tables(text: str, heading: str) -> list[list[str]]:
    """The tables (their lines) of the section that starts at the line beginning with
    ``heading``, up to the next heading of its level or above."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(heading)]
    assert len(starts) == 1, f"{heading!r}: {len(starts)} headings in {DOC}"
    level = len(heading) - len(heading.lstrip("#"))
    tables: list[list[str]] = []
    current: list[str] = []
    for line in lines[starts[0] + 1:]:
        hashes = len(line) - len(line.lstrip("#"))
        if 0 < hashes <= level and line[hashes:hashes + 1] == " ":
            break
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


@pytest.mark.parametrize(("name", "table", "heading", "index"), CASES,
                         ids=[case[1] for case in CASES])
def test_the_docs_table_is_the_committed_json(name: str, table: str, heading: str,
                                              index: int) -> None:
    path = COMMITTED / f"science_{name}.json"
    assert path.is_file(), f"{path} is not committed: run python bench/science.py " \
        f"{'--quick' if name == 'quick' else '--full'}"
    committed = json.loads(path.read_text())
    tables = section_tables(DOC.read_text(), heading)
    assert len(tables) > index, f"{heading!r}: {len(tables)} tables"
    assert tables[index] == getattr(science, f"table_{table}")(committed).splitlines()


@pytest.mark.parametrize("name", ["batch", "gap", "delay", "hier", "real", "quick"])
def test_the_committed_json_is_compact_and_says_how_it_was_made(name: str) -> None:
    path = COMMITTED / f"science_{name}.json"
    assert path.is_file(), f"{path} is not committed"
    # small: under 100 kB (batch, the largest: 28 points x 3 seeds, each seed's epochs kept)
    assert path.stat().st_size < 100_000, path.stat().st_size
    committed = json.loads(path.read_text())
    mode = "--quick" if name == "quick" else "--full"
    assert committed["command"].startswith("python bench/science.py") and \
        mode in committed["command"]
    assert committed["wall_s"] > 0 and committed["label_prior_loss"] > 0
    if name != "quick":
        assert committed["plan"]["name"] == "full"
        assert committed["plan"]["real_runs"] == science.FULL.real_runs
    if name in ("batch", "gap", "delay", "hier"):  # each training point with every seed
        assert committed["plan"]["seeds"] == science.FULL.seeds >= 3
        rows = [*committed["rows"], committed.get("ssgd") or committed["rows"][0]]
        for row in rows:
            assert [run["seed"] for run in row["seeds"]] == \
                list(range(1, science.FULL.seeds + 1)), row
            if "skipped" not in row:
                losses = [run["heldout_loss"] for run in row["seeds"]]
                assert row["heldout_loss"] == pytest.approx(sum(losses) / len(losses))
                assert len(set(losses)) == len(losses), row  # the seeds are different runs


@pytest.mark.parametrize("name", ["batch", "gap", "delay", "hier", "real"])
def test_full_with_the_committed_json_copied_in_reruns_nothing(name: str) -> None:
    """Each committed result was made for the plan `--full` runs (its key: the fields the
    experiment reads), so `bench/science.py --full` with them in --out runs none again."""
    assert science.done_before(COMMITTED / f"science_{name}.json", science.FULL, name) \
        is not None


def test_the_real_points_read_no_seeds(tmp_path: Path) -> None:
    """real runs each point real_runs times with one seed: a result made under a plan with
    other seeds (or none, before Plan.seeds) is still the plan's; not so for the seeded ones."""
    plan = json.loads(json.dumps(asdict(science.FULL)))
    for seeds in (None, 1, 5):
        other = {k: v for k, v in plan.items() if k != "seeds"}
        if seeds is not None:
            other["seeds"] = seeds
        path = tmp_path / f"science_{seeds}.json"
        path.write_text(json.dumps({"plan": other, "rows": []}))
        assert science.done_before(path, science.FULL, "real") is not None
        for name in ("batch", "gap", "delay", "hier", None):
            assert science.done_before(path, science.FULL, name) is None, name
    assert science.plan_key(plan, "real") == {k: v for k, v in plan.items() if k != "seeds"}


def test_the_agreement_table_is_the_committed_json() -> None:
    """docs/science.md's "Agreement with the real backends" is bench/sim_agreement.py's table of
    docs/science/sim_agreement.json, which has every check and says how it was made."""
    path = COMMITTED / "sim_agreement.json"
    assert path.is_file(), f"{path} is not committed: run python bench/sim_agreement.py"
    assert path.stat().st_size < 64_000, path.stat().st_size
    committed = json.loads(path.read_text())
    assert set(committed["checks"]) == set(sim_agreement.CHECKS)
    assert committed["command"].startswith("python bench/sim_agreement.py")
    assert set(committed["runs"]) == set(sim_agreement.CHECKS)
    for run in committed["runs"].values():  # each check's command, wall time and load
        assert run["command"].startswith("python bench/sim_agreement.py") and run["wall_s"] > 0
    tables = section_tables(DOC.read_text(), "## Agreement with the real backends")
    assert tables and tables[0] == sim_agreement.table_sim_agreement(committed).splitlines()


def test_the_difference_of_two_points_over_seeds() -> None:
    """docs/science.md's compared pairs: the difference of the means ± the standard error of
    the difference, sqrt(s1^2/n + s2^2/n), and the difference in those."""
    a = {"seeds": [{"heldout_loss": v} for v in (1.0, 1.2, 1.1)]}   # mean 1.1, sd 0.1
    b = {"seeds": [{"heldout_loss": v} for v in (0.9, 0.9, 0.9)]}   # mean 0.9, sd 0
    d = science.difference(a, b)
    assert d["difference"] == pytest.approx(0.2) and d["n"] == [3, 3]
    assert d["se"] == pytest.approx(0.1 / 3 ** 0.5) and d["z"] == pytest.approx(2 * 3 ** 0.5)
    for row in (a, b):
        row["heldout_loss"] = sum(r["heldout_loss"] for r in row["seeds"]) / 3
    assert science._pairs_table([("a − b", a, b), ("none", a, {"skipped": "x"})]).splitlines() \
        == ["| compared (first − second) | held-out loss, first / second | difference ± se | "
            "standard errors | seeds |", "|---|---|---|---|---|",
            "| a − b | 1.100 / 0.900 | +0.200 ± 0.058 | +3.5 | 3 |", "| none | — | — | — | — |"]
    one = science.difference({"heldout_loss": 1.0}, b)  # a single run: no spread to weigh
    assert one["se"] is None and one["z"] is None and one["difference"] == pytest.approx(0.1)


def test_a_point_over_seeds() -> None:
    """science.over_seeds: the final and each epoch's held-out loss as mean and sd over the
    seeds, every seed's run kept; a point one seed cannot run is skipped."""
    runs = [{"seed": s, "heldout_loss": v, "epochs": [{"epoch": 1, "heldout_loss": 2 * v},
                                                     {"epoch": 2, "heldout_loss": v}],
             "rounds": r, "distance": 0.1, "simulated_s": 5.0, "epoch_steps": [3, 3],
             "spectral_gap": 0.5, "members": 4, "wall_s": 1.0}
            for s, v, r in ((1, 1.0, 10), (2, 1.2, 12), (3, 1.1, 13))]
    row = science.over_seeds(runs)
    assert row["heldout_loss"] == pytest.approx(1.1) and row["heldout_sd"] == pytest.approx(0.1)
    assert row["epochs"][0]["heldout_loss"] == pytest.approx(2.2)
    assert row["epochs"][0]["heldout_sd"] == pytest.approx(0.2)
    assert row["rounds"] == 12 and row["rounds_range"] == [10, 13] and row["wall_s"] == 3.0
    assert row["seeds"] == runs and science._loss_sd(row) == "1.100 ± 0.100"
    assert science.over_seeds([runs[0]])["heldout_sd"] is None
    assert "skipped" in science.over_seeds([runs[0], {"seed": 2, "skipped": "too few"}])


def test_the_quick_tables_on_known_figures() -> None:
    """table_quick_batch / table_quick_gap on a made-up result (the --quick run is minutes:
    not run by the suite)."""
    result = {"batch_tolerance": [
        {"backend": b, "learners": 16, "global_batch": g, "heldout_loss": loss}
        for g, pair in ((64, (1.8371, 2.6069)), (1024, (3.9712, 4.004)))
        for b, loss in zip(("ssgd", "adpsgd"), pair, strict=True)],
        "spectral_gap": [
            {"topology": "ring", "learners": 16, "rounds": 9, "spectral_gap": 0.0989,
             "predicted_rate": 0.9011, "measured_rate": 0.8121,
             "zero_lr_distance": [1.0, 0.9, 0.8, 0.7]},
            {"topology": "exponential", "learners": 16, "rounds": 9, "spectral_gap": 0.25,
             "predicted_rate": 0.75, "measured_rate": 0.0071,
             "zero_lr_distance": [1.0, 0.5, 0.2, 3e-8, 2e-8]}]}
    assert science.table_quick_batch(result).splitlines() == [
        "| global batch (chunks) | SSGD held-out loss | AD-PSGD (random ring) |",
        "|---|---|---|",
        "| 64 (16 x 4) | 1.837 | 2.607 |",
        "| 1,024 (16 x 64) | 3.971 | 4.004 |"]
    assert science.table_quick_gap(result).splitlines()[2:] == [
        "| fixed ring | 0.099 | 0.901 | 0.812 |",
        "| exponential graph | 0.250 | 0.750 | 0.007 (exact consensus after 4 rounds) |"]
    assert science.table_quick_gap(result).splitlines()[0].endswith("| measured over 9 rounds |")


def test_number_formats() -> None:
    assert science._sci(0.0482) == "4.8e-2" and science._sci(0.26) == "2.6e-1"
    assert science._signed(-0.0008) == "-0.0008" and science._signed(0.046) == "+0.046"
    assert science._optimizer_label("adam", science.OPTIMIZERS) == "Adam 1e-3"
    assert science._optimizer_label("sgd", science.OPTIMIZERS) == "SGD 0.5, momentum 0.9"
