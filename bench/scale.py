"""Every stage of the hybrid recipe at three corpus sizes, and a projection to Switchboard.

    python bench/scale.py [--quick] [--sizes H H H] [--nj 2] [--work DIR]

For each size it generates a scale corpus (data/tiny/make_tiny.py --hours H, test set H/5) and
runs the tiny recipe on it, one stage per `asrtrain run ... --stage X --to X` subprocess, each
with `nj` jobs: prepare, lang, lm, features, mfcc, align (mono, tri1, tri3 LDA+MLLT, tri4 SAT with
few iterations), ivectors, train_hybrid (one epoch of a small BLSTM on the 260-dim input),
decode_hybrid. Per stage it records wall time, CPU time, the peak RSS of its largest process,
and its parallel fraction: the share of its CPU time spent in child processes (the jobs) rather
than in the stage process itself. Each stage's process is forked warm (bench/forked_cli.py:
from a fork server that imported torch and the stages once, as a stage process at scale pays
that once, not per hour of data) and reports, at its end, its own `getrusage(RUSAGE_SELF)` and
`RUSAGE_CHILDREN`. Children are counted as parallel jobs; the stage process's own threads are
not.

The projection, for a reference node (--cores 64, --memory-gb 512, --gpus 8) running the jobs
of the Switchboard recipes (nj 32, recipes/swb300), counts each part where it runs: per stage,
CPU seconds of the stage process and of its jobs are each fitted as fixed + per hour (least
squares over the sizes, not one size), and at 300 and 2,000 hours the process's part is taken
as it is and the jobs' part is divided by min(cores, jobs). align is projected per GMM pass on
the data Kaldi gives it (conf/align/swb.yaml, recipes/swb2000: mono on ~30k short utterances,
tri1/tri2 on train_100k_nodup, ... PASS_HOURS) at the pass's model size, from one alignment
iteration timed at SWB size (asrtrain.align.bench) and the align stage's measured parallel
fraction. train_hybrid comes from bench/results/gpu.json (bench/gpu.py on a GPU: end-to-end
frames/s per GPU) when it has a GPU row, else it is marked as having no GPU figure. Peak GB per
process comes from the fitted growth of the peak RSS. Writes bench/results/scale.json and
scale.png; wall times are recorded but the projection uses CPU time (a shared machine's wall
times say more about the neighbours than about the code).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import forked_cli  # bench/forked_cli.py: commands forked warm
import small  # bench/small.py: the suite's small settings

from asrtrain.fileio import atomic_open, write_text

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
GPU_JSON = REPO / "docs" / "results" / "gpu" / "gpu_h100.json"
MAKE_CORPUS = REPO / "data" / "tiny" / "make_tiny.py"

# align is the GMM passes, fmllr the train and dev sets' fMLLR features, decode_gmm the graphs
# and the test sets' first-pass decoding for their fMLLR (align split at Kaldi's seams)
STAGES = ["prepare", "lang", "lm", "features", "mfcc", "align", "fmllr", "decode_gmm",
          "ivectors", "train_hybrid", "decode_hybrid"]
#: The stages that make the hybrid model's data (summed as ``data_stages_hours``).
DATA_STAGES = ["prepare", "lang", "lm", "features", "mfcc", "align", "fmllr", "ivectors"]
QUICK_SIZES = [0.1, 0.25, 0.5]
FULL_SIZES = [1.0, 4.0, 16.0]
TEST_FRACTION = 0.2            # test speech per hour of training speech
FRAME_S = 0.01

# Small model, trainer and GMM settings, the test suite's (recipes/tiny/small.yaml, read by
# bench/small.py): the tiny recipe's stages and input (260 dims: fbank + fMLLR of tri4 +
# i-vectors), small sizes; the i-vectors at the recipe's size. nj is the bench's own.
SMALL = small.overrides("ctc")
ALIGN_SMALL = [*small.overrides("sat_passes"), "stages=[" + ",".join(STAGES) + "]"]
HYBRID_SMALL = small.overrides("hybrid")

# Switchboard targets. Hub5'00 ~ 3.8 h of audio, decoded whatever the training set.
TARGET_HOURS = {"swb300": 300.0, "swb2000": 2000.0}
EVAL2000_HOURS = 3.8
#: Hours of speech each GMM pass trains on (the subsets of conf/align/swb.yaml and
#: recipes/swb2000). SWB-300, from s5c's run.sh comments: train_30kshort "about 12hr",
#: train_100k_nodup "110hr", train_nodup "286hr". SWB-2000 (fisher_swbd/s5 gives no hours):
#: train_10k_nodup 10k of the same 100k shortest Switchboard utterances (~1.4 s each: ~4 h),
#: train_30k_nodup ~30k Switchboard utterances at its mean 4.3 s (~36 h, less duplicates: ~33 h),
#: train_100k_nodup as s5c's (~110 h), train_nodup all 2,000 h.
PASS_HOURS = {"swb300": {"mono": 12.0, "tri1": 110.0, "tri2": 110.0, "tri3": 286.0,
                         "tri4": 286.0},
              "swb2000": {"mono": 4.0, "tri1": 33.0, "tri2": 110.0, "tri3": 2000.0,
                          "tri4": 2000.0}}
#: The monophone pass's pdfs (3 states x the ms98 lexicon's ~46 phones): its Gaussians per pdf.
MONO_PDFS = 138
SWB2000_MODEL = {"num_pdfs": 11500, "gaussians": 200000, "dim": 40}
REFERENCE = {"cores": 64, "memory_gb": 512, "gpus": 8}


# ------------------------------------------------------------------------------ measuring
def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants alive now (from /proc; [pid] where /proc cannot say)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def anon_mb(pid: int) -> float:
    """The private (anonymous) resident memory of ``pid`` in MB (``RssAnon``), 0 if gone.
    ``ru_maxrss`` also counts the file pages a process maps (its libraries, a memory-mapped
    chunk store: page cache, one copy per machine), which grow with the data too."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def watch(pid: int, finished: Callable[[], bool], log: Path, timeout: float) -> dict:
    """Wait until ``finished()``, sampling every 50 ms ``peak_anon_mb``: the peak private RSS
    of the largest process of ``pid``'s tree (so a peak shorter than that can be missed); of
    that, ``peak_anon_self_mb`` of ``pid`` itself (the stage's) and ``peak_anon_jobs_mb`` of its
    largest descendant. Past ``timeout`` (a hang) its process group is killed."""
    start = time.perf_counter()
    peak_anon = peak_self = peak_kids = 0.0
    timed_out = False
    while not finished():
        tree = process_tree(pid)
        own, kids = anon_mb(tree[0]), max(map(anon_mb, tree[1:]), default=0.0)
        peak_self, peak_kids = max(peak_self, own), max(peak_kids, kids)
        peak_anon = max(peak_anon, own, kids)
        if not timed_out and time.perf_counter() > start + timeout:   # the stage, its workers
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with open(log, "ab") as out:
                out.write(f"\nbench/scale.py: killed after {timeout:.0f} s\n".encode())
            timed_out = True
        time.sleep(0.05)
    return {"wall_s": time.perf_counter() - start, "peak_anon_mb": peak_anon,
            "peak_anon_self_mb": peak_self, "peak_anon_jobs_mb": peak_kids,
            "timed_out": timed_out}


