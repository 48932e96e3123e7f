"""Delay-by-one, for real (issue 23 item 5): two nodes of one adpsgd learner each, in two network
namespaces joined by a veth pair whose bandwidth ``tc`` limits, so that every gossip exchange
crosses the link and takes about as long as a step; wall time to a fixed number of global samples
(the tiny recipe's training set ``--epochs`` times; ``run_seconds`` of the last epoch's summary:
training only, start-up excluded) with and without ``trainer.delay_by_one``, runs alternated.

    python bench/delay_by_one.py --rate 20mbit --repeats 3     (root; writes
    bench/results/delay_by_one.json)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
COMMON = ["nj=2", "model.layers=1", "model.cells=48", "model.bottleneck=32",
          "trainer.batch_frames=1500", "trainer.log_every=5", "trainer.timeout_s=120",
          "trainer.backend=adpsgd", "trainer.learners=1"]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def link(rate: str | None) -> Iterator[tuple[list[list[str]], str, list[str]]]:
    """Two namespaces and a veth pair, each end's egress limited to ``rate`` by a token bucket
    (``tc`` tbf; this kernel has no netem for a latency), or unlimited."""
    tag = str(os.getpid() % 100000)
    names, links = [f"bdl{tag}n{k}" for k in (0, 1)], [f"bda{tag}", f"bdb{tag}"]
    made = []
    try:
        for ns in names:
            ip("netns", "add", ns)
            made.append(ns)
        ip("link", "add", links[0], "netns", names[0], "type", "veth", "peer", "name",
           links[1], "netns", names[1])
        for k, (ns, dev) in enumerate(zip(names, links, strict=True)):
            ip("-n", ns, "addr", "add", f"10.232.7.{k + 1}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            if rate:
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev,
                                "root", "tbf", "rate", rate, "burst", "32kbit", "latency",
                                "2000ms"], check=True, capture_output=True, timeout=30)
        prefixes = [["ip", "netns", "exec", ns] for ns in names]
        yield prefixes, "10.232.7.1", links
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def two_nodes(prefixes, host: str, links, exp: Path, name: str, epochs: int,
              *extra: str) -> dict:
    port = 29600 + int(time.time()) % 300
    procs = []
    for k in (1, 0):
        cmd = [*prefixes[k], sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny",
               f"exp_dir={exp}", *COMMON, "--stage", "train", "--to", "train",
               f"model.name={name}", f"trainer.epochs={epochs}", "trainer.nnodes=2",
               f"trainer.node_rank={k}", f"trainer.rdzv_endpoint={host}:{port}", *extra]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1",
                                           "GLOO_SOCKET_IFNAME": links[k]}))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        if p.returncode:
            raise SystemExit(out[-3000:])
    final = torch.load(exp / "train" / name / "final.pt", map_location="cpu",
                       weights_only=False)["metrics"]
    rates = [float(x) for x in re.findall(r"([\d.]+) gossip exchanges/s", outs[1])]
    fps = [float(x) for x in re.findall(r"(\d+) frames/s", outs[1])]
    return {"run_seconds": final["run_seconds"], "global_samples": final["global_samples"],
            "dev_loss": final["dev_loss"],
            "exchanges_per_s": statistics.median(rates) if rates else None,
            "frames_per_s": statistics.median(fps) if fps else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="20mbit", help="tc rate of each veth end ('' for none)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "delay_by_one.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="delay_by_one.") as tmp:
        exp = Path(tmp) / "exp"
        subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny",
                        f"exp_dir={exp}", *COMMON, "--to", "features"], cwd=REPO, check=True,
                       capture_output=True, timeout=600)
        rows = []
        with link(args.rate or None) as (prefixes, host, links):
            for i in range(args.repeats):
                for delay in (False, True):
                    name = f"d{int(delay)}_{i}"
                    row = two_nodes(prefixes, host, links, exp, name, args.epochs,
                                    f"trainer.delay_by_one={str(delay).lower()}")
                    row.update(delay_by_one=delay, repeat=i, rate=args.rate, epochs=args.epochs,
                               load=os.getloadavg()[0])
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    summary = {}
    for delay in (False, True):
        secs = [r["run_seconds"] for r in rows if r["delay_by_one"] is delay]
        summary[f"delay_by_one={delay}"] = {"median_run_seconds": statistics.median(secs),
                                            "runs": secs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    tmp_out.rename(args.out)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
