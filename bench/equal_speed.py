"""AD-PSGD's dev loss at equal speeds, this trainer against an earlier one, over seeds.

    python bench/equal_speed.py [--ref bb7b53d] [--seeds 1 2 3] [--backend adpsgd] [--learners 2]

Issue 23 changed what an ``adpsgd`` epoch is (the whole training set once across all learners,
claimed block by block, instead of equal steps for every learner) and took every collective off
the step loop. With no straggler the learners run at the same speed, and the change should not
cost accuracy: this bench trains the same small CTC model as ``bench/straggler.py`` (tiny recipe,
same model, epochs and batch) with each seed, once with this trainer (``--rev``) and once
with the trainer at ``--ref`` (each a ``git worktree`` of this repository; the default ``--ref``
``bb7b53d`` is the trainer the issue was filed against), and compares the last epoch's dev
loss of the consensus model (the model learner 0 checkpoints, as the trainer reports it).

The rule, fixed before the runs: the new trainer "stays within the spread" when the mean of its
seeds lies within the earlier trainer's min..max over the same seeds, widened by nothing. The
difference of the means and its standard error (Welch) are printed and written beside it.
AD-PSGD is asynchronous: a seed fixes the initial model and the batch order, not the interleaving
of gossip and steps, so each seed is one draw of the run-to-run spread too.

Writes bench/results/equal_speed.json ({"rows": [{trainer, rev, seed, dev_loss, run_seconds,
load}], "verdict": {...}}).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO / "bench"))
from straggler import MODEL  # noqa: E402  (the same small model as the straggler bench)


def asrtrain(repo: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "asrtrain.cli", *args], cwd=repo, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"asrtrain {' '.join(args[:3])} in {repo} failed "
                         f"({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def worktree(rev: str, where: Path) -> Path:
    """A checkout of ``rev`` of this repository at ``where`` (made once)."""
    if not (where / "asrtrain").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=REPO,
                       check=True, capture_output=True)
    return where


def train(repo: Path, exp: Path, a: argparse.Namespace, seed: int) -> dict:
    name = f"equal_{a.backend}_{a.learners}_seed{seed}"
    load = os.getloadavg()[0]
    asrtrain(repo, "run", "recipes/tiny", f"exp_dir={exp}", "--stage", "train", "--to", "train",
             "--force", "train", *MODEL, f"trainer.epochs={a.epochs}",
             f"trainer.batch_frames={a.batch_frames}", f"trainer.backend={a.backend}",
             f"trainer.learners={a.learners}", f"trainer.seed={seed}", f"model.name={name}")
    ckpt = torch.load(exp / "train" / name / f"epoch-{a.epochs}.pt", map_location="cpu",
                      weights_only=False)
    m = ckpt["metrics"]
    return {"seed": seed, "dev_loss": float(m["dev_loss"]),
            "run_seconds": m.get("run_seconds"), "load": [load, os.getloadavg()[0]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref", default="bb7b53d", help="the earlier trainer's git revision")
    p.add_argument("--rev", default="HEAD",
                   help="this trainer's revision (a worktree too, so edits in progress in this "
                        "checkout do not reach the runs)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--backend", default="adpsgd")
    p.add_argument("--learners", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-frames", type=int, default=1500)
    p.add_argument("--work", type=Path, default=None,
                   help="where the worktree and the two exp dirs go (kept); default: temporary")
    p.add_argument("--out", type=Path, default=RESULTS / "equal_speed.json")
    a = p.parse_args()
    start = time.time()
    tmp = None if a.work else tempfile.TemporaryDirectory(prefix="asrtrain-equal-")
    work = (a.work or Path(tmp.name)).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "--short", a.ref], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", a.rev], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    trainers = {"this": (worktree(head, work / f"rev-{head}"), head),
                "earlier": (worktree(a.ref, work / f"ref-{rev}"), rev)}
    rows = []
    for label, (repo, _) in trainers.items():
        exp = work / f"exp-{label}"
        if not (exp / ".done" / "features").is_file():
            asrtrain(repo, "run", "recipes/tiny", f"exp_dir={exp}", "--to", "features", "nj=2")
    for seed in a.seeds:  # alternating, so a change of load falls on both
        for label, (repo, at) in trainers.items():
            row = {"trainer": label, "rev": at, **train(repo, work / f"exp-{label}", a, seed)}
            rows.append(row)
            print(f"{label:8s} {at} seed {seed}: dev loss {row['dev_loss']:.3f}, "
                  f"{row['run_seconds'] or float('nan'):.1f} s, load "
                  f"{min(row['load']):.1f}-{max(row['load']):.1f}", flush=True)
    new = [r["dev_loss"] for r in rows if r["trainer"] == "this"]
    old = [r["dev_loss"] for r in rows if r["trainer"] == "earlier"]
    diff = statistics.mean(new) - statistics.mean(old)
    se = (math.sqrt(statistics.variance(new) / len(new) + statistics.variance(old) / len(old))
          if len(new) > 1 and len(old) > 1 else float("nan"))
    within = min(old) <= statistics.mean(new) <= max(old)
    verdict = {"rule": "mean of this trainer's seeds within the earlier trainer's min..max",
               "this_mean": statistics.mean(new), "this_sd": statistics.pstdev(new),
               "earlier_mean": statistics.mean(old), "earlier_sd": statistics.pstdev(old),
               "earlier_range": [min(old), max(old)], "difference": diff,
               "difference_se": se, "within_spread": within}
    print(f"this trainer {verdict['this_mean']:.3f} (sd {verdict['this_sd']:.3f}), earlier "
          f"{verdict['earlier_mean']:.3f} (sd {verdict['earlier_sd']:.3f}, range "
          f"{min(old):.3f}..{max(old):.3f}): difference {diff:+.3f} ± {se:.3f} (s.e.); "
          f"within the earlier spread: {'yes' if within else 'NO'}")
    out = {"rows": rows, "verdict": verdict, "backend": a.backend, "learners": a.learners,
           "epochs": a.epochs, "batch_frames": a.batch_frames, "model": MODEL,
           "recipe": "recipes/tiny (CTC)", "cores": os.cpu_count(),
           "seconds": time.time() - start,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} in {time.time() - start:.0f} s")
    if tmp is not None:
        for repo, _ in trainers.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(repo)], cwd=REPO,
                           capture_output=True)
        tmp.cleanup()
    sys.exit(0 if within else 1)


if __name__ == "__main__":
    main()