def measured(cmd: list[str], log: Path, timeout: float) -> dict:
    """Run ``cmd`` as a new process; its wall time, CPU time and peak RSS (of it and the
    children it waited for, ``os.wait4``) and :func:`watch`'s private-memory peaks."""
    ended: dict = {}

    def finished() -> bool:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            ended.update(status=status, usage=usage)
        return bool(pid)

    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    m = watch(proc.pid, finished, log, timeout)
    usage = ended["usage"]
    return {**m, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
            "returncode": os.waitstatus_to_exitcode(ended["status"])}


def measure_stage(args_cli: list[str], log: Path, timeout: float) -> dict:
    """One ``asrtrain`` command forked warm (bench/forked_cli.py: the interpreter, torch and
    the stages imported once for all of them, as a stage process at scale pays once): its
    total CPU, split into the stage process's own and its jobs' (``parallel_fraction`` = the
    jobs' share), and the peak RSS of the largest process (``getrusage`` of the process and of
    the children it waited for, which it reports at its end)."""
    report = log.with_suffix(".rusage.json")
    report.unlink(missing_ok=True)
    proc = forked_cli.start(*args_cli, log=log, report=report)
    m = watch(proc.pid, lambda: proc.exitcode is not None, log, timeout)
    m["returncode"] = proc.exitcode
    if report.is_file():
        own = json.loads(report.read_text())
    else:   # killed or died before its end: nothing measured
        own = {"self_cpu_s": 0.0, "children_cpu_s": 0.0, "self_rss_mb": 0.0,
               "children_rss_mb": 0.0}
    m["self_cpu_s"], m["children_cpu_s"] = own["self_cpu_s"], own["children_cpu_s"]
    m["cpu_s"] = m["self_cpu_s"] + m["children_cpu_s"]
    m["self_rss_mb"], m["children_rss_mb"] = own["self_rss_mb"], own["children_rss_mb"]
    m["peak_rss_mb"] = max(own["self_rss_mb"], own["children_rss_mb"])
    m["parallel_fraction"] = m["children_cpu_s"] / m["cpu_s"] if m["cpu_s"] > 0 else 0.0
    return m


def fail(what: str, log: Path) -> None:
    tail = log.read_text(errors="replace").splitlines()[-15:]
    raise SystemExit(f"bench/scale.py: {what} failed (log {log}):\n" + "\n".join(tail))


