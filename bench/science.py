"""The convergence experiments of issue 14, run through the cluster simulator (asrtrain.simulate).

    python bench/science.py --full  [--out bench/results]   # all experiments, scaled corpus
    python bench/science.py --quick [--out bench/results]   # one small point of (a) and (b)
    python bench/science.py --size small --out DIR          # all experiments, seconds (tests)

``--full`` makes a scaled corpus (``data/tiny/make_tiny.py --hours 2`` into exp/science/, ignored
by git), its features and small GMM alignments, and trains a small hybrid BLSTM (1 x 32 cells)
through the simulator in every experiment of the issue:

- ``batch``: held-out loss after ``epochs`` epochs against the global batch (256 to 12,288
  chunks), SSGD against AD-PSGD, 16 and 64 learners, with the recipe's Adam and with the papers'
  SGD with momentum;
- ``gap``: fixed ring, randomized ring and exponential graph at 16, 64 and 128 learners: loss
  against epochs, and the consensus distance at zero learning rate round by round against the
  spectral gap's prediction;
- ``delay``: delay-by-one with and without a 4x straggler;
- ``hier``: H-AD-PSGD with nodes of 4 and 8 against flat AD-PSGD at the same learner count;
- ``real``: one point of each at 8 learners as real gloo processes (``asrtrain run ... --stage
  train_hybrid trainer.backend=... trainer.learners=8``), ``real_runs`` times each (2 in
  ``--full``), every run beside the simulator at the same settings and the pace it logged.

batch, gap, delay and hier run each training point with seeds 1..``seeds`` (3 in ``--full``: the
trainer's and the simulator's seed, :func:`training_point`); a row keeps every seed's run under
``seeds`` and carries the mean and sd of the held-out loss (:func:`over_seeds`); the tables show
mean ± sd and ``table_<name>_pairs`` each compared pair's difference ± its standard error. The
zero-LR mixing runs are deterministic and run once a point; ``real`` runs each point
``real_runs`` times with one seed (what moves is the gossip's timing) and reads no ``seeds``.

Each experiment writes ``science_<name>.json`` and ``.png`` under ``--out``; an experiment whose
JSON is there for the same plan is not run again (``--redo`` runs it anyway). ``--size small`` is
the same code on the committed tiny corpus with a few learners and one epoch
(tests/test_bench_science.py).

Unless ``--no-docs``, the PNGs are copied to ``<docs>/img/`` and a compact copy of each result
(no long trajectories; the command that made it, its wall time and the load) is written to
``<docs>/science/science_<name>.json`` (``--docs``, default docs/): docs/science.md's tables of
these experiments are the ``table_<name>`` functions below of those files
(tests/test_science_tables.py holds the doc to them).

Every loss is the held-out frame cross-entropy in nats; each result records the label-prior
loss (the entropy of the training alignments' pdf prior: what predicting the prior scores), which
the plots draw as a line.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import forked_cli  # bench/forked_cli.py: commands forked warm
import torch

from asrtrain.fileio import atomic_open, write_text

_LOADED = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "tiny"
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs"   # --docs: PNGs to <docs>/img, the compact JSONs to <docs>/science
MAKE_CORPUS = REPO / "data" / "tiny" / "make_tiny.py"
SCIENCE_DIR = REPO / "exp" / "science"
LEARNERS = 16
EPOCHS = 6
TINY_MODEL = ["hybrid.model.layers=1", "hybrid.model.cells=32", "hybrid.model.bottleneck=16"]
MODEL = [*TINY_MODEL, f"hybrid.trainer.epochs={EPOCHS}"]
# The GMM passes of tests/test_e2e.py (ALIGN_SMALL): enough to give the hybrid model targets.
# Every pass after tri1 is deleted (align_overrides), whatever the recipe lists.
ALIGN_OPTIONS = ["align.decode=false",
                 "align.passes.mono.num_iters=4", "align.passes.mono.totgauss=300",
                 "align.passes.mono.realign_iters=[1,2,3]", "align.passes.tri1.num_leaves=60",
                 "align.passes.tri1.num_gauss=300", "+align.passes.tri1.num_iters=4",
                 "+align.passes.tri1.realign_iters=[2]"]
# The stages the experiments (and tests/test_simulate.py) need: none the recipe may add besides
# (i-vectors, decoding), which train_hybrid would then read.
STAGES = "stages=[prepare,lang,features,train,lm,mfcc,align,train_hybrid]"
TOPOLOGIES = ("ring", "random_ring", "exponential")
# The simulated pace of the experiments (seconds): gossip keeps up with compute, as in the
# papers' regime; the delay experiment makes an exchange cost half a step.
PACE = {"step_s": 0.1, "exchange_s": 0.02, "jitter": 0.2, "idle_s": 0.1}
# The optimizers: the tiny recipe's Adam, and the papers' SGD with momentum 0.9 (its LR picked
# on the tiny corpus: SSGD at batch 256 after 4 epochs, 0.05 -> 5.53, 0.2 -> 4.57, 0.8 -> 3.05;
# docs/science.md). The LR is the value at a global batch of 256, scaled by sqrt(B / 256).
OPTIMIZERS = {"adam": {"optimizer": "adam", "lr": 1.0e-3},
              "sgd": {"optimizer": "sgd", "lr": 0.5}}
BASE_BATCH = 256

#: The real experiment's points (:func:`real_points`), in the order they run.
REAL_POINTS = ("batch_ssgd", "batch_adpsgd", "gap", "delay", "hier")


@dataclass(frozen=True)
class Plan:
    """What ``--full`` (or ``--size small``) runs."""

    name: str
    hours: float | None        # the scaled corpus; None: the committed tiny corpus
    epochs: int
    batch_learners: tuple[int, ...]
    global_batches: tuple[int, ...]
    batch_optimizers: tuple[str, ...]
    optimizer: str             # the optimizer of the other experiments
    per_learner: int           # chunks per learner and step in gap / delay / hier / real
    min_per_learner: int       # batch: points with fewer chunks per learner are left out
    gap_learners: tuple[int, ...]
    mixing_rounds: int
    delay_learners: int
    hier_learners: int
    hier_nodes: tuple[int, ...]
    real_learners: int
    real_epochs: int
    real_runs: int             # real: each point this many times (its run-to-run spread)
    seeds: int                 # batch / gap / delay / hier: each training point with seeds 1..seeds
    # real: the points run (:func:`real_points`' names); a field added later, so a result made
    # before it was made with its default (:func:`done_before`)
    real_points: tuple[str, ...] = REAL_POINTS


FULL = Plan("full", 2.0, 2, (16, 64), (256, 1024, 4096, 12288), ("adam", "sgd"), "sgd", 16, 8,
            (16, 64, 128), 24, 64, 64, (4, 8), 8, 2, 2, 3)
# The small plan (tests/test_bench_science.py): each experiment's code with the points its tests
# read, (a) with both optimizers at one global batch (the same point as the seed test's, 4 x 16
# chunks), no point of (a) at 8 learners (hier simulates its SSGD), and the real points of the
# three backends, AD-PSGD's with delay-by-one (the fixed ring and the undelayed AD-PSGD run as
# real learners in tests/test_distributed.py and tests/test_e2e.py).
SMALL = Plan("small", None, 1, (4,), (64,), ("adam", "sgd"), "sgd", 16, 4, (4, 8), 6, 8, 8,
             (4,), 2, 1, 1, 1, ("batch_ssgd", "delay", "hier"))
PLANS = {"full": FULL, "small": SMALL}


# -- the experiment dir ----------------------------------------------------------------------------

def align_overrides(base: list[str]) -> list[str]:
    """Small GMM passes: mono and tri1 with few iterations, every later pass the recipe has
    deleted (the recipe may gain passes; an override list naming only tri2 would break)."""
    from asrtrain.recipe import compose_recipe

    # the settings only: stages the experiments leave out (decode_gmm, fmllr) are refused in a
    # stage list with train_hybrid until the overrides made here take the need away
    names = list(compose_recipe(RECIPE, [*base, "stages=[prepare]"]).align.passes)
    later = names[names.index("tri1") + 1:] if "tri1" in names else []
    return [*(f"~align.passes.{n}" for n in later), *ALIGN_OPTIONS]


def recipe_overrides(base: list[str]) -> list[str]:
    """:func:`align_overrides`, and the hybrid model's input kept to the 40 log-mel filterbanks
    (what docs/science.md's runs had) where the recipe gives it features of its own (fMLLR of a
    SAT pass, i-vectors: passes and stages the experiments leave out)."""
    from asrtrain.recipe import compose_recipe

    hybrid_features = "features" in compose_recipe(RECIPE, [*base, "stages=[prepare]"]).hybrid
    return [*align_overrides(base),
            *(["features@hybrid.features=fbank40"] if hybrid_features else [])]


def corpus_overrides(hours: float | None, root: Path) -> list[str]:
    """The scaled corpus of ``hours`` (made under ``root`` when missing); [] for the tiny one."""
    if hours is None:
        return []
    corpus = root / f"corpus-{hours:g}h"
    if not (corpus / "corpus.json").is_file():
        print(f"making a {hours:g} h corpus in {corpus} (data/tiny/make_tiny.py)", flush=True)
        subprocess.run([sys.executable, str(MAKE_CORPUS), "--hours", f"{hours:g}",
                        "--test-hours", "0.03", "--out", str(corpus)], cwd=REPO, check=True)
    manifest = json.loads((corpus / "corpus.json").read_text())
    dev = max(40, manifest["train"]["segments"] // 20)
    return [f"corpus.root={corpus}", f"corpus.expected_test_sides={manifest['test']['sides']}",
            f"corpus.dev_utts={dev}"]


def ensure_exp(exp: Path, corpus: list[str] | None = None) -> list[str]:
    """The overrides that point the recipe at ``exp``, after making its features and small
    alignments there when it has none (not the CTC model: the span skips ``train``)."""
    base = [f"exp_dir={exp}", *(corpus or []), "nj=2", STAGES]
    overrides = [*base, *recipe_overrides(base)]
    if (exp / ".done" / "align").is_file():
        return overrides
    print(f"making features and alignments in {exp} (asrtrain run)", flush=True)
    for span in (["--to", "features"], ["--stage", "lm", "--to", "align"]):
        proc = forked_cli.run("run", str(RECIPE), *overrides, *span, timeout=None)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        if proc.returncode:
            raise SystemExit(f"bench/science.py: asrtrain run {' '.join(span)} failed")
    return overrides


# -- one simulation --------------------------------------------------------------------------------

def simulate(overrides: list[str], initial_seeds: bool = False, **sim: object) -> dict:
    """One simulation of the tiny hybrid task: its trajectory (a dict)."""
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.engine import SimConfig, Simulator
    from asrtrain.simulate.workload import TaskWorkload, system_config

    cfg = system_config(compose_recipe(RECIPE, overrides), "hybrid")
    work = TaskWorkload(cfg)
    sim_cfg = SimConfig(**{"learners": LEARNERS, "epochs": EPOCHS, "step_s": 0.1,
                           "grad_clip": 5.0, **sim})
    start = time.perf_counter()
    own = own_models(cfg, work.task.input_dim, work.task.output_dim) if initial_seeds else None
    traj = Simulator(sim_cfg, work, initial=own).run()
    out = traj.to_json()
    out["config"]["wall_s"] = time.perf_counter() - start
    out["config"]["epoch_steps"] = [work.epoch_steps(e, sim_cfg.learners)
                                    for e in range(1, sim_cfg.epochs + 1)]
    return out


def label_prior_loss(overrides: list[str]) -> float:
    """The held-out loss's reference for an untrained model: the entropy (nats) of the pdf
    prior of the training alignments (the hybrid task's own priors, as FrameCETask counts them),
    i.e. the frame CE of always predicting the prior."""
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.workload import system_config
    from asrtrain.train.tasks import build_task

    task = build_task(system_config(compose_recipe(RECIPE, [*overrides, *TINY_MODEL]), "hybrid"))
    log_p = torch.from_numpy(task.priors).double()
    return float(-(log_p.exp() * log_p).sum())


def own_models(cfg, input_dim: int, output_dim: int) -> Callable[[int], torch.Tensor]:
    """Each member's own random model (for mixing from a spread start)."""
    from asrtrain.models import build_model

    def own_model(member: int) -> torch.Tensor:
        torch.manual_seed(1000 + member)
        model = build_model(cfg.model, input_dim, output_dim)
        return torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    return own_model


class MixingWorkload:
    """The hybrid model's parameters with no data: every gradient is zero and the learning
    rate is zero, so a simulation is pure gossip (a round is the schedule's ``W_r``), at the
    cost of the averaging alone. ``steps`` steps an epoch, one round after each."""

    def __init__(self, model: torch.nn.Module, steps: int) -> None:
        self.model, self.steps = model, steps

    def epoch_steps(self, epoch: int, world: int) -> int:
        return self.steps

    def batches(self, epoch: int, rank: int, world: int) -> Iterator[None]:
        while True:
            yield None

    def loss(self, model: torch.nn.Module, batch: None) -> torch.Tensor:
        return sum(p.sum() for p in model.parameters()) * 0.0

    def samples(self, batch: None) -> int:
        return 1

    def heldout_loss(self, model: torch.nn.Module) -> float:
        return 0.0

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.0)

    def lr(self, global_samples: int) -> float:
        return 0.0


