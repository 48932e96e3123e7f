"""The seeds' training times, predicted by the simulator's time model (issue 24 item 3).

The seeds (Zhang, Cui, Kingsbury et al., ICASSP 2019, INTERSPEECH 2019, ICASSP 2020) train IBM's
42.6M-parameter BLSTM on SWB-2000 for 16 epochs on V100s over 100 Gb/s Ethernet, 128 chunks of 21
frames per GPU a step, and report 11.5 h on 32 GPUs, 5.2 h on 64 (H-AD-PSGD), 2.28 h on 64 and
1.98 h on 128, against "about a week" on one V100. Nothing here runs a V100: the one compute
figure is the seeds' own week, spread over the ~720M frames of 2,000 hours (at 100 frames a
second) times 16 epochs, i.e. a V100's seconds per frame; everything else is
:func:`asrtrain.simulate.timing.step_time` with the network below (each an assumption, stated in
the JSON), for SSGD, AD-PSGD and H-AD-PSGD as their registered shapes declare them, both for this
trainer's gossip (a step never waits for it) and for the seeds' learner (a step waits for its
last exchange; delay-by-one lets the exchange overlap the next step).

    python bench/seeds_time.py            # writes docs/science/seeds_time.json, prints the table
    python bench/seeds_time.py --gpu-json docs/results/gpu/gpu_h100.json
                                          # docs/science/seeds_time_h100.json

``--gpu-json``: the same runs with this toolkit's measured GPU instead of the V100 week: the step
from bench/gpu.py's row of IBM's 128 chunks in fp32 (end to end, the resident loader;
``bench/scale.py``'s choice) and the host copies from its measured device->host->device copy of
the model; the network and everything else assumed as above.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))

from scale import gpu_rate  # noqa: E402  bench/scale.py: which GPU row stands for IBM's step

from asrtrain.distributed.registry import sim_shape  # noqa: E402
from asrtrain.distributed.topology import Schedule  # noqa: E402
from asrtrain.fileio import write_text  # noqa: E402
from asrtrain.simulate.timing import Network, step_time  # noqa: E402

OUT = REPO / "docs" / "science" / "seeds_time.json"
OUT_GPU = REPO / "docs" / "science" / "seeds_time_{name}.json"

#: The seeds' figures this prediction takes as given.
INPUTS = {
    "parameters": 42.6e6,              # IBM's BLSTM (the seeds)
    "bytes_per_parameter": 4,          # fp32 weights and gradients
    "one_v100_hours": 7 * 24,          # "about a week" on one V100, 16 epochs
    "epochs": 16,
    "frames_per_epoch": 2000 * 3600 * 100,  # SWB-2000 at 10 ms frames: 720M
    "chunks_per_gpu": 128,             # per GPU a step (64 x 128 = the global 8,192)
    "chunk_frames": 21,
    "ethernet_gbit_s": 100,
}

#: What the seeds do not say, assumed here (each moves the prediction; the JSON states them).
ASSUMED = {
    "gpus_per_node": 4,                 # IBM AC922-class servers
    "wire_efficiency": 1448 / 1514,     # TCP payload in an Ethernet frame (MTU 1500)
    "latency_s": 50e-6,                 # a gloo/TCP message over Ethernet
    "intra_bandwidth_bytes_s": 50e9,    # NVLink 2.0 inside a node, effective for a ring
    "intra_latency_s": 10e-6,
    "host_copy_bytes_s": 12e9,          # device<->host for gloo gossip (PCIe gen3 x16)
    "topology": "random_ring",
}

#: The seeds' times: (learners, method as the seed names it, or None, hours).
SEEDS = [(32, None, 11.5), (64, "hadpsgd", 5.2), (64, None, 2.28), (128, None, 1.98)]
LEARNERS = (32, 64, 128)
METHODS = ("ssgd", "adpsgd", "hadpsgd")


def v100_frame_s() -> float:
    """A V100's seconds per frame of training, from the seeds' one-GPU week."""
    frames = INPUTS["epochs"] * INPUTS["frames_per_epoch"]
    return INPUTS["one_v100_hours"] * 3600 / frames


def network(copy_bandwidth: float | None = None) -> Network:
    return Network(bandwidth=INPUTS["ethernet_gbit_s"] * 1e9 / 8 * ASSUMED["wire_efficiency"],
                   latency_s=ASSUMED["latency_s"],
                   intra_bandwidth=ASSUMED["intra_bandwidth_bytes_s"],
                   intra_latency_s=ASSUMED["intra_latency_s"],
                   copy_bandwidth=copy_bandwidth or ASSUMED["host_copy_bytes_s"])


def measured_gpu(gpu_json: Path) -> dict:
    """From bench/gpu.py's results: the seconds a frame of IBM's step and the host-copy
    bandwidth of its gossip (``device_host_copies_s``: to the host and back)."""
    row = gpu_rate(gpu_json)
    if row is None:
        raise SystemExit(f"--gpu-json {gpu_json}: no GPU row (bench/gpu.py on a GPU writes one)")
    result = json.loads(gpu_json.read_text())
    gossip = result.get("gossip") or {}
    out = {"gpu_json": str(gpu_json.relative_to(REPO) if gpu_json.is_relative_to(REPO)
                           else gpu_json),
           "device": row["device"], "chunks": row["chunks"], "precision": row["precision"],
           "chunk_data": row.get("chunk_data"), "end_to_end_fps": row["end_to_end_fps"],
           "frame_s": 1 / row["end_to_end_fps"], "torch": result.get("torch")}
    if gossip.get("device_host_copies_s"):
        out["host_copy_bytes_s"] = 2 * gossip["megabytes"] * 1e6 / gossip["device_host_copies_s"]
    return out


def predict(method: str, learners: int, compute_waits: bool, delay_by_one: bool,
            gpu: dict | None = None) -> dict:
    shape = sim_shape(method)
    per_node = ASSUMED["gpus_per_node"]
    nodes = learners // per_node
    members = shape.members(learners, per_node)
    phases = len(Schedule(members, ASSUMED["topology"], 1).phases(0)) if members > 1 else 0
    batch_frames = INPUTS["chunks_per_gpu"] * INPUTS["chunk_frames"]
    nbytes = INPUTS["parameters"] * INPUTS["bytes_per_parameter"]
    frame_s = gpu["frame_s"] if gpu else v100_frame_s()
    net = network(gpu.get("host_copy_bytes_s") if gpu else None)
    # SSGD's allreduce is NCCL's (no host copies); the gossip goes over gloo (host copies).
    st = step_time(shape, learners, per_node, nodes, batch_frames * frame_s, nbytes,
                   net, phases, delay_by_one, compute_waits)
    steps = INPUTS["epochs"] * INPUTS["frames_per_epoch"] / (learners * batch_frames)
    return {"method": method, "learners": learners, "compute_waits": compute_waits,
            "delay_by_one": delay_by_one, "compute_s": st.compute_s,
            "allreduce_s": st.allreduce_s, "exchange_s": st.exchange_s, "round_s": st.round_s,
            "step_s": st.step_s, "rounds_per_step": st.rounds_per_step,
            "steps_per_learner": steps, "hours": steps * st.step_s / 3600}


def rows(gpu: dict | None = None) -> list[dict]:
    out = []
    for n in LEARNERS:
        for method in METHODS:
            modes = [(False, False)] if method == "ssgd" else [
                (False, False), (False, True), (True, False), (True, True)]
            out += [predict(method, n, waits, delay, gpu) for waits, delay in modes]
    return out


def result(gpu_json: Path | None = None) -> dict:
    """The predictions with the V100 week, or (``gpu_json``) with the GPU measured there."""
    ideal = {n: INPUTS["one_v100_hours"] / n for n in LEARNERS}
    res = {"command": "python bench/seeds_time.py", "inputs": INPUTS, "assumed": ASSUMED,
           "v100_frame_s": v100_frame_s(),
           "v100_step_s": INPUTS["chunks_per_gpu"] * INPUTS["chunk_frames"] * v100_frame_s(),
           "ideal_hours": {str(n): h for n, h in ideal.items()},
           "seeds": [{"learners": n, "method": m, "hours": h} for n, m, h in SEEDS]}
    gpu = None
    if gpu_json is not None:
        gpu = measured_gpu(gpu_json)
        res["command"] += f" --gpu-json {gpu['gpu_json']}"
        res["measured_gpu"] = gpu
        res["gpu_step_s"] = INPUTS["chunks_per_gpu"] * INPUTS["chunk_frames"] * gpu["frame_s"]
    res["predicted"] = rows(gpu)
    return res


def table(res: dict) -> str:
    """The doc's table: per learners and method, hours predicted (this trainer; the seeds'
    waiting learner without and with delay-by-one) beside the seeds' figures."""
    lines = ["| learners | method | this trainer (h) | waits, no delay-by-one (h) | "
             "waits, delay-by-one (h) | the seeds (h) |", "|---|---|---|---|---|---|"]
    for n in LEARNERS:
        seeds = [s for s in res["seeds"] if s["learners"] == n]
        for method in METHODS:
            got = {(r["compute_waits"], r["delay_by_one"]): r["hours"] for r in res["predicted"]
                   if r["learners"] == n and r["method"] == method}
            ours = got[(False, False)]
            waits = got.get((True, False), ours)
            delay = got.get((True, True), ours)
            seed = ", ".join(f"{s['hours']:g}" for s in seeds
                             if s["method"] in (method, None)) or "—"
            lines.append(f"| {n} | {method} | {ours:.2f} | {waits:.2f} | {delay:.2f} | "
                         f"{seed} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help=f"default {OUT.relative_to(REPO)}, with --gpu-json "
                         f"{OUT_GPU.relative_to(REPO)} (NAME: the JSON's name past 'gpu_')")
    ap.add_argument("--gpu-json", type=Path, default=None,
                    help="bench/gpu.py's results: predict with that GPU's measured step")
    args = ap.parse_args()
    res = result(args.gpu_json.resolve() if args.gpu_json else None)
    out = args.out or (OUT if args.gpu_json is None else Path(str(OUT_GPU).format(
        name=args.gpu_json.stem.removeprefix("gpu_"))))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(res, indent=1) + "\n")
    print(table(res))


if __name__ == "__main__":
    main()
