"""The tiny recipe's align stage with nj=1 and then nj=2: wall and CPU time, and the outputs
byte-identical (issue 22: nj=2 at most 0.65x the wall time of nj=1 on an idle 2-core machine).

    python bench/align_nj.py --work DIR [--settings small|recipe] [--nj 1 2]

The stages before align (prepare, lang, lm, mfcc) run once in DIR/exp-prep; each nj then gets
a copy of that exp dir (DIR/exp-njN: its tables point into exp-prep's features, which it only
reads) and runs `asrtrain run recipes/tiny ... --stage align --to align` under bench/scale.py's
measuring wrapper (wall s, CPU s of the stage and its jobs, peak RSS of the largest process).
The align dirs (models, alignments, transforms, fMLLR feature tables) are then compared byte for
byte, less the files that hold times, keys or paths (log.txt, passes.json, .done,
graph/info.json) or point into their own exp dir (the .scp tables: compared as the arrays they
index); a model that differs is also compared to 1e-6 relative, to say how far it is.  Exit
status 1 when any file differs: the jobs serve blocks of whole speakers cut by a rule without
nj, and the stage sums their statistics in block order, so nothing may.

``--settings small`` (default): bench/scale.py's small GMM settings (mono, tri1, tri3 LDA+MLLT,
tri4 SAT, a few iterations each, no decoding); ``recipe``: conf/align/tiny.yaml's passes as the
recipe runs them, without decoding (align.decode=false). Prints a summary and writes
bench/results/align_nj.json with the load (`uptime`) before and after each run.

Takes about 2 min on an idle 2-core machine with the small settings (stages up to mfcc ~15 s,
align nj=1 ~35 s of CPU, nj=2 ~25 s); 5 min at load 16.  The CPU seconds show where the time
goes: at the small settings the stage process's own serial part (imports, trees, MLLT, the test
set's graph and first-pass decode for its fMLLR features) is ~7.5 of nj=1's ~36 s.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import scale  # noqa: E402  (bench/scale.py: the measuring wrapper and the small settings)

from asrtrain.fileio import write_text  # noqa: E402

RESULTS = REPO / "bench" / "results"
PREP_STAGES = ["prepare", "lang", "lm", "mfcc"]
#: Files of an align dir that hold times, rates, keys or absolute paths, not results.
VOLATILE = {"log.txt", "passes.json", ".done", "info.json"}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


def overrides(exp: Path, nj: int, settings: str) -> list[str]:
    common = [f"exp_dir={exp}", f"nj={nj}", "stages=[prepare,lang,lm,mfcc,align]"]
    if settings == "small":
        small = [o for o in scale.ALIGN_SMALL if not o.startswith("stages=")]
        return common + small
    return common + ["align.decode=false"]


def run(cli: list[str], log: Path, timeout: float) -> dict:
    m = scale.measure_stage(cli, log, timeout)
    if m["returncode"]:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise SystemExit(f"bench/align_nj.py: {' '.join(cli[:6])} ... failed (log {log}):\n"
                         + "\n".join(tail))
    return m


def table_arrays(scp: Path) -> dict:
    """An .scp table's entries as arrays (the offsets point into its own dir)."""
    import kaldiio
    import numpy as np

    return {k: np.asarray(v) for k, v in kaldiio.load_scp(str(scp)).items()}


def close_models(a: Path, b: Path, rtol: float = 1e-6) -> str | None:
    """None when the two model files are equal to ``rtol`` relative (a diagnosis of a model whose
    bytes differ: how far it is), else what differs."""
    import numpy as np
    import torch

    da, db = (torch.load(p, map_location="cpu", weights_only=False) for p in (a, b))

    def leaves(d, prefix=""):
        if isinstance(d, dict):
            for k in sorted(d, key=str):
                yield from leaves(d[k], f"{prefix}/{k}")
        elif isinstance(d, list | tuple):
            for i, v in enumerate(d):
                yield from leaves(v, f"{prefix}/{i}")
        else:
            yield prefix, d

    la, lb = dict(leaves(da)), dict(leaves(db))
    if la.keys() != lb.keys():
        return f"fields differ: {sorted(la.keys() ^ lb.keys())[:5]}"
    for k in la:
        x, y = la[k], lb[k]
        if isinstance(x, torch.Tensor):
            x, y = x.double().numpy(), y.double().numpy()
        if isinstance(x, np.ndarray):
            x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            if x.shape != y.shape:
                return f"{k}: shapes {x.shape} {y.shape}"
            fin = np.isfinite(x)
            if not (np.array_equal(fin, np.isfinite(y)) and np.array_equal(x[~fin], y[~fin])):
                return f"{k}: infinities differ"
            scale = max(float(np.abs(x[fin]).max(initial=0.0)), 1e-30)
            err = float(np.abs(x[fin] - y[fin]).max(initial=0.0))
            if err > rtol * scale:
                return f"{k}: max difference {err:.3g} ({err / scale:.3g} relative)"
        elif x != y:
            return f"{k}: {x!r} != {y!r}"
    return None


