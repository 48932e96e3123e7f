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


def rate_bits(rate: str) -> int:
    """A tc rate (``20mbit``, ``1gbit``) in bits per second."""
    for unit, scale in {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}.items():
        if rate.endswith(unit):
            return round(float(rate[: -len(unit)]) * scale)
    raise SystemExit(f"rate {rate!r}: expected a number and kbit, mbit or gbit")


#: The rendezvous ports of the runs: one block of 256 (0x7400-0x74ff), so that one ``u32``
#: filter with a mask finds the store's traffic whichever port a run takes.
PORT_BLOCK = 0x7400


def _shape(ns: str, dev: str, rate: str, queue: str) -> None:
    """Limit ``dev``'s egress to ``rate``. ``fifo``: a token bucket (tbf) over one queue of up
    to 2 s, so a small message waits behind every queued byte. ``store-first``: an htb class
    of ``rate`` whose store traffic (the rendezvous port block, either direction) goes first
    and whose other traffic queues in the interface's FIFO behind it: the store's small
    messages (epoch claims, torchrun's heartbeats) do not wait behind gossip, as on a link
    whose queue is short or fair (this kernel has no fq_codel, sfq or prio)."""
    def tc(*args: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=True,
                       capture_output=True, timeout=30)
    if queue == "fifo":
        tc("qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kbit",
           "latency", "2000ms")
        return
    if queue != "store-first":
        raise SystemExit(f"queue {queue!r}: expected fifo or store-first")
    bits = rate_bits(rate)
    store = max(bits // 20, 64_000)  # the store's own share; it borrows the rest when it sends
    tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
    tc("class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate",
       f"{bits}bit", "ceil", f"{bits}bit")
    for cls, own, prio in (("1:10", store, "0"), ("1:20", bits - store, "1")):
        tc("class", "add", "dev", dev, "parent", "1:1", "classid", cls, "htb", "rate",
           f"{own}bit", "ceil", f"{bits}bit", "prio", prio)
    for field in ("sport", "dport"):
        tc("filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
           "match", "ip", field, str(PORT_BLOCK), "0xff00", "flowid", "1:10")


@contextlib.contextmanager
def link(rate: str | None, queue: str = "fifo") -> Iterator[tuple[list[list[str]], str,
                                                                  list[str]]]:
    """Two namespaces and a veth pair, each end's egress limited to ``rate`` (``queue``: how
    it queues, :func:`_shape`), or unlimited."""
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
                _shape(ns, dev, rate, queue)
        prefixes = [["ip", "netns", "exec", ns] for ns in names]
        yield prefixes, "10.232.7.1", links
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def two_nodes(prefixes, host: str, links, exp: Path, name: str, epochs: int,
              *extra: str) -> dict:
    port = PORT_BLOCK + int(time.time()) % 256
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
    return {"run_seconds": final["run_seconds"], "epoch_seconds": final["epoch_seconds"],
            "global_samples": final["global_samples"],
            "dev_loss": final["dev_loss"],
            # the last drain's barrier (gossiping backends; asrtrain.distributed.gossip)
            "hold_s": final.get("gossip_hold_s"),
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
