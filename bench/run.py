"""Benchmarks of the distributed backends on one machine, per-step compute simulated by a sleep.

    python bench/run.py [straggler|scaling|consensus|gossip|all] [--quick]

Writes bench/results/<name>.json and <name>.png (figures, not asserts):
  straggler  8 learners, one slowed 1x/2x/4x/8x: aggregate samples/s of each registered backend
             against the ideal (the sum of the learners' own rates). A model, not the trainer:
             the slow learner is given fewer steps and sleeps instead of computing, so nothing
             waits at an epoch's end; bench/straggler.py measures the real trainer.
  scaling    1, 2, 4, 8 learners, each registered backend: throughput / (N x one learner).
  consensus  16 learners, zero learning rate: measured consensus distance per gossip round against
             the sqrt((1 - gap)^t) bound the topology predicts, for the fixed and randomized ring.
  gossip     2 AD-PSGD learners gossiping the IBM hybrid BLSTM's 42.6M parameters (a 170 MB fp32
             message; --quick: a tenth): the pairwise exchange time over gloo (MB/s) and the
             copy/apply times of the gossip thread; and the compute slowdown gossip causes: steps/s
             of the small MLP learner (no sleep) with gossip held, with gossip of its own 68 KB,
             and with gossip of the 170 MB message (the model plus an unused ballast parameter).
Learners are forked from a fork server that imported torch once (bench/synthetic.py, run_local)
so the machine's two cores spend their time on the learners, not on importing torch; the sleep
makes compute, not the cores, the bottleneck, as it is on GPUs. The backends are those of
asrtrain.distributed.registry (a new backend module is benchmarked with no change here); nodes
of hadpsgd-like backends are pairs of learners (--per-node 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import synthetic  # noqa: E402  (bench/synthetic.py, beside this file)

from asrtrain.distributed.registry import backend_class, backend_names  # noqa: E402
from asrtrain.distributed.topology import spectral_gap  # noqa: E402

RESULTS = REPO / "bench" / "results"
STEP_S = 0.1          # simulated compute per step of a normal learner
PER_LEARNER_BATCH = 8
# 16.9k parameters (68 KB per gossip message); one thread per learner, also for the single one.
MODEL = ["--dim", "64", "--hidden", "256", "--threads", "1"]
MODEL_PARAMS = 64 * 256 + 256 + 256 + 1
PER_NODE = 2          # learners per node, for the backends that have nodes
#: Parameters of the IBM-size hybrid BLSTM (conf/hybrid/ibm.yaml: 6 x 512 per direction, 256
#: bottleneck, 32k outputs), whose flat fp32 vector a gossip round exchanges.
IBM_PARAMS = 42_600_000


def run(learners: int, argv: list[str]) -> list[dict]:
    """Run the synthetic learners; their rank<r>.json statistics."""
    with tempfile.TemporaryDirectory(prefix="asrtrain-bench-") as tmp:
        codes = synthetic.run_local(Path(tmp), learners, argv, timeout=600)
        if any(codes.values()):
            errors = [p.read_text() for p in Path(tmp).glob("error*.txt")]
            raise RuntimeError(f"bench run failed {codes}: {errors}")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(learners)]


def throughput(stats: list[dict]) -> float:
    """Aggregate samples/s: the sum of every learner's rate over its own training time."""
    return sum(s["samples"] / s["elapsed"] for s in stats)


def backend_args(backend: str, learners: int) -> list[str]:
    return ["--backend", backend, "--per-node", str(min(PER_NODE, learners))]


def straggler_steps(backend: str, n: int, base: int, slow_rank: int, slow_steps: int) -> list[int]:
    """Steps per learner so that every learner trains for about the same time: learners in
    lockstep with the slow one (Backend.lockstep) take its number of steps."""
    lockstep = backend_class(backend).lockstep
    if lockstep == "all":
        together = set(range(n))
    elif lockstep == "node":
        first = slow_rank - slow_rank % PER_NODE
        together = set(range(first, first + PER_NODE))
    else:
        together = {slow_rank}
    return [slow_steps if r in together else base for r in range(n)]


