"""What the hybrid trainer's resident chunk data cost a machine: each learner's own copy
(``memory``, ResidentChunks without a store) against the chunk store shared by the machine's
learners (``store``, asrtrain.train.store), for 1 and N learners, at several corpus sizes, so
that a learner's private memory is measured as a constant plus a slope per hour of speech.

    OMP_NUM_THREADS=1 python bench/store.py [--hours 1 4 16] [--learners 1 4]
        [--memory-hours 1 4] [--work DIR] [EXP_DIR --set train_nodup --align tri2]

The data: EXP_DIR's set and alignments when given, else a synthetic set of each ``--hours``
of frames (100 a second) in the layout of conf/features/ibm260.yaml (40 fbank dims with
per-speaker CMVN statistics and Δ/ΔΔ, 40 fMLLR, 100-dim online i-vectors every 10 frames;
utterances of 100-1,500 frames, 3,000 pdfs) written with kaldiio under ``--work`` and kept
for the next run, with the tables a prepared Switchboard data dir has beside them (text of
6-18 words, segments, a sph2pipe wav.scp line and reco2file_and_channel per recording), so
that the per-utterance tables weigh what they weigh in a real run. Each learner is a process
of its own (one torch thread) that does what the hybrid task (asrtrain.train.tasks.FrameCETask)
does: builds the ChunkSet, counts the pdfs (the priors) and the epoch's steps, loads the set
(``load_seconds``) and, from the store, drops the per-utterance tables (forget_tables); runs
its shard of one epoch (seed 2, 128 chunks a batch), and then reads every stored frame once (as
it will have after some epochs, its shards being dealt afresh each epoch). A thread in the
learner samples its RssAnon every 2 ms: ``peak_anon_mib`` (the most private memory it held at
any time up to the end of its epoch, the load's transients included; ``_read_all``: up to the
end of its full read too) and ``anon_mib`` at each step.
The driver reads every learner's /proc/PID/smaps_rollup and /proc/PID/status after the
epoch and after the full read, while all of them are alive: ``rss`` (every resident page the
learner maps), ``pss`` (shared pages divided among the processes that map them: the page cache
pages of the store count once per machine), ``uss`` (pages only this learner maps; a file page
mapped by one learner alone counts here too), ``rss_anon`` (its own heap) and ``rss_file``
(mapped files: the store, libraries); ``node`` sums them. ``store`` runs twice: ``start`` (no
store: the first learner to take the lock writes it, the others wait) and ``resume`` (the store
is there; the page cache still holds it, unless the machine evicted it). ``baseline`` is a
learner that builds the ChunkSet and loads nothing. ``fits``: per mode and learner count, the
least-squares lines through the largest private memory of a learner (``rss_anon`` after
reading every frame; ``peak_anon``: the peak of the learners that did not write the store,
``peak_anon_writer``: the one that did) against hours and against utterances, and
``projection``: a node of 8 learners at SWB-2000 (2,000 h, 720M frames, 1.67M utterances of
Switchboard's 4.3 s mean, twice the synthetic set's per hour) = the store once (page cache) +
8 x (constant + slope x size), by hours and by utterances (the tables a learner holds are per
utterance); ``node_gb_at_peaks`` counts one writer's peak and 7 readers'.
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
import threading
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


WORDS = ("yeah", "uh", "um", "i", "you", "know", "the", "that", "and", "it's", "like", "we",
         "they", "so", "really", "think", "mean", "well", "about", "because", "[laughter]")


def swb_tables(data: Path, out: Path, seed: int = 2) -> Path:
    """A copy of the data dir ``data`` (its scp tables, which name the same arks) with the
    tables of a prepared Switchboard set: text of 6-18 words, segments of the utterances laid
    end to end in their speaker's recording, a sph2pipe wav.scp line and reco2file_and_channel
    per recording. Kept for the next run."""
    if (out / "segments").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("feats.scp", "cmvn.scp", "utt2num_frames", "utt2spk", "spk2utt"):
        shutil.copy(data / name, tmp / name)
    rng = np.random.default_rng(seed)
    frames = dict(line.split() for line in (data / "utt2num_frames").read_text().splitlines())
    spk = dict(line.split() for line in (data / "utt2spk").read_text().splitlines())
    text, segments, at = [], [], {}
    for utt in sorted(spk):
        words = rng.choice(len(WORDS), int(rng.integers(6, 19)))
        text.append(f"{utt} {' '.join(WORDS[w] for w in words)}\n")
        reco, t0 = spk[utt], at.get(spk[utt], 0.0)
        t1 = t0 + int(frames[utt]) / 100
        segments.append(f"{utt} {reco} {t0:.2f} {t1:.2f}\n")
        at[reco] = t1 + 0.5
    recos = sorted(at)
    write_text(tmp / "text", "".join(text))
    write_text(tmp / "segments", "".join(segments))
    write_text(tmp / "wav.scp", "".join(
        f"{r} /usr/local/bin/sph2pipe -f wav -p -c 1 /corpora/LDC97S62/swb1/{r}.sph |\n"
        for r in recos))
    write_text(tmp / "reco2file_and_channel", "".join(f"{r} {r} A\n" for r in recos))
    os.rename(tmp, out)
    return out


def anon_mib() -> float:
    """This process's RssAnon (its own heap: not the mapped store's page cache), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