def mixing(base: list[str], learners: int, topology: str, rounds: int) -> dict:
    """Zero-LR consensus distance per round from every member's own random model, against
    the spectral gap's prediction (the expected squared distance shrinks by at most
    ``1 - gap`` a round, so the distance by ``sqrt(1 - gap)``)."""
    from asrtrain.models import build_model
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.engine import SimConfig, Simulator
    from asrtrain.simulate.workload import system_config
    from asrtrain.train.tasks import build_task

    cfg = system_config(compose_recipe(RECIPE, [*base, *TINY_MODEL]), "hybrid")
    task = build_task(cfg)
    model = build_model(cfg.model, task.input_dim, task.output_dim)
    sim_cfg = SimConfig(learners=learners, backend="adpsgd", topology=topology, epochs=1,
                        step_s=0.1, idle_s=1e9, log_every=1)
    traj = Simulator(sim_cfg, MixingWorkload(model, rounds),
                     initial=own_models(cfg, task.input_dim, task.output_dim)).run().to_json()
    gap = traj["config"]["spectral_gap"]
    d = [p["distance"] for p in traj["points"]]
    rate = (d[-1] / d[0]) ** (2.0 / (len(d) - 1)) if len(d) > 1 and d[0] > 0 else math.nan
    return {"spectral_gap": gap, "predicted_rate": 1.0 - gap, "measured_rate": rate,
            "distance": d}


def optimizer_overrides(name: str, global_batch: int) -> list[str]:
    """The optimizer ``name`` at a global batch: its LR scaled by sqrt(B / 256)."""
    opt = OPTIMIZERS[name]
    lr = opt["lr"] * math.sqrt(global_batch / BASE_BATCH)
    return [f"trainer.optimizer={opt['optimizer']}", f"hybrid.trainer.lr={lr:.6g}"]


def training_point(base: list[str], plan: Plan, learners: int, per_learner: int,
                   optimizer: str, epochs: int | None = None, seed: int = 1,
                   **sim: object) -> dict:
    """Simulated training at a point: its epochs' held-out losses and gossip figures, or the
    reason it cannot run (a learner's share of the data under one batch). ``seed`` is the
    trainer's (``trainer.seed``: the initial model, the batches' order) and the simulator's
    (the randomized ring's draws, the straggler's choice, the step-time jitter)."""
    from asrtrain import AsrtrainError

    epochs = epochs or plan.epochs
    overrides = [*base, *TINY_MODEL, f"hybrid.trainer.epochs={epochs}",
                 f"hybrid.trainer.batch_chunks={per_learner}",
                 *optimizer_overrides(optimizer, learners * per_learner), f"trainer.seed={seed}"]
    if "topology" in sim:
        overrides.append(f"trainer.topology={sim['topology']}")
    try:
        traj = simulate(overrides, learners=learners, epochs=epochs,
                        **{**PACE, "log_every": 10, **sim, "seed": seed})
    except AsrtrainError as e:
        print(f"  skipped: {e}", flush=True)
        return {"skipped": str(e)}
    last = traj["epochs"][-1]
    return {"heldout_loss": last["heldout_loss"], "epochs": traj["epochs"],
            "points": traj["points"][-200:], "rounds": last["rounds"],
            "simulated_s": last["time"], "distance": last["distance"],
            "epoch_steps": traj["config"]["epoch_steps"],
            "spectral_gap": traj["config"]["spectral_gap"],
            "members": traj["config"]["members"], "wall_s": traj["config"]["wall_s"]}


def say(what: str, row: dict) -> None:
    if "skipped" in row:
        return
    spread = f" ± {row['heldout_sd']:.4f}" if row.get("heldout_sd") is not None else ""
    print(f"{what}: held-out loss {row['heldout_loss']:.4f}{spread}, {row['rounds']} rounds, "
          f"{row['wall_s']:.0f} s", flush=True)


