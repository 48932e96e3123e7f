"""bench/noise_scale.py: the estimator recovers a known gradient noise scale from sampled
gradients, and the tool measures the tiny hybrid task (the session's tiny_tri1 exp dir) in this
process; bench/batch_tolerance.py's decision rule (docs/science.md) on known figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import noise_scale  # bench/noise_scale.py (conftest puts bench/ on the path)
import pytest
import small
import torch

from asrtrain import AsrtrainError
from asrtrain.recipe import compose_recipe

REPO = Path(__file__).resolve().parents[1]


def test_the_estimator_recovers_a_known_noise_scale() -> None:
    """Per-sample gradients G + e, e ~ N(0, diag(s^2)): tr(Sigma) = sum(s^2), and B_simple =
    tr(Sigma) / |G|^2 is known; the draws are made as the tool makes them (B/b batches of b)."""
    gen = torch.Generator().manual_seed(0)
    dim, b, big, draws = 40, 4, 64, 400
    g_true = torch.full((dim,), 0.5, dtype=torch.float64)          # |G|^2 = 10
    sd = torch.linspace(0.5, 2.0, dim, dtype=torch.float64)        # tr(Sigma) = sum(sd^2)
    small_sqs, big_sqs = [], []
    for _ in range(draws):
        samples = g_true + sd * torch.randn(big, dim, generator=gen, dtype=torch.float64)
        batches = samples.reshape(big // b, b, dim).mean(1)
        small_sqs.append(float((batches ** 2).sum(1).mean()))
        big_sqs.append(float(batches.mean(0).pow(2).sum()))
    est = noise_scale.estimate(sum(small_sqs) / draws, sum(big_sqs) / draws, b, big)
    trace = float((sd ** 2).sum())
    assert est.grad_sq == pytest.approx(10.0, rel=0.05)
    assert est.trace == pytest.approx(trace, rel=0.05)
    assert est.b_simple == pytest.approx(trace / 10.0, rel=0.08)
    se = noise_scale.jackknife(small_sqs, big_sqs, b, big)
    assert 0 < se < 0.08 * est.b_simple
    # the naive ratio at one batch size is not the noise scale: the estimator is not trivial
    assert abs(est.small_sq / est.big_sq - est.b_simple) > 1


def test_estimate_refuses_batches_out_of_order() -> None:
    with pytest.raises(ValueError, match="small < big"):
        noise_scale.estimate(1.0, 0.5, 8, 8)
    assert noise_scale.estimate(1.0, 0.4, 4, 8).b_simple == math.inf  # |G|^2 estimated <= 0


def test_the_tiny_hybrid_task_has_a_noise_scale(tiny_tri1: Path) -> None:
    """The initial model, batches of 4 and 32 chunks, 6 draws: finite, positive estimates, and
    a held-out loss of the untrained model near the uniform guess (ln of the pdfs)."""
    overrides = [f"exp_dir={tiny_tri1}", *small.overrides("tri1"), *small.overrides("hybrid")]
    cfg = compose_recipe(REPO / "recipes" / "tiny", overrides)
    torch.set_num_threads(1)
    result = noise_scale.measure(cfg, 4, 32, 6)
    assert result["draws"] == 6 and result["small"] == 4 and result["big"] == 32
    assert result["grad_sq"] > 0 and result["trace"] > 0
    assert 0 < result["b_simple"] < math.inf and result["b_simple_se"] > 0
    assert result["small_sq"] > result["big_sq"]   # a small batch's gradient is the noisier
    assert abs(result["heldout_loss"] - math.log(result["num_pdfs"])) < 1.0, result
    with pytest.raises(AsrtrainError, match="multiple of --small"):
        noise_scale.measure(cfg, 4, 30, 2)


def test_the_batch_tolerance_rule_and_verdict() -> None:
    """bench/batch_tolerance.py's rule as docs/science.md states it: within max(2 se of the
    difference of means, 2% of the baseline); T_M stops at the first batch not tolerated."""
    import batch_tolerance as bt

    base = {"losses": [1.00, 1.02, 0.98], "mean": 1.0, "sd": 0.02}
    assert bt.tolerates([1.015, 1.02, 1.025], base)         # +2%: the relative margin
    assert not bt.tolerates([1.05, 1.05, 1.06], base)       # beyond both margins
    noisy = [0.9, 1.2, 1.05]                                # mean 1.05, a large spread
    assert bt.tolerates(noisy, base)                        # within 2 se of the difference

    def rows(ssgd: list[bool], adpsgd: list[bool]) -> list[dict]:
        return [{"backend": b, "global_batch": g, "tolerates": t}
                for b, ts in (("ssgd", ssgd), ("adpsgd", adpsgd))
                for g, t in zip((128, 512, 2048), ts, strict=True)]

    assert bt.decide(rows([True, False, False], [True, True, False])) == {
        "largest_tolerated": {"ssgd": 128, "adpsgd": 512}, "verdict": "supported"}
    assert bt.decide(rows([True, True, True], [True, False, True]))["verdict"] == "refuted"
    assert bt.decide(rows([False, True, True], [False, True, True])) == {
        "largest_tolerated": {"ssgd": 0, "adpsgd": 0}, "verdict": "inconclusive"}


@pytest.mark.parametrize(("name", "heading"), [
    ("batch_tolerance.json", "### (a) at this task's scale, measured"),
    ("batch_tolerance_below.json", "**Below the noise scale, run after the verdict**")])
def test_claim_a_table_and_verdict_are_the_committed_json(name: str, heading: str) -> None:
    """docs/science.md's tables of the rescaled sweep are bench/batch_tolerance.py's table of
    the committed summaries, and every 'tolerates' and verdict in them are the rule's on their
    losses."""
    import batch_tolerance as bt

    committed = json.loads((REPO / "docs" / "science" / name).read_text())
    text = (REPO / "docs" / "science.md").read_text()
    start = text.index(heading)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    assert rows == bt.table(committed).splitlines()
    base, sweep = committed["baseline"], committed["sweep"]
    assert base["lr"] == float(min(base["lr_grid"], key=base["lr_grid"].get))
    for row in sweep["rows"]:
        assert row["tolerates"] == bt.tolerates(row["losses"], base), row
    assert bt.decide(sweep["rows"]) == {k: sweep[k] for k in ("largest_tolerated", "verdict")}
    if "real" in committed:
        assert committed["real"]["global_batch"] == bt.deciding_batch(sweep)
        # the real runs' table: the next after the sweep's whose header is the real one's
        real = bt.table_real(committed).splitlines()
        rest = text[start:].splitlines()
        at = rest.index(real[0])
        got = [line for line in rest[at:at + len(real) + 1] if line.startswith("|")]
        assert got == real


def test_real_alone_takes_the_deciding_point_from_the_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--steps real`` with a summary in --out that has the sweep (the committed one copied
    there) runs no baseline or sweep run: the deciding point is the summary's; without one it
    runs them first."""
    import batch_tolerance as bt
    import science

    calls: list[str] = []
    monkeypatch.setattr(science, "ensure_exp", lambda exp, corpus=None: [])
    monkeypatch.setattr(science, "corpus_overrides", lambda hours, root: [])
    committed = json.loads((REPO / "docs" / "science" / "batch_tolerance.json").read_text())
    monkeypatch.setattr(bt, "baseline", lambda base, out: calls.append("baseline")
                        or committed["baseline"])
    monkeypatch.setattr(bt, "sweep", lambda base, out, b0, multiples: calls.append("sweep")
                        or committed["sweep"])

    def real(base: list[str], out: Path, sweep: dict, exp: Path) -> dict:
        calls.append("real")
        return {"global_batch": bt.deciding_batch(sweep)}
    monkeypatch.setattr(bt, "real", real)
    (tmp_path / "batch_tolerance.json").write_text(json.dumps(committed))
    bt.main(["--steps", "real", "--out", str(tmp_path)])
    assert calls == ["real"]
    written = json.loads((tmp_path / "batch_tolerance.json").read_text())
    assert written["sweep"] == committed["sweep"]
    assert written["real"] == {"global_batch": bt.deciding_batch(committed["sweep"])}
    calls.clear()
    bt.main(["--steps", "real", "--out", str(tmp_path / "empty")])
    assert calls == ["baseline", "sweep", "real"]
