"""docs/science.md's "Agreement with the real backends": every row of its table, run here and
written to one JSON (``docs/science/sim_agreement.json`` by default), whose
:func:`table_sim_agreement` is the doc's table (tests/test_sim_agreement_table.py holds the doc to
it)::

    python bench/sim_agreement.py [--exp exp/science/exp-tiny] [--only CHECK ...] [--out JSON]

The checks are tests/test_simulate.py's, with their figures kept instead of asserted:

- ``ssgd_hybrid`` / ``ssgd_ctc``: SSGD with 4 real gloo learners (``asrtrain run ...
  trainer.backend=ssgd trainer.learners=4``, torchrun) against ``asrtrain simulate ... --learners
  4 --backend ssgd``, the tiny hybrid and CTC BLSTMs (1 x 32), 2 epochs: the largest weight
  difference and both dev losses;
- ``ssgd_synthetic``: SSGD with 4 synthetic learners (bench/synthetic.py) against the simulator
  on the same MLP, batches, SGD and LR: the largest weight difference;
- ``zero_lr``: AD-PSGD (fixed ring, randomized ring, exponential graph with delay-by-one) and
  H-AD-PSGD (4 nodes of 2) at zero LR from each learner's own model, out of step: the consensus
  distance after every drain against the simulator's after as many rounds;
- ``learning_synthetic``: AD-PSGD, AD-PSGD with delay-by-one and H-AD-PSGD (2 nodes of 2) with
  learning, 4 synthetic learners at 30 ms a step, seeds 0-3, real against simulated held-out
  MSE; and what moves a real run with one seed (AD-PSGD run three times with each seed) and
  without the 30 ms a step (two runs a seed);
- ``learning_hybrid``: AD-PSGD with learning on the tiny hybrid BLSTM (1 x 32), 4 learners, 16
  chunks each, 2 epochs, seeds 1-5: real (``asrtrain run ... trainer.backend=adpsgd``) against
  ``asrtrain simulate ... --step-s 0.017 --exchange-s 0.025 --jitter 0.3`` (the pace the doc
  states), and simulated SSGD at the same settings.

The hybrid checks run in ``--exp`` (default exp/science/exp-tiny: the tiny corpus's features and
bench/science.py's small GMM alignments, made there when missing, as ``--quick`` makes them).
With ``--only``, the other checks are kept from the JSON already at ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import science  # bench/science.py (this file's folder is on the path)
import synthetic  # bench/synthetic.py
import torch

from asrtrain.fileio import write_text

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "science" / "sim_agreement.json"
DIM, HIDDEN, EXAMPLES = 8, 16, 256
LEARN = ["--steps", "40", "--batch", "36", "--lr", "0.1", "--decay-samples", "1e9",
         "--sleep", "0.03"]
SEEDS = range(4)
# (backend, learners, per_node, topology, delay-by-one) of the zero-LR consensus checks
ZERO_LR = [("adpsgd", 4, 1, "ring", False), ("adpsgd", 4, 1, "random_ring", False),
           ("adpsgd", 4, 1, "exponential", True), ("hadpsgd", 8, 2, "random_ring", False)]
# (backend, per_node, delay-by-one) of the learning checks on the synthetic MLP
LEARNING = [("adpsgd", 1, False), ("adpsgd", 1, True), ("hadpsgd", 2, False)]
TINY_HYBRID = ["hybrid.model.layers=1", "hybrid.model.cells=32", "hybrid.model.bottleneck=16"]
SSGD_RUN = [*TINY_HYBRID, "hybrid.trainer.batch_chunks=16", "hybrid.trainer.epochs=2"]
CTC_RUN = ["model.layers=1", "model.cells=32", "model.bottleneck=16", "trainer.epochs=2",
           "trainer.batch_frames=4000"]
HYBRID_SEEDS = range(1, 6)
HYBRID_PACE = ["--step-s", "0.017", "--exchange-s", "0.025", "--jitter", "0.3"]
CHECKS = ("ssgd_hybrid", "ssgd_ctc", "ssgd_synthetic", "zero_lr", "learning_synthetic",
          "learning_hybrid")


# -- the synthetic learners and their simulated twin (tests/test_simulate.py's) -------------------

class SyntheticWorkload:
    """bench/synthetic.py's learner as a simulator workload: the same MLP, data, global batches
    (learner r takes ``[r::world]`` of step s's), SGD with momentum and inverse-decay LR."""

    def __init__(self, steps: int, batch: int, lr: float, decay: float, seed: int = 0) -> None:
        self.model = synthetic.make_model(DIM, HIDDEN, seed)
        self.x, self.y = synthetic.make_data(EXAMPLES, DIM, seed)
        self.steps, self.batch, self.lr0, self.decay = steps, batch, lr, decay

    def epoch_steps(self, epoch: int, world: int) -> int:
        return self.steps

    def batches(self, epoch: int, rank: int, world: int) -> Iterator:
        for step in range(self.steps):
            idx = synthetic.global_batch(step, self.batch, EXAMPLES)[rank::world]
            yield self.x[idx], self.y[idx]

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def samples(self, batch) -> int:
        return len(batch[0])

    def heldout_loss(self, model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(self.x), self.y))

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr0, momentum=0.9)

    def lr(self, global_samples: int) -> float:
        return synthetic.lr_at(self.lr0, global_samples, self.decay)