class PeakAnon:
    """The highest RssAnon of this process, sampled every 2 ms by a daemon thread."""

    def __init__(self) -> None:
        self.peak = anon_mib()
        threading.Thread(target=self._run, daemon=True, name="peak-anon").start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, anon_mib())
            time.sleep(0.002)


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

    from asrtrain.train.chunks import ChunkSet, log_priors
    from asrtrain.train.resident import ResidentChunks, release_freed_heap

    torch.set_num_threads(1)
    peak = PeakAnon()
    anon = {"imported": round(anon_mib(), 1)}
    streams = {k: Path(v) for k, v in json.loads(args.streams).items()}
    cs = ChunkSet(args.data, args.ali, delta_order=2, norm_vars=True, streams=streams)
    log_priors(cs.pdf_counts())  # as FrameCETask does when it is built
    steps = cs.steps(2, args.world, args.batch)
    anon["task"] = round(anon_mib(), 1)
    out: dict = {"rank": args.rank, "utterances": len(cs.reader.data.utt2num_frames),
                 "chunks": len(cs)}
    if args.mode != "baseline":
        t0 = time.perf_counter()
        rc = ResidentChunks(cs, "cpu", announce=False,
                            store_dir=args.store if args.mode == "store" else None)
        if args.mode == "store" and hasattr(cs, "forget_tables"):  # FrameCETask.resident (the
            cs.forget_tables()  # test lets the bench measure the code before it, for comparison)
            release_freed_heap()
        out["load_seconds"] = round(time.perf_counter() - t0, 3)
        out["store_written"] = rc.store_written
        anon["loaded"] = round(anon_mib(), 1)
        t0, frames = time.perf_counter(), 0
        for batch in rc.batches(2, args.rank, args.world, args.batch, 256, steps):
            frames += batch.frames
        out["epoch_frames"], out["epoch_seconds"] = frames, round(time.perf_counter() - t0, 3)
        out["bytes_per_frame"], out["frames"] = round(rc.bytes_per_frame, 2), rc.frames
        anon["epoch"] = round(anon_mib(), 1)
    out["anon_mib"], out["peak_anon_mib"] = anon, round(peak.peak, 1)
    print(json.dumps(out), flush=True)
    read = 1 << 14  # rows at a time: the read's own float32 copy stays small (5 MiB at 80 dims)
    sys.stdin.readline()
    if args.mode != "baseline":
        total = 0.0
        for part in (rc.feats, rc.targets, rc.ivector_rows, rc.first, rc.utt_lo, rc.utt_hi,
                     rc.length, rc.row0):
            if part is not None:
                for i in range(0, len(part), read):
                    total += float(part[i: i + read].float().sum())
    print(json.dumps({"read_all": True, "peak_anon_mib": round(peak.peak, 1)}), flush=True)
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
        for p, report in zip(procs, reports, strict=True):  # the peak with the full read
            report["peak_anon_mib_read_all"] = json.loads(p.stdout.readline())["peak_anon_mib"]
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
    return {"learners": world, "mode": mode, "hours": args.size_hours,
            "wall_seconds_to_first_batch_epoch": round(wall, 2),
            "learner_reports": reports,
            "after_epoch": {"per_learner": after_epoch, "node": node(after_epoch)},
            "after_reading_every_frame": {"per_learner": after_read, "node": node(after_read)}}


