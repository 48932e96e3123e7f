"""Start the learners of one machine through torchrun's launcher (``torch.distributed.run``).

``launch(argv, learners)`` runs ``python -m asrtrain.cli train <argv...>`` in ``learners``
processes on this machine, in this process (torchrun's ``run(args)``), and raises an
AsrtrainError naming the learner that failed. With ``nnodes > 1`` run it on every machine with
that machine's ``node_rank`` and the same ``rdzv_endpoint`` (``host:port`` of node 0), which uses
torchrun's static rendezvous. On CPUs every learner gets ``trainer.threads`` threads (one by
default: :func:`asrtrain.distributed.comm.cpu_threads`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence

from asrtrain import AsrtrainError
from asrtrain.distributed.comm import cpu_threads
from asrtrain.distributed.liveness import LAUNCHER_ENV, first_line

#: Seconds torchrun waits for learners to end after SIGTERM before it sends SIGKILL (its own
#: default, 30 s, is long for a learner that only has to drop what it is doing: checkpoints are
#: written atomically).
SHUTDOWN_GRACE_S = 5
#: Seconds the agents of a multi-node run wait for each other at the rendezvous (torchrun's own
#: default for its static rendezvous): node 0's for every other node, the others' for node 0.
RDZV_TIMEOUT_S = 600
#: How often torchrun's agent looks at its learners (torchrun's default): a run's end, or a
#: learner's death, is seen within it (0.5 s here before: a quarter second lost a run on average).
MONITOR_INTERVAL_S = 0.1


def torchrun_args(argv: Sequence[str], learners: int, nnodes: int = 1, node_rank: int = 0,
                  rdzv_endpoint: str | None = None, module: str = "asrtrain.cli",
                  module_args: Sequence[str] = ("train",), max_restarts: int = 0,
                  run_id: str | None = None, rdzv_timeout_s: int = RDZV_TIMEOUT_S) -> list[str]:
    """The ``torchrun`` command line (without the program name) that :func:`launch` runs."""
    if learners < 1:
        raise AsrtrainError(f"launch: need at least one learner per node, got {learners}")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise AsrtrainError(f"launch: node_rank {node_rank} is not in 0..{nnodes - 1}")
    args = [f"--nproc-per-node={learners}", f"--max-restarts={max_restarts}",
            f"--monitor-interval={MONITOR_INTERVAL_S}"]
    if nnodes == 1 and rdzv_endpoint is None:
        args.append("--standalone")  # a free local port, no endpoint to agree on
    else:
        if not rdzv_endpoint or ":" not in rdzv_endpoint:
            raise AsrtrainError(
                f"launch: {nnodes} nodes need rdzv_endpoint='host:port' of node 0 "
                f"(got {rdzv_endpoint!r})")
        args += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=static",
                 f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-conf=timeout={rdzv_timeout_s}"]
        if run_id:
            args.append(f"--rdzv-id={run_id}")
    return args + ["-m", module, *module_args, *argv]


def launch(argv: Sequence[str], learners: int, nnodes: int = 1, node_rank: int = 0,
           rdzv_endpoint: str | None = None, module: str = "asrtrain.cli",
           module_args: Sequence[str] = ("train",), max_restarts: int = 0,
           run_id: str | None = None, threads: int = 0,
           rdzv_timeout_s: int = RDZV_TIMEOUT_S) -> None:
    """Run ``python -m <module> <module_args...> <argv...>`` in ``learners`` processes.

    Args:
        argv: arguments for every learner (e.g. the recipe's Hydra overrides).
        learners: learners on this machine (torchrun's ``--nproc-per-node``).
        nnodes, node_rank, rdzv_endpoint: the multi-machine settings, passed through.
        module: the module each learner runs; tests launch ``synthetic`` (bench/).
        max_restarts: torchrun restarts of the whole group after a failure (0: fail at once).
        threads: CPU threads per learner (0: :func:`asrtrain.distributed.comm.cpu_threads`'s one).
        rdzv_timeout_s: how long the agents of several nodes wait for each other.

    Raises:
        AsrtrainError: a learner failed; the message names its rank and exit code. Or, over
            several nodes, the nodes did not meet at the rendezvous.
    """
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.run import parse_args, run

    from asrtrain.distributed.warm import warm_handlers

    args = parse_args(torchrun_args(argv, learners, nnodes, node_rank, rdzv_endpoint, module,
                                    module_args, max_restarts, run_id, rdzv_timeout_s))
    # Each learner also calls torch.set_num_threads (build_backend); this covers what runs first.
    env = {"OMP_NUM_THREADS": str(cpu_threads(threads)), LAUNCHER_ENV: str(os.getpid()),
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(SHUTDOWN_GRACE_S)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # torchrun's agent logs each signal it sends and each exit it sees: the error raised here
    # says what matters in one line.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        with warm_handlers(), cheap_rendezvous_names():
            run(args)
    except ChildFailedError as e:
        raise AsrtrainError(failure_message(e)) from e
    except (DistError, RendezvousError) as e:  # the agents' own rendezvous (no learner ran)
        if nnodes == 1 and rdzv_endpoint is None:
            raise
        raise AsrtrainError(rendezvous_message(e, nnodes, node_rank, rdzv_endpoint,
                                               rdzv_timeout_s)) from e
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def cheap_rendezvous_names() -> Iterator[None]:
    """While inside, torchrun's rendezvous names its events' methods from the frame itself.

    ``dynamic_rendezvous.get_method_name`` calls :func:`inspect.stack` twice for each event it
    records (a dozen a launch), and that reads the source file of every frame of the launcher's
    stack: 0.8 CPU-s a launch here, for a name that goes to torchrun's event log. This one
    returns the same name (``tests/test_distributed_launch.py`` compares them)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = dynamic_rendezvous.get_method_name
    dynamic_rendezvous.get_method_name = method_name
    try:
        yield
    finally:
        dynamic_rendezvous.get_method_name = original


def method_name(depth: int = 2) -> str:
    """``inspect.stack()[depth].function`` (frame 0 is this call's own), or torch's
    ``"no_method_name"`` where the stack is not that deep."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


def rendezvous_message(error: BaseException, nnodes: int, node_rank: int,
                       rdzv_endpoint: str | None, timeout_s: int) -> str:
    """One line for agents of several nodes that did not meet: who waited for whom."""
    cause = first_line(error)
    if node_rank == 0:
        who = (f"the other {nnodes - 1} node(s) did not all join within {timeout_s} s: run the "
               "same command on each of them with its trainer.node_rank")
    else:
        who = (f"node 0 did not answer within {timeout_s} s: it serves the rendezvous once it "
               "reaches this training stage (is its run going, and is the address reachable "
               "from here?)")
    return (f"node {node_rank} of {nnodes}: the rendezvous at {rdzv_endpoint} failed: {who}. "
            f"Underlying error: {cause}")


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
    if said and all(was_stopped for was_stopped, _, _ in silent):
        silent = []  # the launcher stopped them after one that said why
    rank = silent[0][2] if silent else min((f.timestamp, r) for r, f in failures.items())[1]
    failure = failures[rank]
    what = said.get(rank) or failure.message
    if what.startswith("To enable traceback"):
        what = "it died without a word (its output is above)"
    first = min(((failures[r].timestamp, r) for r in said if r != rank), default=None)
    others = sorted(r for r in failures if r != rank)
    # Over several nodes a lost node is what matters: the learners' words name it (Liveness).
    lost = re.search(r"node \d+(?: on \S+)? is lost", what + " ".join(said.values()))
    return ((f"{lost.group(0)}: " if lost else "")
            + f"learner rank {rank} failed first (exit code {failure.exitcode}, pid "
            f"{failure.pid}): {what.strip()}"
            + (f"; rank {first[1]} said: {said[first[1]].strip()}" if first else "")
            + (f" [ranks {others} were stopped after it]" if others else "")
            + "; resume with the same command")
