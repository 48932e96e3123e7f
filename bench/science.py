"""The convergence experiments of issue 14, run through the cluster simulator (asrtrain.simulate).

    python bench/science.py --quick [--exp DIR] [--out bench/results]

``--quick`` (this session's skeleton, minutes on 2 cores) runs on the tiny hybrid task with a
small BLSTM (1 x 32 cells):

- batch tolerance: held-out loss after ``EPOCHS`` epochs at three global batches (16 learners x
  4, 16 and 64 chunks: 64 to 1,024), SSGD against AD-PSGD (random ring);
- spectral gap: 16 learners from their own random models at zero learning rate, fixed ring,
  randomized ring and exponential graph; the consensus distance round by round against the
  gap's prediction (the squared distance shrinks by about ``1 - gap`` a round), and the
  held-out loss of each topology with learning.

It writes ``science_quick.json`` and ``science_quick.png`` under ``--out`` (the PNG is copied to
docs/img/ for docs/science.md). The experiments at scale (16-128 learners, global batches to
12,288 on a scaled corpus, stragglers and delay-by-one, H-AD-PSGD, multi-process confirmation)
are not written yet: ``--full`` says so. ``--exp`` is an experiment with features and GMM
alignments (``asrtrain run recipes/tiny exp_dir=DIR --to align``); when it has none they are
made there first with the small settings of tests/test_e2e.py.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from asrtrain.fileio import atomic_open, write_text

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOCS_IMG = REPO / "docs" / "img"
LEARNERS = 16
EPOCHS = 6
MODEL = ["hybrid.model.layers=1", "hybrid.model.cells=32", "hybrid.model.bottleneck=16",
         f"hybrid.trainer.epochs={EPOCHS}"]
# The GMM passes of tests/test_e2e.py (ALIGN_SMALL): enough to give the hybrid model targets.
ALIGN_SMALL = ["nj=2", "align.decode=false", "~align.passes.tri2",
               "align.passes.mono.num_iters=4", "align.passes.mono.totgauss=300",
               "align.passes.mono.realign_iters=[1,2,3]", "align.passes.tri1.num_leaves=60",
               "align.passes.tri1.num_gauss=300", "+align.passes.tri1.num_iters=4",
               "+align.passes.tri1.realign_iters=[2]"]
TOPOLOGIES = ("ring", "random_ring", "exponential")


def ensure_exp(exp: Path) -> list[str]:
    """The overrides that point the recipe at ``exp``, after making its features and
    alignments if it has none (a finished tiny experiment is used as it is)."""
    if (exp / ".done" / "align").is_file():
        return [f"exp_dir={exp}"]
    overrides = [f"exp_dir={exp}", *ALIGN_SMALL]
    print(f"making features and alignments in {exp} (asrtrain run --to align)", flush=True)
    subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny", *overrides,
                    "--to", "align"], cwd=REPO, check=True)
    return overrides


def simulate(overrides: list[str], initial_seeds: bool = False, **sim: object) -> dict:
    """One simulation of the tiny hybrid task: its trajectory (a dict)."""
    from asrtrain.models import build_model
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.engine import SimConfig, Simulator
    from asrtrain.simulate.workload import TaskWorkload, system_config

    cfg = system_config(compose_recipe(REPO / "recipes" / "tiny", overrides), "hybrid")
    work = TaskWorkload(cfg)
    sim_cfg = SimConfig(**{"learners": LEARNERS, "epochs": EPOCHS, "step_s": 0.1,
                           "grad_clip": 5.0, **sim})

    def own_model(member: int) -> torch.Tensor:
        torch.manual_seed(1000 + member)
        model = build_model(cfg.model, work.task.input_dim, work.task.output_dim)
        return torch.nn.utils.parameters_to_vector(model.parameters()).detach()

    start = time.perf_counter()
    traj = Simulator(sim_cfg, work, initial=own_model if initial_seeds else None).run()
    out = traj.to_json()
    out["config"]["wall_s"] = time.perf_counter() - start
    return out


def batch_tolerance(base: list[str]) -> list[dict]:
    rows = []
    for per_learner in (4, 16, 64):
        for backend in ("ssgd", "adpsgd"):
            traj = simulate([*base, f"hybrid.trainer.batch_chunks={per_learner}"],
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
        mixing = simulate([*base, "hybrid.trainer.batch_chunks=16", "hybrid.trainer.lr=0",
                           f"trainer.topology={topology}"], initial_seeds=True,
                          topology=topology, idle_s=1e9, epochs=1, log_every=1)
        gap = mixing["config"]["spectral_gap"]
        d = [p["distance"] for p in mixing["points"]]
        rate = (d[-1] / d[0]) ** (2.0 / (len(d) - 1)) if len(d) > 1 and d[0] > 0 else math.nan
        learning = simulate([*base, "hybrid.trainer.batch_chunks=16",
                             f"trainer.topology={topology}"], topology=topology, log_every=5)
        rows.append({"topology": topology, "learners": LEARNERS, "spectral_gap": gap,
                     "predicted_rate": 1.0 - gap, "measured_rate": rate,
                     "zero_lr_distance": d,
                     "final_zero_lr_distance": mixing["epochs"][0]["distance"],
                     "heldout_loss": learning["epochs"][-1]["heldout_loss"],
                     "learning_distance": [p["distance"] for p in learning["points"]],
                     "wall_s": mixing["config"]["wall_s"] + learning["config"]["wall_s"]})
        print(f"{topology:12s} gap {gap:.4f}: squared distance x{rate:.4f} a round (predicted "
              f"<= x{1 - gap:.4f}); held-out loss {rows[-1]['heldout_loss']:.4f}", flush=True)
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
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
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the quick experiments (minutes)")
    p.add_argument("--full", action="store_true", help="the experiments at scale (not yet)")
    p.add_argument("--exp", type=Path, default=Path("/tmp/asrtrain-science-exp"),
                   help="an experiment with features and alignments (made when missing)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.full or not args.quick:
        sys.exit("bench/science.py: only --quick is written so far; the experiments at scale "
                 "(issue 14, item 4) are not (docs/science.md)")
    torch.set_num_threads(1)
    start = time.perf_counter()
    base = [*ensure_exp(args.exp.resolve()), *MODEL]
    result = {"learners": LEARNERS, "epochs": EPOCHS, "model": MODEL,
              "batch_tolerance": batch_tolerance(base), "spectral_gap": spectral_gap_point(base)}
    result["wall_s"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "science_quick.json", json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "science_quick.png")
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.out / "science_quick.png", DOCS_IMG / "science_quick.png")
    print(f"wrote {args.out / 'science_quick.json'} and science_quick.png "
          f"({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
