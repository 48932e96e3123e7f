"""What the hybrid trainer's resident chunk data cost a machine: each learner's own copy
(``memory``, ResidentChunks without a store) against the chunk store shared by the machine's
learners (``store``, asrtrain.train.store), for 1 and N learners.

    OMP_NUM_THREADS=1 python bench/store.py [--hours 4] [--learners 1 4] [--work DIR]
        [EXP_DIR --set train_nodup --align tri2]

The data: EXP_DIR's set and alignments when given, else a synthetic set of ``--hours`` of
frames (100 a second) in the layout of conf/features/ibm260.yaml (40 fbank dims with
per-speaker CMVN statistics and Δ/ΔΔ, 40 fMLLR, 100-dim online i-vectors every 10 frames;
utterances of 100-1,500 frames, 3,000 pdfs) written with kaldiio under ``--work`` and kept
for the next run. Each learner is a process of its own (one torch thread) that loads the set
(``load_seconds``), runs its shard of one epoch (seed 2, 128 chunks a batch), and then reads
every stored frame once (as it will have after some epochs, its shards being dealt afresh each
epoch). The driver reads every learner's /proc/PID/smaps_rollup and /proc/PID/status after the
epoch and after the full read, while all of them are alive: ``rss`` (every resident page the
learner maps), ``pss`` (shared pages divided among the processes that map them: the page cache
pages of the store count once per machine), ``uss`` (pages only this learner maps; a file page
mapped by one learner alone counts here too), ``rss_anon`` (its own heap) and ``rss_file``
(mapped files: the store, libraries); ``node`` sums them. ``store`` runs twice: ``start`` (no
store: the first learner to take the lock writes it, the others wait) and ``resume`` (the store
is there; the page cache still holds it, unless the machine evicted it). ``baseline`` is a
learner that builds the ChunkSet and loads nothing: the constant every learner pays.
Writes bench/results/store.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import kaldiio  # noqa: E402
import numpy as np  # noqa: E402

from asrtrain.fileio import write_text  # noqa: E402

MIB = 1 << 20
FRAMES_PER_HOUR = 360_000


def synthetic_streams(data: Path, root: Path, fmllr_dim: int = 40, ivector_dim: int = 100,
                      period: int = 10, seed: int = 1) -> dict[str, Path]:
    """fMLLR features and online i-vectors for the set in ``data`` (kept for the next run)."""
    fmllr, ivec = root / "fmllr", root / "ivectors"
    if (ivec / "ivector_period").is_file():
        return {"fmllr": fmllr, "ivector": ivec}
    rng = np.random.default_rng(seed)
    fmllr.mkdir(parents=True, exist_ok=True)
    ivec.mkdir(parents=True, exist_ok=True)
    lengths = [line.split() for line in (data / "utt2num_frames").read_text().splitlines()]
    with kaldiio.WriteHelper(f"ark,scp:{fmllr}/feats.ark,{fmllr}/feats.scp") as wf, \
            kaldiio.WriteHelper(f"ark,scp:{ivec}/ivector_online.ark,"
                                f"{ivec}/ivector_online.scp") as wi:
        for utt, n in lengths:
            n = int(n)
            wf(utt, rng.normal(size=(n, fmllr_dim)).astype(np.float32))
            wi(utt, rng.normal(size=(-(-n // period), ivector_dim)).astype(np.float32))
    write_text(ivec / "ivector_period", f"{period}\n")
    return {"fmllr": fmllr, "ivector": ivec}


def memory_of(pid: int) -> dict[str, float]:
    """MiB: rss, pss, uss (private clean + dirty), pss_file, rss_anon, rss_file of ``pid``."""
    kb: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        kb[key] = int(value.split()[0])
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem"):
            kb[key] = int(value.split()[0])
    mib = lambda k: round(kb.get(k, 0) / 1024, 1)  # noqa: E731
    return {"rss": mib("Rss"), "pss": mib("Pss"),
            "uss": round((kb["Private_Clean"] + kb["Private_Dirty"]) / 1024, 1),
            "pss_file": mib("Pss_File"), "rss_anon": mib("RssAnon"), "rss_file": mib("RssFile")}


def learner(args: argparse.Namespace) -> None:
    """One learner: load, run its shard of an epoch, report, wait; read every frame, report,
    wait (the driver measures it while it waits)."""
    import torch

    from asrtrain.train.chunks import ChunkSet
    from asrtrain.train.resident import ResidentChunks

    torch.set_num_threads(1)
    streams = {k: Path(v) for k, v in json.loads(args.streams).items()}
    cs = ChunkSet(args.data, args.ali, delta_order=2, norm_vars=True, streams=streams)
    cs.chunk_table()
    out: dict = {"rank": args.rank}
    if args.mode != "baseline":
        t0 = time.perf_counter()
        rc = ResidentChunks(cs, "cpu", announce=False,
                            store_dir=args.store if args.mode == "store" else None)
        out["load_seconds"] = round(time.perf_counter() - t0, 3)
        out["store_written"] = rc.store_written
        steps = cs.steps(2, args.world, args.batch)
        t0, frames = time.perf_counter(), 0
        for batch in rc.batches(2, args.rank, args.world, args.batch, 256, steps):
            frames += batch.frames
        out["epoch_frames"], out["epoch_seconds"] = frames, round(time.perf_counter() - t0, 3)
        out["bytes_per_frame"], out["frames"] = round(rc.bytes_per_frame, 2), rc.frames
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    if args.mode != "baseline":
        total = 0.0
        for part in (rc.feats, rc.targets, rc.ivector_rows, rc.first, rc.utt_lo, rc.utt_hi,
                     rc.length, rc.row0):
            if part is not None:
                for i in range(0, len(part), 1 << 20):
                    total += float(part[i: i + (1 << 20)].float().sum())
    print(json.dumps({"read_all": True}), flush=True)
    sys.stdin.readline()


def run_learners(args: argparse.Namespace, mode: str, world: int, data: Path, ali: Path,
                 streams: dict[str, Path], store: Path) -> dict:
    cmd = [sys.executable, __file__, "--learner", "--mode", mode, "--world", str(world),
           "--data", str(data), "--ali", str(ali), "--store", str(store),
           "--batch", str(args.batch), "--streams",
           json.dumps({k: str(v) for k, v in streams.items()})]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for r in range(world)]
    try:
        reports = [json.loads(p.stdout.readline()) for p in procs]
        wall = time.perf_counter() - t0
        after_epoch = [memory_of(p.pid) for p in procs]
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            json.loads(p.stdout.readline())
        after_read = [memory_of(p.pid) for p in procs]
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        for p in procs:
            if p.wait(timeout=120):
                raise SystemExit(f"a {mode} learner failed (exit {p.returncode})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    node = lambda ms: {k: round(sum(m[k] for m in ms), 1) for k in ms[0]}  # noqa: E731
    return {"learners": world, "mode": mode, "wall_seconds_to_first_batch_epoch": round(wall, 2),
            "learner_reports": reports,
            "after_epoch": {"per_learner": after_epoch, "node": node(after_epoch)},
            "after_reading_every_frame": {"per_learner": after_read, "node": node(after_read)}}


def summary(row: dict) -> str:
    m = row["after_reading_every_frame"]
    loads = [r["load_seconds"] for r in row["learner_reports"] if "load_seconds" in r]
    load = f"load {min(loads):.1f}-{max(loads):.1f} s" if loads else "no load"
    return (f"{row['learners']} learner(s) {row['mode']:>15s}: {load}; per learner RSS "
            f"{m['per_learner'][0]['rss']:.0f} PSS {m['per_learner'][0]['pss']:.0f} USS "
            f"{m['per_learner'][0]['uss']:.0f} anon {m['per_learner'][0]['rss_anon']:.0f} MiB; "
            f"node RSS {m['node']['rss']:.0f} PSS {m['node']['pss']:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("exp", type=Path, nargs="?")
    ap.add_argument("--set", default="train_nodup")
    ap.add_argument("--align", default="tri2")
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--learners", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--work", type=Path, default=Path("/tmp/asrtrain-bench-store"))
    # one learner's process (run by the driver)
    ap.add_argument("--learner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--ali", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--streams", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.learner:
        return learner(args)

    from loader import synthetic_set

    t0 = time.perf_counter()
    if args.exp is not None:
        data, ali, streams = args.exp / "data" / args.set, args.exp / "align" / args.align, {}
        name = f"{args.exp.name}:{args.set}"
    else:
        frames = int(args.hours * FRAMES_PER_HOUR)
        data, ali = synthetic_set(args.work, frames)
        streams = synthetic_streams(data, args.work / f"streams_{frames}")
        name = f"synthetic ibm260 {args.hours:g} h ({frames} frames)"
    made = time.perf_counter() - t0
    print(f"data: {name} (ready in {made:.1f} s)", flush=True)
    store = args.work / "chunkstore"
    load_before = os.getloadavg()
    rows = [run_learners(args, "baseline", 1, data, ali, streams, store)]
    print(summary(rows[-1]), flush=True)
    for world in args.learners:
        rows.append(run_learners(args, "memory", world, data, ali, streams, store))
        print(summary(rows[-1]), flush=True)
        shutil.rmtree(store, ignore_errors=True)
        for phase in ("start", "resume"):
            row = run_learners(args, "store", world, data, ali, streams, store)
            row["mode"] = f"store {phase}"
            rows.append(row)
            print(summary(row), flush=True)
    store_bytes = sum(f.stat().st_size for f in store.rglob("*.bin"))
    result = {"host": platform.node(), "cpus": os.cpu_count(), "data": name,
              "torch_threads_per_learner": 1, "batch_chunks": args.batch,
              "store_mib_on_disk": round(store_bytes / MIB, 1),
              "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()},
              "rows": rows}
    out = REPO / "bench" / "results" / "store.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} (store {store_bytes / MIB:.1f} MiB)")


if __name__ == "__main__":
    main()