def make_corpus(hours: float, out: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """Generate the scale corpus; its manifest and the generator's measurement.  A corpus
    already in ``out`` made with the same settings (its corpus.json) is taken as it is (its
    generation figures then come from the earlier run: ``reused``)."""
    test_hours = max(0.02, hours * TEST_FRACTION)
    manifest = out / "corpus.json"
    if manifest.is_file():
        made = json.loads(manifest.read_text())
        a = made.get("args", {})
        if (a.get("hours"), a.get("test_hours"), a.get("speakers"), a.get("vocab")) == (
                hours, float(f"{test_hours:g}"), args.speakers, args.vocab):
            return made, {"reused": True, "wall_s": 0.0, "cpu_s": 0.0}
    cmd = [sys.executable, str(MAKE_CORPUS), "--hours", f"{hours:g}", "--out", str(out),
           "--test-hours", f"{test_hours:g}",
           "--speakers", str(args.speakers), "--vocab", str(args.vocab),
           "--jobs", str(os.cpu_count() or 1)]
    log = out.parent / f"make_corpus_{hours:g}h.log"
    m = measured(cmd, log, timeout=6 * 3600)
    if m["returncode"]:
        fail(f"corpus generation ({hours:g} h)", log)
    return json.loads((out / "corpus.json").read_text()), m


def recipe_overrides(exp: Path, corpus: Path, manifest: dict, nj: int,
                     extra: list[str] = ()) -> list[str]:
    dev = max(10, manifest["train"]["segments"] // 50)
    return [f"exp_dir={exp}", f"corpus.root={corpus}",
            f"corpus.expected_test_sides={manifest['test']['sides']}", f"corpus.dev_utts={dev}",
            *SMALL, *ALIGN_SMALL, *HYBRID_SMALL, f"nj={nj}", *extra]


def run_size(hours: float, work: Path, args: argparse.Namespace) -> dict:
    """Corpus + every stage at one size."""
    corpus, exp = work / f"corpus-{hours:g}h", work / f"exp-{hours:g}h"
    manifest, gen = make_corpus(hours, corpus, args)
    print(f"[{hours:g} h] corpus: {manifest['train']['speech_hours']:.3f} h train speech, "
          f"{manifest['test']['speech_hours']:.3f} h test, generated in {gen['wall_s']:.1f} s",
          file=sys.stderr, flush=True)
    overrides = recipe_overrides(exp, corpus, manifest, args.nj, args.override)
    stages = {}
    measure = args.stages or STAGES
    before = STAGES[:STAGES.index(measure[0])]
    if before:   # --stages: the stages before the first measured one, run but not measured
        log = work / f"stage_{hours:g}h_before.log"
        m = measure_stage(["run", "recipes/tiny", *overrides, "--to", before[-1]], log,
                          args.stage_timeout)
        if m["returncode"]:
            fail(f"stages {before[0]}..{before[-1]} ({hours:g} h)", log)
        print(f"[{hours:g} h] {before[0]}..{before[-1]} (not measured) in {m['wall_s']:.1f} s",
              file=sys.stderr, flush=True)
    for stage in measure:
        log = work / f"stage_{hours:g}h_{stage}.log"
        cli = ["run", "recipes/tiny", *overrides, "--stage", stage, "--to", stage]
        if args.stages:   # measured again in an exp dir where it may be done: run it anyway
            cli += ["--force", stage]
        m = measure_stage(cli, log, args.stage_timeout)
        hangs = 0
        while m.get("timed_out") and hangs < args.hang_retries:
            hangs += 1   # recorded: a stage that hung once is a finding, not noise
            print(f"[{hours:g} h] {stage} hung ({args.stage_timeout:.0f} s): run again",
                  file=sys.stderr, flush=True)
            m = measure_stage(cli, log, args.stage_timeout)
        if m["returncode"]:
            fail(f"stage {stage} ({hours:g} h)", log)
        m["hung_before"] = hangs
        stages[stage] = m
        print(f"[{hours:g} h] {stage:13s} wall {m['wall_s']:7.1f} s  cpu {m['cpu_s']:7.1f} s  "
              f"parallel {m['parallel_fraction']:4.2f}  peak RSS {m['peak_rss_mb']:6.0f} MB "
              f"({m['peak_anon_mb']:.0f} private)",
              file=sys.stderr, flush=True)
    return {"hours": manifest["train"]["speech_hours"], "requested_hours": hours,
            "test_hours": manifest["test"]["speech_hours"], "corpus": manifest,
            "generate": gen, "stages": stages}


# ------------------------------------------------------------------------------ align timing
ALIGN_TIMER = """
import json, sys
from asrtrain.align.bench import time_align_iteration
print(json.dumps(time_align_iteration(**json.loads(sys.argv[1]))))
"""


def time_align(args: argparse.Namespace, work: Path) -> dict:
    """One alignment iteration at SWB-2000 model size, in its own process, on the CPU."""
    kwargs = {**SWB2000_MODEL, "frames": args.align_frames}
    if args.align_gaussians:
        kwargs["gaussians"] = args.align_gaussians
    log = work / "align_iteration.log"
    m = measured([sys.executable, "-c", ALIGN_TIMER, json.dumps(kwargs)], log,
                 timeout=args.stage_timeout)
    text = log.read_text(errors="replace")
    result = {"gaussians": kwargs["gaussians"], "num_pdfs": kwargs["num_pdfs"],
              "frames": kwargs["frames"], "wall_s": m["wall_s"], "cpu_s": m["cpu_s"]}
    if m["returncode"]:
        result["error"] = text.strip().splitlines()[-1] if text.strip() else "failed"
        print(f"align iteration: not measured ({result['error']})", file=sys.stderr)
        return result
    timing = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    result["timing"] = timing
    return result


def align_costs(align: dict) -> dict | None:
    """CPU seconds per frame of the timed iteration's parts: a realignment (likelihoods and
    Viterbi) and an accumulation, split into what grows with the Gaussians per pdf and what
    does not (Viterbi); None when the timing is missing."""
    timing = align.get("timing")
    if not timing:
        return None
    parts, n = timing["seconds"], timing["frames"]
    return {"likelihoods": parts["likelihoods"] / n, "viterbi": parts["viterbi"] / n,
            "accumulate": parts["accumulate"] / n,
            "gauss_per_pdf": timing["gaussians"] / timing["num_pdfs"]}


# ------------------------------------------------------------------------------ fitting
def spread(xs: list[float]) -> bool:
    """Sizes far enough apart to fit a growth (the largest at least 1.5 times the smallest)."""
    return len(xs) >= 2 and min(xs) > 0 and max(xs) >= 1.5 * min(xs)


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Slope of log y against log x (least squares): cost ~ size^exponent."""
    if not spread(xs) or min(ys) <= 0:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    var = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / var


def linear(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """cost = fixed + per_unit * size (least squares, per_unit >= 0): the fixed part is the
    start-up (imports, pools) that dominates small corpora and is paid once at any size."""
    if not spread(xs):
        return 0.0, max(ys) / max(xs)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / \
        sum((x - mx) ** 2 for x in xs)
    slope = max(slope, 0.0)
    return my - slope * mx, slope


def size_of(stage: str, size: dict) -> float:
    """The amount a stage's cost grows with: test hours for the stages that work on the test
    sets (decode_hybrid; decode_gmm, which makes the test sets' fMLLR features and decodes
    them), else training hours."""
    return size["test_hours" if stage in TEST_STAGES else "hours"]


#: Stages whose work grows with the test sets (projected at EVAL2000_HOURS).
TEST_STAGES = ("decode_gmm", "decode_hybrid")


def growth(sizes: list[dict], stages: list[str] = STAGES) -> dict:
    """Per stage, fitted over the sizes: CPU seconds of the stage process and of its jobs, the
    peak RSS of its largest process (and of the stage process and its largest job at their
    report), as fixed + per hour; the exponents of total CPU and peak RSS."""
    out = {}
    for stage in stages:
        xs = [size_of(stage, s) for s in sizes]
        ms = [s["stages"][stage] for s in sizes]
        fit: dict = {"size": "test hours" if stage in TEST_STAGES else "training hours",
                     "cpu_exponent": exponent(xs, [m["cpu_s"] for m in ms]),
                     "rss_exponent": exponent(xs, [m["peak_rss_mb"] for m in ms])}
        for part in ("self_cpu_s", "children_cpu_s", "peak_rss_mb", "self_rss_mb",
                     "children_rss_mb", "peak_anon_mb"):
            if part == "peak_anon_mb" and not all(part in m for m in ms):
                continue   # sizes measured before it was recorded (--reuse)
            fixed, per_hour = linear(xs, [m[part] for m in ms])
            fit[part] = {"fixed": fixed, "per_hour": per_hour}
        if stage in BLOCK_STAGES:   # its jobs hold one block: their memory follows its size
            blocks = [block_hours(h) for h in xs]
            fixed, per_hour = linear(blocks, [m["children_rss_mb"] for m in ms])
            fit["children_rss_mb_by_block"] = {"fixed": fixed, "per_block_hour": per_hour,
                                               "block_hours": blocks}
        out[stage] = fit
    return out


#: Stages whose jobs work on one block of the data dir's split at a time (asrtrain.data.datadir
#: split_data_dir: blocks of whole speakers cut by a rule without nj).
BLOCK_STAGES = ("align",)


def block_hours(hours: float) -> float:
    """Hours of speech in one block of a training set of ``hours`` (the split rule of
    :func:`asrtrain.data.datadir.num_split_blocks`, speakers not limiting)."""
    from asrtrain.data.datadir import num_split_blocks

    frames = hours * 3600 / FRAME_S
    return hours / num_split_blocks(int(frames), 10 ** 9)


def peak_mb(f: dict, hours: float) -> float:
    """The largest process's peak at ``hours``: for a stage whose jobs hold one block, the
    larger of its own process (fitted by hours) and a job (fitted by block hours); else the
    fit of the largest process by hours."""
    by_block = f.get("children_rss_mb_by_block")
    if by_block is None:
        return at(f["peak_rss_mb"], hours)
    job = max(by_block["fixed"] + by_block["per_block_hour"] * block_hours(hours), 0.0)
    return max(at(f["self_rss_mb"], hours), job)


def at(part: dict, hours: float) -> float:
    """A fitted part at ``hours`` (never below zero: a negative intercept is fitting noise)."""
    return max(part["fixed"] + part["per_hour"] * hours, 0.0)


def parallel_share(fit: dict) -> float:
    """The share of a stage's growing CPU time that runs in its jobs (from the fitted slopes;
    from the fixed parts when nothing grows)."""
    own, jobs = fit["self_cpu_s"], fit["children_cpu_s"]
    total = own["per_hour"] + jobs["per_hour"]
    if total > 0:
        return jobs["per_hour"] / total
    total = max(own["fixed"], 0) + max(jobs["fixed"], 0)
    return max(jobs["fixed"], 0) / total if total > 0 else 0.0


# ------------------------------------------------------------------------------ projection
def stage_seconds(fit: dict, hours: float, cores: int, jobs: int) -> float:
    """The rule: the stage process's part as it is, the jobs' part over min(cores, jobs)."""
    return at(fit["self_cpu_s"], hours) + at(fit["children_cpu_s"], hours) / min(cores, jobs)


def pass_plan(recipe: str) -> list[dict]:
    """The recipe's GMM passes: name, data rules, Gaussians per pdf, realignments (the pass's
    realign_iters, plus one when its data differ from its from pass's: align_si.sh) and
    iterations (each accumulates statistics), from conf/align/swb.yaml and the recipe."""
    from omegaconf import OmegaConf

    from asrtrain.align.config import TRI_DEFAULTS, GmmConfig
    from asrtrain.recipe import compose_recipe

    cfg = compose_recipe(REPO / "recipes" / recipe)
    passes = OmegaConf.to_container(cfg.align.passes, resolve=True)
    plan = []
    for name, opts in passes.items():
        gmm = {k: v for k, v in opts.items() if k not in ("from", "data")}
        mono = opts.get("from") is None
        c = GmmConfig.from_config(gmm) if mono else GmmConfig.from_config(gmm, **TRI_DEFAULTS)
        moved = not mono and opts.get("data") != passes[opts["from"]].get("data")
        plan.append({"pass": name, "data": opts.get("data"),
                     "gauss_per_pdf": c.totgauss / MONO_PDFS if mono
                     else c.num_gauss / c.num_leaves,
                     "realignments": len(c.realign_iters) + int(moved),
                     "iterations": c.num_iters})
    return plan


def align_seconds(plan: list[dict], pass_hours: dict, costs: dict, share: float, cores: int,
                  jobs: int) -> tuple[float, dict]:
    """align's projected seconds: per pass, its frames (``pass_hours``) times its realignments'
    and accumulations' cost per frame at its Gaussians per pdf (likelihoods and accumulation
    scale with them, Viterbi does not); the align stage's ``share`` of it in jobs."""
    cpu, per_pass = 0.0, {}
    for p in plan:
        frames = pass_hours[p["pass"]] * 3600 / FRAME_S
        scale = p["gauss_per_pdf"] / costs["gauss_per_pdf"]
        per_frame = p["realignments"] * (costs["likelihoods"] * scale + costs["viterbi"]) + \
            p["iterations"] * costs["accumulate"] * scale
        per_pass[p["pass"]] = {"hours_of_speech": pass_hours[p["pass"]], "cpu_h":
                               round(frames * per_frame / 3600, 3), **p}
        cpu += frames * per_frame
    return cpu * (1 - share) + cpu * share / min(cores, jobs), per_pass