def spawn(out: Path, learners: int, *args: str) -> list[dict]:
    """``learners`` synthetic gloo learners (bench/synthetic.py's run_local) with ``args``:
    each learner's stats. A learner that fails raises AssertionError naming its error files."""
    torch.set_num_threads(1)
    codes = synthetic.run_local(out, learners, args, 90.0)
    if codes != dict.fromkeys(range(learners), 0):
        raise AssertionError(f"{codes}: {sorted(out.glob('error*'))}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(learners)]


def heldout(state: dict[str, torch.Tensor], seed: int) -> float:
    """The synthetic task's held-out MSE of a model state (the data of ``seed``)."""
    work = SyntheticWorkload(1, 1, 0.0, 1.0, seed)
    work.model.load_state_dict(state)
    return work.heldout_loss(work.model)


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - v.double()).abs().max()) for k, v in b.items())


# -- the checks ------------------------------------------------------------------------------------

def check_ssgd_synthetic(tmp: Path) -> dict:
    from asrtrain.simulate.engine import SimConfig, Simulator

    spawn(tmp, 4, "--backend", "ssgd", "--steps", "12", "--batch", "12", "--lr", "0.1",
          "--decay-samples", "50")
    real = torch.load(tmp / "rank0.pt")
    sim = Simulator(SimConfig(4, "ssgd", speed="hetero:0.5"),
                    SyntheticWorkload(12, 12, 0.1, 50.0))
    sim.run()
    return {"learners": 4, "steps": 12,
            "largest_weight_difference": _largest_difference(sim.final_state(), real["final"]),
            "smallest_weight_change": min(float((v - real["initial"][k]).abs().max())
                                          for k, v in real["final"].items())}


def zero_lr_point(tmp: Path, backend: str, learners: int, per_node: int, scheme: str,
                  delay_by_one: bool) -> dict:
    """The consensus distance after every drain of real learners at zero LR against the
    simulator's after as many rounds (the count learner 0 logs is an upper bound: the match is
    the nearest of it and the 2 rounds before, as in tests/test_simulate.py)."""
    from asrtrain.simulate.engine import SimConfig, Simulator

    stats = spawn(tmp, learners, "--backend", backend, "--per-node", str(per_node),
                  "--topology", scheme, "--steps", "24", "--log-every", "4", "--no-sync-init",
                  "--lr", "0", "--batch", "16", "--sleep", "0.005", "--jitter", "0.01",
                  "--idle", "0.02", "--seed", "2", *(["--delay-by-one"] if delay_by_one else []))
    points = stats[0]["distances"]  # (step, distance, rounds) after a drain
    rounds = max(p[2] for p in points)
    starts = [torch.nn.utils.parameters_to_vector(
        synthetic.make_model(DIM, HIDDEN, 2 + 1000 * (r + 1)).parameters()).detach()
        for r in range(0, learners, per_node)]  # each node's leader
    sim = Simulator(SimConfig(learners, backend, per_node=per_node, topology=scheme, seed=2,
                              delay_by_one=delay_by_one, idle_s=1e9, log_every=1),
                    SyntheticWorkload(rounds + 1, 16, 0.0, 1.0, seed=2),
                    initial=lambda m: starts[m])
    first = sim.distance()
    traj = sim.run()
    by_round = {0: first, **{p["rounds"]: p["distance"] for p in traj.points}}
    matched = []
    for step, distance, r in points:
        near = {q: abs(distance - by_round[q]) for q in range(max(0, r - 2), r + 1)
                if q in by_round}
        best = min(near, key=near.get) if near else None
        matched.append({"step": step, "distance": distance, "rounds_logged": r,
                        "matched_round": best,
                        "simulated": by_round[best] if near else None,
                        "difference": near[best] if near else None})
    # float32 rounding: below a millionth of the first distance the models are equal to it
    above = [m for m in matched if m["step"] > 0 and m["distance"] > 1e-6 * first]
    return {"backend": backend, "learners": learners, "per_node": per_node, "topology": scheme,
            "delay_by_one": delay_by_one, "rounds": rounds,
            "simulated_rounds": max(by_round), "first_distance": first, "drains": matched,
            "unmatched": sum(m["matched_round"] is None for m in matched),
            "above_rounding": len(above),
            "largest_relative_difference": max((m["difference"] / m["simulated"] for m in above
                                                if m["simulated"]), default=None),
            "largest_difference_at_rounding": max(
                (m["difference"] / first for m in matched
                 if m["step"] > 0 and m not in above and m["simulated"] is not None),
                default=None),
            "at_the_logged_count": sum(m["matched_round"] == m["rounds_logged"]
                                       for m in matched),
            "smallest_distance_fraction": min(by_round.values()) / first}


