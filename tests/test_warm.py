"""Warm learner starts (asrtrain/distributed/warm.py): torchrun's learners forked from a fork
server that imported torch, with what torchrun would give a new process.

The launcher here is a process of its own (``python -c "launch(...)"``), and its learners run
``tests/warm_probe.py``: each writes what it sees (was torch imported before it ran, its
parent, session, working folder, environment, arguments) and prints a line to stdout and one to
stderr, which must reach the launcher's own output. Rank 1 of the second run prints a line and
kills itself with SIGKILL: the line is there only if its output is unbuffered (``-u``), and the
launcher names it with torchrun's exit code for a signal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warm_probe import OUT_ENV

from asrtrain.distributed.liveness import _alive

REPO = Path(__file__).resolve().parents[1]


def _launch(tmp_path: Path, *args: str, forked: bool = True) -> subprocess.CompletedProcess:
    """``forked``: the launcher forks its fork server first, as ``asrtrain run`` does
    (warm.start_fork_server); else multiprocessing starts one at the first learner."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    code = ("import sys; from asrtrain import AsrtrainError; "
            "from asrtrain.distributed.launch import launch\n"
            "print('launcher', __import__('os').getpid(), flush=True)\n"
            + ("from asrtrain.distributed.warm import start_fork_server\n"
               "print('forked', start_fork_server(), flush=True)\n" if forked else "") +
            # a first launch starts the fork server with 1 thread a learner (OMP_NUM_THREADS)
            "launch(['--noop'], 1, module='warm_probe', module_args=(), threads=1)\n"
            "try: launch(sys.argv[1:], 2, module='warm_probe', module_args=(), threads=2)\n"
            "except AsrtrainError as e: print('error:', e, file=sys.stderr); sys.exit(1)\n")
    env = {**os.environ, OUT_ENV: str(out), "ASRTRAIN_TEST_WARM_MARK": "from the launcher",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH")]))}
    env.pop("OPENBLAS_NUM_THREADS", None)
    return subprocess.run([sys.executable, "-c", code, *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def _seen(tmp_path: Path) -> list[dict]:
    return [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("forked", [True, False], ids=["forked-server", "multiprocessing-server"])
def test_learners_start_warm_with_what_torchrun_would_give_them(tmp_path: Path,
                                                                forked: bool) -> None:
    proc = _launch(tmp_path, "--flag", "value with spaces", forked=forked)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launcher = int(proc.stdout.split()[1])
    assert ("forked True" in proc.stdout) == forked, proc.stdout
    seen = _seen(tmp_path)
    for rank, s in enumerate(seen):
        assert s["preloaded"], s                     # forked warm, not a new interpreter
        assert s["ppid"] != launcher                 # the fork server's child ...
        # ... the one the launcher forked (its name in top), or multiprocessing's
        assert (s["parent_comm"] == "asrtrain-fork") == forked, s["parent_comm"]
        assert s["env"]["ASRTRAIN_LAUNCHER_PID"] == str(s["ppid"])  # ... which it watches
        assert s["comm"] == f"learner-{rank}"       # its name in top
        # ps shows the command torchrun would have run
        assert s["cmdline"] == (f"{sys.executable} -u -m warm_probe --flag value with spaces")
        assert not s["parent_process"]              # a main process, as a new one is
        # BLAS's threads from the learner's environment, not from the fork server's
        assert s["blas_threads"] and set(s["blas_threads"]) == {2}, s["blas_threads"]
        assert s["sid"] == s["pid"]                  # a session of its own, as torchrun's Popen
        assert s["cwd"] == str(tmp_path / "work")    # the launcher's working folder
        assert s["argv"] == ["--flag", "value with spaces"]
        assert s["sys_path_head"][0] == str(tmp_path / "work")  # as python -m puts it
        assert s["sys_path_head"][1] == str(REPO / "tests")     # then PYTHONPATH
        env = s["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert env["ASRTRAIN_TEST_WARM_MARK"] == "from the launcher"  # the launcher's own
        assert env["OMP_NUM_THREADS"] == "2"                          # what launch() adds
        assert env["TORCHELASTIC_ERROR_FILE"].endswith("error.json")  # torchrun's per rank
        assert env["MASTER_PORT"] == seen[0]["env"]["MASTER_PORT"]
        assert f"learner {rank} says hello on stdout" in proc.stdout
        assert f"learner {rank} says hello on stderr" in proc.stderr
    assert seen[0]["env"]["TORCHELASTIC_ERROR_FILE"] != seen[1]["env"]["TORCHELASTIC_ERROR_FILE"]
    deadline = time.monotonic() + 60   # the fork server ends once it sees the launcher gone
    while any(_alive(str(s["ppid"])) for s in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(str(s["ppid"])) for s in seen)
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.timeout(600)
def test_a_killed_warm_learner_is_named_with_its_signal_and_its_last_line(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "--die")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "learner 1 about to be killed" in proc.stdout  # unbuffered, as -u makes it
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error:"))
    assert "learner rank 1 failed first (exit code -9" in error, error


def test_torchrun_still_makes_its_handlers_where_warm_replaces_the_maker() -> None:
    """warm_handlers() swaps ``get_subprocess_handler`` in torchrun's module: a torch that
    stopped looking it up there would start every learner cold, without a word."""
    import inspect

    from torch.distributed.elastic.multiprocessing import api

    from asrtrain.distributed.warm import warm_handlers

    assert "get_subprocess_handler(" in inspect.getsource(api.SubprocessContext._start)
    before = api.get_subprocess_handler
    with warm_handlers():
        assert api.get_subprocess_handler is not before
    assert api.get_subprocess_handler is before


def test_a_launcher_with_threads_does_not_fork_its_fork_server() -> None:
    """A fork copies only the calling thread: a launcher running a Python thread, or torch's
    OpenMP pool (after a parallel region), leaves the fork server to multiprocessing; numpy's
    OpenBLAS workers (there from numpy's import, safe to fork) do not count."""
    code = ("import threading, torch\n"
            "from asrtrain.distributed import warm\n"
            "print('blas only', warm._one_thread())\n"
            "stop = threading.Event(); t = threading.Thread(target=stop.wait); t.start()\n"
            "print('a thread', warm.start_fork_server())\n"
            "stop.set(); t.join()\n"
            "torch.set_num_threads(2); (torch.rand(2000, 2000) @ torch.rand(2000, 2000)).sum()\n"
            "print('an OpenMP pool', warm.start_fork_server())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["blas only True", "a thread False",
                                        "an OpenMP pool False"], proc.stdout



@pytest.mark.parametrize("omp", [None, "1"])
def test_a_command_the_tests_fork_forks_its_own_fork_server(tmp_path: Path,
                                                            omp: str | None) -> None:
    """bench/forked_cli.py's commands are children of a warm fork server that take torch's and
    BLAS's thread counts from their environment, as a new process does. Done before ``asrtrain
    run`` forks its learners' fork server, that left a thread (torch's OpenMP pool, an OpenBLAS
    worker) that kept it from forking: every training command of the suite had
    multiprocessing start a new interpreter instead, importing torch and the trainer (27 of
    them, 221 CPU-s, in a fresh clone's suite: bench/suite_cpu.py)."""
    import forked_cli
    from warm_probe import as_a_forked_command

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    proc = forked_cli._context.Process(target=as_a_forked_command,
                                       args=(env, str(tmp_path / "log")))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0, f"exit status {proc.exitcode} (3: not forked from the command)"