def _sd(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def over_seeds(runs: list[dict]) -> dict:
    """One point's runs (one a seed, each carrying its ``seed``) as a row: ``seeds`` the runs
    (their trajectories kept), ``heldout_loss`` / ``heldout_sd`` the mean and sd of the final
    held-out losses over the seeds, ``epochs`` each epoch's mean and sd; ``rounds`` (mean,
    rounded; ``rounds_range``), ``distance`` and ``simulated_s`` means; ``wall_s`` the sum. A
    point that cannot run with one seed is skipped."""
    skipped = next((r for r in runs if "skipped" in r), None)
    if skipped is not None:
        return {"skipped": skipped["skipped"], "seeds": runs}
    finals = [r["heldout_loss"] for r in runs]
    epochs = []
    for i, first in enumerate(runs[0]["epochs"]):
        values = [r["epochs"][i]["heldout_loss"] for r in runs]
        epochs.append({"epoch": first["epoch"], "heldout_loss": statistics.mean(values),
                       "heldout_sd": _sd(values)})
    rounds = [r["rounds"] for r in runs]
    return {"heldout_loss": statistics.mean(finals), "heldout_sd": _sd(finals),
            "epochs": epochs, "rounds": round(statistics.mean(rounds)),
            "rounds_range": [min(rounds), max(rounds)],
            "distance": statistics.mean(r["distance"] for r in runs),
            "simulated_s": statistics.mean(r["simulated_s"] for r in runs),
            "epoch_steps": runs[0]["epoch_steps"], "spectral_gap": runs[0]["spectral_gap"],
            "members": runs[0]["members"], "wall_s": sum(r["wall_s"] for r in runs),
            "seeds": runs}


def seeded_point(base: list[str], plan: Plan, learners: int, per_learner: int,
                 optimizer: str, what: str, **sim: object) -> dict:
    """:func:`training_point` with each of the plan's seeds (1..``plan.seeds``), as one row
    (:func:`over_seeds`)."""
    runs = []
    for seed in range(1, plan.seeds + 1):
        run = {"seed": seed, **training_point(base, plan, learners, per_learner, optimizer,
                                              seed=seed, **sim)}
        say(f"{what} seed {seed}", run)
        runs.append(run)
    return over_seeds(runs)


# -- the experiments (--full, --size small) --------------------------------------------------------

def exp_batch(base: list[str], plan: Plan) -> dict:
    """(a) Held-out loss after the plan's epochs against the global batch, SSGD against
    AD-PSGD (random ring), each point with the plan's seeds (:func:`seeded_point`); SSGD at the
    smallest batch is a single learner's loss at that batch (the same arithmetic)."""
    rows = []
    for optimizer in plan.batch_optimizers:
        for learners in plan.batch_learners:
            for global_batch in plan.global_batches:
                if global_batch % learners or global_batch // learners < plan.min_per_learner:
                    continue  # 64 x 4 chunks: 4x the steps of 16 x 16, and a quarter the work
                for backend in ("ssgd", "adpsgd"):
                    what = f"batch {global_batch} {learners}L {backend} {optimizer}"
                    row = seeded_point(base, plan, learners, global_batch // learners,
                                       optimizer, what, backend=backend)
                    rows.append({"optimizer": optimizer, "learners": learners,
                                 "global_batch": global_batch, "backend": backend, **row})
                    say(f"{what}, mean", row)
    return {"rows": rows}


def exp_gap(base: list[str], plan: Plan) -> dict:
    """(b) Each topology at each learner count: loss against epochs (AD-PSGD with learning) and
    the zero-LR consensus distance per round against the gap's prediction."""
    rows = []
    for learners in plan.gap_learners:
        for topology in TOPOLOGIES:
            mix = mixing(base, learners, topology, plan.mixing_rounds)  # deterministic: once
            row = seeded_point(base, plan, learners, plan.per_learner, plan.optimizer,
                               f"  {learners}L {topology}", backend="adpsgd", topology=topology)
            rows.append({"learners": learners, "topology": topology, "mixing": mix, **row})
            print(f"{learners} learners {topology}: gap {mix['spectral_gap']:.4f}, squared "
                  f"distance x{mix['measured_rate']:.4f} a round (predicted <= "
                  f"x{mix['predicted_rate']:.4f})", flush=True)
            say(f"  {learners}L {topology}, mean", row)
    return {"rows": rows}


def exp_delay(base: list[str], plan: Plan) -> dict:
    """(b) Delay-by-one with and without a 4x straggler (AD-PSGD, randomized ring), where an
    exchange costs half a step (so waiting for it matters)."""
    rows = []
    for speed in ("equal", "straggler:1:4"):
        for delay in (False, True):
            what = f"delay {speed} delay_by_one={delay}"
            row = seeded_point(base, plan, plan.delay_learners, plan.per_learner,
                               plan.optimizer, what, backend="adpsgd", topology="random_ring",
                               delay_by_one=delay, speed=speed, exchange_s=0.05)
            rows.append({"learners": plan.delay_learners, "speed": speed,
                         "delay_by_one": delay, **row})
            say(f"{what}, mean", row)
    return {"rows": rows}


def exp_hier(base: list[str], plan: Plan, batch: dict | None = None) -> dict:
    """(c) H-AD-PSGD with nodes of each size against flat AD-PSGD at the same learners; and
    SSGD at the same learners and global batch (what one learner at that batch computes): the
    point of (a) when ``batch`` (its result) has it with every seed of the plan (the same
    simulations), else simulated here with each seed."""
    rows = []
    for per_node in (1, *plan.hier_nodes):
        backend = "adpsgd" if per_node == 1 else "hadpsgd"
        what = f"hier {backend} per_node={per_node}"
        row = seeded_point(base, plan, plan.hier_learners, plan.per_learner, plan.optimizer,
                           what, backend=backend, per_node=per_node, topology="random_ring")
        rows.append({"learners": plan.hier_learners, "per_node": per_node, "backend": backend,
                     **row})
        say(f"{what}, mean", row)
    global_batch = plan.hier_learners * plan.per_learner
    same = [r for r in (batch or {}).get("rows", []) if r["backend"] == "ssgd"
            and r["optimizer"] == plan.optimizer and r["learners"] == plan.hier_learners
            and r["global_batch"] == global_batch and "skipped" not in r]
    if same and [r.get("seed", 1) for r in same[0].get("seeds", [{}])] == \
            list(range(1, plan.seeds + 1)):
        ssgd = {**same[0], "from": "batch"}
    else:
        ssgd = {"learners": plan.hier_learners, "global_batch": global_batch, "backend": "ssgd",
                **seeded_point(base, plan, plan.hier_learners, plan.per_learner,
                               plan.optimizer, "hier ssgd", backend="ssgd"), "from": "hier"}
        say("hier ssgd, mean", ssgd)
    return {"rows": rows, "ssgd": ssgd}


def real_points(plan: Plan) -> list[dict]:
    """One point of each experiment at ``real_learners``, as real processes can run it: those
    of ``plan.real_points``, in :data:`REAL_POINTS`' order."""
    per_node = max(1, plan.real_learners // 2)
    points = {
        "batch_ssgd": {"experiment": "batch", "backend": "ssgd", "topology": "random_ring"},
        "batch_adpsgd": {"experiment": "batch", "backend": "adpsgd", "topology": "random_ring"},
        "gap": {"experiment": "gap", "backend": "adpsgd", "topology": "ring"},
        "delay": {"experiment": "delay", "backend": "adpsgd", "topology": "random_ring",
                  "delay_by_one": True},
        "hier": {"experiment": "hier", "backend": "hadpsgd", "topology": "random_ring",
                 "per_node": per_node},
    }
    unknown = sorted(set(plan.real_points) - set(points))
    if unknown:
        raise SystemExit(f"bench/science.py: plan {plan.name}: no real point {unknown} "
                         f"(the points: {', '.join(REAL_POINTS)})")
    return [points[name] for name in REAL_POINTS if name in plan.real_points]


EPOCH_LINE = re.compile(r"epoch (\d+): train_loss [-\d.e+]+, dev_loss ([-\d.e+]+)")
# The epoch summary's frames/s per learner (asrtrain/train/trainer.py's _end_epoch: each learner's
# epoch frames over its epoch seconds, a mean over learners): the fallback where a run wrote no
# step curves. Since issue 23 the gossiping backends' step lines are learner 0's own ("learner 0:
# ... N frames/s"), and the step figures each learner's, in its own event files.
RATE_LINE = re.compile(r"epoch \d+: .*?frames_per_second_per_learner ([-+\w.]+)")
GOSSIP_LINE = re.compile(r"([\d.]+) gossip exchanges/s")


def real_run(base: list[str], plan: Plan, point: dict, exp: Path, tag: str) -> dict:
    """The point trained by ``asrtrain run`` with real gloo learners: its held-out loss per
    epoch and the pace it logged: frames/s per learner and exchanges/s from the learners' own
    step curves (:func:`learner_figures`), else the epoch summaries and learner 0's step lines."""
    name = f"science_{tag}"
    overrides = [*base, *TINY_MODEL, f"hybrid.model.name={name}",
                 f"hybrid.trainer.epochs={plan.real_epochs}",
                 f"hybrid.trainer.batch_chunks={plan.per_learner}",
                 *optimizer_overrides(plan.optimizer, plan.real_learners * plan.per_learner),
                 f"trainer.backend={point['backend']}", f"trainer.learners={plan.real_learners}",
                 f"trainer.topology={point['topology']}",
                 f"trainer.delay_by_one={str(point.get('delay_by_one', False)).lower()}",
                 "trainer.threads=1"]
    if "per_node" in point:
        overrides.append(f"trainer.per_node={point['per_node']}")
    # The learners log to log/train.log (asrtrain/train/worker.py), one learner to the stage's.
    logs = [exp / "log" / "train.log", exp / "log" / "train_hybrid.log"]
    offsets = [p.stat().st_size if p.exists() else 0 for p in logs]
    start = time.perf_counter()
    # forked warm (bench/forked_cli.py): the wall time is the run's, not the interpreter's start
    proc = forked_cli.run("run", str(RECIPE), *overrides, "--stage", "train_hybrid", "--to",
                          "train_hybrid", "--force", "train_hybrid", timeout=None)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"bench/science.py: real run {tag} failed:\n{proc.stderr[-3000:]}")
    text = "".join(new_text(p, o) for p, o in zip(logs, offsets, strict=True))
    epochs = [{"epoch": int(e), "heldout_loss": float(v)} for e, v in EPOCH_LINE.findall(text)]
    if not epochs:
        raise SystemExit(f"bench/science.py: real run {tag}: no epoch's dev_loss in {logs}")
    shares_of(exp / "train" / name / "epochs.json", epochs)
    rates, gossip = learner_figures(exp / "train" / name)
    if not rates:
        rates = [float(v) for v in RATE_LINE.findall(text)]
    if not gossip:
        gossip = [float(v) for v in GOSSIP_LINE.findall(text)]
    return {"overrides": overrides[len(base):], "epochs": epochs,
            "heldout_loss": epochs[-1]["heldout_loss"],
            "frames_per_s": sum(rates) / len(rates) if rates else math.nan,
            "exchanges_per_s": sum(gossip) / len(gossip) if gossip else None,
            "wall_s": wall}


def shares_of(record: Path, epochs: list[dict]) -> None:
    """Each epoch's samples per learner, consensus distance and seconds from the run's epoch
    record (``epochs.json``), into ``epochs``: the gossiping learners claim their work from the
    epoch's one order, so their shares are the run's own."""
    if not record.is_file():
        return
    summaries = json.loads(record.read_text())
    for row in epochs:
        summary = summaries.get(str(row["epoch"]), {})
        keys = sorted((k for k in summary if k.startswith("samples_learner_")),
                      key=lambda k: int(k.rsplit("_", 1)[1]))
        row.update(samples_per_learner=[int(summary[k]) for k in keys],
                   consensus_distance=summary.get("consensus_distance"),
                   epoch_seconds=summary.get("epoch_seconds"))


def learner_figures(run_dir: Path) -> tuple[list[float], list[float]]:
    """Each learner's step figures from the run's curves: its frames/s (a mean over its points)
    and every point of its gossip exchanges/s. In lockstep learner 0 writes every learner's rate
    (``frames_per_s/learner_<r>``); the gossiping backends write each learner's own, learner
    r > 0 under ``learner_<r>/`` (asrtrain/train/curves.py). A learner that claimed too few units
    to reach a point has none; the pace is the learners' that trained."""
    from asrtrain.train.curves import read_scalars

    dirs = [run_dir, *sorted(run_dir.glob("learner_*"))] if run_dir.is_dir() else []
    own: dict[str, list[float]] = {}
    gossip: list[float] = []
    for d in dirs:
        if not any(d.glob("events.out.tfevents.*")):
            continue
        for tag, points in read_scalars(d).items():
            values = [v for _, v in points if math.isfinite(v)]
            if tag.startswith("frames_per_s/learner_"):
                own.setdefault(tag, []).extend(values)
            elif tag == "gossip/exchanges_per_s":
                gossip.extend(values)
    rates = [sum(v) / len(v) for v in own.values() if v]
    return rates, gossip


def new_text(path: Path, offset: int) -> str:
    """What was written to ``path`` after it had ``offset`` bytes."""
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(offset if path.stat().st_size >= offset else 0)
        return f.read().decode(errors="replace")


def real_pace(real: dict, per_learner: int, chunk: int) -> dict:
    """The simulator's pace from a real run's log: a step's seconds from its frames/s, an
    exchange's from learner 0's exchanges/s (bounded by two steps), ±30% per step."""
    step_s = per_learner * chunk / real["frames_per_s"] if real["frames_per_s"] > 0 else 0.1
    rate = real["exchanges_per_s"]
    exchange_s = min(2 * step_s, 1.0 / rate) if rate else 0.0
    return {"step_s": step_s, "exchange_s": exchange_s, "jitter": 0.3}


def exp_real(base: list[str], plan: Plan, exp: Path) -> dict:
    """Each real point ``plan.real_runs`` times (the same seed: what moves is the gossip's
    timing), each run beside the simulator at the same settings, its pace that run's and its
    sync points the real trainer's (the epochs' ends: since issue 23 the gossiping backends meet
    nowhere else)."""
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.workload import system_config

    hcfg = system_config(compose_recipe(RECIPE, base), "hybrid")
    chunk, sync_every = int(hcfg.trainer.chunk), 0
    rows = []
    for i, point in enumerate(real_points(plan)):
        runs = []
        for j in range(plan.real_runs):
            tag = f"{i}_{point['experiment']}_{point['backend']}_run{j + 1}"
            real = real_run(base, plan, point, exp, tag)
            pace = real_pace(real, plan.per_learner, chunk)
            sim_keys = {k: point[k] for k in ("topology", "delay_by_one", "per_node")
                        if k in point}
            sim = training_point(base, plan, plan.real_learners, plan.per_learner,
                                 plan.optimizer, epochs=plan.real_epochs,
                                 backend=point["backend"], sync_every=sync_every, idle_s=0.1,
                                 **pace, **sim_keys)
            runs.append({"real": real, "pace": pace, "simulated": sim,
                         "difference": sim.get("heldout_loss", math.nan)
                         - real["heldout_loss"]})
            print(f"real {tag}: held-out loss real {real['heldout_loss']:.4f} "
                  f"({real['wall_s']:.0f} s), simulated "
                  f"{sim.get('heldout_loss', math.nan):.4f}", flush=True)
        rows.append({**point, "learners": plan.real_learners, "runs": runs})
    return {"rows": rows}


# -- plots -----------------------------------------------------------------------------------------

def _figure(ncols: int, width: float = 5.5):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4), squeeze=False)
    return plt, fig, axes[0]


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=90)
    plt.close(fig)