def straggler(quick: bool) -> dict:
    n, base = 8, (20 if quick else 40)
    slow_rank = n - 1
    out: dict = {"learners": n, "step_s": STEP_S, "slow_rank": slow_rank, "per_node": PER_NODE,
                 "runs": []}
    for factor in (1, 2, 4, 8):
        own = [1.0 / STEP_S] * n
        own[slow_rank] = 1.0 / (STEP_S * factor)
        ideal = PER_LEARNER_BATCH * sum(own)
        for backend in backend_names():
            # Synchronous groups must take the same number of steps: the slow pace sets theirs.
            steps = straggler_steps(backend, n, base, slow_rank, max(4, base // factor))
            stats = run(n, [*backend_args(backend, n), *MODEL, "--batch",
                            str(PER_LEARNER_BATCH * n), "--sleep", str(STEP_S),
                            "--slow", f"{slow_rank}:{factor}",
                            "--steps", ",".join(map(str, steps)), "--lr", "0.01"])
            rate = throughput(stats)
            out["runs"].append({"backend": backend, "slowdown": factor, "samples_per_s": rate,
                                "ideal": ideal, "fraction_of_ideal": rate / ideal})
            print(f"straggler {factor}x {backend:8s} {rate:8.1f} samples/s = "
                  f"{rate / ideal:.3f} of ideal {ideal:.1f}", flush=True)
    return out


def scaling(quick: bool) -> dict:
    steps = "20" if quick else "40"
    out: dict = {"step_s": STEP_S, "per_learner_batch": PER_LEARNER_BATCH, "runs": []}
    # The machine is shared: the best of three runs is the least disturbed one-learner rate.
    one = max(throughput(run(1, ["--backend", "ssgd", *MODEL, "--batch", str(PER_LEARNER_BATCH),
                                 "--sleep", str(STEP_S), "--steps", steps])) for _ in range(3))
    out["one_learner"] = one
    out["one_learner_sleep_bound"] = PER_LEARNER_BATCH / STEP_S
    for backend in backend_names():
        out["runs"].append({"backend": backend, "learners": 1, "samples_per_s": one,
                            "efficiency": 1.0})
        for n in (2, 4, 8):
            rate = throughput(run(n, [*backend_args(backend, n), *MODEL, "--batch",
                                      str(PER_LEARNER_BATCH * n), "--sleep", str(STEP_S),
                                      "--steps", steps, "--lr", "0.01"]))
            out["runs"].append({"backend": backend, "learners": n, "samples_per_s": rate,
                                "efficiency": rate / (n * one)})
            print(f"scaling {backend:8s} N={n}: {rate:8.1f} samples/s, efficiency "
                  f"{rate / (n * one):.3f}", flush=True)
    return out


def consensus(quick: bool) -> dict:
    n, steps = 16, (12 if quick else 20)
    out: dict = {"learners": n, "runs": []}
    for scheme in ("ring", "random_ring"):
        stats = run(n, ["--backend", "adpsgd", "--topology", scheme, "--no-sync-init", "--lr",
                        "0", *MODEL, "--batch", str(n), "--steps", str(steps), "--log-every", "1",
                        "--idle", "30", "--sleep", "0.01"])
        gap = spectral_gap(n, scheme)
        rows = stats[0]["distances"]  # (step, consensus distance, gossip rounds so far)
        d0 = rows[0][1]
        out["runs"].append({"scheme": scheme, "gap": gap,
                            "rounds": [r for _, _, r in rows],
                            "distance": [d / d0 for _, d, _ in rows],
                            "predicted": [(1 - gap) ** (r / 2) for _, _, r in rows]})
        print(f"consensus {scheme}: gap {gap:.4f}; distance after {rows[-1][2]} rounds "
              f"{rows[-1][1] / d0:.3g} (bound {(1 - gap) ** (rows[-1][2] / 2):.3g})", flush=True)
    return out


def gossip(quick: bool) -> dict:
    params = IBM_PARAMS // 10 if quick else IBM_PARAMS
    ballast = ["--ballast", str(params - MODEL_PARAMS)]
    rounds = 3 if quick else 6
    out: dict = {"params": params, "message_mb": params * 4 / 1e6, "learners": 2, "runs": []}
    # Rounds back to back after one step: each learner's time waiting for its partner's message
    # (sending its own at the same time), per exchange.
    stats = run(2, ["--backend", "adpsgd", "--topology", "ring", *MODEL, *ballast, "--lr", "0",
                    "--steps", "1", "--idle", "0.001", "--wait-rounds", str(rounds)])
    exchanges = sum(s["exchanges"] for s in stats)
    per = {k: sum(s["gossip_seconds"][k] for s in stats) / exchanges
           for k in stats[0]["gossip_seconds"]}
    out["exchange"] = {"exchanges": exchanges, "wait_s": per["wait"], "copy_s": per["copy"],
                       "apply_s": per["apply"], "mb_per_s": out["message_mb"] / per["wait"]}
    print(f"gossip exchange of {out['message_mb']:.0f} MB between 2 gloo learners: "
          f"{per['wait']:.3f} s ({out['message_mb'] / per['wait']:.0f} MB/s); copy out "
          f"{per['copy']:.3f} s, change computed and applied {per['apply']:.3f} s "
          f"({exchanges} exchanges)", flush=True)
    steps = "600" if quick else "3000"
    configs = {"no gossip": ["--no-gossip"], "gossip 68 KB": [],
               f"gossip {out['message_mb']:.0f} MB": ballast}
    # The machine is shared: each setting runs 3 times, interleaved, and keeps its best run.
    best: dict[str, tuple[float, int]] = {}
    for _ in range(3):
        for label, extra in configs.items():
            stats = run(2, ["--backend", "adpsgd", "--topology", "ring", *MODEL, *extra,
                            "--lr", "0.01", "--batch", str(2 * PER_LEARNER_BATCH), "--steps",
                            steps, "--idle", "0.01"])
            rate = sum(s["steps"] / s["elapsed"] for s in stats) / len(stats)
            exchanges = sum(s["exchanges"] for s in stats)
            print(f"gossip slowdown, {label:13s}: {rate:7.1f} steps/s per learner "
                  f"({exchanges} exchanges)", flush=True)
            best[label] = max(best.get(label, (0.0, 0)), (rate, exchanges))
    out["runs"] = [{"gossip": label, "steps_per_s": rate, "exchanges": exchanges}
                   for label, (rate, exchanges) in best.items()]
    base = out["runs"][0]["steps_per_s"]
    for r in out["runs"]:
        r["relative"] = r["steps_per_s"] / base
    return out


def plot(name: str, data: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): JSON only", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    backends = sorted({r["backend"] for r in data["runs"] if "backend" in r})
    if name == "straggler":
        for backend in backends:
            runs = [r for r in data["runs"] if r["backend"] == backend]
            ax.plot([r["slowdown"] for r in runs], [r["samples_per_s"] for r in runs], "o-",
                    label=backend)
        ideal = [r for r in data["runs"] if r["backend"] == backends[0]]
        ax.plot([r["slowdown"] for r in ideal], [r["ideal"] for r in ideal], "k--", label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("slowdown of one learner (of 8)")
        ax.set_ylabel("aggregate samples/s")
        ax.set_title(f"Straggler: 8 learners, {STEP_S * 1000:.0f} ms simulated compute/step")
    elif name == "gossip":
        runs = data["runs"]
        ax.bar([r["gossip"] for r in runs], [r["steps_per_s"] for r in runs])
        ax.set_ylabel("steps/s per learner")
        ex = data["exchange"]
        ax.set_title(f"2 CPU learners; {data['message_mb']:.0f} MB exchange "
                     f"{ex['wait_s']:.2f} s ({ex['mb_per_s']:.0f} MB/s)", fontsize=9)
    elif name == "scaling":
        for backend in backends:
            runs = [r for r in data["runs"] if r["backend"] == backend]
            ax.plot([r["learners"] for r in runs], [r["efficiency"] for r in runs], "o-",
                    label=backend)
        ax.axhline(0.9, color="k", ls=":", label="0.9")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("learners")
        ax.set_ylabel("throughput / (N x one learner)")
        ax.set_title("Scaling (simulated compute)")
    else:
        for run_ in data["runs"]:
            line = ax.semilogy(run_["rounds"], run_["distance"], "o-",
                               label=f"{run_['scheme']} measured")[0]
            ax.semilogy(run_["rounds"], run_["predicted"], "--", color=line.get_color(),
                        label=f"{run_['scheme']} sqrt((1-gap)^t), gap {run_['gap']:.3f}")
        ax.set_xlabel("gossip rounds t")
        ax.set_ylabel("consensus distance / initial")
        ax.set_title(f"Consensus, {data['learners']} learners, zero LR")
    ax.grid(True, alpha=0.3)
    if name != "gossip":
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("which", nargs="?", default="all",
                   choices=["straggler", "scaling", "consensus", "gossip", "all"])
    p.add_argument("--quick", action="store_true", help="fewer steps")
    args = p.parse_args()
    torch.set_num_threads(1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    benches = {"straggler": straggler, "scaling": scaling, "consensus": consensus,
               "gossip": gossip}
    for name, fn in benches.items():
        if args.which not in (name, "all"):
            continue
        start = time.monotonic()
        data = fn(args.quick)
        data["seconds"] = time.monotonic() - start
        (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1))
        plot(name, data)


if __name__ == "__main__":
    main()
