"""Start the learners of one machine through torchrun's launcher (``torch.distributed.run``).

``launch(argv, learners)`` runs ``python -m asrtrain.cli train <argv...>`` in ``learners``
processes on this machine, in this process (torchrun's ``run(args)``), and raises an
AsrtrainError naming the learner that failed. With ``nnodes > 1`` run it on every machine with
that machine's ``node_rank`` and the same ``rdzv_endpoint`` (``host:port`` of node 0), which uses
torchrun's static rendezvous. On CPUs every learner gets ``trainer.threads`` threads (one by
default: :func:`asrtrain.distributed.comm.cpu_threads`).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence

from asrtrain import AsrtrainError
from asrtrain.distributed.comm import cpu_threads
from asrtrain.distributed.liveness import LAUNCHER_ENV

#: Seconds torchrun waits for learners to end after SIGTERM before it sends SIGKILL (its own
#: default, 30 s, is long for a learner that only has to drop what it is doing: checkpoints are
#: written atomically).
SHUTDOWN_GRACE_S = 5


def torchrun_args(argv: Sequence[str], learners: int, nnodes: int = 1, node_rank: int = 0,
                  rdzv_endpoint: str | None = None, module: str = "asrtrain.cli",
                  module_args: Sequence[str] = ("train",), max_restarts: int = 0,
                  run_id: str | None = None) -> list[str]:
    """The ``torchrun`` command line (without the program name) that :func:`launch` runs."""
    if learners < 1:
        raise AsrtrainError(f"launch: need at least one learner per node, got {learners}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise AsrtrainError(f"launch: node_rank {node_rank} is not in 0..{nnodes - 1}")
    args = [f"--nproc-per-node={learners}", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.5"]
    if nnodes == 1 and rdzv_endpoint is None:
        args.append("--standalone")  # a free local port, no endpoint to agree on
    else:
        if not rdzv_endpoint or ":" not in rdzv_endpoint:
            raise AsrtrainError(
                f"launch: {nnodes} nodes need rdzv_endpoint='host:port' of node 0 "
                f"(got {rdzv_endpoint!r})")
        args += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=static",
                 f"--rdzv-endpoint={rdzv_endpoint}"]
        if run_id:
            args.append(f"--rdzv-id={run_id}")
    return args + ["-m", module, *module_args, *argv]


def launch(argv: Sequence[str], learners: int, nnodes: int = 1, node_rank: int = 0,
           rdzv_endpoint: str | None = None, module: str = "asrtrain.cli",
           module_args: Sequence[str] = ("train",), max_restarts: int = 0,
           run_id: str | None = None, threads: int = 0) -> None:
    """Run ``python -m <module> <module_args...> <argv...>`` in ``learners`` processes.

    Args:
        argv: arguments for every learner (e.g. the recipe's Hydra overrides).
        learners: learners on this machine (torchrun's ``--nproc-per-node``).
        nnodes, node_rank, rdzv_endpoint: the multi-machine settings, passed through.
        module: the module each learner runs; tests launch ``synthetic`` (bench/).
        max_restarts: torchrun restarts of the whole group after a failure (0: fail at once).
        threads: CPU threads per learner (0: :func:`asrtrain.distributed.comm.cpu_threads`'s one).

    Raises:
        AsrtrainError: a learner failed; the message names its rank and exit code.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(torchrun_args(argv, learners, nnodes, node_rank, rdzv_endpoint, module,
                                    module_args, max_restarts, run_id))
    # Each learner also calls torch.set_num_threads (build_backend); this covers what runs first.
    env = {"OMP_NUM_THREADS": str(cpu_threads(threads)), LAUNCHER_ENV: str(os.getpid()),
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(SHUTDOWN_GRACE_S)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # torchrun's agent logs each signal it sends and each exit it sees: the error raised here
    # says what matters in one line.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(args)
    except ChildFailedError as e:
        raise AsrtrainError(failure_message(e)) from e
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def failure_message(error) -> str:
    """One line for a failed group of learners: the one at fault, and what the others said.

    A learner that fails writes its one-line error to torchrun's error file
    (:func:`asrtrain.distributed.liveness.record_error`); one that was killed, or died without a
    word, writes none and is the one at fault (the launcher's own SIGTERMs excepted). The first
    learner that said something is quoted too: it names a learner that stopped answering, and
    whether it was killed for it.
    """
    failures = error.failures
    said = {r: f.message for r, f in failures.items()  # "<NONE>": torchrun's "no error file"
            if isinstance(f.message, str) and f.error_file_data.get("message") != "<NONE>"}
    # Learners the launcher stopped after the first failure end by its SIGTERM (or SIGINT).
    stopped = (-signal.SIGTERM, -signal.SIGINT)
    silent = sorted((f.exitcode in stopped, f.timestamp, r)
                    for r, f in failures.items() if r not in said)
    rank = silent[0][2] if silent else min((f.timestamp, r) for r, f in failures.items())[1]
    failure = failures[rank]
    what = said.get(rank) or failure.message
    if what.startswith("To enable traceback"):
        what = "it died without a word (its output is above)"
    first = min(((failures[r].timestamp, r) for r in said if r != rank), default=None)
    others = sorted(r for r in failures if r != rank)
    return (f"learner rank {rank} failed first (exit code {failure.exitcode}, pid "
            f"{failure.pid}): {what.strip()}"
            + (f"; rank {first[1]} said: {said[first[1]].strip()}" if first else "")
            + (f" [ranks {others} were stopped after it]" if others else "")
            + "; resume with the same command")