LOSS = "held-out frame CE (nats)"


def _references(ax, result: dict, baseline: float | None = None,
                baseline_label: str = "") -> None:
    """The label-prior loss (an untrained model's reference) and, where there is one, a single
    learner's loss, as horizontal lines."""
    prior = result.get("label_prior_loss")
    if prior is not None:
        ax.axhline(prior, color="grey", linestyle="-.", linewidth=1,
                   label=f"label prior ({prior:.2f})")
    if baseline is not None and math.isfinite(baseline):
        ax.axhline(baseline, color="black", linestyle=":", linewidth=1,
                   label=f"{baseline_label} ({baseline:.3f})")


def plot_batch(result: dict, plan: Plan, path: Path) -> None:
    opts = plan.batch_optimizers
    plt, fig, axes = _figure(len(opts))
    for ax, optimizer in zip(axes, opts, strict=True):
        for learners in plan.batch_learners:
            for backend, style in (("ssgd", "o-"), ("adpsgd", "s--")):
                rows = [r for r in result["rows"] if r["optimizer"] == optimizer
                        and r["learners"] == learners and r["backend"] == backend
                        and "skipped" not in r]
                sds = [r.get("heldout_sd") or 0.0 for r in rows]
                ax.errorbar([r["global_batch"] for r in rows], [r["heldout_loss"] for r in rows],
                            yerr=sds if any(sds) else None, fmt=style, capsize=3,
                            label=f"{backend}, {learners} learners")
        one = batch_baseline(result, optimizer)
        _references(ax, result, one["heldout_loss"] if one else None,
                    f"one learner at {one['global_batch']:,}" if one else "")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="global batch (chunks)", ylabel=f"{LOSS} after {plan.epochs} epochs",
               title=f"batch tolerance, {optimizer} (LR x sqrt(B/256))"
                     f"{_seeds_note(result).replace(', ', chr(10), 1)}")
        ax.legend(fontsize=8)
    _save(plt, fig, path)