def check_zero_lr(tmp: Path) -> dict:
    rows = []
    for i, point in enumerate(ZERO_LR):
        out = tmp / f"zero{i}"
        out.mkdir()
        rows.append(zero_lr_point(out, *point))
        print(f"  zero LR {point}: largest relative difference "
              f"{rows[-1]['largest_relative_difference']} over {rows[-1]['above_rounding']} "
              f"drains above rounding, {rows[-1]['unmatched']} unmatched", flush=True)
    return {"rows": rows}


def synthetic_run(out: Path, backend: str, per_node: int, delay_by_one: bool, seed: int,
                  learn: list[str]) -> dict:
    out.mkdir(parents=True)
    stats = spawn(out, 4, *learn, "--backend", backend, "--per-node", str(per_node),
                  "--seed", str(seed), *(["--delay-by-one"] if delay_by_one else []))
    return {"seed": seed, "heldout_mse": heldout(torch.load(out / "consensus.pt"), seed),
            "rounds": [s["rounds"] for s in stats[::per_node]],
            "step_ms": 1000 * statistics.mean(s["elapsed"] / s["steps"] for s in stats)}


def check_learning_synthetic(tmp: Path) -> dict:
    from asrtrain.simulate.engine import SimConfig, Simulator

    rows = []
    for backend, per_node, delay_by_one in LEARNING:
        real, sim = [], []
        for seed in SEEDS:
            name = f"{backend}_{per_node}_{int(delay_by_one)}_s{seed}"
            real.append(synthetic_run(tmp / name, backend, per_node, delay_by_one, seed, LEARN))
            s = Simulator(SimConfig(4, backend, per_node=per_node, delay_by_one=delay_by_one,
                                    seed=seed, step_s=0.03, jitter=0.2, exchange_s=0.005,
                                    log_every=0),
                          SyntheticWorkload(40, 36, 0.1, 1e9, seed))
            traj = s.run()
            sim.append({"seed": seed, "heldout_mse": traj.epochs[-1]["heldout_loss"],
                        "rounds": traj.epochs[-1]["rounds"]})
        rows.append({"backend": backend, "per_node": per_node, "delay_by_one": delay_by_one,
                     "real": real, "simulated": sim})
        print(f"  learning {backend} per_node={per_node} delay_by_one={delay_by_one}: real "
              f"{[round(r['heldout_mse'], 4) for r in real]}, simulated "
              f"{[round(r['heldout_mse'], 4) for r in sim]}", flush=True)
    start = statistics.mean(heldout(synthetic.make_model(DIM, HIDDEN, s).state_dict(), s)
                            for s in SEEDS)
    # run to run with one seed: AD-PSGD's real runs twice more a seed (the first is above)
    repeats = {str(seed): [rows[0]["real"][seed]["heldout_mse"]] for seed in SEEDS}
    for run in (2, 3):
        for seed in SEEDS:
            repeats[str(seed)].append(synthetic_run(tmp / f"repeat{run}_s{seed}", "adpsgd", 1,
                                                    False, seed, LEARN)["heldout_mse"])
    # without the 30 ms a step: the learners' own pace (a step of milliseconds), two runs a seed
    fast = [synthetic_run(tmp / f"fast{run}_s{seed}", "adpsgd", 1, False, seed,
                          LEARN[:-2]) for run in (1, 2) for seed in SEEDS]
    return {"rows": rows, "initial_mse": start, "repeats": repeats, "no_sleep": fast}