def summary(row: dict) -> str:
    m = row["after_reading_every_frame"]
    loads = [r["load_seconds"] for r in row["learner_reports"] if "load_seconds" in r]
    load = f"load {min(loads):.1f}-{max(loads):.1f} s" if loads else "no load"
    peak = max(r["peak_anon_mib"] for r in row["learner_reports"])
    return (f"{row['hours']:g} h, {row['learners']} learner(s) {row['mode']:>12s}: {load}; "
            f"peak anon {peak:.0f} MiB; per learner RSS "
            f"{m['per_learner'][0]['rss']:.0f} PSS {m['per_learner'][0]['pss']:.0f} USS "
            f"{m['per_learner'][0]['uss']:.0f} anon {m['per_learner'][0]['rss_anon']:.0f} MiB; "
            f"node RSS {m['node']['rss']:.0f} PSS {m['node']['pss']:.0f} MiB")


SWB2000_HOURS, NODE_LEARNERS = 2000, 8
#: Switchboard's mean utterance is 4.3 s (bench/scale.py), the synthetic set's 8 s: SWB-2000
#: has ~1.67M utterances, about twice as many an hour, and a learner's tables are per utterance.
SWB2000_UTTS = round(SWB2000_HOURS * 3600 / 4.3)


def fit(points: list[tuple[float, float, int]]) -> dict[str, float]:
    """Least-squares lines through (hours, MiB, utterances) points: MiB against hours (the
    slope as bytes per frame too) and against utterances (bytes per utterance)."""
    h, m, u = (np.array([p[i] for p in points], dtype=float) for i in range(3))
    line = lambda x: np.polyfit(x, m, 1) if len(set(x.tolist())) > 1 else (0.0, m.mean())  # noqa: E731
    slope, const = line(h)
    per_utt, const_u = line(u)
    return {"constant_mib": round(float(const), 1), "slope_mib_per_hour": round(float(slope), 3),
            "bytes_per_frame": round(float(slope) * MIB / FRAMES_PER_HOUR, 2),
            "constant_mib_by_utterances": round(float(const_u), 1),
            "bytes_per_utterance": round(float(per_utt) * MIB, 1),
            "points_hours_mib_utterances": [list(p) for p in points]}