def gpu_rate(gpu_json: Path) -> dict | None:
    """The GPU row of bench/gpu.py's results to project train_hybrid with: IBM's 128 chunks in
    fp32 with the resident loader (the default) when there is one, else the fastest GPU row;
    None without a GPU row. A row is a GPU's when its ``device`` is not the CPU's (bench/gpu.py
    names a GPU as torch does, e.g. ``NVIDIA H100 80GB HBM3``)."""
    if not gpu_json.is_file():
        return None
    rows = [r for r in json.loads(gpu_json.read_text()).get("rows", [])
            if not str(r.get("device", "cpu")).startswith("cpu") and r.get("end_to_end_fps")]
    if not rows:
        return None
    ibm = sorted((r for r in rows if r.get("chunks") == 128 and r.get("precision") == "fp32"),
                 key=lambda r: r.get("chunk_data", "resident") != "resident")
    return (ibm or sorted(rows, key=lambda r: -r["end_to_end_fps"]))[0]


def recipe_setting(recipe: str, key: str) -> int:
    """A top-level integer of recipes/<recipe>/recipe.yaml (nj, trainer.epochs)."""
    import yaml

    value = yaml.safe_load((REPO / "recipes" / recipe / "recipe.yaml").read_text())
    for part in key.split("."):
        value = value[part]
    return int(value)