def asrtrain(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "asrtrain.cli", *args], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench/sim_agreement.py: asrtrain {' '.join(args[:2])} failed:\n"
                         f"{proc.stderr[-3000:]}")
    return proc


def real_and_simulated(recipe: list[str], exp: Path, tmp: Path, system: str, settings: list[str],
                       name: str, backend: str, pace: list[str]) -> dict:
    """One run of ``asrtrain run`` with 4 real learners and one of ``asrtrain simulate`` with
    4 simulated learners at the same settings: the final models and dev losses."""
    stage = "train_hybrid" if system == "hybrid" else "train"
    key = "hybrid.model.name" if system == "hybrid" else "model.name"
    t = time.perf_counter()
    asrtrain("run", str(science.RECIPE), *recipe, "--stage", stage, "--to", stage, *settings,
             f"{key}={name}", f"trainer.backend={backend}", "trainer.learners=4", "--force",
             stage)
    real_s = time.perf_counter() - t
    trained = torch.load(exp / "train" / name / "final.pt", map_location="cpu",
                         weights_only=False)
    rates, gossip = science.learner_figures(exp / "train" / name)
    out = tmp / f"{name}.json"
    t = time.perf_counter()
    asrtrain("simulate", str(science.RECIPE), *recipe, *settings, "--system", system,
             "--learners", "4", "--backend", backend, *pace, "--log-every", "20",
             "--out", str(out))
    sim_s = time.perf_counter() - t
    traj = json.loads(out.read_text())
    simulated = torch.load(out.with_suffix(".pt"))
    return {"real": {"dev_loss": trained["metrics"]["dev_loss"],
                     "global_samples": trained["metrics"]["global_samples"],
                     "frames_per_s": statistics.mean(rates) if rates else None,
                     "exchanges_per_s": [min(gossip), max(gossip)] if gossip else None,
                     "wall_s": real_s},
            "simulated": {"dev_loss": traj["epochs"][-1]["heldout_loss"],
                          "samples": traj["epochs"][-1]["samples"],
                          "rounds": traj["epochs"][-1]["rounds"],
                          "wall_s": sim_s},
            "largest_weight_difference": _largest_difference(simulated, trained["model"])}


def check_ssgd_model(system: str, recipe: list[str], exp: Path, tmp: Path) -> dict:
    settings = SSGD_RUN if system == "hybrid" else CTC_RUN
    row = real_and_simulated(recipe, exp, tmp, system, settings, f"sa_{system}_ssgd", "ssgd", [])
    return {"system": system, "settings": settings, **row}


def check_learning_hybrid(recipe: list[str], exp: Path, tmp: Path) -> dict:
    runs = []
    for seed in HYBRID_SEEDS:
        settings = [*SSGD_RUN, f"trainer.seed={seed}"]
        row = real_and_simulated(recipe, exp, tmp, "hybrid", settings, f"sa_adpsgd_s{seed}",
                                 "adpsgd", HYBRID_PACE)
        ssgd = tmp / f"sa_ssgd_sim_s{seed}.json"
        asrtrain("simulate", str(science.RECIPE), *recipe, *settings, "--learners", "4",
                 "--backend", "ssgd", "--log-every", "20", "--out", str(ssgd))
        row["simulated_ssgd"] = json.loads(ssgd.read_text())["epochs"][-1]["heldout_loss"]
        runs.append({"seed": seed, **row})
        print(f"  hybrid AD-PSGD seed {seed}: real {row['real']['dev_loss']:.4f} "
              f"({row['real']['wall_s']:.0f} s), simulated {row['simulated']['dev_loss']:.4f}, "
              f"simulated SSGD {row['simulated_ssgd']:.4f}", flush=True)
    return {"settings": SSGD_RUN, "pace": HYBRID_PACE, "runs": runs}