def batch_baseline(result: dict, optimizer: str) -> dict | None:
    """SSGD at the smallest global batch with ``optimizer`` (the fewest learners): the same
    arithmetic as one learner at that batch."""
    rows = [r for r in result["rows"] if r["optimizer"] == optimizer and r["backend"] == "ssgd"
            and "skipped" not in r]
    return min(rows, key=lambda r: (r["global_batch"], r["learners"]), default=None)


def _epochs_errorbar(ax, row: dict, label: str) -> None:
    """A row's held-out loss per epoch: the mean over its seeds, the sd as error bars."""
    epochs = row["epochs"]
    sds = [e.get("heldout_sd") or 0.0 for e in epochs]
    ax.errorbar([e["epoch"] for e in epochs], [e["heldout_loss"] for e in epochs],
                yerr=sds if any(sds) else None, fmt="o-", capsize=3, label=label)


def _seeds_note(result: dict) -> str:
    n = max((len(r.get("seeds", [])) for r in result.get("rows", [])), default=1)
    return f", mean ± sd of {n} seeds" if n > 1 else ""


def plot_gap(result: dict, plan: Plan, path: Path) -> None:
    plt, fig, (a, b, c) = _figure(3, 5.0)
    for row in result["rows"]:
        label = f"{row['topology']} {row['learners']}"
        if "skipped" not in row:
            _epochs_errorbar(a, row, label)
        d = row["mixing"]["distance"]
        line, = b.semilogy(range(1, len(d) + 1), d, "-", label=label)
        pred = [d[0] * row["mixing"]["predicted_rate"] ** (r / 2) for r in range(len(d))]
        b.semilogy(range(1, len(d) + 1), pred, ":", color=line.get_color())
    _references(a, result)
    a.set(xlabel="epoch", ylabel=f"{LOSS}, consensus model",
          title=f"AD-PSGD, {plan.optimizer}, {plan.per_learner} chunks/learner"
                f"{_seeds_note(result)}")
    a.legend(fontsize=7)
    b.set(xlabel="gossip round", ylabel="consensus distance (zero LR)",
          title="measured (-) vs (1 - gap)^(r/2) (:)")
    for topology in TOPOLOGIES:
        rows = [r for r in result["rows"] if r["topology"] == topology]
        c.plot([r["mixing"]["spectral_gap"] for r in rows],
               [r["mixing"]["measured_rate"] for r in rows], "o", label=f"{topology}")
    c.plot([0, 1], [1, 0], "k:", label="1 - gap (bound)")
    c.set(xlabel="spectral gap", ylabel="measured squared-distance factor a round",
          title="mixing per round vs the gap's bound")
    c.legend(fontsize=8)
    _save(plt, fig, path)


def _loss_vs_epochs(ax, rows: list[dict], label: Callable[[dict], str], title: str) -> None:
    for row in rows:
        if "skipped" not in row:
            _epochs_errorbar(ax, row, label(row))
    ax.set(xlabel="epoch", ylabel=LOSS, title=title)


def plot_delay(result: dict, plan: Plan, path: Path) -> None:
    plt, fig, (a, b) = _figure(2)
    rows = result["rows"]
    _loss_vs_epochs(a, rows, lambda r: f"{r['speed']}, delay-by-one {r['delay_by_one']}",
                    f"AD-PSGD, {plan.delay_learners} learners{_seeds_note(result)}")
    _references(a, result)
    a.legend(fontsize=8)
    labels = [f"{r['speed'].split(':')[0]}\n{'d1' if r['delay_by_one'] else 'no d1'}"
              for r in rows]
    heights = [r.get("rounds", 0) for r in rows]
    spans = [r.get("rounds_range", [h, h]) for r, h in zip(rows, heights, strict=True)]
    b.bar(labels, heights, yerr=[[h - lo for h, (lo, _) in zip(heights, spans, strict=True)],
                                 [hi - h for h, (_, hi) in zip(heights, spans, strict=True)]],
          capsize=4)
    b.set_ylim(bottom=0)
    b.set(ylabel="gossip rounds in the run",
          title="rounds (exchange = half a step; bars: the seeds' range)")
    _save(plt, fig, path)


def plot_hier(result: dict, plan: Plan, path: Path) -> None:
    plt, fig, (a,) = _figure(1, 6)
    _loss_vs_epochs(a, result["rows"], lambda r: f"{r['backend']} per node {r['per_node']} "
                    f"({r.get('members', '?')} gossip members)",
                    f"{plan.hier_learners} learners{_seeds_note(result)}")
    ssgd = result.get("ssgd", {})
    _references(a, result, ssgd.get("heldout_loss"),
                f"SSGD = one learner at {ssgd.get('global_batch', 0):,}")
    a.legend(fontsize=8)
    _save(plt, fig, path)


def _point_label(r: dict) -> str:
    return (f"{r['experiment']}: {r['backend']}"
            f"{'' if r['backend'] == 'ssgd' else chr(10) + r['topology']}"
            f"{' d1' if r.get('delay_by_one') else ''}"
            f"{chr(10) + 'nodes of ' + str(r['per_node']) if 'per_node' in r else ''}")


def plot_real(result: dict, plan: Plan, path: Path) -> None:
    """Each run's real and simulated loss, bars from zero; the real SSGD's (one learner's
    arithmetic at the global batch) and the label prior as lines."""
    plt, fig, (a,) = _figure(1, 8)
    rows = result["rows"]
    runs = max((len(r["runs"]) for r in rows), default=1)
    width = 0.8 / (2 * runs)
    for j in range(runs):
        for k, (key, name) in enumerate((("real", "real"), ("simulated", "simulated"))):
            offset = -0.4 + width * (2 * j + k + 0.5)
            a.bar([i + offset for i in range(len(rows))],
                  [r["runs"][j][key].get("heldout_loss", math.nan) if j < len(r["runs"])
                   else math.nan for r in rows], width,
                  label=f"{name}, run {j + 1}", color=f"C{k}", alpha=1.0 - 0.35 * j)
    ssgd = [r for r in rows if r["backend"] == "ssgd"]
    baseline = (sum(run["real"]["heldout_loss"] for run in ssgd[0]["runs"])
                / len(ssgd[0]["runs"])) if ssgd else None
    _references(a, result, baseline, "real SSGD = one learner's arithmetic")
    a.set_ylim(bottom=0)
    a.set_xticks(list(range(len(rows))), [_point_label(r) for r in rows], fontsize=7)
    a.set(ylabel=f"{LOSS} after {plan.real_epochs} epochs",
          title=f"{plan.real_learners} real gloo learners vs the simulator")
    a.legend(fontsize=7)
    _save(plt, fig, path)


# -- docs/science.md's tables (tests/test_science_tables.py: the doc's are these of the committed
# compact JSONs) -----------------------------------------------------------------------------------

def _sci(x: float) -> str:
    """One significant digit and a short exponent: 4.8e-2."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _signed(x: float) -> str:
    return f"{x:+.4f}" if abs(x) < 0.005 else f"{x:+.3f}"


def _loss(row: dict | None, digits: int = 3) -> str:
    if row is None or "skipped" in row:
        return "—"
    return f"{row['heldout_loss']:.{digits}f}"


def _loss_sd(row: dict | None, digits: int = 3) -> str:
    """The held-out loss as mean ± sd over the row's seeds (the mean alone with one seed)."""
    if row is None or "skipped" in row:
        return "—"
    sd = row.get("heldout_sd")
    return _loss(row, digits) + (f" ± {sd:.{digits}f}" if sd is not None else "")


def _seeds(rows: list[dict]) -> int:
    return max((len(r.get("seeds", [])) for r in rows), default=0) or 1


def _of_seeds(n: int) -> str:
    return f", mean ± sd of {n} seeds" if n > 1 else ""


def _rounds(row: dict) -> str:
    lo, hi = row.get("rounds_range", [row["rounds"], row["rounds"]])
    return str(row["rounds"]) if lo == hi else f"{row['rounds']} ({lo}–{hi})"


def difference(a: dict, b: dict) -> dict:
    """``a``'s mean held-out loss minus ``b``'s over their seeds, with the standard error of
    the difference of two means, sqrt(s_a^2/n_a + s_b^2/n_b), and the difference in those
    (None with a single seed on a side: no spread)."""
    losses = [[r["heldout_loss"] for r in row.get("seeds", [row])] for row in (a, b)]
    diff = statistics.mean(losses[0]) - statistics.mean(losses[1])
    if min(len(v) for v in losses) < 2:
        return {"difference": diff, "se": None, "z": None, "n": [len(v) for v in losses]}
    se = math.sqrt(sum(statistics.variance(v) / len(v) for v in losses))
    return {"difference": diff, "se": se, "z": diff / se if se > 0 else math.inf,
            "n": [len(v) for v in losses]}


