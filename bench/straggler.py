"""A straggler in the real trainer: training time with one learner made slower, per backend.

    python bench/straggler.py [--learners 2 4] [--backends ssgd adpsgd hadpsgd] [--quick]

Each point is the real ``asrtrain run recipes/tiny --stage train --to train`` (the CTC model,
small; gloo learners under torchrun, one CPU thread each), once as it is and once with learner
``N-1`` made ``FACTOR`` times slower from outside: this script stops it (SIGSTOP) for
``1 - 1/FACTOR`` of every 200 ms and lets it go on (SIGCONT) for the rest, found in the process
tree of the run by its ``RANK``. Nothing in the trainer knows. The figures come from the last
epoch's checkpoint: ``run_seconds`` (training from its first step to the last epoch's dev loss
and checkpoint, learner start-up left out), the dev loss of the consensus model, and each
learner's samples of that epoch. Each point runs ``--repeats`` times, with and without the
straggler in turn; the slowdown is the ratio of the medians. ``hadpsgd`` runs nodes of
``N // 2`` learners (2 learners: two one-learner nodes, which is AD-PSGD between the leaders;
4: two nodes of 2).

A learner that is never waited for would make the run ``N / (N - 1 + 1/FACTOR)`` times slower
(``ideal`` in the rows: the others go on at full speed and the work is shared by speed), where
every learner has a core of its own; with more learners than cores a stopped learner also hands
its core to the others, so the ideal is only a guide there.

Writes bench/results/straggler.json ({"rows": [{backend, learners, per_node,
straggler_factor, slowdown, ideal, samples_share, dev_loss, run_seconds, load}, ...], ...}) and
straggler.png. The machine's load average is recorded beside each run (other jobs share the
cores: the figures are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FACTOR = 4
PERIOD_S = 0.2
MODEL = ["model.layers=2", "model.cells=96", "model.bottleneck=64"]


def asrtrain(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "asrtrain.cli", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def finish(proc: subprocess.Popen, what: str) -> str:
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{out[-4000:]}")
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except FileNotFoundError:
            continue
        for t in tasks:
            try:
                kids = Path(f"/proc/{p}/task/{t}/children").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            for k in map(int, kids):
                out.append(k)
                todo.append(k)
    return out


def learner_pid(run_pid: int, rank: int, timeout_s: float = 300) -> int | None:
    """The pid of the learner with ``RANK=rank`` under the run ``run_pid`` (None: it ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in descendants(run_pid):
            try:
                # a learner is named learner-RANK (asrtrain/distributed/warm.py)
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if comm == f"learner-{rank}" and b"asrtrain.cli train" in cmd:
                return pid
        if not os.path.exists(f"/proc/{run_pid}"):
            return None
        time.sleep(0.05)
    raise RuntimeError(f"no learner with RANK={rank} under pid {run_pid} after {timeout_s} s")


def slow_down(pid: int, factor: float, stop: threading.Event) -> None:
    """Stop ``pid`` for ``1 - 1/factor`` of every PERIOD_S until it ends or ``stop`` is set."""
    stopped_s = PERIOD_S * (1 - 1 / factor)
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stopped_s)
            os.kill(pid, signal.SIGCONT)
            time.sleep(PERIOD_S - stopped_s)
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def train(exp: Path, backend: str, learners: int, epochs: int, batch_frames: int,
          factor: float) -> dict:
    """One training run; its last epoch's figures."""
    per_node = max(1, learners // 2)
    name = f"straggler_{backend}_{learners}_{factor:g}x"
    shutil.rmtree(exp / "train" / name, ignore_errors=True)
    load = os.getloadavg()[0]
    proc = asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--stage", "train", "--to", "train",
                    "--force", "train", *MODEL, f"trainer.epochs={epochs}",
                    f"trainer.batch_frames={batch_frames}", f"trainer.backend={backend}",
                    f"trainer.learners={learners}", f"trainer.per_node={per_node}",
                    f"model.name={name}")
    stop = threading.Event()
    slower = None
    if factor > 1:
        pid = learner_pid(proc.pid, learners - 1)
        if pid is not None:
            slower = threading.Thread(target=slow_down, args=(pid, factor, stop), daemon=True)
            slower.start()
    try:
        finish(proc, f"{name}")
    finally:
        stop.set()
        if slower is not None:
            slower.join()
    ckpt = torch.load(exp / "train" / name / f"epoch-{epochs}.pt", map_location="cpu",
                      weights_only=False)
    m = ckpt["metrics"]
    samples = [int(m[f"samples_learner_{r}"]) for r in range(learners)]
    return {"backend": backend, "learners": learners, "per_node": per_node,
            "straggler_factor": factor, "run_seconds": m["run_seconds"],
            "samples": samples, "samples_share": [s / sum(samples) for s in samples],
            "dev_loss": m["dev_loss"], "load": [load, os.getloadavg()[0]]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slowed = [r for r in rows if r["straggler_factor"] > 1]
    counts = sorted({r["learners"] for r in slowed})
    backends = list(dict.fromkeys(r["backend"] for r in slowed))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        xs = [j + i * width for j in range(len(counts))]
        ys = [next((r["slowdown"] for r in slowed if r["backend"] == b
                    and r["learners"] == n), 0) for n in counts]
        axes[0].bar(xs, ys, width, label=b)
        share = [next((r["samples_share"][-1] for r in slowed if r["backend"] == b
                       and r["learners"] == n), 0) for n in counts]
        axes[1].bar(xs, share, width, label=b)
    for j, n in enumerate(counts):
        ideal = next(r["ideal"] for r in slowed if r["learners"] == n)
        axes[0].hlines(ideal, j - 0.1, j + 0.9, colors="k", linestyles="--")
        axes[1].hlines(1 / n, j - 0.1, j + 0.9, colors="grey", linestyles=":")
        axes[1].hlines(0.25 / (n - 0.75), j - 0.1, j + 0.9, colors="k", linestyles="--")
    for ax in axes:
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(counts))])
        ax.set_xticklabels([f"{n} learners" for n in counts])
    axes[0].set_ylabel(f"training time, one learner {FACTOR}x slower / none")
    axes[0].set_title("slowdown (dashed: a learner never waited for)")
    axes[1].set_ylabel("the slow learner's share of an epoch's samples")
    axes[1].set_title("slow learner's share (dotted: equal; dashed: by speed)")
    axes[0].legend()
    fig.suptitle("Real trainer, tiny CTC recipe, gloo learners on 2 shared cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--learners", type=int, nargs="+", default=[2, 4])
    p.add_argument("--backends", nargs="+", default=["ssgd", "adpsgd", "hadpsgd"])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-frames", type=int, default=1500)
    p.add_argument("--exp", type=Path, default=None,
                   help="An exp dir to keep (the tiny recipe's data and features are made there "
                        "once); default: a temporary one.")
    p.add_argument("--repeats", type=int, default=2,
                   help="Runs of each point, alternating with and without the straggler; the "
                        "medians' ratio is the slowdown.")
    p.add_argument("--quick", action="store_true", help="2 learners, one epoch, one run each")
    p.add_argument("--out", type=Path, default=RESULTS / "straggler.json")
    a = p.parse_args()
    if a.quick:
        a.learners, a.epochs, a.repeats = [2], 1, 1
    tmp = None
    exp = a.exp
    if exp is None:
        tmp = tempfile.TemporaryDirectory(prefix="asrtrain-straggler-")
        exp = Path(tmp.name) / "exp"
    exp = exp.resolve()
    start = time.time()
    if not (exp / ".done" / "features").is_file():
        finish(asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--to", "features", "nj=2"),
               "preparing the tiny recipe")
    rows = []
    for n in a.learners:
        for backend in a.backends:
            runs: dict[float, list[dict]] = {1: [], FACTOR: []}
            for _ in range(a.repeats):  # alternating, so a change of load falls on both
                for factor in runs:
                    runs[factor].append(train(exp, backend, n, a.epochs, a.batch_frames,
                                              factor))
            seconds = {f: statistics.median(r["run_seconds"] for r in rs)
                       for f, rs in runs.items()}
            ideal = n / (n - 1 + 1 / FACTOR)
            for factor, rs in runs.items():
                row = dict(rs[-1])
                row["run_seconds"] = seconds[factor]
                row["run_seconds_each"] = [r["run_seconds"] for r in rs]
                row["samples_share_each"] = [r["samples_share"] for r in rs]
                row["dev_loss_each"] = [r["dev_loss"] for r in rs]
                row["load"] = [x for r in rs for x in r["load"]]
                row["slowdown"] = seconds[factor] / seconds[1]
                row["ideal"] = ideal if factor > 1 else 1.0
                rows.append(row)
                print(f"{backend:8s} {n} learners, straggler {row['straggler_factor']:g}x: "
                      f"{row['run_seconds']:.1f} s, slowdown {row['slowdown']:.2f} "
                      f"(never waited for: {row['ideal']:.2f}), shares "
                      f"{[round(s, 3) for s in row['samples_share']]}, dev loss "
                      f"{row['dev_loss']:.2f}, seconds {row['run_seconds_each']}, load "
                      f"{min(row['load']):.1f}-{max(row['load']):.1f}",
                      flush=True)
    out = {"rows": rows, "cores": os.cpu_count(), "factor": FACTOR, "period_s": PERIOD_S,
           "repeats": a.repeats, "epochs": a.epochs, "batch_frames": a.batch_frames, "model": MODEL,
           "recipe": "recipes/tiny (CTC)", "seconds": time.time() - start,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, a.out.with_suffix(".png"))
    print(f"wrote {a.out} and {a.out.with_suffix('.png')} in {time.time() - start:.0f} s")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
