"""The data stages at three corpus sizes, and a projection to Switchboard (SWB-300, SWB-2000).

    python bench/scale.py [--quick] [--sizes H H H] [--cores C] [--gpus G]

For each size it generates a scale corpus (data/tiny/make_tiny.py --hours H, test set H/5) and
runs the tiny recipe on it, one stage per `asrtrain run ... --stage X --to X` subprocess:
prepare, lang, lm, features, mfcc, align, train_hybrid, decode_hybrid, with small model and
trainer settings (those of tests/test_e2e.py) so that the figures are about the data stages.
Per stage it records wall time, CPU time (user + sys of the stage and its children, from
os.wait4) and peak RSS (the largest of the stage's processes), and throughput: real time per
CPU second for features, mfcc and decode_hybrid, frames per CPU second for align. Over the
sizes it fits the exponent of cost growth (log-log least squares of CPU time against hours).

It also times one alignment iteration at SWB-2000 model size (11.5k pdfs, 200k Gaussians;
asrtrain.align.bench.time_align_iteration) in its own subprocess, and projects every data stage
to 300 and 2,000 hours of speech on a machine of --cores C and --gpus G; the dominant stage is
the one with the most projected hours. Writes bench/results/scale.json and scale.png. CPU time,
not wall time, is the basis of the throughputs and projections: the wall times of a shared
machine say more about the neighbours than about the code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asrtrain.fileio import atomic_open, write_text

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
MAKE_CORPUS = REPO / "data" / "tiny" / "make_tiny.py"

STAGES = ["prepare", "lang", "lm", "features", "mfcc", "align", "train_hybrid", "decode_hybrid"]
# The stages projected to Switchboard: train_hybrid runs a toy model here (not a data stage).
PROJECTED = ["prepare", "lm", "features", "mfcc", "align", "decode_hybrid"]
QUICK_SIZES = [0.1, 0.25, 0.5]
FULL_SIZES = [0.25, 1.0, 4.0]
TEST_FRACTION = 0.2            # test speech per hour of training speech
FRAME_S = 0.01

# Small model, trainer and GMM settings (tests/test_e2e.py SMALL, ALIGN_SMALL, HYBRID_SMALL).
SMALL = ["model.layers=1", "model.cells=48", "model.bottleneck=32", "trainer.epochs=1",
         "trainer.batch_frames=4000", "trainer.log_every=5"]
ALIGN_SMALL = ["align.decode=false", "~align.passes.tri2", "align.passes.mono.num_iters=4",
               "align.passes.mono.totgauss=300", "align.passes.mono.realign_iters=[1,2,3]",
               "align.passes.tri1.num_leaves=60", "align.passes.tri1.num_gauss=300",
               "+align.passes.tri1.num_iters=4", "+align.passes.tri1.realign_iters=[2]",
               "~align.passes.tri3", "~align.passes.tri4", "features@hybrid.features=fbank40",
               # the hybrid reads 40 log-mel here: no i-vectors to make
               "stages=[" + ",".join(STAGES) + "]"]
HYBRID_SMALL = ["hybrid.model.layers=1", "hybrid.model.cells=48", "hybrid.model.bottleneck=32",
                "hybrid.trainer.epochs=1", "hybrid.trainer.batch_chunks=32",
                "+hybrid.decode.decoder=faster", "+hybrid.decode.max_active=300",
                "+hybrid.decode.beam=8", "+hybrid.decode.lmwt=10"]

# Switchboard targets. SWB-2000 ~ 7.2e8 frames (issue 12); Hub5'00 ~ 3.8 h of audio, decoded
# whatever the training set. A GMM recipe of Kaldi's s5c shape realigns the full set about 16
# times at full model size (tri1..tri4, realign_iters 10 20 30 plus the initial alignment), and
# accumulates statistics on fixed alignments in the other iterations (35 per pass).
TARGET_HOURS = {"swb300": 300.0, "swb2000": 2000.0}
EVAL2000_HOURS = 3.8
SWB2000_MODEL = {"num_pdfs": 11500, "gaussians": 200000, "dim": 40}
REALIGNMENTS = 16
ITERATIONS = 4 * 35


# ------------------------------------------------------------------------------ measuring
def measured(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> dict:
    """Run cmd; its wall time, CPU time and peak RSS (of it and the children it waited for)."""
    start = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        deadline, timed_out = start + timeout, False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:   # a hang: the stage and its workers go
                os.killpg(proc.pid, signal.SIGKILL)
                _pid, status, usage = os.wait4(proc.pid, 0)
                out.write(f"\nbench/scale.py: killed after {timeout:.0f} s\n".encode())
                timed_out = True
                break
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024, "returncode": proc.returncode,
            "timed_out": timed_out}


def fail(what: str, log: Path) -> None:
    tail = log.read_text(errors="replace").splitlines()[-15:]
    raise SystemExit(f"bench/scale.py: {what} failed (log {log}):\n" + "\n".join(tail))


def make_corpus(hours: float, out: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """Generate the scale corpus; its manifest and the generator's measurement."""
    cmd = [sys.executable, str(MAKE_CORPUS), "--hours", f"{hours:g}", "--out", str(out),
           "--test-hours", f"{max(0.02, hours * TEST_FRACTION):g}",
           "--speakers", str(args.speakers), "--vocab", str(args.vocab),
           "--jobs", str(os.cpu_count() or 1)]
    log = out.parent / f"make_corpus_{hours:g}h.log"
    m = measured(cmd, log, timeout=3600)
    if m["returncode"]:
        fail(f"corpus generation ({hours:g} h)", log)
    return json.loads((out / "corpus.json").read_text()), m