def _pairs_table(pairs: list[tuple[str, dict | None, dict | None]]) -> str:
    """One line a compared pair: the difference of the means ± its standard error, and how
    many standard errors that is."""
    lines = ["| compared (first − second) | held-out loss, first / second | difference ± se | "
             "standard errors | seeds |", "|---|---|---|---|---|"]
    for name, a, b in pairs:
        if a is None or b is None or "skipped" in a or "skipped" in b:
            lines.append(f"| {name} | — | — | — | — |")
            continue
        d = difference(a, b)
        se = f" ± {d['se']:.3f}" if d["se"] is not None else ""
        z = f"{d['z']:+.1f}" if d["z"] is not None else "—"
        n = str(d["n"][0]) if d["n"][0] == d["n"][1] else " / ".join(map(str, d["n"]))
        lines.append(f"| {name} | {_loss(a)} / {_loss(b)} | {d['difference']:+.3f}{se} | {z} "
                     f"| {n} |")
    return "\n".join(lines)


def _steps(row: dict) -> str:
    steps = row.get("epoch_steps") or []
    if not steps:
        return "—"
    return str(steps[0]) if min(steps) == max(steps) else f"{min(steps)}–{max(steps)}"


def _optimizer_label(name: str, optimizers: dict) -> str:
    lr = optimizers[name]["lr"]
    if name == "adam":
        return f"Adam {_sci(lr).replace('.0e', 'e')}"
    return f"SGD {lr:g}, momentum 0.9"


def _batch_pairs(rows: list[dict]) -> Iterator[tuple[str, int, int, dict]]:
    """(a)'s points in the run's order: (optimizer, learners, global batch, {backend: row})."""
    keys = list(dict.fromkeys((r["optimizer"], r["learners"], r["global_batch"]) for r in rows))
    for optimizer, learners, global_batch in keys:
        yield optimizer, learners, global_batch, {
            r["backend"]: r for r in rows
            if (r["optimizer"], r["learners"], r["global_batch"]) == (optimizer, learners,
                                                                      global_batch)}


def table_batch(result: dict) -> str:
    """(a) Batch tolerance: a row for each optimizer, learner count and global batch, the
    held-out loss as mean ± sd over the seeds (the lowest mean in bold)."""
    optimizers = result.get("optimizers", OPTIMIZERS)
    rows = result["rows"]
    trained = [r for r in rows if "skipped" not in r]
    best = min(trained, key=lambda r: r["heldout_loss"], default=None)
    n = _seeds(rows)
    lines = ["| optimizer | learners | global batch (chunks) | steps an epoch | "
             f"SSGD{_of_seeds(n)} | AD-PSGD (random ring) |", "|---|---|---|---|---|---|"]
    named = set()
    for optimizer, learners, global_batch, pair in _batch_pairs(rows):
        cells = []
        for backend in ("ssgd", "adpsgd"):
            cell = _loss_sd(pair.get(backend))
            cells.append(f"**{cell}**" if pair.get(backend) is best else cell)
        label = optimizer.upper() if optimizer == "sgd" else optimizer.capitalize()
        if optimizer not in named:
            label = _optimizer_label(optimizer, optimizers)
            named.add(optimizer)
        steps = _steps(pair.get("ssgd") or pair.get("adpsgd"))
        lines.append(f"| {label} | {learners} | {global_batch:,} | {steps} | {cells[0]} | "
                     f"{cells[1]} |")
    return "\n".join(lines)


def table_batch_pairs(result: dict) -> str:
    """(a) At each optimizer, learner count and global batch, AD-PSGD against SSGD."""
    pairs = []
    for optimizer, learners, global_batch, pair in _batch_pairs(result["rows"]):
        label = "Adam" if optimizer == "adam" else optimizer.upper()
        pairs.append((f"{label}, {learners} learners, {global_batch:,}: AD-PSGD − SSGD",
                      pair.get("adpsgd"), pair.get("ssgd")))
    return _pairs_table(pairs)


TOPOLOGY_NAMES = {"ring": "ring", "random_ring": "random ring", "exponential": "exponential"}