def project(fit: dict, align: dict, gpu: dict | None, ref: dict, jobs: int,
            plans: dict[str, list[dict]] | None = None) -> dict:
    """Hours of each stage and peak GB per process at SWB-300 and SWB-2000 on the reference
    node (see the module docstring for the rule)."""
    out: dict = {"reference": {**ref, "jobs": jobs}}
    costs = align_costs(align)
    for name, hours in TARGET_HOURS.items():
        stage_hours, peak_gb, anon_gb, basis = {}, {}, {}, {}
        for stage in STAGES:
            amount = EVAL2000_HOURS if stage in TEST_STAGES else hours
            f = fit[stage]
            stage_hours[stage] = stage_seconds(f, amount, ref["cores"], jobs) / 3600
            peak_gb[stage] = round(peak_mb(f, amount) / 1024, 2)
            if "peak_anon_mb" in f:   # private pages are part of the RSS: never above it
                anon_gb[stage] = min(round(at(f["peak_anon_mb"], amount) / 1024, 2),
                                     peak_gb[stage])
            share = parallel_share(f)
            basis[stage] = (f"fitted: {share:.2f} of the growing CPU time in jobs "
                            f"(/ min({ref['cores']}, {jobs})), the rest in one process")
        plan = (plans or {}).get(name)
        if costs and plan:
            share = parallel_share(fit["align"])
            seconds, per_pass = align_seconds(plan, PASS_HOURS[name], costs, share,
                                              ref["cores"], jobs)
            stage_hours["align"] = seconds / 3600
            basis["align"] = {"rule": f"per pass on its data (PASS_HOURS) at its Gaussians per "
                              f"pdf, from one SWB-size iteration; {share:.2f} in jobs",
                              "passes": per_pass}
        if gpu:
            frames = hours * 3600 / FRAME_S * recipe_setting(name, "trainer.epochs")
            stage_hours["train_hybrid"] = frames / (gpu["end_to_end_fps"] * ref["gpus"]) / 3600
            basis["train_hybrid"] = (f"gpu.json: {gpu['end_to_end_fps']:.0f} frames/s per GPU "
                                     f"({gpu['device']}, {gpu['chunks']} chunks, "
                                     f"{gpu['precision']}) x {ref['gpus']} GPUs, epochs of "
                                     f"recipes/{name}")
        else:
            stage_hours["train_hybrid"] = None
            basis["train_hybrid"] = "no GPU figure: the --gpu-json given has no GPU row"
        data_hours = sum(stage_hours[s] for s in DATA_STAGES)
        out[name] = {"speech_hours": hours,
                     "stage_hours": {k: None if v is None else round(v, 3)
                                     for k, v in stage_hours.items()},
                     "peak_process_gb": peak_gb,
                     # private memory only: peak_process_gb less the mapped files' pages
                     "peak_process_anon_gb": anon_gb,
                     "fits_node_memory": max(peak_gb.values()) <= ref["memory_gb"],
                     "data_stages_hours": round(data_hours, 3),
                     "dominant_data_stage": max(DATA_STAGES, key=lambda s: stage_hours[s]),
                     "basis": basis}
    return out