def recipe_overrides(exp: Path, corpus: Path, manifest: dict, nj: int) -> list[str]:
    dev = max(10, manifest["train"]["segments"] // 50)
    return [f"exp_dir={exp}", f"corpus.root={corpus}",
            f"corpus.expected_test_sides={manifest['test']['sides']}", f"corpus.dev_utts={dev}",
            f"nj={nj}", *SMALL, *ALIGN_SMALL, *HYBRID_SMALL]


def frames(data_dir: Path) -> int:
    path = data_dir / "utt2num_frames"
    return sum(int(line.split()[1]) for line in path.read_text().splitlines()) if path.exists() \
        else 0


def stage_work(stage: str, exp: Path) -> dict:
    """What a stage processed: seconds of audio (feature and decode stages), frames (align)."""
    data = exp / "data"
    sets = [d for d in data.iterdir() if d.is_dir() and d.name != "local"] if data.exists() \
        else []
    if stage == "features":
        return {"audio_s": FRAME_S * sum(frames(d) for d in sets if not d.name.endswith("_mfcc"))}
    if stage == "mfcc":
        return {"audio_s": FRAME_S * sum(frames(d) for d in sets if d.name.endswith("_mfcc"))}
    if stage == "align":
        return {"frames": sum(frames(d) for d in sets
                              if d.name.endswith("_mfcc") and not d.name.startswith("eval"))}
    if stage == "decode_hybrid":
        return {"audio_s": FRAME_S * sum(frames(d) for d in sets if d.name == "eval2000")}
    return {}


def throughput(stage: str, m: dict) -> dict:
    cpu = max(m["cpu_s"], 1e-9)
    if "audio_s" in m:
        return {"rt_per_core": m["audio_s"] / cpu}
    if "frames" in m:
        return {"frames_per_s_per_core": m["frames"] / cpu}
    return {}


def run_size(hours: float, work: Path, args: argparse.Namespace) -> dict:
    """Corpus + every stage at one size."""
    corpus, exp = work / f"corpus-{hours:g}h", work / f"exp-{hours:g}h"
    manifest, gen = make_corpus(hours, corpus, args)
    print(f"[{hours:g} h] corpus: {manifest['train']['speech_hours']:.3f} h train speech, "
          f"{manifest['test']['speech_hours']:.3f} h test, generated in {gen['wall_s']:.1f} s",
          file=sys.stderr, flush=True)
    overrides = recipe_overrides(exp, corpus, manifest, args.nj)
    stages = {}
    for stage in STAGES:
        log = work / f"stage_{hours:g}h_{stage}.log"
        cmd = [sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny", *overrides,
               "--stage", stage, "--to", stage]
        m = measured(cmd, log, timeout=args.stage_timeout, env={"PYTHONUNBUFFERED": "1"})
        hangs = 0
        while m.get("timed_out") and hangs < args.hang_retries:
            hangs += 1   # recorded: a stage that hung once is a finding, not noise
            print(f"[{hours:g} h] {stage} hung ({args.stage_timeout:.0f} s): run again",
                  file=sys.stderr, flush=True)
            m = measured(cmd, log, timeout=args.stage_timeout, env={"PYTHONUNBUFFERED": "1"})
        if m["returncode"]:
            fail(f"stage {stage} ({hours:g} h)", log)
        m["hung_before"] = hangs
        m.update(stage_work(stage, exp))
        m.update(throughput(stage, m))
        stages[stage] = m
        print(f"[{hours:g} h] {stage:13s} wall {m['wall_s']:7.1f} s  cpu {m['cpu_s']:7.1f} s  "
              f"peak RSS {m['peak_rss_mb']:6.0f} MB", file=sys.stderr, flush=True)
    return {"hours": manifest["train"]["speech_hours"], "requested_hours": hours,
            "test_hours": manifest["test"]["speech_hours"], "corpus": manifest,
            "generate": gen, "stages": stages}


# ------------------------------------------------------------------------------ align timing
ALIGN_TIMER = """
import json, sys
from asrtrain.align.bench import time_align_iteration
print(json.dumps(time_align_iteration(**json.loads(sys.argv[1]))))
"""


def time_align(args: argparse.Namespace, work: Path, device: str = "cpu") -> dict:
    """One alignment iteration at SWB-2000 model size, in its own process (peak RSS its own)."""
    kwargs = {**SWB2000_MODEL, "frames": args.align_frames}
    if args.align_gaussians:
        kwargs["gaussians"] = args.align_gaussians
    if device != "cpu":
        kwargs["device"] = device
    log = work / f"align_iteration_{device}.log"
    cmd = [sys.executable, "-c", ALIGN_TIMER, json.dumps(kwargs)]
    m = measured(cmd, log, timeout=args.stage_timeout)
    text = log.read_text(errors="replace")
    result = {"gaussians": kwargs["gaussians"], "num_pdfs": kwargs["num_pdfs"],
              "dim": kwargs["dim"], "frames": kwargs["frames"], "wall_s": m["wall_s"],
              "cpu_s": m["cpu_s"], "peak_rss_mb": m["peak_rss_mb"]}
    if m["returncode"]:
        last = text.strip().splitlines()[-1] if text.strip() else f"exit {m['returncode']}"
        result.update(frames_per_s_per_core=None, error=last)
        print(f"align iteration at {kwargs['gaussians']} Gaussians on {device}: not measured "
              f"({last})", file=sys.stderr)
        return result
    timing = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    result["timing"] = timing
    result["frames_per_s_per_core"] = per_core_rate(timing, kwargs["frames"], m["cpu_s"])
    result["frames_per_s_wall"] = timing.get("frames_per_s_wall")
    print(f"align iteration at {kwargs['gaussians']} Gaussians on {device}: "
          f"{result['frames_per_s_per_core']:.0f} frames/s per core, "
          f"{result['frames_per_s_wall'] or 0:.0f} of the wall clock", file=sys.stderr)
    return result


def has_cuda() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def per_core_rate(timing: dict, n_frames: int, cpu_s: float) -> float:
    """frames/s per core as the timing function states it, else frames over its CPU time."""
    for key in ("frames_per_s_per_core", "frames_per_second_per_core"):
        if isinstance(timing.get(key), (int, float)):
            return float(timing[key])
    return n_frames / max(cpu_s, 1e-9)


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


def growth(sizes: list[dict]) -> dict:
    """Per stage: exponents of CPU time and peak RSS against size, the linear model of CPU time
    and of peak RSS (fixed + per hour), and the throughput of the per-hour part."""
    out = {}
    for stage in STAGES:
        xs = [s["test_hours" if stage == "decode_hybrid" else "hours"] for s in sizes]
        ms = [s["stages"][stage] for s in sizes]
        cpu, rss = [m["cpu_s"] for m in ms], [m["peak_rss_mb"] for m in ms]
        fixed, per_hour = linear(xs, cpu)
        rss_fixed, rss_per_hour = linear(xs, rss)
        fit = {"size": "test hours" if stage == "decode_hybrid" else "training hours",
               "cpu_exponent": exponent(xs, cpu), "rss_exponent": exponent(xs, rss),
               "cpu_fixed_s": fixed, "cpu_s_per_hour": per_hour,
               "rss_fixed_mb": rss_fixed, "rss_mb_per_hour": rss_per_hour}
        work = "audio_s" if "audio_s" in ms[-1] else "frames" if "frames" in ms[-1] else None
        if work:
            _f, per_unit = linear([m[work] for m in ms], cpu)
            key = "marginal_rt_per_core" if work == "audio_s" else \
                "marginal_frames_per_s_per_core"
            fit[key] = 1.0 / per_unit if per_unit > 0 else None
        out[stage] = fit
    return out


# ------------------------------------------------------------------------------ projection
def accumulate_share(align: dict) -> float:
    """The accumulation's part of one alignment iteration's time (0 when not broken down)."""
    parts = (align.get("timing") or {}).get("seconds") or {}
    total = sum(v for v in parts.values() if isinstance(v, (int, float)))
    return parts.get("accumulate", 0.0) / total if total else 0.0


def project(fit: dict, align: dict, align_gpu: dict | None, cores: int, gpus: int) -> dict:
    """Hours of each data stage at SWB-300 and SWB-2000 on `cores` cores (and `gpus` GPUs).

    Each stage costs its fitted fixed part plus its per-hour part; data-parallel stages
    (features, mfcc, align, decode: nj jobs) divide the per-hour part by the cores, prepare and
    lm run in one process. align, when the SWB-2000-size iteration was measured, is
    REALIGNMENTS full alignment iterations plus the other ITERATIONS as accumulations only, at
    that rate (the cores' CPU rate plus, with --gpus, each GPU's wall-clock rate), every pass
    on the full set at full model size: an upper bound, as Kaldi trains its first passes on
    subsets with fewer Gaussians. decode_hybrid decodes Hub5'00
    (EVAL2000_HOURS) whatever the training set, on a graph of the tiny vocabulary."""
    out = {}
    rate = (align.get("frames_per_s_per_core") or 0) * cores
    gpu_rate = (align_gpu or {}).get("frames_per_s_wall") or 0
    rate += gpu_rate * gpus
    for name, hours in TARGET_HOURS.items():
        stage_hours, basis = {}, {}
        for stage in PROJECTED:
            amount = EVAL2000_HOURS if stage == "decode_hybrid" else hours
            parallel = cores if stage in ("features", "mfcc", "align", "decode_hybrid") else 1
            f = fit[stage]
            seconds = max(f["cpu_fixed_s"], 0.0) + f["cpu_s_per_hour"] * amount / parallel
            stage_hours[stage] = seconds / 3600
            basis[stage] = (f"{f['cpu_fixed_s']:.1f} CPU s + {f['cpu_s_per_hour']:.1f} CPU s "
                            f"per hour of speech{' / cores' if parallel > 1 else ''} (fitted)")
        if rate:
            n_frames = hours * 3600 / FRAME_S
            accumulate = accumulate_share(align)
            passes = REALIGNMENTS + (ITERATIONS - REALIGNMENTS) * accumulate
            stage_hours["align"] = passes * n_frames / rate / 3600
            basis["align"] = (f"{REALIGNMENTS} alignment iterations + "
                              f"{ITERATIONS - REALIGNMENTS} accumulations on fixed alignments "
                              f"({accumulate:.2f} of an iteration each) over {n_frames:.2e} "
                              f"frames at {rate:.0f} frames/s ({align['gaussians']} Gaussians; "
                              f"{align.get('frames_per_s_per_core') or 0:.0f} per core"
                              + (f", {gpu_rate:.0f} per GPU" if gpus and gpu_rate else "") + ")")
        dominant = max(stage_hours, key=stage_hours.get)
        out[name] = {"speech_hours": hours, "cores": cores, "gpus": gpus,
                     "stage_hours": {k: round(v, 3) for k, v in stage_hours.items()},
                     "total_hours": round(sum(stage_hours.values()), 3),
                     "dominant_stage": dominant, "basis": basis}
    if gpus and not gpu_rate:
        out["note"] = "no GPU rate was measured (no GPU here): the projection uses the cores"
    return out


# ------------------------------------------------------------------------------ report
def fmt(rate: float | None, unit: str) -> str:
    return "no growth" if rate is None else f"{rate:.0f}{unit}"


def table(sizes: list[dict], fit: dict) -> str:
    lines = ["| stage | " + " | ".join(f"{s['hours']:.2f} h: wall s / CPU s / peak MB"
                                        for s in sizes)
             + " | throughput: per added hour (at the largest, start-up included) "
             "| CPU exponent | RSS exponent |",
             "|---|" + "---|" * (len(sizes) + 3)]
    for stage in STAGES:
        cells = [f"{s['stages'][stage]['wall_s']:.1f} / {s['stages'][stage]['cpu_s']:.1f} / "
                 f"{s['stages'][stage]['peak_rss_mb']:.0f}" for s in sizes]
        last, f = sizes[-1]["stages"][stage], fit[stage]
        if "rt_per_core" in last:
            tp = (f"{fmt(f['marginal_rt_per_core'], 'x')} ({last['rt_per_core']:.0f}x) "
                  "real time per core")
        elif "frames_per_s_per_core" in last:
            tp = (f"{fmt(f['marginal_frames_per_s_per_core'], '')} "
                  f"({last['frames_per_s_per_core']:.0f}) frames/s per core")
        else:
            tp = ""
        ex = fit[stage]["cpu_exponent"]
        rx = fit[stage]["rss_exponent"]
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {tp} | "
                     f"{'' if ex is None else f'{ex:.2f}'} | {'' if rx is None else f'{rx:.2f}'} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: JSON only", file=sys.stderr)
        return
    sizes = result["sizes"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for stage in STAGES:
        xs = [s["test_hours"] if stage == "decode_hybrid" else s["hours"] for s in sizes]
        ax1.loglog(xs, [s["stages"][stage]["cpu_s"] for s in sizes], "o-", label=stage)
    ax1.set_xlabel("hours of speech (decode_hybrid: test hours)")
    ax1.set_ylabel("CPU seconds")
    ax1.set_title("cost of each stage against corpus size")
    ax1.legend(fontsize=7)
    proj = result["projection"]["swb2000"]
    names = list(proj["stage_hours"])
    ax2.barh(names, [proj["stage_hours"][n] for n in names])
    ax2.set_xscale("log")
    ax2.set_xlabel(f"hours on {proj['cores']} cores")
    ax2.set_title(f"SWB-2000 projection (dominant: {proj['dominant_stage']})")
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def summary(result: dict) -> dict:
    """The headline figures (the keys other tools read): throughput of the part of the cost
    that grows with the data (start-up excluded), else of the largest size as measured."""
    last, fit = result["sizes"][-1]["stages"], result["growth"]

    def rate(stage: str, key: str) -> dict:
        measured_rate = last[stage][key]
        marginal_rate = fit[stage].get(f"marginal_{key}")
        return {key: marginal_rate or measured_rate,
                f"{key}_with_startup": measured_rate}

    return {"features": rate("features", "rt_per_core"), "mfcc": rate("mfcc", "rt_per_core"),
            "decode_hybrid": rate("decode_hybrid", "rt_per_core"),
            "align": {**result["align_iteration"],
                      "stage": rate("align", "frames_per_s_per_core")}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} h (<= 10 min)")
    ap.add_argument("--sizes", type=float, nargs="+", help=f"hours (default {FULL_SIZES})")
    ap.add_argument("--cores", type=int, default=16, help="cores of the projected machine")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs of the projected machine")
    ap.add_argument("--nj", type=int, default=os.cpu_count() or 1, help="jobs of the stages")
    ap.add_argument("--speakers", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--align-frames", type=int, default=20000,
                    help="frames of the SWB-2000-size alignment iteration")
    ap.add_argument("--align-gaussians", type=int, default=None,
                    help=f"Gaussians of that iteration (default {SWB2000_MODEL['gaussians']})")
    ap.add_argument("--stage-timeout", type=float, default=None,
                    help="seconds before a stage counts as hung (default 600 with --quick, "
                         "else 3600)")
    ap.add_argument("--hang-retries", type=int, default=1,
                    help="runs again of a stage that hung (counted in the JSON: hung_before)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where scale.json/png go")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep corpora, exp dirs and logs here (default: a temporary dir)")
    args = ap.parse_args(argv)
    args.sizes = sorted(args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES))
    if args.stage_timeout is None:
        args.stage_timeout = 600 if args.quick else 3600
    if len(args.sizes) < 2 or args.sizes[0] <= 0:
        ap.error("--sizes: at least two positive sizes (the growth is fitted over them)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="asrtrain-scale-")
        args.work = Path(tmp.name)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        sizes = [run_size(h, args.work, args) for h in args.sizes]
        align = time_align(args, args.work)
        align_gpu = time_align(args, args.work, "cuda") if args.gpus and has_cuda() else None
    finally:
        if tmp is not None:
            tmp.cleanup()
    fit = growth(sizes)
    result = {"machine": {"cpus": os.cpu_count(), "nj": args.nj,
                          "load_avg_1m": os.getloadavg()[0]},
              "sizes": sizes, "align_iteration": align, "align_iteration_gpu": align_gpu,
              "growth": fit}
    result["projection"] = project(fit, align, align_gpu, args.cores, args.gpus)
    result.update(summary(result))
    result["wall_s"] = time.perf_counter() - started
    args.results.mkdir(parents=True, exist_ok=True)
    write_text(args.results / "scale.json", json.dumps(result, indent=2) + "\n")
    plot(result, args.results / "scale.png")
    print(table(sizes, fit))
    for name in TARGET_HOURS:
        p = result["projection"][name]
        print(f"{name}: " + ", ".join(f"{k} {v:.2f} h" for k, v in p["stage_hours"].items())
              + f" on {p['cores']} cores; dominant: {p['dominant_stage']}")
    print(f"wrote {args.results / 'scale.json'} and scale.png in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
