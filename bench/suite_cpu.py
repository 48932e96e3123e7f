"""Where a test run's CPU time goes, by kind of process, from BSD process accounting.

The suite is CPU-bound (Makefile, TEST_WORKERS): its time on 2 cores is its CPU seconds over
~1.8. This groups every process that started during a run by what it is, its name and whether
it was forked or exec'd, and its parent's: torchrun's learners (``learner-RANK``, forked by
the fork server of asrtrain/distributed/warm.py; or ``python`` exec'd by a process torch
renamed ``pt_elastic``, its agent), forked commands (bench/forked_cli.py, job pools), and
so on::

    apt-get install acct && accton /var/log/account/pacct     # as root, once
    date +%T; make test; date +%T                              # the run's start and end
    dump-acct /var/log/account/pacct > pacct.txt
    python bench/suite_cpu.py pacct.txt 20:15:31 20:35:21 [--json out.json]

The times are today's, as ``date`` prints them. Accounting records a process when it ends, with
its CPU time in 1/100 s; ``accton off`` stops it.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import statistics
from pathlib import Path


def read(path: Path, start: datetime.datetime, end: datetime.datetime) -> dict[int, dict]:
    """The processes of ``dump-acct``'s output that started between ``start`` and ``end``."""
    procs: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15:
            continue
        began = datetime.datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y")
        if start <= began <= end:
            procs[int(f[9])] = {"comm": f[0], "cpu_s": (float(f[2]) + float(f[3])) / 100,
                                "ppid": int(f[10]), "forked": "F" in f[11]}
    return procs


def summary(procs: dict[int, dict]) -> dict:
    def kind(p: dict) -> str:
        return f"{p['comm']} ({'forked' if p['forked'] else 'exec'})"

    groups: dict[str, list[float]] = collections.defaultdict(list)
    for p in procs.values():
        parent = procs.get(p["ppid"])
        groups[f"{kind(p)} of {kind(parent) if parent else '?'}"].append(p["cpu_s"])
    # warm learners (asrtrain/distributed/warm.py) are named learner-RANK, children of a fork
    # server that their launcher started; a learner started as a new process is a python
    # exec'd by torchrun's agent
    warm = [p for p in procs.values() if p["comm"].startswith("learner-")]
    servers = {p["ppid"] for p in warm}
    cold = [p for p in procs.values() if p["comm"] == "python" and not p["forked"]
            and procs.get(p["ppid"], {}).get("comm") == "pt_elastic"]
    learners = warm + cold
    # a fork server ends just after its launcher, so accounting records init as its parent: a
    # warm learner's launcher is not known here
    launchers = {p["ppid"] for p in cold}
    cpus = [p["cpu_s"] for p in learners]
    return {
        "processes": len(procs), "cpu_s": round(sum(p["cpu_s"] for p in procs.values()), 1),
        "torchrun_learners": {
            "count": len(learners), "warm": len(warm), "cpu_s": round(sum(cpus), 1),
            "median_cpu_s": statistics.median(cpus) if cpus else None,
            "fork_servers": len(servers),
            "fork_servers_cpu_s": round(sum(procs[q]["cpu_s"] for q in servers if q in procs), 1),
            "launching_processes": len(launchers),
            "launching_cpu_s": round(sum(procs[q]["cpu_s"] for q in launchers if q in procs), 1)},
        "by_kind": {k: {"count": len(v), "cpu_s": round(sum(v), 1)}
                    for k, v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pacct", type=Path, help="dump-acct's output")
    p.add_argument("start", help="HH:MM:SS, today")
    p.add_argument("end", help="HH:MM:SS, today")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args()
    day = datetime.date.today()
    start, end = (datetime.datetime.combine(day, datetime.time.fromisoformat(t))
                  for t in (args.start, args.end))
    s = summary(read(args.pacct, start, end))
    t = s["torchrun_learners"]
    print(f"{s['processes']} processes, {s['cpu_s']} CPU-s")
    print(f"torchrun learners: {t['count']} ({t['warm']} warm), {t['cpu_s']} CPU-s (median "
          f"{t['median_cpu_s']}); {t['fork_servers']} fork servers ({t['fork_servers_cpu_s']} "
          f"CPU-s); the cold ones' {t['launching_processes']} launching processes "
          f"({t['launching_cpu_s']} CPU-s)")
    for k, v in list(s["by_kind"].items())[:12]:
        print(f"{v['cpu_s']:9.1f} CPU-s {v['count']:6d}  {k}")
    if args.json:
        args.json.write_text(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