def table_gap(result: dict) -> str:
    """(b) Each learner count and topology: gap, bound, measured mixing (zero LR: one run),
    the held-out loss per epoch (means over the seeds), after the last epoch as mean ± sd (bold
    beyond the smallest learner count), the consensus distance at the end (a mean)."""
    rows = result["rows"]
    epochs = max((len(r.get("epochs", [])) for r in rows), default=0)
    smallest = min((r["learners"] for r in rows), default=0)
    n = _seeds(rows)
    lines = ["| learners | topology | spectral gap | bound on the squared distance a round | "
             "measured | held-out loss, epoch " + " / ".join(str(e + 1) for e in range(epochs))
             + f"{' (means)' if n > 1 else ''} | after epoch {epochs}{_of_seeds(n)} | "
             "consensus distance at the end |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mix = r["mixing"]
        if "skipped" in r:
            losses, final, distance = "—", "—", "—"
        else:
            losses = " / ".join(f"{e['heldout_loss']:.3f}" for e in r["epochs"])
            final = _loss_sd(r)
            if r["learners"] > smallest:
                final = f"**{final}**"
            distance = _sci(r["distance"])
        lines.append(f"| {r['learners']} | {TOPOLOGY_NAMES[r['topology']]} | "
                     f"{mix['spectral_gap']:.4f} | {mix['predicted_rate']:.3f} | "
                     f"{mix['measured_rate']:.3f} | {losses} | {final} | {distance} |")
    return "\n".join(lines)


def table_gap_pairs(result: dict) -> str:
    """(b) At each learner count, the fixed ring and the exponential graph against the
    randomized ring: the difference of the mean held-out losses ± its standard error."""
    rows = result["rows"]
    pairs = []
    for learners in dict.fromkeys(r["learners"] for r in rows):
        at = {r["topology"]: r for r in rows if r["learners"] == learners}
        for topology in ("ring", "exponential"):
            name = "fixed ring" if topology == "ring" else "exponential"
            pairs.append((f"{learners} learners: {name} − randomized ring", at.get(topology),
                          at.get("random_ring")))
    return _pairs_table(pairs)


def _speed_label(speed: str) -> str:
    if speed == "equal":
        return "equal"
    kind, *args = speed.split(":")
    if kind == "straggler" and len(args) == 2:
        count, factor = int(args[0]), float(args[1])
        who = "one learner" if count == 1 else f"{count} learners"
        return f"{who} {factor:g}x slower"
    return speed


def table_delay(result: dict) -> str:
    """Each speed with and without delay-by-one: gossip rounds (the mean and the seeds' range),
    the held-out loss as mean ± sd, the consensus distance and simulated seconds (means)."""
    n = _seeds(result["rows"])
    lines = [f"| speed | delay-by-one | gossip rounds | held-out loss{_of_seeds(n)} | "
             "consensus distance at the end | simulated s |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        d1 = "yes" if r["delay_by_one"] else "no"
        if "skipped" in r:
            lines.append(f"| {_speed_label(r['speed'])} | {d1} | — | — | — | — |")
            continue
        lines.append(f"| {_speed_label(r['speed'])} | {d1} | {_rounds(r)} | {_loss_sd(r)} | "
                     f"{_sci(r['distance'])} | {r['simulated_s']:.1f} |")
    return "\n".join(lines)


def table_delay_pairs(result: dict) -> str:
    """At each speed, delay-by-one against none."""
    rows = result["rows"]
    pairs = []
    for speed in dict.fromkeys(r["speed"] for r in rows):
        at = {r["delay_by_one"]: r for r in rows if r["speed"] == speed}
        pairs.append((f"{_speed_label(speed)}: delay-by-one − none", at.get(True),
                      at.get(False)))
    return _pairs_table(pairs)


def _hier_name(r: dict) -> str:
    return "flat AD-PSGD" if r["per_node"] == 1 else f"H-AD-PSGD, nodes of {r['per_node']}"


def table_hier(result: dict) -> str:
    """Flat AD-PSGD and H-AD-PSGD at each node size, and SSGD at the same global batch: the
    held-out loss as mean ± sd over the seeds, gossip rounds (mean and range)."""
    n = _seeds([*result["rows"], *([result["ssgd"]] if result.get("ssgd") else [])])
    lines = [f"| | gossip members | gossip rounds | held-out loss{_of_seeds(n)} |",
             "|---|---|---|---|"]
    for r in result["rows"]:
        if "skipped" in r:
            lines.append(f"| {_hier_name(r)} | — | — | — |")
        else:
            lines.append(f"| {_hier_name(r)} | {r['members']} | {_rounds(r)} | {_loss_sd(r)} |")
    ssgd = result.get("ssgd")
    if ssgd is not None:
        where = ", from (a)" if ssgd.get("from") == "batch" else ""
        lines.append(f"| (SSGD, the same global batch{where}) | — | — | {_loss_sd(ssgd)} |")
    return "\n".join(lines)


def table_hier_pairs(result: dict) -> str:
    """Each H-AD-PSGD node size against flat AD-PSGD and against SSGD."""
    rows = result["rows"]
    flat = next((r for r in rows if r["per_node"] == 1), None)
    ssgd = result.get("ssgd")
    pairs = [(f"{_hier_name(r)} − flat AD-PSGD", r, flat) for r in rows if r["per_node"] > 1]
    pairs += [(f"{_hier_name(r)} − SSGD", r, ssgd) for r in rows if r["per_node"] > 1]
    pairs.append(("flat AD-PSGD − SSGD", flat, ssgd))
    return _pairs_table(pairs)


EXPERIMENT_LETTER = {"batch": "(a)", "gap": "(b)", "delay": "(b)", "hier": "(c)"}


def _real_point(r: dict) -> str:
    letter = EXPERIMENT_LETTER.get(r["experiment"], r["experiment"])
    if r["backend"] == "ssgd":
        return f"{letter} SSGD"
    if r["backend"] == "hadpsgd":
        nodes = r["learners"] // r["per_node"]
        return f"{letter} H-AD-PSGD, {nodes} nodes of {r['per_node']}"
    ring = "fixed ring" if r["topology"] == "ring" else TOPOLOGY_NAMES.get(
        r["topology"], r["topology"]).replace("random ring", "randomized ring")
    return f"{letter} AD-PSGD, {ring}{', delay-by-one' if r.get('delay_by_one') else ''}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds else "—"


def table_real(result: dict) -> str:
    """Each point: every run's real loss (and wall), the simulator beside each run, their
    differences, and the first run's pace."""
    rows = result["rows"]
    runs = max((len(r["runs"]) for r in rows), default=1)
    which = " / ".join(f"run {j + 1}" for j in range(runs))
    lines = [f"| point | real, {which} (wall) | simulated, beside {which} | simulated - real | "
             "real pace (run 1): step / exchange |", "|---|---|---|---|---|"]
    for r in rows:
        real = " / ".join(f"{run['real']['heldout_loss']:.4f}" for run in r["runs"])
        walls = " / ".join(f"{run['real']['wall_s']:.0f}" for run in r["runs"])
        sim = " / ".join(_loss(run["simulated"], 4) for run in r["runs"])
        diffs = [_signed(run["difference"]) for run in r["runs"]]
        diff = diffs[0] if len(set(diffs)) == 1 else " / ".join(diffs)
        pace = r["runs"][0]["pace"]
        lines.append(f"| {_real_point(r)} | {real} ({walls} s) | {sim} | {diff} | "
                     f"{_ms(pace['step_s'])} / {_ms(pace['exchange_s'])} |")
    return "\n".join(lines)


def table_quick_batch(result: dict) -> str:
    lines = ["| global batch (chunks) | SSGD held-out loss | AD-PSGD (random ring) |",
             "|---|---|---|"]
    rows = result["batch_tolerance"]
    for global_batch in dict.fromkeys(r["global_batch"] for r in rows):
        pair = {r["backend"]: r for r in rows if r["global_batch"] == global_batch}
        learners = next(iter(pair.values()))["learners"]
        lines.append(f"| {global_batch:,} ({learners} x {global_batch // learners}) | "
                     f"{_loss(pair.get('ssgd'))} | {_loss(pair.get('adpsgd'))} |")
    return "\n".join(lines)


QUICK_TOPOLOGY_NAMES = {"ring": "fixed ring", "random_ring": "randomized ring",
                        "exponential": "exponential graph"}


def exact_after(distances: list[float], tolerance: float = 1e-5) -> int | None:
    """The gossip round (1-based, as the distances are logged) after which the zero-LR
    distance is float rounding: below ``tolerance`` of the first round's; None if never."""
    for r, d in enumerate(distances):
        if distances[0] > 0 and d <= tolerance * distances[0]:
            return r + 1
    return None


def table_quick_gap(result: dict) -> str:
    rows = result["spectral_gap"]
    learners = rows[0]["learners"] if rows else LEARNERS
    rounds = rows[0].get("rounds", len(rows[0]["zero_lr_distance"])) if rows else 0
    lines = [f"| {learners} learners, zero LR | spectral gap | predicted contraction of the "
             f"squared distance per round (at most) | measured over {rounds} rounds |",
             "|---|---|---|---|"]
    for r in rows:
        exact = exact_after(r["zero_lr_distance"])
        note = f" (exact consensus after {exact} rounds)" if exact else ""
        lines.append(f"| {QUICK_TOPOLOGY_NAMES[r['topology']]} | {r['spectral_gap']:.3f} | "
                     f"{r['predicted_rate']:.3f} | {r['measured_rate']:.3f}{note} |")
    return "\n".join(lines)


TABLES = {"batch": table_batch, "gap": table_gap, "delay": table_delay, "hier": table_hier,
          "real": table_real, "quick_batch": table_quick_batch, "quick_gap": table_quick_gap,
          "batch_pairs": table_batch_pairs, "gap_pairs": table_gap_pairs,
          "delay_pairs": table_delay_pairs,
          "hier_pairs": table_hier_pairs}


# -- the compact JSON for docs/science -------------------------------------------------------------

LONG = ("points", "learning_distance")  # trajectories: dropped from the committed copy when long
KEEP = 5


def compact(result: dict) -> dict:
    """``result`` without its long trajectories (a ``<key>`` list of more than a few entries is
    replaced by ``<key>_dropped``: its length) and with this checkout's path made relative."""
    prefix = f"{REPO}/"

    def walk(x: object) -> object:
        if isinstance(x, dict):
            out = {}
            for k, v in x.items():
                if k in LONG and isinstance(v, list) and len(v) > KEEP:
                    out[f"{k}_dropped"] = len(v)
                else:
                    out[k] = walk(v)
            return out
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return x.replace(prefix, "")
        return x
    return walk(copy.deepcopy(result))


def write_docs_json(docs: Path, name: str, result: dict) -> Path:
    path = docs / "science" / f"science_{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(compact(result), indent=1) + "\n")
    return path


def copy_png(docs: Path, src: Path) -> None:
    (docs / "img").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, docs / "img" / src.name)


def process_age() -> float:
    """Seconds since this process started (Linux /proc), so that a wall time counts the
    interpreter's start and its imports; the time since this module was loaded elsewhere."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _LOADED


def cpu_s() -> float:
    """CPU seconds of this process and of the children it waited for (the asrtrain runs)."""
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                  resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime



EXPERIMENTS = {"batch": (exp_batch, plot_batch), "gap": (exp_gap, plot_gap),
               "delay": (exp_delay, plot_delay), "hier": (exp_hier, plot_hier),
               "real": (exp_real, plot_real)}


# The plan's fields an experiment never reads: a result made under a plan that differs from this
# one only there is this plan's result. ``real`` runs each point ``real_runs`` times with one seed
# (the trainer's default, 1: what moves between the runs is the gossip's timing).
NOT_READ = {"real": ("seeds",), **{name: ("real_points",)
                                   for name in ("batch", "gap", "delay", "hier")}}


def plan_key(plan: dict, name: str | None) -> dict:
    """The fields of ``plan`` (a JSON plan) that experiment ``name``'s result depends on."""
    return {k: v for k, v in plan.items() if k not in NOT_READ.get(name or "", ())}


def done_before(path: Path, plan: Plan, name: str | None = None) -> dict | None:
    """The result at ``path`` if it was made for ``plan`` (for experiment ``name``: its
    :func:`plan_key`, the fields it reads; None: every field)."""
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    # as JSON has it: tuples are lists; a field the result's plan lacks had its default then
    defaults = json.loads(json.dumps({f.name: f.default for f in fields(Plan)
                                      if f.default is not MISSING}))
    want = plan_key(json.loads(json.dumps(asdict(plan))), name)
    return result if plan_key({**defaults, **(result.get("plan") or {})}, name) == want \
        else None


def load() -> float:
    return round(os.getloadavg()[0], 2)


def code_state() -> dict:
    """The commit the run used and the files of the package that differed from it (a run on
    a working tree under edit says so)."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return proc.stdout.rstrip() if proc.returncode == 0 else ""
    return {"commit": git("rev-parse", "HEAD"),
            "modified": git("status", "--short", "--", "asrtrain").splitlines()}


def run_plan(plan: Plan, out: Path, exp: Path | None, only: list[str], redo: bool,
             docs: Path | None, command: str = "") -> dict:
    """Every experiment of ``plan`` (or ``only`` those), each to its JSON + PNG under ``out``;
    with ``docs``, the PNGs copied to ``docs/img`` and the compact results written to
    ``docs/science`` (:func:`compact`)."""

    torch.set_num_threads(1)
    start = time.perf_counter()
    default = f"exp-{plan.hours:g}h" if plan.hours else "exp-tiny"
    exp = (exp or SCIENCE_DIR / default).resolve()
    base = ensure_exp(exp, corpus_overrides(plan.hours, SCIENCE_DIR))
    setup_s = time.perf_counter() - start
    prior = None   # made before the first experiment that runs (none: every one done before)
    out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    results: dict[str, dict] = {}
    for name in only or list(EXPERIMENTS):
        run, plot = EXPERIMENTS[name]
        path = out / f"science_{name}.json"
        result = None if redo else done_before(path, plan, name)
        if result is not None:
            print(f"{name}: done before ({path})", flush=True)
        else:
            if prior is None:
                prior = label_prior_loss(base)
                print("label-prior loss (entropy of the training alignments' pdf prior): "
                      f"{prior:.4f} nats", flush=True)
            t, load_start, code = time.perf_counter(), load(), code_state()
            print(f"== {name}", flush=True)
            if name == "real":
                result = exp_real(base, plan, exp)
            elif name == "hier":
                batch = results.get("batch") or done_before(out / "science_batch.json", plan,
                                                            "batch")
                result = exp_hier(base, plan, batch)
            else:
                result = run(base, plan)
            result.update(plan=asdict(plan), wall_s=time.perf_counter() - t, base=base,
                          label_prior_loss=prior, load=[load_start, load()],
                          command=command, code=code)
            write_text(path, json.dumps(result, indent=1) + "\n")
        results[name] = result
        walls[name] = result["wall_s"]
        plot(result, plan, out / f"science_{name}.png")
        if docs is not None:
            copy_png(docs, out / f"science_{name}.png")
            write_docs_json(docs, name, result)
    summary = {"plan": asdict(plan), "wall_s": time.perf_counter() - start, "setup_s": setup_s,
               "process_wall_s": process_age(), "cpu_s": cpu_s(),
               "experiment_wall_s": walls, "command": command}
    write_text(out / "science_summary.json", json.dumps(summary, indent=1) + "\n")
    print(f"wrote {len(walls)} experiments under {out} ({summary['wall_s']:.0f} s, of which "
          f"{setup_s:.0f} s the corpus and experiment dir; {summary['process_wall_s']:.0f} s "
          f"since the process started, {summary['cpu_s']:.0f} CPU-s)")
    return summary


# -- --quick ---------------------------------------------------------------------------------------

def batch_tolerance(base: list[str]) -> list[dict]:
    rows = []
    for per_learner in (4, 16, 64):
        for backend in ("ssgd", "adpsgd"):
            traj = simulate([*base, *MODEL, f"hybrid.trainer.batch_chunks={per_learner}"],
                            backend=backend, log_every=50)
            rows.append({"backend": backend, "learners": LEARNERS,
                         "global_batch": LEARNERS * per_learner,
                         "heldout_loss": traj["epochs"][-1]["heldout_loss"],
                         "epochs": traj["epochs"], "wall_s": traj["config"]["wall_s"]})
            print(f"batch {LEARNERS * per_learner:5d} {backend:7s} held-out loss "
                  f"{rows[-1]['heldout_loss']:.4f} ({rows[-1]['wall_s']:.0f} s)", flush=True)
    return rows


def spectral_gap_point(base: list[str]) -> list[dict]:
    rows = []
    for topology in TOPOLOGIES:
        mix = mixing(base, LEARNERS, topology, 9)
        learning = simulate([*base, *MODEL, "hybrid.trainer.batch_chunks=16",
                             f"trainer.topology={topology}"], topology=topology, log_every=5)
        rows.append({"topology": topology, "learners": LEARNERS, "rounds": 9,
                     "spectral_gap": mix["spectral_gap"],
                     "predicted_rate": mix["predicted_rate"],
                     "measured_rate": mix["measured_rate"], "zero_lr_distance": mix["distance"],
                     "heldout_loss": learning["epochs"][-1]["heldout_loss"],
                     "learning_distance": [p["distance"] for p in learning["points"]],
                     "wall_s": learning["config"]["wall_s"]})
        print(f"{topology:12s} gap {mix['spectral_gap']:.4f}: squared distance "
              f"x{mix['measured_rate']:.4f} a round (predicted <= x{mix['predicted_rate']:.4f});"
              f" held-out loss {rows[-1]['heldout_loss']:.4f}", flush=True)
    return rows


def plot_quick(result: dict, path: Path) -> None:
    plt, fig, (a, b) = _figure(2)
    for backend in ("ssgd", "adpsgd"):
        rows = [r for r in result["batch_tolerance"] if r["backend"] == backend]
        a.plot([r["global_batch"] for r in rows], [r["heldout_loss"] for r in rows], "o-",
               label=backend)
    ssgd = [r for r in result["batch_tolerance"] if r["backend"] == "ssgd"]
    one = min(ssgd, key=lambda r: r["global_batch"], default=None)
    _references(a, result, one["heldout_loss"] if one else None,
                f"one learner at {one['global_batch']:,}" if one else "")
    a.set_xscale("log", base=2)
    a.set(xlabel="global batch (chunks)", ylabel=f"{LOSS} after {EPOCHS} epochs",
          title=f"batch tolerance, {LEARNERS} simulated learners (tiny)")
    a.legend(fontsize=8)
    for row in result["spectral_gap"]:
        d = row["zero_lr_distance"]
        line, = b.semilogy(range(1, len(d) + 1), d, "o-", label=f"{row['topology']} "
                           f"(gap {row['spectral_gap']:.3f})")
        pred = [d[0] * row["predicted_rate"] ** (r / 2) for r in range(len(d))]
        b.semilogy(range(1, len(d) + 1), pred, "--", color=line.get_color())
    b.set(xlabel="gossip round", ylabel="consensus distance (zero LR)",
          title=f"{LEARNERS} learners: measured (o) vs (1 - gap)^(r/2) (--)")
    b.legend(fontsize=8)
    _save(plt, fig, path)


def run_quick(out: Path, exp: Path | None, docs: Path | None = DOCS,
              command: str = "") -> dict:
    """The quick experiments; ``wall_s`` is the process's whole time (the interpreter's start,
    the imports and the experiment dir when it has to be made included), printed at the end."""
    torch.set_num_threads(1)
    load_start, t = load(), time.perf_counter()
    exp = (exp or SCIENCE_DIR / "exp-tiny").resolve()
    built = not (exp / ".done" / "align").is_file()
    base = ensure_exp(exp)
    exp_s = time.perf_counter() - t
    result = {"learners": LEARNERS, "epochs": EPOCHS, "model": MODEL,
              "label_prior_loss": label_prior_loss(base),
              "batch_tolerance": batch_tolerance(base), "spectral_gap": spectral_gap_point(base)}
    result.update(wall_s=process_age(), cpu_s=cpu_s(), experiment_built=built,
                  experiment_s=exp_s, load=[load_start, load()], command=command,
                  code=code_state())
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "science_quick.json", json.dumps(result, indent=1) + "\n")
    plot_quick(result, out / "science_quick.png")
    if docs is not None:
        copy_png(docs, out / "science_quick.png")
        write_docs_json(docs, "quick", result)
    made = f"making {exp.name} {exp_s:.0f} s" if built else f"{exp.name} made before"
    print(f"wrote {out / 'science_quick.json'} and science_quick.png: {result['wall_s']:.0f} s "
          f"wall from the process's start ({made}), {result['cpu_s']:.0f} CPU-s, load "
          f"{result['load'][0]:g} -> {result['load'][1]:g}")
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="the quick experiments (minutes)")
    mode.add_argument("--full", action="store_true", help="every experiment at scale")
    mode.add_argument("--size", choices=sorted(PLANS), help="every experiment at this size")
    p.add_argument("--only", nargs="+", choices=list(EXPERIMENTS), default=[],
                   help="run only these experiments")
    p.add_argument("--redo", action="store_true", help="rerun experiments done before")
    p.add_argument("--exp", type=Path, default=None,
                   help="the experiment dir with features and alignments (made when missing; "
                        "default exp/science/exp-<H>h or exp-tiny)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--docs", type=Path, default=DOCS,
                   help="where the PNGs (<docs>/img) and the compact JSONs (<docs>/science) go "
                        "(default docs/; tests point it elsewhere)")
    p.add_argument("--no-docs", action="store_true",
                   help="neither copy the PNGs nor write the compact JSONs")
    args = p.parse_args(argv)
    command = " ".join(["python bench/science.py",
                        *(sys.argv[1:] if argv is None else argv)]).replace(f"{REPO}/", "")
    docs = None if args.no_docs else args.docs.resolve()
    if args.quick:
        run_quick(args.out, args.exp, docs, command)
        return
    plan = FULL if args.full else PLANS[args.size]
    run_plan(plan, args.out, args.exp, args.only, args.redo, docs, command)


if __name__ == "__main__":
    main()
