"""The simulator's time model against real gloo runs (issue 24 item 2): 4 and 8 learners, 2 and
4 in each of two network namespaces joined by a veth pair (bench/delay_by_one.py's ``link``, the
tiny CTC model of 69,473 parameters = 278 kB a message), each backend with and without
delay-by-one, first with the link unlimited, then with its rate limited by ``tc`` tbf.

What is measured and what predicted: the unlimited run of a setting gives the one figure the
model takes from it, a learner's seconds per step on this machine (compute, data, the gossip
thread's CPU and the unlimited link's latencies, all together; the CPU is shared by the
learners of both namespaces and other work); the link's bandwidth is fitted once, on
the SSGD pair of the fewest learners (``--fraction F``: not fitted, F of the tc rate, e.g. an
earlier rate's fit); every other limited run is then predicted by
:func:`asrtrain.simulate.timing.step_time` from the bytes, that bandwidth and the backend's
registered shape, and the gossip thread's event timing (:func:`~asrtrain.simulate.timing.
gossip_events`: the rounds and the drain that ends the epoch), with nothing fitted to it. The
"ratio at the tc rate" is the same prediction at the tc rate less the headers (1448 payload
bytes in a 1514-byte frame). The wall time compared is the trainer's ``run_seconds``
(training and the epoch's evaluation, start-up excluded). In this trainer a step never waits
for gossip, so a slow link thins the rounds out rather than slowing the steps; learner 0's
gossip exchanges per second are recorded beside the model's (on the limited link its few log
points often saw none finish). The model's other mode (a step waits for its exchange, the
seeds' learner) is predicted beside it, delay-by-one on and off, for the same settings.

    sudo python bench/sim_calibrate.py --rate 20mbit     (root; about 12 minutes
    here; writes docs/science/sim_calibrate.json)
    python bench/sim_calibrate.py --from docs/science/sim_calibrate.json --out X.json
                                   (the comparisons again from the committed runs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import delay_by_one  # bench/delay_by_one.py: the namespaces, the veth pair and a two-node run
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from asrtrain.distributed.registry import sim_shape  # noqa: E402
from asrtrain.distributed.topology import Schedule  # noqa: E402
from asrtrain.simulate.timing import (  # noqa: E402
    GossipClock,
    LinkCosts,
    Network,
    gossip_events,
    placement,
    ring_allreduce_s,
    step_time,
)

#: Payload bytes per byte on the wire for full TCP segments over Ethernet (1448 of 1514).
WIRE_EFFICIENCY = 1448 / 1514
TOPOLOGY = "random_ring"
#: Frames of a learner's batch: half delay_by_one.py's, for more steps (and messages) an epoch.
BATCH_FRAMES = 750
#: Tries of a run: two-node runs of 2 learners a node hung now and then here in a gradient
#: allreduce or the consensus averaging after the first epoch (4 of 7 two-epoch runs at load
#: 3-4; one-epoch runs did not), so runs are one epoch and a failed one is tried again.
TRIES = 3
IDLE_S = 0.1  # trainer.gossip_idle_s's default


def rate_bytes(rate: str) -> float:
    """A tc rate (``20mbit``, ``1gbit``) in payload bytes per second."""
    return delay_by_one.rate_bits(rate) / 8 * WIRE_EFFICIENCY


def run_steps(run_dir: Path, epoch: int, learners: int) -> list[int]:
    """Each learner's optimizer steps over the run (Adam's step count in its last checkpoint)."""
    out = []
    for r in range(learners):
        state = torch.load(run_dir / f"epoch-{epoch}.optim.rank{r}.pt", map_location="cpu",
                           weights_only=False)["optimizer"]["state"]
        out.append(int(max(float(s["step"]) for s in state.values())))
    return out


def settings(backend: str, learners: int, delay: bool) -> list[str]:
    per_node = learners // 2
    return [f"trainer.learners={per_node}", f"trainer.backend={backend}",
            f"trainer.batch_frames={BATCH_FRAMES}", "trainer.timeout_s=40",
            f"trainer.per_node={per_node}", f"trainer.topology={TOPOLOGY}",
            f"trainer.delay_by_one={str(delay).lower()}"]


def model_bytes(run_dir: Path) -> int:
    state = torch.load(run_dir / "final.pt", map_location="cpu", weights_only=False)["model"]
    return sum(v.numel() * v.element_size() for v in state.values() if v.is_floating_point())


def predict(backend: str, learners: int, delay: bool, nbytes: float, net: Network,
            compute_s: float, compute_waits: bool = False):
    shape = sim_shape(backend)
    per_node = learners // 2
    members = shape.members(learners, per_node)
    phases = len(Schedule(members, TOPOLOGY, 1).phases(0)) if members > 1 else 0
    return step_time(shape, learners, per_node, 2, compute_s, nbytes, net, phases, delay,
                     compute_waits)


def real(prefixes, host, links, exp: Path, name: str, epochs: int, backend: str,
         learners: int, delay: bool, rate: str | None) -> dict:
    for attempt in range(1, TRIES + 1):
        start = time.monotonic()
        try:
            row = delay_by_one.two_nodes(prefixes, host, links, exp, f"{name}_{attempt}",
                                         epochs, *settings(backend, learners, delay))
            break
        except SystemExit as e:
            print(f"{name}: try {attempt} failed: {str(e)[-300:]}", flush=True)
            if attempt == TRIES:
                raise
    run_dir = exp / "train" / f"{name}_{attempt}"
    steps = run_steps(run_dir, epochs, learners)
    row.update(backend=backend, learners=learners, delay_by_one=delay, rate=rate or "none",
               epochs=epochs, steps_mean=statistics.mean(steps), steps=steps,
               model_bytes=model_bytes(run_dir), seconds_with_startup=time.monotonic() - start,
               load=os.getloadavg()[0], tries=attempt)
    print(json.dumps(row), flush=True)
    return row


def compare(free: dict, limited: dict, bandwidth: float, hold_messages: float = 0.0) -> dict:
    """The limited run predicted from the unlimited one's seconds per step. The drain's barrier
    (its hold) is the limited run's own, as the trainer measured it (``gossip_hold_s``: how
    long it takes depends on the gossip bytes queued on the link, which the model does not
    follow); for a run made before the trainer measured it, ``hold_messages`` message times
    (:func:`fit_hold`)."""
    backend, learners, delay = free["backend"], free["learners"], free["delay_by_one"]
    unlimited = Network(bandwidth=1e12)  # the veth unlimited: its latencies are in the step
    net = Network(bandwidth=bandwidth)
    nbytes = free["model_bytes"]
    measured = limited.get("hold_s")
    hold = measured if measured is not None else hold_messages * nbytes / bandwidth
    base = predict(backend, learners, delay, nbytes, unlimited, 1.0)
    epochs = free["epochs"]
    if "epoch_seconds" not in free:
        raise SystemExit("sim_calibrate: runs recorded before epoch_seconds (before a5f12b2) "
                         "cannot be compared; run them again")
    # The unlimited run's training seconds (its last epoch's, learner 0's) over its steps: a
    # step's seconds; the rest of its wall time (the epoch's end: evaluation, checkpoints, and
    # what the model gives its link, next to nothing) is a fixed cost, added to the limited
    # run's prediction as measured.
    per_step = free["epoch_seconds"] / (free["steps_mean"] / epochs) - base.allreduce_s
    fixed = free["run_seconds"] - simulated_wall(
        backend, learners, delay, nbytes, unlimited,
        predict(backend, learners, delay, nbytes, unlimited, per_step), free["steps_mean"],
        epochs)
    ours = predict(backend, learners, delay, nbytes, net, per_step)
    wall = fixed + simulated_wall(backend, learners, delay, nbytes, net, ours,
                                  limited["steps_mean"], epochs, hold)
    seeds = {str(d): predict(backend, learners, d, nbytes, net, per_step, True)
             for d in (False, True)}
    rounds_per_s = ours.rounds_per_step / ours.step_s if ours.round_s else None
    out = {"backend": backend, "learners": learners, "delay_by_one": delay,
           "rate": limited["rate"], "bandwidth_bytes_per_s": bandwidth,
           "measured_step_s_unlimited": per_step, "fixed_s_unlimited": fixed,
           "predicted": {"allreduce_s": ours.allreduce_s, "exchange_s": ours.exchange_s,
                         "round_s": ours.round_s, "step_s": ours.step_s,
                         "rounds_per_step": ours.rounds_per_step, "wall_s": wall},
           "hold_s": hold, "real_hold_s": limited.get("hold_s"),
           "real_wall_s": limited["run_seconds"], "ratio": wall / limited["run_seconds"],
           "unlimited_wall_s": free["run_seconds"],
           "load": [free["load"], limited["load"]],
           "seeds_learner_wall_s": {
               f"delay_by_one={d}": fixed + limited["steps_mean"] * s.step_s + epochs * s.round_s
               for d, s in seeds.items()}}
    if rounds_per_s is not None and limited.get("exchanges_per_s"):
        members = sim_shape(backend).members(learners, learners // 2)
        phases = len(Schedule(members, TOPOLOGY, 1).phases(0))
        out["predicted"]["exchanges_per_s"] = rounds_per_s * phases
        out["real_exchanges_per_s"] = limited["exchanges_per_s"]
    return out


def simulated_wall(backend: str, learners: int, delay: bool, nbytes: float, net: Network,
                   st, steps: float, epochs: int, hold_s: float = 0.0) -> float:
    """The simulator's wall time for ``steps`` equal steps of ``st.step_s``: the gossip
    thread's event timing (timing.gossip_events: rounds at the model's exchange time, the drain
    that ends the epoch ``hold_s`` after the last step), then the epoch's consensus (a model
    allreduce over all learners across the link, for the gossiping backends)."""
    shape = sim_shape(backend)
    members = shape.members(learners, learners // 2)
    n = round(steps / epochs)
    # the rounding's part step (claims leave learners with unequal counts, their mean a
    # fraction) at the step time: the steps' seconds are then exactly steps x step_s
    rest = (steps - n * epochs) * st.step_s
    if members < 2:
        return epochs * n * st.step_s + rest
    sched = Schedule(members, TOPOLOGY, 1)
    clock, now = GossipClock(), 0.0
    for _ in range(epochs):
        ends = [now + np.arange(1, n + 1) * st.step_s for _ in range(members)]
        _events, now = gossip_events(sched, ends, now, clock, delay, IDLE_S,
                                     LinkCosts(net, nbytes, placement(members, 2)), 0, hold_s)
        now += ring_allreduce_s(learners, nbytes, net.bandwidth, net.latency_s)
    return now + rest


def fit_bandwidth(free: dict, limited: dict) -> float:
    """The link's effective payload bytes/s from an SSGD pair: the seconds a step gained under
    the limit are its ring allreduce's bytes over the bandwidth (the latencies are in both)."""
    k = free["learners"]
    gained = limited["run_seconds"] / limited["steps_mean"] - free["run_seconds"] / free[
        "steps_mean"]
    return 2 * (k - 1) / k * free["model_bytes"] / gained