def compare(a: Path, b: Path) -> dict:
    """Two align dirs file by file: ``differences`` (bytes; .scp tables as the arrays they
    index), and of those the ``models_not_close`` (.mdl/.alimdl beyond 1e-6 relative) and the
    ``alignments_differ`` (ali*.scp tables)."""
    import numpy as np

    out = {"differences": [], "models_not_close": [], "alignments_differ": []}
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    for rel in sorted(files_a ^ files_b):
        where = "the first" if rel in files_a else "the second"
        out["differences"].append(f"{rel}: only in {where}")
    for rel in sorted(files_a & files_b):
        if rel.name in VOLATILE:
            continue
        if rel.suffix == ".scp":
            ta, tb = table_arrays(a / rel), table_arrays(b / rel)
            if ta.keys() != tb.keys() or any(
                    ta[k].dtype != tb[k].dtype or not np.array_equal(ta[k], tb[k]) for k in ta):
                out["differences"].append(f"{rel}: tables differ")
                if rel.name.startswith("ali"):
                    out["alignments_differ"].append(str(rel))
        elif not filecmp.cmp(a / rel, b / rel, shallow=False):
            out["differences"].append(f"{rel}: bytes differ")
            if rel.suffix in (".mdl", ".alimdl"):
                why = close_models(a / rel, b / rel)
                if why:
                    out["models_not_close"].append(f"{rel}: {why}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="exp dirs and logs go here")
    ap.add_argument("--settings", choices=["small", "recipe"], default="small")
    ap.add_argument("--nj", type=int, nargs=2, default=[1, 2], metavar=("A", "B"),
                    help="the two job counts compared (default 1 2)")
    ap.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per run")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    prep = work / "exp-prep"
    prep_log = work / "prep.log"
    cli = ["run", "recipes/tiny", *overrides(prep, 1, args.settings),
           "--stage", PREP_STAGES[0], "--to", PREP_STAGES[-1]]
    print(f"stages {PREP_STAGES[0]}..{PREP_STAGES[-1]} in {prep}", file=sys.stderr, flush=True)
    run(cli, prep_log, args.timeout)

    runs = []
    for nj in args.nj:
        exp = work / f"exp-nj{nj}"
        shutil.rmtree(exp, ignore_errors=True)
        shutil.copytree(prep, exp, symlinks=True)
        before = uptime()
        cli = ["run", "recipes/tiny", *overrides(exp, nj, args.settings),
               "--stage", "align", "--to", "align"]
        m = run(cli, work / f"align_nj{nj}.log", args.timeout)
        m.update(nj=nj, exp=str(exp), uptime_before=before, uptime_after=uptime())
        runs.append(m)
        print(f"align nj={nj}: wall {m['wall_s']:.1f} s, cpu {m['cpu_s']:.1f} s "
              f"(jobs {m['children_cpu_s']:.1f} s), peak RSS {m['peak_rss_mb']:.0f} MB; "
              f"{before} -> {m['uptime_after']}", file=sys.stderr, flush=True)

    cmp = compare(work / f"exp-nj{args.nj[0]}" / "align", work / f"exp-nj{args.nj[1]}" / "align")
    diffs = cmp["differences"]
    a, b = runs
    result = {"settings": args.settings, "cpus": os.cpu_count(), "runs": runs,
              "wall_ratio": b["wall_s"] / a["wall_s"], "cpu_ratio": b["cpu_s"] / a["cpu_s"],
              "identical": not diffs, "alignments_identical": not cmp["alignments_differ"],
              "models_close": not cmp["models_not_close"], **cmp,
              "compared": "every file of exp/align less log.txt and passes.json (.scp tables "
                          "as arrays); models also to 1e-6 relative",
              "target": "wall_ratio <= 0.65 on an idle 2-core machine",
              "wall_s": time.perf_counter() - started}
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "align_nj.json"
    write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"nj={b['nj']} / nj={a['nj']}: wall {b['wall_s']:.1f} / {a['wall_s']:.1f} s = "
          f"{result['wall_ratio']:.3f}, cpu {b['cpu_s']:.1f} / {a['cpu_s']:.1f} s = "
          f"{result['cpu_ratio']:.3f}; outputs "
          + ("identical" if not diffs else
             f"differ in {len(diffs)} files: alignments "
             + ("identical" if result["alignments_identical"] else
                f"DIFFER {cmp['alignments_differ']}")
             + ", models " + ("equal to 1e-6" if result["models_close"] else
                              f"NOT CLOSE {cmp['models_not_close']}")))
    print(f"wrote {out} in {result['wall_s']:.0f} s")
    if diffs:   # the jobs' blocks do not depend on nj: every file the same bytes
        raise SystemExit(1)


if __name__ == "__main__":
    main()
