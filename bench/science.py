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
  train_hybrid trainer.backend=... trainer.learners=8``), beside the simulator at the same
  settings and the pace the real run logged.

Each experiment writes ``science_<name>.json`` and ``.png`` under ``--out`` (the PNGs are copied
to docs/img/ for docs/science.md); an experiment whose JSON is there for the same plan is not
run again (``--redo`` runs it anyway). ``--size small`` is the same code on the committed tiny
corpus with a few learners and one epoch (tests/test_bench_science.py).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from asrtrain.fileio import atomic_open, write_text

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "tiny"
RESULTS = REPO / "bench" / "results"
DOCS_IMG = REPO / "docs" / "img"
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


FULL = Plan("full", 2.0, 2, (16, 64), (256, 1024, 4096, 12288), ("adam", "sgd"), "sgd", 16, 8,
            (16, 64, 128), 24, 64, 64, (4, 8), 8, 2)
SMALL = Plan("small", None, 1, (4,), (64, 128), ("adam", "sgd"), "sgd", 16, 4, (4, 8), 6, 8, 8,
             (4,), 2, 1)
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
        subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", str(RECIPE), *overrides,
                        *span], cwd=REPO, check=True)
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
    return out


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
                   optimizer: str, epochs: int | None = None, **sim: object) -> dict:
    """Simulated training at a point: its epochs' held-out losses and gossip figures, or the
    reason it cannot run (a learner's share of the data under one batch)."""
    from asrtrain import AsrtrainError

    epochs = epochs or plan.epochs
    overrides = [*base, *TINY_MODEL, f"hybrid.trainer.epochs={epochs}",
                 f"hybrid.trainer.batch_chunks={per_learner}",
                 *optimizer_overrides(optimizer, learners * per_learner)]
    if "topology" in sim:
        overrides.append(f"trainer.topology={sim['topology']}")
    try:
        traj = simulate(overrides, learners=learners, epochs=epochs,
                        **{**PACE, "log_every": 10, **sim})
    except AsrtrainError as e:
        print(f"  skipped: {e}", flush=True)
        return {"skipped": str(e)}
    last = traj["epochs"][-1]
    return {"heldout_loss": last["heldout_loss"], "epochs": traj["epochs"],
            "points": traj["points"][-200:], "rounds": last["rounds"],
            "simulated_s": last["time"], "spectral_gap": traj["config"]["spectral_gap"],
            "members": traj["config"]["members"], "wall_s": traj["config"]["wall_s"]}


def say(what: str, row: dict) -> None:
    if "skipped" in row:
        return
    print(f"{what}: held-out loss {row['heldout_loss']:.4f}, {row['rounds']} rounds, "
          f"{row['wall_s']:.0f} s", flush=True)


# -- the experiments (--full, --size small) --------------------------------------------------------

def exp_batch(base: list[str], plan: Plan) -> dict:
    """(a) Held-out loss after the plan's epochs against the global batch, SSGD against
    AD-PSGD (random ring); SSGD at the smallest batch is a single learner's loss at that batch
    (the same arithmetic)."""
    rows = []
    for optimizer in plan.batch_optimizers:
        for learners in plan.batch_learners:
            for global_batch in plan.global_batches:
                if global_batch % learners or global_batch // learners < plan.min_per_learner:
                    continue  # 64 x 4 chunks: 4x the steps of 16 x 16, and a quarter the work
                for backend in ("ssgd", "adpsgd"):
                    row = training_point(base, plan, learners, global_batch // learners,
                                         optimizer, backend=backend)
                    rows.append({"optimizer": optimizer, "learners": learners,
                                 "global_batch": global_batch, "backend": backend, **row})
                    say(f"batch {global_batch} {learners}L {backend} {optimizer}", row)
    return {"rows": rows}


