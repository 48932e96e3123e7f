"""Soak: randomized AD-PSGD runs with a learner that fails at a random step, then the resume.

    python bench/faults.py [--runs 200] [--quick] [--seed 0]

Each run draws 2-8 learners, 30-80 steps, a per-step compute delay with jitter, a victim rank, a
step, and how the victim fails: it exits without a word, is killed (SIGKILL), or hangs (SIGSTOP:
alive, silent). The run goes through the real launcher (torchrun's agent, as the train stage
uses it: :func:`asrtrain.distributed.launch.launch`, each run in a process of its own), with
``WAIT_S`` seconds on every wait. It must end (one still going after the hang guard is a hang,
which must never happen), its error must name the victim as the learner that failed first, and
no learner may be left. Then the same run without the fault must finish (the resume; its
learners are forked from bench/synthetic.py's fork server, which starts them at once).

Writes bench/results/faults.json: the counts, and one record a run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import synthetic  # noqa: E402  (bench/synthetic.py, beside this file)

from asrtrain import AsrtrainError  # noqa: E402
from asrtrain.fileio import write_text  # noqa: E402

RESULTS = REPO / "bench" / "results"
WAIT_S = 10.0       # every blocking wait's limit in the learners (trainer.timeout_s)
HANG_GUARD_S = 120  # a run still going after this is counted as a hang


def draw(rng: random.Random) -> dict:
    learners = rng.randint(2, 8)
    steps = rng.randint(30, 80)
    return {"learners": learners, "steps": steps, "sleep": round(rng.uniform(0.0, 0.02), 4),
            "jitter": round(rng.uniform(0.0, 0.02), 4), "victim": rng.randrange(learners),
            "step": rng.randint(1, steps - 1), "how": rng.choice(["exit", "kill", "stop"]),
            "topology": rng.choice(["ring", "random_ring"]), "seed": rng.randrange(10**6)}


def argv(run: dict, fault: bool) -> list[str]:
    args = ["--backend", "adpsgd", "--topology", run["topology"], "--steps", str(run["steps"]),
            "--sleep", str(run["sleep"]), "--jitter", str(run["jitter"]), "--seed",
            str(run["seed"]), "--timeout", str(WAIT_S)]
    if fault:
        args += ["--die-rank", str(run["victim"]), "--die-step", str(run["step"]),
                 "--die-how", run["how"]]
    return args


def faulty(run: dict, out: Path) -> tuple[bool, str, float]:
    """Launch the faulty run in a process of its own: (hung, its error, seconds to the end).

    A launcher that ended without an ``AsrtrainError`` (a traceback, a crash) gives the last
    line of its stderr, prefixed ``LAUNCHER:`` and its exit status."""
    code = ("import sys; from asrtrain import AsrtrainError; "
            "from asrtrain.distributed.launch import launch\n"
            "try: launch(sys.argv[2:], int(sys.argv[1]), module='synthetic', module_args=())\n"
            "except AsrtrainError as e: print('ERROR', e)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "bench")])}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, str(run["learners"]),
                             *argv(run, True), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        hung = True
    error = next((line[6:] for line in stdout.splitlines() if line.startswith("ERROR ")), "")
    if not error and not hung and proc.returncode != 0:
        last = [line for line in stderr.splitlines() if line.strip()][-1:] or [""]
        error = f"LAUNCHER: exit status {proc.returncode}: {last[0][:300]}"
    return hung, error, time.monotonic() - t0


def leftovers(out: Path) -> int:
    """Processes still running whose command line names ``out`` (learners left behind)."""
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                n += str(out).encode() in (d / "cmdline").read_bytes()
            except OSError:
                pass
    return n


def one(run: dict, out: Path) -> dict:
    """The faulty run, then the resume; what happened."""
    hung, error, ended_s = faulty(run, out / "fault")
    first = re.match(r"learner rank (\d+) failed first", error)
    record = {**run, "hung": hung, "ended_s": round(ended_s, 2), "error": error,
              "named_victim": bool(first) and int(first.group(1)) == run["victim"],
              "blamed_other": bool(first) and int(first.group(1)) != run["victim"],
              "launcher_failed": error.startswith("LAUNCHER:"),
              "finished_anyway": not hung and not error, "left_behind": leftovers(out)}
    t1 = time.monotonic()
    try:
        again = synthetic.run_local(out / "resume", run["learners"], argv(run, False),
                                    timeout=HANG_GUARD_S)
        record["resumed"] = all(c == 0 for c in again.values())
    except AsrtrainError:
        record["resumed"] = False
    record["resume_s"] = round(time.monotonic() - t1, 2)
    return record


def summary(records: list[dict]) -> dict:
    failed = [r for r in records if not r["finished_anyway"]]
    return {
        "runs": len(records),
        "hangs": sum(r["hung"] for r in records),
        "runs_that_failed": len(failed),
        "of_those_naming_the_victim_first": sum(r["named_victim"] for r in failed),
        "runs_blaming_another_rank": sum(r["blamed_other"] for r in records),
        "runs_finished_despite_the_fault": len(records) - len(failed),
        "runs_leaving_a_process": sum(r["left_behind"] > 0 for r in records),
        "launcher_failed_without_its_one_line": sum(r.get("launcher_failed", False)
                                                    for r in records),
        "resumed": sum(r["resumed"] for r in records),
        "longest_run_s": max((r["ended_s"] for r in records), default=0.0),
        "median_run_s_by_how": {
            how: statistics.median([r["ended_s"] for r in records if r["how"] == how] or [0])
            for how in ("exit", "kill", "stop")},
        "by_how": {how: sum(r["how"] == how for r in records) for how in ("exit", "kill", "stop")},
        "wait_limit_s": WAIT_S,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="10 runs")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    runs = 10 if args.quick else args.runs
    rng = random.Random(args.seed)
    records: list[dict] = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    for i in range(runs):
        run = draw(rng)
        with tempfile.TemporaryDirectory() as tmp:
            rec = one(run, Path(tmp))
        records.append(rec)
        print(f"run {i + 1}/{runs}: {run['learners']} learners, rank {run['victim']} "
              f"{run['how']} at step {run['step']}/{run['steps']}: "
              + ("HUNG" if rec["hung"] else
                 "finished anyway" if rec["finished_anyway"] else
                 f"ended in {rec['ended_s']:.1f} s, victim named: {rec['named_victim']}")
              + (", BLAMED ANOTHER RANK" if rec["blamed_other"] else "")
              + (f", {rec['left_behind']} PROCESSES LEFT" if rec["left_behind"] else "")
              + f", resumed: {rec['resumed']}", flush=True)
        result = {"summary": summary(records), "runs": records}  # after each run: a long soak
        write_text(RESULTS / "faults.json", json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