# ------------------------------------------------------------------------------ report
def per_stage(sizes: list[dict], stages: list[str] = STAGES) -> dict:
    """``stages.NAME.{cpu_s, wall_s, peak_rss_mb, peak_anon_mb, parallel_fraction}``: a list
    over the sizes (``peak_anon_mb``, the private part, when every size recorded it)."""
    keys = ("cpu_s", "wall_s", "peak_rss_mb", "peak_anon_mb", "parallel_fraction")
    return {stage: {k: [round(s["stages"][stage][k], 3) for s in sizes] for k in keys
                    if all(k in s["stages"][stage] for s in sizes)}
            for stage in stages}


def table(result: dict) -> str:
    sizes = result["hours"]
    lines = ["| stage | " + " | ".join(f"{h:.2f} h: CPU s / wall s / peak MB / in jobs"
                                        for h in sizes)
             + " | SWB-300 h | SWB-2000 h | peak GB (2000 h) |",
             "|---|" + "---|" * (len(sizes) + 3)]
    p3, p20 = result["projection"]["swb300"], result["projection"]["swb2000"]
    for stage in STAGES:
        m = result["stages"][stage]
        cells = [f"{m['cpu_s'][i]:.1f} / {m['wall_s'][i]:.1f} / {m['peak_rss_mb'][i]:.0f} / "
                 f"{m['parallel_fraction'][i]:.2f}" for i in range(len(sizes))]
        h3, h20 = p3["stage_hours"][stage], p20["stage_hours"][stage]
        lines.append(f"| {stage} | " + " | ".join(cells) + " | "
                     + ("no GPU figure" if h3 is None else f"{h3:.2f}") + " | "
                     + ("no GPU figure" if h20 is None else f"{h20:.2f}") + " | "
                     + f"{p20['peak_process_gb'][stage]:.1f} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: JSON only", file=sys.stderr)
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for stage in STAGES:
        xs = [size_of(stage, s) for s in result["sizes"]]
        ax1.loglog(xs, result["stages"][stage]["cpu_s"], "o-", label=stage)
    ax1.set_xlabel("hours of speech (decode_gmm, decode_hybrid: test hours)")
    ax1.set_ylabel("CPU seconds (stage process + jobs)")
    ax1.set_title("measured: cost of each stage against corpus size")
    ax1.legend(fontsize=7)
    ref = result["projection"]["reference"]
    names = [s for s in STAGES if result["projection"]["swb2000"]["stage_hours"][s] is not None]
    for k, target in enumerate(("swb300", "swb2000")):
        hours = result["projection"][target]["stage_hours"]
        ax2.barh([y + 0.4 * k for y in range(len(names))], [hours[n] for n in names],
                 height=0.4, label=target)
    ax2.set_yticks([y + 0.2 for y in range(len(names))], names)
    ax2.set_xscale("log")
    ax2.set_xlabel(f"projected hours on {ref['cores']} cores, {ref['gpus']} GPUs "
                   f"({ref['jobs']} jobs)")
    ax2.set_title("projection to SWB-300 and SWB-2000")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} h")
    ap.add_argument("--sizes", type=float, nargs="+", help=f"hours (default {FULL_SIZES})")
    ap.add_argument("--cores", type=int, default=REFERENCE["cores"],
                    help="cores of the reference node")
    ap.add_argument("--memory-gb", type=float, default=REFERENCE["memory_gb"])
    ap.add_argument("--gpus", type=int, default=REFERENCE["gpus"])
    ap.add_argument("--jobs", type=int, default=None,
                    help="jobs of the projected run (default: nj of recipes/swb300)")
    ap.add_argument("--nj", type=int, default=2, help="jobs of the measured stages")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a recipe override for every stage (e.g. ivector.ubm.num_gauss=16 for "
                         "corpora of minutes); repeatable")
    ap.add_argument("--speakers", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--align-frames", type=int, default=20000,
                    help="frames of the SWB-2000-size alignment iteration")
    ap.add_argument("--align-gaussians", type=int, default=None,
                    help=f"Gaussians of that iteration (default {SWB2000_MODEL['gaussians']})")
    ap.add_argument("--gpu-json", type=Path, default=GPU_JSON,
                    help="bench/gpu.py's results, for train_hybrid's GPU figure (default: the "
                         "committed H100 run, docs/results/gpu/gpu_h100.json)")
    ap.add_argument("--reproject", type=Path, default=None, metavar="SCALE_JSON",
                    help="measure nothing: project the sizes and alignment iteration of an "
                         "earlier scale.json again (its growth fits, with --gpu-json and the "
                         "reference node's settings), written to --results")
    ap.add_argument("--stage-timeout", type=float, default=None,
                    help="seconds before a stage counts as hung (default 900 with --quick, "
                         "else 4 h)")
    ap.add_argument("--hang-retries", type=int, default=1,
                    help="runs again of a stage that hung (counted in the JSON: hung_before)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where scale.json/png go")
    ap.add_argument("--reuse", type=Path, nargs="+", default=[],
                    help="measured sizes to take instead of running them again: an earlier "
                         "scale.json, or a size's own JSON (work/size-H.json, written after "
                         "each size)")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=None,
                    help="measure these stages only (the stages before them run first, not "
                         "measured); writes scale_stages.json (sizes, per-stage figures and "
                         "their growth), no projection")
    ap.add_argument("--merge", action="store_true",
                    help="with --stages and --reuse: measure those stages again (in --work, "
                         "where the reused sizes ran) and put their figures in place of the "
                         "reused ones, then project as a full run does")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep corpora, exp dirs and logs here (default: a temporary dir)")
    args = ap.parse_args(argv)
    args.sizes = sorted(args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES))
    if args.stage_timeout is None:
        args.stage_timeout = 900 if args.quick else 4 * 3600
    if len(args.sizes) < 2 or args.sizes[0] <= 0:
        ap.error("--sizes: at least two positive sizes (the growth is fitted over them)")
    if args.stages:
        args.stages = [s for s in STAGES if s in args.stages]
        if args.stages == STAGES:
            args.stages = None
    if args.merge and not (args.stages and args.reuse):
        ap.error("--merge needs --stages (what to measure again) and --reuse (the sizes)")
    return args


