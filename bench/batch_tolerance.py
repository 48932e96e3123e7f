"""Claim (a) at this task's scale (issue 24 item 1; the plan and the rule: docs/science.md,
"(a) at this task's scale"), step by step, each step's runs kept in ``--out`` and not run again:

    python bench/batch_tolerance.py --hours 4 --steps noise baseline sweep --out DIR

- ``noise``: the gradient noise scale (bench/noise_scale.py) at the initial model;
- ``baseline``: one learner at a batch of 32 chunks, the LR grid with seed 1, then seeds 2 and 3
  at the chosen LR; the noise scale after the chosen run's first epoch gives B_noise;
- ``sweep``: 16 simulated learners, SSGD and AD-PSGD (randomized ring) at B_noise x {1, 4, 16},
  both LR scalings with seed 1, then seeds 2 and 3 with the better; the verdict by the rule;
- ``real``: the deciding batch (:func:`deciding_batch`) with 8 real gloo learners, both
  methods, seeds 1 and 2, at the simulated point's LR; alone, with a summary in ``--out`` that
  has the sweep (the committed docs/science/batch_tolerance.json copied there), it takes the
  deciding point from it and runs only the real runs.

Every run is the simulator (asrtrain.simulate) on bench/science.py's scaled corpus and small
hybrid BLSTM, with SGD and momentum 0.9 and the recipe's warm-up and annealing; one JSON a run
under ``--out/runs/``, and ``--out/batch_tolerance.json`` with what the steps decided.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import noise_scale
import science
import torch

from asrtrain.fileio import atomic_open, write_text

EPOCHS = 4
BASE_BATCH = 32
LR_GRID = (0.05, 0.1, 0.2, 0.4)
SEEDS = (1, 2, 3)
LEARNERS = 16
REAL_LEARNERS = 8
MULTIPLES = (1, 4, 16)
SCALINGS = {"sqrt": math.sqrt, "linear": lambda k: k}
NOISE = {"small": 8, "big": 256, "draws": 16}


def run_point(base: list[str], out: Path, tag: str, *, learners: int, backend: str,
              global_batch: int, lr: float, seed: int, epochs: int = EPOCHS) -> dict:
    """One simulated run (kept as ``runs/<tag>.json`` and its consensus model ``.pt``)."""
    path = out / "runs" / f"{tag}.json"
    if path.is_file():
        return json.loads(path.read_text())
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.engine import SimConfig, Simulator
    from asrtrain.simulate.workload import TaskWorkload, system_config

    overrides = [*base, *science.TINY_MODEL, f"hybrid.trainer.epochs={epochs}",
                 f"hybrid.trainer.batch_chunks={global_batch // learners}",
                 "trainer.optimizer=sgd", f"hybrid.trainer.lr={lr:.6g}",
                 f"trainer.seed={seed}", "trainer.topology=random_ring"]
    cfg = system_config(compose_recipe(science.RECIPE, overrides), "hybrid")
    start = time.perf_counter()
    sim = Simulator(SimConfig(learners=learners, backend=backend, epochs=epochs, seed=seed,
                              grad_clip=5.0, log_every=50, **science.PACE), TaskWorkload(cfg))
    traj = sim.run().to_json()
    row = {"tag": tag, "learners": learners, "backend": backend, "global_batch": global_batch,
           "lr": lr, "seed": seed, "epochs": traj["epochs"],
           "heldout_loss": traj["epochs"][-1]["heldout_loss"],
           "wall_s": time.perf_counter() - start, "overrides": overrides[len(base):]}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path.with_suffix(".pt"), "wb") as f:
        torch.save(sim.final_state(), f)
    write_text(path, json.dumps(row, indent=1) + "\n")
    print(f"{tag}: held-out {row['heldout_loss']:.4f} ({row['wall_s']:.0f} s)", flush=True)
    return row


def noise_at(base: list[str], out: Path, name: str, model: Path | None) -> dict:
    path = out / f"noise_{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    from asrtrain.recipe import compose_recipe

    cfg = compose_recipe(science.RECIPE, [*base, *science.TINY_MODEL])
    state = torch.load(model, map_location="cpu") if model else None
    result = {**noise_scale.measure(cfg, model_state=state, **NOISE), "model": str(model or "")}
    write_text(path, json.dumps(result, indent=1) + "\n")
    print(f"noise scale ({name}): {result['b_simple']:.1f} +- {result['b_simple_se']:.1f} "
          "chunks", flush=True)
    return result


def baseline(base: list[str], out: Path) -> dict:
    grid = [run_point(base, out, f"base_lr{lr:g}_s1", learners=1, backend="ssgd",
                      global_batch=BASE_BATCH, lr=lr, seed=1) for lr in LR_GRID]
    best = min(grid, key=lambda r: r["heldout_loss"])
    lr = best["lr"]
    seeds = [best, *(run_point(base, out, f"base_lr{lr:g}_s{s}", learners=1, backend="ssgd",
                               global_batch=BASE_BATCH, lr=lr, seed=s) for s in SEEDS[1:])]
    # the noise scale after the first epoch of the chosen LR (seed 1), from a run of one epoch
    one = run_point(base, out, f"base_lr{lr:g}_s1_e1", learners=1, backend="ssgd",
                    global_batch=BASE_BATCH, lr=lr, seed=1, epochs=1)
    noise = noise_at(base, out, "epoch1", out / "runs" / f"{one['tag']}.pt")
    losses = [r["heldout_loss"] for r in seeds]
    return {"lr_grid": {f"{r['lr']:g}": r["heldout_loss"] for r in grid}, "lr": lr,
            "losses": losses, "mean": statistics.mean(losses), "sd": statistics.stdev(losses),
            "noise_epoch1": noise["b_simple"],
            "b_noise": 2 ** round(math.log2(noise["b_simple"]))}


def tolerates(losses: list[float], base: dict) -> bool:
    """The rule (docs/science.md): within max(2 se of the difference of means, 2%)."""
    n, m = len(losses), len(base["losses"])
    se = math.sqrt(statistics.variance(losses) / n + base["sd"] ** 2 / m)
    return statistics.mean(losses) <= base["mean"] + max(2 * se, 0.02 * base["mean"])


def sweep(base: list[str], out: Path, b0: dict, multiples=MULTIPLES) -> dict:
    rows = []
    for k in multiples:
        batch = round(b0["b_noise"] * k)
        if batch % LEARNERS:
            raise SystemExit(f"global batch {batch} is not a multiple of {LEARNERS} learners")
        for backend in ("ssgd", "adpsgd"):
            first = {name: run_point(base, out, f"{backend}_B{batch}_{name}_s1",
                                     learners=LEARNERS, backend=backend, global_batch=batch,
                                     lr=b0["lr"] * f(batch / BASE_BATCH), seed=1)
                     for name, f in SCALINGS.items()}
            kept = min(first, key=lambda n: first[n]["heldout_loss"])
            runs = [first[kept], *(run_point(
                base, out, f"{backend}_B{batch}_{kept}_s{s}", learners=LEARNERS,
                backend=backend, global_batch=batch, lr=first[kept]["lr"], seed=s)
                for s in SEEDS[1:])]
            losses = [r["heldout_loss"] for r in runs]
            rows.append({"backend": backend, "global_batch": batch, "multiple": k,
                         "scaling": kept, "lr": first[kept]["lr"],
                         "other_scaling_loss": first[next(n for n in first if n != kept)][
                             "heldout_loss"],
                         "losses": losses, "mean": statistics.mean(losses),
                         "sd": statistics.stdev(losses), "tolerates": tolerates(losses, b0)})
    return {"rows": rows, **decide(rows)}


def decide(rows: list[dict]) -> dict:
    """T_M, the largest batch M tolerates with every smaller one of the grid, and the verdict
    (docs/science.md): supported if AD-PSGD's is larger than SSGD's, refuted if smaller."""
    largest = {}
    for backend in ("ssgd", "adpsgd"):
        largest[backend] = 0
        for row in sorted((r for r in rows if r["backend"] == backend),
                          key=lambda r: r["global_batch"]):
            if not row["tolerates"]:
                break
            largest[backend] = row["global_batch"]
    verdict = ("supported" if largest["adpsgd"] > largest["ssgd"] else
               "refuted" if largest["adpsgd"] < largest["ssgd"] else "inconclusive")
    return {"largest_tolerated": largest, "verdict": verdict}


def deciding_batch(sweep_result: dict) -> int:
    """The smallest batch of the grid that one method tolerates and the other does not; the
    largest of the grid if there is none."""
    by = {(r["backend"], r["global_batch"]): r["tolerates"] for r in sweep_result["rows"]}
    batches = sorted({b for _, b in by})
    split = [b for b in batches if by[("ssgd", b)] != by[("adpsgd", b)]]
    return split[0] if split else batches[-1]


def real(base: list[str], out: Path, sweep_result: dict, exp: Path) -> dict:
    """Both methods at the deciding batch with REAL_LEARNERS real gloo learners (``asrtrain
    run ... --stage train_hybrid``), at the simulated point's kept LR, seeds 1 and 2."""
    import subprocess

    batch = deciding_batch(sweep_result)
    rows = []
    for backend in ("ssgd", "adpsgd"):
        point = next(r for r in sweep_result["rows"]
                     if r["backend"] == backend and r["global_batch"] == batch)
        for seed in SEEDS[:2]:
            tag = f"real_{backend}_B{batch}_s{seed}"
            path = out / "runs" / f"{tag}.json"
            if path.is_file():
                rows.append(json.loads(path.read_text()))
                continue
            name = f"bt_{tag}"
            overrides = [*base, *science.TINY_MODEL, f"hybrid.model.name={name}",
                         f"hybrid.trainer.epochs={EPOCHS}",
                         f"hybrid.trainer.batch_chunks={batch // REAL_LEARNERS}",
                         "trainer.optimizer=sgd", f"hybrid.trainer.lr={point['lr']:.6g}",
                         f"trainer.seed={seed}", f"trainer.backend={backend}",
                         f"trainer.learners={REAL_LEARNERS}", "trainer.topology=random_ring",
                         "trainer.threads=1"]
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "asrtrain.cli", "run",
                                   str(science.RECIPE), *overrides, "--stage", "train_hybrid",
                                   "--to", "train_hybrid", "--force", "train_hybrid"],
                                  cwd=science.REPO, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"batch_tolerance: real run {tag} failed:\n"
                                 f"{proc.stderr[-3000:]}")
            final = torch.load(exp / "train" / name / "final.pt", map_location="cpu",
                               weights_only=False)
            row = {"tag": tag, "backend": backend, "global_batch": batch, "seed": seed,
                   "learners": REAL_LEARNERS, "lr": point["lr"], "scaling": point["scaling"],
                   "heldout_loss": float(final["metrics"]["dev_loss"]),
                   "simulated_mean": point["mean"], "wall_s": time.perf_counter() - start}
            write_text(path, json.dumps(row, indent=1) + "\n")
            print(f"{tag}: held-out {row['heldout_loss']:.4f} ({row['wall_s']:.0f} s)",
                  flush=True)
            rows.append(row)
    mean = {b: statistics.mean(r["heldout_loss"] for r in rows if r["backend"] == b)
            for b in ("ssgd", "adpsgd")}
    sim = {r["backend"]: r["mean"] for r in sweep_result["rows"] if r["global_batch"] == batch}
    agrees = (mean["adpsgd"] < mean["ssgd"]) == (sim["adpsgd"] < sim["ssgd"])
    return {"global_batch": batch, "rows": rows, "mean": mean, "simulated_mean": sim,
            "same_order_as_simulated": agrees}