def median_runs(rows: list[dict], rate: str) -> dict[tuple, dict]:
    """Each setting's run of the median wall time at ``rate`` (of an even count, the lower):
    a run as it was, its steps and load with it."""
    runs: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["rate"] == rate:
            runs.setdefault((r["backend"], r["learners"], r["delay_by_one"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["run_seconds"])[(len(v) - 1) // 2]
            for k, v in runs.items()}


def fit_hold(rows: list[dict], rate: str, bandwidth: float) -> tuple[float, list[float]]:
    """The drain's barrier (the trainer's ``gossip_hold_s``: from the last learner's arrival
    until rounds stop being counted) as one figure of the link: the median over the limited
    gossiping runs of their measured hold, in times of one message over the link at
    ``bandwidth`` (its small messages cross behind the gossip bytes queued on the link, so it is
    not a latency). The comparisons take each run's own; this is for runs without one."""
    runs = [r for r in rows if r["rate"] == rate and r["backend"] != "ssgd"]
    holds = [r["hold_s"] for r in runs if r.get("hold_s") is not None]
    if not runs or len(holds) < len(runs):
        raise SystemExit(f"sim_calibrate: {len(runs) - len(holds)} of the {len(runs)} gossiping "
                         f"runs at {rate} record no drain hold (gossip_hold_s: runs made before "
                         "it was measured); run them again, or give --hold-messages")
    return statistics.median(holds) / (runs[0]["model_bytes"] / bandwidth), holds


def analyse(rows: list[dict], rate: str, fraction: float | None = None,
            hold_messages: float | None = None) -> dict:
    """Pair each setting's unlimited and limited runs; fit the bandwidth on the first SSGD pair
    (the fewest learners) and the drain's hold on the gossiping runs' measured holds
    (:func:`fit_hold`), and predict every other pair with them, and with the tc rate as given.
    ``fraction``: no fit; the link carries this fraction of the tc rate (an earlier fit's);
    ``hold_messages``: no fit of the hold; this many message times (an earlier fit's)."""
    free, limited = median_runs(rows, "none"), median_runs(rows, rate)
    pairs = [(free[k], limited[k]) for k in free if k in limited]
    nominal = rate_bytes(rate)
    if fraction is None:
        fit_pair = min((p for p in pairs if p[0]["backend"] == "ssgd"),
                       key=lambda p: p[0]["learners"])
        fitted = fit_bandwidth(*fit_pair)
    else:
        fit_pair, fitted = (None, None), fraction * nominal
    holds = None
    hold = hold_messages
    if hold is None:
        hold, holds = fit_hold(rows, rate, fitted)
    comparisons = []
    for f, lim in pairs:
        row = compare(f, lim, fitted, hold)
        row["fit_point"] = f is fit_pair[0]
        row["ratio_at_nominal_rate"] = compare(f, lim, nominal, hold)["ratio"]
        comparisons.append(row)
    return {"rate": rate, "nominal_bytes_per_s": nominal, "fitted_bytes_per_s": fitted,
            "fitted_fraction_of_nominal": fitted / nominal, "given_fraction": fraction,
            "fit_on": ({k: fit_pair[0][k] for k in ("backend", "learners", "delay_by_one")}
                       if fit_pair[0] is not None else f"given: {fraction} of the tc rate"),
            "hold_messages": hold, "given_hold_messages": hold_messages,
            "measured_hold_s": holds, "comparisons": comparisons}


def table(result: dict) -> str:
    """docs/science.md's calibration table."""
    lines = ["| backend | learners | delay-by-one | unlimited (s) | real, limited (s) | "
             "simulated (s) | ratio | ratio at the tc rate | drain's hold, real / model (s) | "
             "seeds' learner, no delay / delay-by-one (s) | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["comparisons"]:
        seeds = c["seeds_learner_wall_s"]
        gossips = c["backend"] != "ssgd"
        real_hold = c.get("real_hold_s")
        hold = (f"{real_hold:.2f}" if real_hold is not None else "—") + (
            f" / {c['hold_s']:.2f}" if gossips else "")
        lines.append(
            f"| {c['backend']} | {c['learners']} | {'yes' if c['delay_by_one'] else 'no'} | "
            f"{c['unlimited_wall_s']:.2f} | {c['real_wall_s']:.2f} | "
            f"{c['predicted']['wall_s']:.2f} | {c['ratio']:.2f} | "
            f"{c['ratio_at_nominal_rate']:.2f} | {hold if gossips else '—'} | "
            f"{seeds['delay_by_one=False']:.2f} / "
            f"{seeds['delay_by_one=True']:.2f} | {c['load'][0]:.1f}, {c['load'][1]:.1f}"
            + (" (the bandwidth's fit) |" if c["fit_point"] else " |"))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="20mbit", help="tc rate of each veth end")
    ap.add_argument("--queue", choices=("fifo", "store-first"), default="fifo",
                    help="how the limited link queues (bench/delay_by_one.py's _shape): one "
                         "FIFO of up to 2 s, or the store's messages first")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each setting at each rate, alternated; the median is compared")
    ap.add_argument("--learners", default="4,8")
    ap.add_argument("--backends", default="ssgd,adpsgd,hadpsgd")
    ap.add_argument("--fraction", type=float, default=None,
                    help="no fit: the link carries this fraction of the tc rate (an earlier "
                         "run's fitted_fraction_of_nominal)")
    ap.add_argument("--hold-messages", type=float, default=None,
                    help="no fit of the drain's hold: this many message times over the link "
                         "(an earlier run's hold_messages; runs made before the trainer "
                         "measured gossip_hold_s need it)")
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="recompute the comparisons from the runs of an earlier result")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "science" / "sim_calibrate.json")
    args = ap.parse_args()
    if args.source:
        old = json.loads(args.source.read_text())
        rows, command = old["runs"], old["command"]
        args.queue = old.get("queue", "fifo")  # runs made before --queue: one FIFO
    else:
        rows, command = run_all(args), "sudo python bench/sim_calibrate.py " + " ".join(
            sys.argv[1:])
    result = {"command": command,
              "conditions": (f"tiny CTC (69,473 parameters), trainer.batch_frames={BATCH_FRAMES}, "
                             f"{args.epochs} epoch, two namespaces over a veth pair, tc "
                             f"{args.rate} each way, queue {args.queue}; {os.cpu_count()} "
                             "CPU cores shared with other work (load beside each row)"),
              "queue": args.queue,
              "runs": rows, **analyse(rows, args.rate, args.fraction, args.hold_messages)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(result, indent=1) + "\n")
    tmp_out.rename(args.out)
    print(f"fitted {result['fitted_bytes_per_s']:.0f} B/s "
          f"({result['fitted_fraction_of_nominal']:.2f} of the tc rate)")
    print(table(result))
    for p in result["comparisons"]:
        print(f"{p['backend']:8s} {p['learners']} learners delay_by_one={p['delay_by_one']!s:5s}"
              f" predicted {p['predicted']['wall_s']:6.2f} s real {p['real_wall_s']:6.2f} s "
              f"ratio {p['ratio']:.2f} (at the tc rate {p['ratio_at_nominal_rate']:.2f}; "
              f"load {p['load'][1]:.1f}){' fit' if p['fit_point'] else ''}")


def run_all(args: argparse.Namespace) -> list[dict]:
    plan = [(b, int(n), d) for n in args.learners.split(",") for b in args.backends.split(",")
            for d in ((False,) if b == "ssgd" else (False, True))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="sim_calibrate.") as tmp:
        exp = Path(tmp) / "exp"
        subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny",
                        f"exp_dir={exp}", *delay_by_one.COMMON, "--to", "features"], cwd=REPO,
                       check=True, capture_output=True, timeout=600)
        for i, (backend, learners, delay) in enumerate(plan):
            for repeat in range(args.repeats):
                for rate in (None, args.rate):
                    with delay_by_one.link(rate, args.queue) as (prefixes, host, links):
                        row = real(prefixes, host, links, exp,
                                   f"c{i}_{rate or 'free'}_{repeat}", args.epochs, backend,
                                   learners, delay, rate)
                        rows.append({**row, "repeat": repeat})
    return rows


if __name__ == "__main__":
    main()