def fits_and_projection(rows: list[dict], store_mib_per_hour: float) -> tuple[dict, dict]:
    """Per mode and learner count: lines through each learner's private memory (after reading
    every frame; and its peak) against hours; the 8-learner SWB-2000 node from them."""
    fits: dict = {}
    for row in rows:
        key = f"{row['mode']}, {row['learners']} learner(s)"
        after = row["after_reading_every_frame"]["per_learner"]
        f = fits.setdefault(key, {"anon": [], "peak_anon": []})
        reports = row["learner_reports"]
        utts = reports[0]["utterances"]
        f["anon"].append((row["hours"], max(m["rss_anon"] for m in after), utts))
        # the store's writer (one a machine) apart: its load's transients are its own
        readers = [r for r in reports if not r.get("store_written")]
        if readers:
            f["peak_anon"].append((row["hours"], max(r["peak_anon_mib"] for r in readers), utts))
        for r in reports:
            if r.get("store_written"):
                f.setdefault("peak_anon_writer", []).append(
                    (row["hours"], r["peak_anon_mib"], utts))
    fits = {k: {m: fit(v) for m, v in f.items() if v} for k, f in fits.items()}
    gb = 1e9 / MIB
    store_gb = store_mib_per_hour * SWB2000_HOURS / gb
    projection = {"hours": SWB2000_HOURS, "frames": SWB2000_HOURS * FRAMES_PER_HOUR,
                  "utterances": SWB2000_UTTS, "learners": NODE_LEARNERS,
                  "store_gb_once": round(store_gb, 1)}
    for key in ("store start, 4 learner(s)", "store resume, 4 learner(s)",
                "memory, 4 learner(s)"):
        if key not in fits:
            continue
        shared = store_gb if key.startswith("store") else 0.0
        out = projection[key] = {}
        ways = [("by_hours", lambda f: f["constant_mib"] + f["slope_mib_per_hour"]
                 * SWB2000_HOURS)]
        if shared:  # the private copies grow by the frame, not by the utterance
            ways.append(("by_utterances", lambda f: f["constant_mib_by_utterances"]
                         + f["bytes_per_utterance"] / MIB * SWB2000_UTTS))
        for by, size in ways:
            per = {m: size(f) / gb for m, f in fits[key].items()}
            writer = per.get("peak_anon_writer")
            peaks = (writer + (NODE_LEARNERS - 1) * per["peak_anon"] if writer is not None
                     else NODE_LEARNERS * per["peak_anon"])
            out[by] = {"private_gb_per_learner": round(per["anon"], 2),
                       "peak_private_gb_per_learner": round(per["peak_anon"], 2),
                       "node_gb": round(shared + NODE_LEARNERS * per["anon"], 1),
                       "node_gb_at_peaks": round(shared + peaks, 1)}
            if writer is not None:
                out[by]["peak_private_gb_writer"] = round(writer, 2)
    return fits, projection


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("exp", type=Path, nargs="?")
    ap.add_argument("--set", default="train_nodup")
    ap.add_argument("--align", default="tri2")
    ap.add_argument("--hours", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    ap.add_argument("--memory-hours", type=float, nargs="*", default=[1.0, 4.0],
                    help="the sizes that also run the private copies (memory mode)")
    ap.add_argument("--learners", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--work", type=Path, default=Path("/tmp/asrtrain-bench-store"))
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "store.json")
    ap.add_argument("--refit", action="store_true",
                    help="recompute --out's fits and projection from its rows, run nothing")
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
    if args.refit:
        result = json.loads(args.out.read_text())
        result["fits"], result["projection_swb2000_node"] = fits_and_projection(
            result["rows"], max(result["store_mib_on_disk"].values())
            / max(float(k.split()[0]) for k in result["store_mib_on_disk"]))
        write_text(args.out, json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["projection_swb2000_node"], indent=1))
        return None

    from loader import synthetic_set

    load_before, rows, sets, store_mib = os.getloadavg(), [], [], {}
    sizes = [None] if args.exp is not None else args.hours
    for hours in sizes:
        t0 = time.perf_counter()
        if hours is None:
            data, ali, streams = args.exp / "data" / args.set, args.exp / "align" / args.align, {}
            name, hours = f"{args.exp.name}:{args.set}", 0.0
        else:
            frames = int(hours * FRAMES_PER_HOUR)
            data, ali = synthetic_set(args.work, frames)
            streams = synthetic_streams(data, args.work / f"streams_{frames}")
            data = swb_tables(data, args.work / f"swb_{frames}")
            name = f"synthetic ibm260 {hours:g} h ({frames} frames)"
        args.size_hours = hours
        print(f"data: {name} (ready in {time.perf_counter() - t0:.1f} s)", flush=True)
        sets.append(name)
        store = args.work / "chunkstore"
        rows.append(run_learners(args, "baseline", 1, data, ali, streams, store))
        print(summary(rows[-1]), flush=True)
        for world in args.learners:
            if hours in args.memory_hours:
                rows.append(run_learners(args, "memory", world, data, ali, streams, store))
                print(summary(rows[-1]), flush=True)
            shutil.rmtree(store, ignore_errors=True)
            for phase in ("start", "resume"):
                row = run_learners(args, "store", world, data, ali, streams, store)
                row["mode"] = f"store {phase}"
                rows.append(row)
                print(summary(row), flush=True)
        store_mib[hours] = round(sum(f.stat().st_size for f in store.rglob("*.bin")) / MIB, 1)
        shutil.rmtree(store, ignore_errors=True)
    per_hour = max(store_mib.values()) / max(max(store_mib), 1e-9)
    fits, projection = fits_and_projection(rows, per_hour)
    result = {"host": platform.node(), "cpus": os.cpu_count(), "data": sets,
              "torch_threads_per_learner": 1, "batch_chunks": args.batch,
              "store_mib_on_disk": {f"{h:g} h": m for h, m in store_mib.items()},
              "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()},
              "fits": fits, "projection_swb2000_node": projection, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(json.dumps({"fits": {k: {m: {x: f[x] for x in ("constant_mib", "slope_mib_per_hour")}
                                   for m, f in v.items()} for k, v in fits.items()},
                      "projection": projection}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