def exp_gap(base: list[str], plan: Plan) -> dict:
    """(b) Each topology at each learner count: loss against epochs (AD-PSGD with learning) and
    the zero-LR consensus distance per round against the gap's prediction."""
    rows = []
    for learners in plan.gap_learners:
        for topology in TOPOLOGIES:
            mix = mixing(base, learners, topology, plan.mixing_rounds)
            row = training_point(base, plan, learners, plan.per_learner, plan.optimizer,
                                 backend="adpsgd", topology=topology)
            rows.append({"learners": learners, "topology": topology, "mixing": mix, **row})
            print(f"{learners} learners {topology}: gap {mix['spectral_gap']:.4f}, squared "
                  f"distance x{mix['measured_rate']:.4f} a round (predicted <= "
                  f"x{mix['predicted_rate']:.4f})", flush=True)
            say(f"  {learners}L {topology}", row)
    return {"rows": rows}


def exp_delay(base: list[str], plan: Plan) -> dict:
    """(b) Delay-by-one with and without a 4x straggler (AD-PSGD, randomized ring), where an
    exchange costs half a step (so waiting for it matters)."""
    rows = []
    for speed in ("equal", "straggler:1:4"):
        for delay in (False, True):
            row = training_point(base, plan, plan.delay_learners, plan.per_learner,
                                 plan.optimizer, backend="adpsgd", topology="random_ring",
                                 delay_by_one=delay, speed=speed, exchange_s=0.05)
            rows.append({"learners": plan.delay_learners, "speed": speed,
                         "delay_by_one": delay, **row})
            say(f"delay {speed} delay_by_one={delay}", row)
    return {"rows": rows}


def exp_hier(base: list[str], plan: Plan) -> dict:
    """(c) H-AD-PSGD with nodes of each size against flat AD-PSGD at the same learners."""
    rows = []
    for per_node in (1, *plan.hier_nodes):
        backend = "adpsgd" if per_node == 1 else "hadpsgd"
        row = training_point(base, plan, plan.hier_learners, plan.per_learner, plan.optimizer,
                             backend=backend, per_node=per_node, topology="random_ring")
        rows.append({"learners": plan.hier_learners, "per_node": per_node, "backend": backend,
                     **row})
        say(f"hier {backend} per_node={per_node}", row)
    return {"rows": rows}


def real_points(plan: Plan) -> list[dict]:
    """One point of each experiment at ``real_learners``, as real processes can run it."""
    per_node = max(1, plan.real_learners // 2)
    return [
        {"experiment": "batch", "backend": "ssgd", "topology": "random_ring"},
        {"experiment": "batch", "backend": "adpsgd", "topology": "random_ring"},
        {"experiment": "gap", "backend": "adpsgd", "topology": "ring"},
        {"experiment": "delay", "backend": "adpsgd", "topology": "random_ring",
         "delay_by_one": True},
        {"experiment": "hier", "backend": "hadpsgd", "topology": "random_ring",
         "per_node": per_node},
    ]


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
    proc = subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", str(RECIPE), *overrides,
                           "--stage", "train_hybrid", "--to", "train_hybrid", "--force",
                           "train_hybrid"], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"bench/science.py: real run {tag} failed:\n{proc.stderr[-3000:]}")
    text = "".join(new_text(p, o) for p, o in zip(logs, offsets, strict=True))
    epochs = [{"epoch": int(e), "heldout_loss": float(v)} for e, v in EPOCH_LINE.findall(text)]
    if not epochs:
        raise SystemExit(f"bench/science.py: real run {tag}: no epoch's dev_loss in {logs}")
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
    """Each real point beside the simulator at the same settings, its pace the real run's and
    its sync points the real trainer's (the epochs' ends: since issue 23 the gossiping backends
    meet nowhere else)."""
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.workload import system_config

    hcfg = system_config(compose_recipe(RECIPE, base), "hybrid")
    chunk, sync_every = int(hcfg.trainer.chunk), 0
    rows = []
    for i, point in enumerate(real_points(plan)):
        tag = f"{i}_{point['experiment']}_{point['backend']}"
        real = real_run(base, plan, point, exp, tag)
        pace = real_pace(real, plan.per_learner, chunk)
        sim_keys = {k: point[k] for k in ("topology", "delay_by_one", "per_node") if k in point}
        sim = training_point(base, plan, plan.real_learners, plan.per_learner, plan.optimizer,
                             epochs=plan.real_epochs, backend=point["backend"],
                             sync_every=sync_every, idle_s=0.1, **pace, **sim_keys)
        rows.append({**point, "learners": plan.real_learners, "real": real, "pace": pace,
                     "simulated": sim,
                     "difference": sim.get("heldout_loss", math.nan) - real["heldout_loss"]})
        print(f"real {tag}: held-out loss real {real['heldout_loss']:.4f} ({real['wall_s']:.0f}"
              f" s), simulated {sim.get('heldout_loss', math.nan):.4f}", flush=True)
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


