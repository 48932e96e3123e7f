"""The learner of tests/test_warm.py: what a warm-started learner sees, written for the test.

A plain module (no pytest): it runs as ``python -u -m warm_probe`` under torchrun's launcher.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

from threadpoolctl import threadpool_info

#: torch before this module's own imports: preloaded by the fork server, or not (a new process)
PRELOADED = "torch" in sys.modules
OUT_ENV = "ASRTRAIN_TEST_WARM_OUT"


def _learner() -> None:
    if "--noop" in sys.argv:  # the launch that starts the fork server
        return
    rank = int(os.environ["RANK"])
    out = Path(os.environ[OUT_ENV])
    seen = {"preloaded": PRELOADED, "pid": os.getpid(), "ppid": os.getppid(),
            "parent_comm": Path(f"/proc/{os.getppid()}/comm").read_text().strip(),
            "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv[1:],
            "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                   "TORCHELASTIC_ERROR_FILE", "MASTER_PORT",
                                                   "ASRTRAIN_LAUNCHER_PID", "OMP_NUM_THREADS",
                                                   "ASRTRAIN_TEST_WARM_MARK")},
            "sys_path_head": sys.path[:3], "comm": Path("/proc/self/comm").read_text().strip(),
            "cmdline": Path("/proc/self/cmdline").read_bytes().decode().rstrip("\0"),
            "parent_process": multiprocessing.parent_process() is not None,
            "blas_threads": [p["num_threads"] for p in threadpool_info()
                             if p["user_api"] == "blas"]}
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    print(f"learner {rank} says hello on stdout")
    print(f"learner {rank} says hello on stderr", file=sys.stderr)
    if "--die" in sys.argv and rank == 1:
        print("learner 1 about to be killed")  # lost if stdout were buffered
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    _learner()
    sys.exit(0)



def as_a_forked_command(env: dict[str, str], log: str) -> None:
    """In a child of bench/forked_cli.py's fork server: become ``asrtrain run`` as its commands
    do, then exit 0 if this process's learner fork server is the one forked from it
    (asrtrain.distributed.warm), 3 if it is not."""
    import multiprocessing.forkserver

    import forked_cli  # bench/ (the suite's path)

    forked_cli.become(["run", "recipes/tiny"], os.getcwd(), env, log, log)
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    # the fork names itself a moment after the fork: read its name until it has (the first
    # read raced it once, on a loaded machine); multiprocessing's own server, a new
    # interpreter, never takes that name
    deadline = time.monotonic() + 60
    ok = False
    while pid is not None and not ok and time.monotonic() < deadline:
        ok = Path(f"/proc/{pid}/comm").read_text().strip() == "asrtrain-fork"
        time.sleep(0.05)
    os._exit(0 if ok else 3)