def reused_sizes(paths: list[Path]) -> dict[float, tuple[dict, Path]]:
    """Requested hours -> (a size's measurements, the file they came from), from earlier
    scale.json files (their ``sizes``) or single sizes' JSON (``work/size-H.json``)."""
    out: dict[float, tuple[dict, Path]] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"--reuse {path}: cannot read it: {e}") from e
        for size in data.get("sizes", [data] if "requested_hours" in data else []):
            out[float(size["requested_hours"])] = (size, Path(path))
        if not out:
            raise SystemExit(f"--reuse {path}: no measured size in it")
    return out


def partial(args: argparse.Namespace, sizes: list[dict], started: float) -> None:
    """``--stages``: the measured stages' figures and growth, in scale_stages.json."""
    result = {"machine": {"cpus": os.cpu_count(), "nj": args.nj,
                          "load_avg_1m": os.getloadavg()[0]},
              "measured_stages": args.stages, "hours": [s["hours"] for s in sizes],
              "stages": per_stage(sizes, args.stages), "sizes": sizes,
              "growth": growth(sizes, args.stages), "wall_s": time.perf_counter() - started}
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "scale_stages.json"
    write_text(out, json.dumps(result, indent=2) + "\n")
    for stage in args.stages:
        f = result["stages"][stage]
        print(f"{stage}: " + "; ".join(
            f"{h:.2f} h: cpu {c:.0f} s, wall {w:.0f} s, peak RSS {r:.0f} MB"
            for h, c, w, r in zip(result["hours"], f["cpu_s"], f["wall_s"], f["peak_rss_mb"],
                                  strict=True)))
    print(f"wrote {out} in {result['wall_s']:.0f} s")