def plot_batch(result: dict, plan: Plan, path: Path) -> None:
    opts = plan.batch_optimizers
    plt, fig, axes = _figure(len(opts))
    for ax, optimizer in zip(axes, opts, strict=True):
        for learners in plan.batch_learners:
            for backend, style in (("ssgd", "o-"), ("adpsgd", "s--")):
                rows = [r for r in result["rows"] if r["optimizer"] == optimizer
                        and r["learners"] == learners and r["backend"] == backend
                        and "skipped" not in r]
                ax.plot([r["global_batch"] for r in rows], [r["heldout_loss"] for r in rows],
                        style, label=f"{backend}, {learners} learners")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="global batch (chunks)",
               ylabel=f"held-out loss after {plan.epochs} epochs",
               title=f"batch tolerance, {optimizer} (LR x sqrt(B/256))")
        ax.legend(fontsize=8)
    _save(plt, fig, path)


def plot_gap(result: dict, plan: Plan, path: Path) -> None:
    plt, fig, (a, b, c) = _figure(3, 5.0)
    for row in result["rows"]:
        label = f"{row['topology']} {row['learners']}"
        if "skipped" not in row:
            a.plot([e["epoch"] for e in row["epochs"]],
                   [e["heldout_loss"] for e in row["epochs"]], "o-", label=label)
        d = row["mixing"]["distance"]
        line, = b.semilogy(range(1, len(d) + 1), d, "-", label=label)
        pred = [d[0] * row["mixing"]["predicted_rate"] ** (r / 2) for r in range(len(d))]
        b.semilogy(range(1, len(d) + 1), pred, ":", color=line.get_color())
    a.set(xlabel="epoch", ylabel="held-out loss (consensus model)",
          title=f"AD-PSGD, {plan.optimizer}, {plan.per_learner} chunks/learner")
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
            ax.plot([e["epoch"] for e in row["epochs"]],
                    [e["heldout_loss"] for e in row["epochs"]], "o-", label=label(row))
    ax.set(xlabel="epoch", ylabel="held-out loss", title=title)
    ax.legend(fontsize=8)


def plot_delay(result: dict, plan: Plan, path: Path) -> None:
    plt, fig, (a, b) = _figure(2)
    rows = result["rows"]
    _loss_vs_epochs(a, rows, lambda r: f"{r['speed']}, delay-by-one {r['delay_by_one']}",
                    f"AD-PSGD, {plan.delay_learners} learners")
    labels = [f"{r['speed'].split(':')[0]}\n{'d1' if r['delay_by_one'] else 'no d1'}"
              for r in rows]
    b.bar(labels, [r.get("rounds", 0) for r in rows])
    b.set(ylabel="gossip rounds in the run", title="rounds (exchange = half a step)")
    _save(plt, fig, path)


def plot_hier(result: dict, plan: Plan, path: Path) -> None:
    plt, fig, (a,) = _figure(1, 6)
    _loss_vs_epochs(a, result["rows"], lambda r: f"{r['backend']} per node {r['per_node']} "
                    f"({r.get('members', '?')} gossip members)",
                    f"{plan.hier_learners} learners")
    _save(plt, fig, path)