# -- the doc's table -------------------------------------------------------------------------------

def _values(values: list[float], digits: int) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def _learning_cells(row: dict, first: bool) -> list[str]:
    real = [r["heldout_mse"] for r in row["real"]]
    sim = [r["heldout_mse"] for r in row["simulated"]]
    spread = max(real) - min(real)
    apart = abs(statistics.mean(sim) - statistics.mean(real))
    real_cell = (f"{'held-out MSE ' if first else ''}{_values(real, 4)} "
                 f"(mean {statistics.mean(real):.4f}; range {spread:.4f})")
    within = "within" if apart <= spread else "outside"
    verdict = f"means {apart:.4f} apart, {within} the real runs' range over seeds"
    return [real_cell, f"{_values(sim, 4)} (mean {statistics.mean(sim):.4f})",
            verdict + (" (the test's criterion)" if first else "")]


def _paired(real: list[float], sim: list[float]) -> str:
    diffs = [r - s for r, s in zip(real, sim, strict=True)]
    lower, higher = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    if lower == len(diffs):
        return f"paired by seed the simulator is lower every time (by {min(diffs):.3f}–" \
               f"{max(diffs):.3f})"
    if higher == len(diffs):
        return f"paired by seed the simulator is higher every time (by {-max(diffs):.3f}–" \
               f"{-min(diffs):.3f})"
    return f"paired by seed the simulator is higher in {higher} of {len(diffs)}, lower in " \
           f"{lower} (real − simulated {min(diffs):+.3f} to {max(diffs):+.3f})"


def table_sim_agreement(result: dict) -> str:
    """docs/science.md's table "Agreement with the real backends", from the JSON of this
    script's run."""
    c = result["checks"]
    lines = ["| check | real | simulator | agreement |", "|---|---|---|---|"]

    def ssgd_cell(row: dict) -> str:
        real, sim = row["real"]["dev_loss"], row["simulated"]["dev_loss"]
        both = f"{real:.4f} both" if f"{real:.4f}" == f"{sim:.4f}" else \
            f"{real:.4f} and {sim:.4f}"
        return f"largest weight difference {science._sci(row['largest_weight_difference'])}; " \
               f"dev loss {both} (the test: 1e-5)"

    h, ctc = c["ssgd_hybrid"], c["ssgd_ctc"]
    lines.append("| SSGD, tiny hybrid BLSTM (1 x 32), 4 learners, 16 chunks each, Adam, clipping, "
                 "2 epochs | `asrtrain run ... trainer.backend=ssgd trainer.learners=4` "
                 "(torchrun) | `asrtrain simulate ... --learners 4 --backend ssgd` | "
                 f"{ssgd_cell(h)} |")
    lines.append("| SSGD, tiny CTC BLSTM (1 x 32), 4 learners, 4,000 frames each, the recipe's "
                 "SpecAugment, 2 epochs | `asrtrain run ... --stage train trainer.backend=ssgd "
                 "trainer.learners=4` | `asrtrain simulate --system ctc ...` | "
                 f"{ssgd_cell(ctc)} |")
    s = c["ssgd_synthetic"]
    lines.append("| SSGD, synthetic MLP (`bench/synthetic.py`), 4 learners, 12 steps | "
                 "`synthetic.run_local` | the same model, batches, SGD and LR | largest weight "
                 f"difference {science._sci(s['largest_weight_difference'])} (the test: 1e-5) |")
    z = c["zero_lr"]["rows"]
    worst = max(r["largest_relative_difference"] for r in z
                if r["largest_relative_difference"] is not None)
    above = sum(r["above_rounding"] for r in z)
    drains = sum(len(r["drains"]) - 1 for r in z)  # the first is the start
    rounding = max(r["largest_difference_at_rounding"] or 0.0 for r in z)
    lines.append("| AD-PSGD, zero LR, 4 learners from their own models, uneven delays; H-AD-PSGD, "
                 "8 learners in 4 nodes of 2 | consensus distance after every drain (every 4 "
                 "steps) | after as many rounds | largest relative difference "
                 f"{science._sci(worst)} over the {above} of {drains} drains above float rounding "
                 "(a millionth of the start); the others (exact consensus or rounding) within "
                 f"{science._sci(rounding)} of the start (the test: 1e-4 relative, 1e-7 of the "
                 "start); for the fixed ring, the randomized ring, the exponential graph with "
                 "delay-by-one, and H-AD-PSGD's randomized ring |")
    names = {("adpsgd", 1, False): "AD-PSGD with learning, synthetic MLP, 4 learners, 40 steps "
                                   "at 30 ms, seeds 0–3",
             ("adpsgd", 1, True): "the same, AD-PSGD with delay-by-one",
             ("hadpsgd", 2, False): "the same, H-AD-PSGD, 2 nodes of 2"}
    for i, row in enumerate(c["learning_synthetic"]["rows"]):
        name = names[(row["backend"], row["per_node"], row["delay_by_one"])]
        lines.append(f"| {name} | " + " | ".join(_learning_cells(row, i == 0)) + " |")
    runs = c["learning_hybrid"]["runs"]
    real = [r["real"]["dev_loss"] for r in runs]
    sim = [r["simulated"]["dev_loss"] for r in runs]
    sd = statistics.stdev(real)
    apart = abs(statistics.mean(real) - statistics.mean(sim))
    within = "within one sd" if apart <= sd else f"{apart / sd:.1f} sd"
    seeds = f"{runs[0]['seed']}–{runs[-1]['seed']}"
    lines.append("| AD-PSGD with learning, tiny hybrid BLSTM (1 x 32), 4 learners, 16 chunks each, "
                 f"2 epochs, seeds {seeds} | dev loss {_values(real, 3)} (mean "
                 f"{statistics.mean(real):.3f}, sd {sd:.3f}) | {_values(sim, 3)} (mean "
                 f"{statistics.mean(sim):.3f}, sd {statistics.stdev(sim):.3f}) | means "
                 f"{apart:.3f} apart, {within} of the real runs; {_paired(real, sim)} |")
    return "\n".join(lines)