def reproject(args: argparse.Namespace) -> None:
    """--reproject: the projection of an earlier run's measurements, made again."""
    try:
        result = json.loads(args.reproject.read_text())
        fit, align = result["growth"], result["align_iteration"]
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"--reproject {args.reproject}: not a scale.json of this script: "
                         f"{e}") from e
    ref = {"cores": args.cores, "memory_gb": args.memory_gb, "gpus": args.gpus}
    jobs = args.jobs or recipe_setting("swb300", "nj")
    result["projection"] = project(fit, align, gpu_rate(args.gpu_json), ref, jobs,
                                   {name: pass_plan(name) for name in TARGET_HOURS})
    result["reprojected"] = {"from": str(args.reproject), "gpu_json": str(args.gpu_json),
                             "at": time.strftime("%Y-%m-%d %H:%M")}
    finish(args, result)


def finish(args: argparse.Namespace, result: dict) -> None:
    """Write scale.json and scale.png to --results, and print the projection."""
    args.results.mkdir(parents=True, exist_ok=True)
    write_text(args.results / "scale.json", json.dumps(result, indent=2) + "\n")
    plot(result, args.results / "scale.png")
    print(table(result))
    for name in TARGET_HOURS:
        p = result["projection"][name]
        print(f"{name}: data stages {p['data_stages_hours']:.2f} h on {args.cores} cores "
              f"(dominant: {p['dominant_data_stage']}); train_hybrid "
              + ("no GPU figure" if p["stage_hours"]["train_hybrid"] is None
                 else f"{p['stage_hours']['train_hybrid']:.2f} h on {args.gpus} GPUs"))
    print(f"wrote {args.results / 'scale.json'} and scale.png in {result['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.reproject is not None:
        reproject(args)
        return
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="asrtrain-scale-")
        args.work = Path(tmp.name)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        done = reused_sizes(args.reuse)
        sizes = []
        for h in args.sizes:
            if h in done and args.merge:
                again = run_size(h, args.work, args)
                size = json.loads(json.dumps(done[h][0]))
                size["stages"].update(again["stages"])
                size["remeasured"] = {"stages": args.stages, "from": str(done[h][1]),
                                      "at": time.strftime("%Y-%m-%d %H:%M")}
                sizes.append(size)
                write_text(args.work / f"size-{h:g}.json", json.dumps(size, indent=2) + "\n")
                continue
            if h in done:
                print(f"[{h:g} h] measured before: taken from {done[h][1]}", file=sys.stderr,
                      flush=True)
                sizes.append(done[h][0])
                continue
            sizes.append(run_size(h, args.work, args))
            name = f"size-{h:g}" + (f"-{'-'.join(args.stages)}" if args.stages else "")
            write_text(args.work / f"{name}.json", json.dumps(sizes[-1], indent=2) + "\n")
        if args.stages and not args.merge:
            partial(args, sizes, started)
            return
        align = time_align(args, args.work)
    finally:
        if tmp is not None:
            tmp.cleanup()
    fit = growth(sizes)
    ref = {"cores": args.cores, "memory_gb": args.memory_gb, "gpus": args.gpus}
    jobs = args.jobs or recipe_setting("swb300", "nj")
    result = {"machine": {"cpus": os.cpu_count(), "nj": args.nj,
                          "load_avg_1m": os.getloadavg()[0]},
              "hours": [s["hours"] for s in sizes], "stages": per_stage(sizes),
              "sizes": sizes, "align_iteration": align, "growth": fit}
    result["projection"] = project(fit, align, gpu_rate(args.gpu_json), ref, jobs,
                                   {name: pass_plan(name) for name in TARGET_HOURS})
    result["wall_s"] = time.perf_counter() - started
    finish(args, result)


if __name__ == "__main__":
    main()