def plot_real(result: dict, plan: Plan, path: Path) -> None:
    plt, fig, (a,) = _figure(1, 7)
    rows = result["rows"]
    labels = [f"{r['experiment']}\n{r['backend']}"
              f"{'' if r['backend'] == 'ssgd' else ' ' + r['topology']}"
              f"{' d1' if r.get('delay_by_one') else ''}"
              f"{' nodes of ' + str(r['per_node']) if 'per_node' in r else ''}" for r in rows]
    x = range(len(rows))
    a.bar([i - 0.2 for i in x], [r["real"]["heldout_loss"] for r in rows], 0.4, label="real")
    a.bar([i + 0.2 for i in x], [r["simulated"].get("heldout_loss", math.nan) for r in rows],
          0.4, label="simulated")
    losses = [v for r in rows for v in (r["real"]["heldout_loss"],
                                        r["simulated"].get("heldout_loss", math.nan))]
    a.set_ylim(0.95 * min(losses), 1.02 * max(losses))
    a.set_xticks(list(x), labels, fontsize=7)
    a.set(ylabel=f"held-out loss after {plan.real_epochs} epochs",
          title=f"{plan.real_learners} real gloo learners vs the simulator")
    a.legend()
    _save(plt, fig, path)


EXPERIMENTS = {"batch": (exp_batch, plot_batch), "gap": (exp_gap, plot_gap),
               "delay": (exp_delay, plot_delay), "hier": (exp_hier, plot_hier),
               "real": (exp_real, plot_real)}


def run_plan(plan: Plan, out: Path, exp: Path | None, only: list[str], redo: bool,
             docs: bool) -> dict:
    """Every experiment of ``plan`` (or ``only`` those), each to its JSON + PNG."""

    torch.set_num_threads(1)
    start = time.perf_counter()
    default = f"exp-{plan.hours:g}h" if plan.hours else "exp-tiny"
    exp = (exp or SCIENCE_DIR / default).resolve()
    base = ensure_exp(exp, corpus_overrides(plan.hours, SCIENCE_DIR))
    out.mkdir(parents=True, exist_ok=True)
    walls = {}
    for name in only or list(EXPERIMENTS):
        run, plot = EXPERIMENTS[name]
        path = out / f"science_{name}.json"
        if path.is_file() and not redo and json.loads(path.read_text()).get("plan") == \
                json.loads(json.dumps(asdict(plan))):  # as JSON has it: tuples are lists
            print(f"{name}: done before ({path})", flush=True)
            result = json.loads(path.read_text())
        else:
            t = time.perf_counter()
            print(f"== {name}", flush=True)
            result = run(base, plan, exp) if name == "real" else run(base, plan)
            result.update(plan=asdict(plan), wall_s=time.perf_counter() - t, base=base)
            write_text(path, json.dumps(result, indent=1) + "\n")
        walls[name] = result["wall_s"]
        plot(result, plan, out / f"science_{name}.png")
        if docs:
            DOCS_IMG.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / f"science_{name}.png", DOCS_IMG / f"science_{name}.png")
    summary = {"plan": asdict(plan), "wall_s": time.perf_counter() - start,
               "experiment_wall_s": walls}
    write_text(out / "science_summary.json", json.dumps(summary, indent=1) + "\n")
    print(f"wrote {len(walls)} experiments under {out} ({summary['wall_s']:.0f} s)")
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
        rows.append({"topology": topology, "learners": LEARNERS,
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
    a.set_xscale("log", base=2)
    a.set(xlabel="global batch (chunks)", ylabel=f"held-out loss after {EPOCHS} epochs",
          title=f"batch tolerance, {LEARNERS} simulated learners (tiny)")
    a.legend()
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


def run_quick(out: Path, exp: Path | None) -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    base = ensure_exp((exp or SCIENCE_DIR / "exp-tiny").resolve())
    result = {"learners": LEARNERS, "epochs": EPOCHS, "model": MODEL,
              "batch_tolerance": batch_tolerance(base), "spectral_gap": spectral_gap_point(base)}
    result["wall_s"] = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "science_quick.json", json.dumps(result, indent=1) + "\n")
    plot_quick(result, out / "science_quick.png")
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "science_quick.png", DOCS_IMG / "science_quick.png")
    print(f"wrote {out / 'science_quick.json'} and science_quick.png ({result['wall_s']:.0f} s)")


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
    p.add_argument("--no-docs", action="store_true", help="do not copy the PNGs to docs/img")
    args = p.parse_args(argv)
    if args.quick:
        run_quick(args.out, args.exp)
        return
    plan = FULL if args.full else PLANS[args.size]
    run_plan(plan, args.out, args.exp, args.only, args.redo, docs=not args.no_docs)


if __name__ == "__main__":
    main()