def table(summary: dict) -> str:
    """docs/science.md's table of the rescaled sweep, from the summary JSON."""
    b0 = summary["baseline"]
    lines = ["| run | global batch (chunks) | LR scaling kept (other's seed-1 loss) | LR | "
             "held-out loss, seeds 1 / 2 / 3 | mean ± sd | tolerates |",
             "|---|---|---|---|---|---|---|",
             f"| one learner (baseline) | {summary['base_batch']} | — | {b0['lr']:g} | "
             + " / ".join(f"{v:.4f}" for v in b0["losses"])
             + f" | {b0['mean']:.4f} ± {b0['sd']:.4f} | — |"]
    for r in summary.get("sweep", {}).get("rows", []):
        lines.append(f"| {r['backend']} x {summary['learners']} | {r['global_batch']:,} | "
                     f"{r['scaling']} ({r['other_scaling_loss']:.4f}) | {r['lr']:.4g} | "
                     + " / ".join(f"{v:.4f}" for v in r["losses"])
                     + f" | {r['mean']:.4f} ± {r['sd']:.4f} | "
                     f"{'yes' if r['tolerates'] else 'no'} |")
    return "\n".join(lines)


def table_real(summary: dict) -> str:
    """docs/science.md's table of the real gloo runs at the summary's real point."""
    lines = ["| run | global batch | LR | seed | held-out loss | wall |",
             "|---|---|---|---|---|---|"]
    for r in summary["real"]["rows"]:
        lines.append(f"| {r['backend']} x {r['learners']} | {r['global_batch']:,} | "
                     f"{r['lr']:g} | {r['seed']} | {r['heldout_loss']:.4f} | "
                     f"{r['wall_s']:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--steps", nargs="+", choices=("noise", "baseline", "sweep", "real"),
                    default=["noise", "baseline", "sweep", "real"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--multiples", type=float, nargs="+", default=list(MULTIPLES),
                    help="the sweep's batches as multiples of B_noise (default: the plan's)")
    ap.add_argument("--summary", default="batch_tolerance.json",
                    help="the summary's file name in --out (another grid: another name; the "
                         "runs are shared)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    exp = science.SCIENCE_DIR / f"exp-{args.hours:g}h"
    base = science.ensure_exp(exp, science.corpus_overrides(args.hours, science.SCIENCE_DIR))
    summary_path = args.out / args.summary
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    summary.update(hours=args.hours, epochs=EPOCHS, base_batch=BASE_BATCH, learners=LEARNERS,
                   multiples=args.multiples)
    if "noise" in args.steps:
        summary["noise_init"] = noise_at(base, args.out, "init", None)["b_simple"]
    # ``real`` alone takes the deciding point from a summary in --out that has the sweep (e.g.
    # the committed docs/science/batch_tolerance.json copied there): its runs are not needed
    reuse = "sweep" not in args.steps and "sweep" in summary
    if "baseline" in args.steps or "sweep" in args.steps or (
            "real" in args.steps and not reuse and "baseline" not in summary):
        summary["baseline"] = baseline(base, args.out)
    if "sweep" in args.steps or ("real" in args.steps and not reuse):
        summary["sweep"] = sweep(base, args.out, summary["baseline"], args.multiples)
    if "real" in args.steps:
        summary["real"] = real(base, args.out, summary["sweep"], exp)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(summary_path, json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("sweep", "real")}, indent=1))
    print(table(summary))
    if "sweep" in summary:
        print(f"claim (a): {summary['sweep']['verdict']} (largest tolerated batch "
              f"{summary['sweep']['largest_tolerated']})")


if __name__ == "__main__":
    sys.exit(main())