# -- the command -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp", type=Path, default=science.SCIENCE_DIR / "exp-tiny",
                   help="the tiny experiment dir (features and small alignments, made there "
                        "when missing)")
    p.add_argument("--only", nargs="+", choices=CHECKS, default=list(CHECKS))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    command = " ".join(["python bench/sim_agreement.py",
                        *(sys.argv[1:] if argv is None else argv)]).replace(f"{REPO}/", "")
    torch.set_num_threads(1)
    start, load_start = time.perf_counter(), science.load()
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    checks = dict(previous.get("checks", {})) if set(args.only) != set(CHECKS) else {}
    runs = dict(previous.get("runs", {})) if checks else {}
    exp = args.exp.resolve()
    recipe: list[str] = []
    if {"ssgd_hybrid", "ssgd_ctc", "learning_hybrid"} & set(args.only):
        recipe = science.ensure_exp(exp)
    with tempfile.TemporaryDirectory(prefix="sim_agreement") as tmp_dir:
        tmp = Path(tmp_dir)
        for name in args.only:
            t, load_before = time.perf_counter(), science.load()
            print(f"== {name}", flush=True)
            work = tmp / name
            work.mkdir()
            if name in ("ssgd_hybrid", "ssgd_ctc"):
                checks[name] = check_ssgd_model(name.split("_")[1], recipe, exp, work)
            elif name == "learning_hybrid":
                checks[name] = check_learning_hybrid(recipe, exp, work)
            else:
                checks[name] = globals()[f"check_{name}"](work)
            runs[name] = {"wall_s": time.perf_counter() - t, "load": [load_before,
                                                                       science.load()],
                          "command": command, "code": science.code_state()}
            print(f"{name}: {runs[name]['wall_s']:.0f} s", flush=True)
            result = {"checks": checks, "runs": runs, "exp": str(exp).replace(f"{REPO}/", ""),
                      "command": command}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_text(args.out, json.dumps(result, indent=1) + "\n")
    result.update(wall_s=time.perf_counter() - start, process_wall_s=science.process_age(),
                  cpu_s=science.cpu_s(), load=[load_start, science.load()])
    write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}: {result['process_wall_s']:.0f} s since the process started, "
          f"{result['cpu_s']:.0f} CPU-s, load {load_start:g} -> {result['load'][1]:g}")
    if set(checks) == set(CHECKS):
        print(table_sim_agreement(result))


if __name__ == "__main__":
    main()
