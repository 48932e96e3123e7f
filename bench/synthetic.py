"""A synthetic learner: a 2-layer MLP regressing a fixed random teacher, trained through the
Backend interface exactly as the real trainer does (``build_backend``, the registry, the same
calls per step). The test harness of the distributed backends and the learner of ``bench/run.py``;
it is not part of the package. Under torchrun (with ``bench`` on ``PYTHONPATH``)::

    PYTHONPATH=bench python -m torch.distributed.run --nproc-per-node 4 -m synthetic \\
        --backend adpsgd --steps 50 --out /tmp/run

or, faster on a small machine, :func:`run_local` (learners forked from a fork server).

Each learner writes ``<out>/rank<r>.json`` (steps, samples, rate, consensus distances) and
``<out>/rank<r>.pt`` (its initial and final parameters); rank 0 also writes ``consensus.pt``.
Compute can be simulated by a sleep per step (``--sleep``, ``--slow RANK:FACTOR``) so that
communication, not the machine's cores, is what a benchmark measures.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from asrtrain import AsrtrainError
from asrtrain.distributed.learner import build_backend
from asrtrain.distributed.liveness import record_error
from asrtrain.fileio import atomic_open, write_text


def make_model(dim: int, hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 1))


def make_data(examples: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 12345)
    x = torch.randn(examples, dim, generator=g)
    w = torch.randn(dim, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(examples, 1, generator=g)
    return x, y


def global_batch(step: int, batch: int, examples: int) -> torch.Tensor:
    """Indices of the global batch of ``step`` (learners take ``[data_rank::data_world]``)."""
    return (torch.arange(batch) + step * batch) % examples


def lr_at(lr: float, samples: int, decay_samples: float) -> float:
    """The LR schedule of the synthetic run: inverse decay in global samples."""
    return lr / (1.0 + samples / decay_samples)


def _rounds(backend: object) -> int:
    """Gossip rounds done so far (equal on all learners right after a consensus call)."""
    gossip = getattr(backend, "gossip", None)
    return gossip.rounds if gossip is not None else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="synthetic", description=__doc__)
    p.add_argument("--backend", default="ssgd", help="a registered backend name")
    p.add_argument("--plugin", action="append", default=[],
                   help="import this module first (it may register backends)")
    p.add_argument("--per-node", type=int, default=0)
    p.add_argument("--topology", default="random_ring")
    p.add_argument("--delay-by-one", action="store_true")
    p.add_argument("--no-sync-init", action="store_true",
                   help="every learner starts from its own random model")
    p.add_argument("--steps", default="20", help="steps, or a comma list of steps per rank")
    p.add_argument("--agree-steps", action="store_true",
                   help="run the smallest step count of all learners (Backend.agree_min)")
    p.add_argument("--batch", type=int, default=16, help="global batch per step")
    p.add_argument("--examples", type=int, default=256)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--decay-samples", type=float, default=1000.0)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--sleep", type=float, default=0.0, help="simulated compute seconds per step")
    p.add_argument("--slow", default="", help="RANK:FACTOR[,RANK:FACTOR]: slower learners")
    p.add_argument("--jitter", type=float, default=0.0, help="random extra sleep per step (s)")
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-step", type=int, default=-1)
    p.add_argument("--die-how", choices=("exit", "kill", "stop"), default="exit",
                   help="exit: os._exit(3); kill: SIGKILL itself; stop: SIGSTOP itself (hung)")
    p.add_argument("--ballast", type=int, default=0,
                   help="a trainable parameter of N numbers that the model does not use: "
                        "gossip moves it (an IBM-size message), the steps never touch it")
    p.add_argument("--no-gossip", action="store_true",
                   help="hold gossip after setup (Backend drain) until the final consensus")
    p.add_argument("--wait-rounds", type=int, default=0,
                   help="after the last step, wait until this learner started N gossip rounds "
                        "(exactly N with --steps N and a long --idle)")
    p.add_argument("--log-every", type=int, default=0,
                   help="measure the consensus distance every N steps (equal steps only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: one)")
    p.add_argument("--device", default="cpu",
                   help="where the model trains: cpu; learner (the trainer's choice: "
                        "cuda:<local rank> where CUDA is, process groups NCCL); or a device such "
                        "as cuda:0 (learners may share one GPU; process groups stay gloo)")
    p.add_argument("--gossip-backend", default="gloo", help="trainer.gossip_backend")
    p.add_argument("--start-samples", type=int, default=0, help="progress of a resumed run")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--idle", type=float, default=0.1, help="gossip round interval when idle")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    for module in args.plugin:
        importlib.import_module(module)
    cfg = {"backend": args.backend, "topology": args.topology, "delay_by_one": args.delay_by_one,
           "seed": args.seed, "timeout_s": args.timeout, "gossip_idle_s": args.idle,
           "sync_init": not args.no_sync_init, "cpu": args.device != "learner",
           "threads": args.threads, "gossip_backend": args.gossip_backend}
    if args.per_node:
        cfg["per_node"] = args.per_node
    backend = build_backend(cfg)
    rank = backend.rank
    out = Path(args.out)
    steps_list = [int(s) for s in args.steps.split(",")]
    steps = steps_list[rank] if len(steps_list) > 1 else steps_list[0]
    if args.agree_steps:
        steps = backend.agree_min(steps)
    slow = {int(r): float(f) for r, f in (item.split(":") for item in args.slow.split(",") if item)}
    factor = slow.get(rank, 1.0)
    rng = random.Random(args.seed * 1000 + rank)

    device = backend.device if args.device == "learner" else torch.device(args.device)
    model = make_model(args.dim, args.hidden, args.seed if not args.no_sync_init
                       else args.seed + 1000 * (rank + 1)).to(device)
    x, y = make_data(args.examples, args.dim, args.seed)
    x, y = x.to(device), y.to(device)
    if args.ballast:
        model.register_parameter("ballast", torch.nn.Parameter(torch.zeros(args.ballast,
                                                                           device=device)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    backend.setup(model, optimizer, global_samples=args.start_samples)
    if backend.is_main:
        print(backend.describe(), flush=True)
    initial = _state(model)
    distances: list[tuple[int, float]] = []
    if args.log_every:
        distances.append((0, backend.consensus_distance(), _rounds(backend)))

    if args.no_gossip and hasattr(backend, "drain"):
        backend.drain()  # every learner at rest until the consensus at the end releases it
    samples = 0
    last_loss = 0.0  # a learner with no step (its share empty) reports 0
    start = time.monotonic()
    for step in range(steps):
        if rank == args.die_rank and step == args.die_step:
            _die(args.die_how)
        delay = args.sleep * factor + (rng.uniform(0, args.jitter) if args.jitter else 0.0)
        if delay:
            time.sleep(delay)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(args.lr, backend.global_samples(), args.decay_samples)
        idx = global_batch(step, args.batch, args.examples)[backend.data_rank::backend.data_world]
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        last_loss = float(loss.detach())
        loss.backward()
        backend.after_backward(step)
        backend.optimizer_step(optimizer)
        optimizer.zero_grad()
        backend.after_step(step, len(idx))
        samples += len(idx)
        if args.log_every and (step + 1) % args.log_every == 0:
            distances.append((step + 1, backend.consensus_distance(), _rounds(backend)))
    elapsed = time.monotonic() - start
    _wait_rounds(backend, args.wait_rounds, args.timeout)

    final_distance = backend.consensus_distance()
    drain = backend.drain_figures()  # that meeting's drain: the learners arrive from their steps
    consensus = backend.consensus()
    metrics = backend.reduce_mean({"loss": last_loss})
    stats = {"rank": rank, "world_size": backend.world_size, "backend": backend.name,
             "steps": steps, "samples": samples, "elapsed": elapsed,
             "rate": samples / elapsed if elapsed > 0 else 0.0,
             "global_samples": backend.global_samples(), "distances": distances,
             "final_distance": final_distance, "mean_loss": metrics["loss"],
             "exchanges": getattr(getattr(backend, "gossip", None), "exchanges", 0),
             "rounds": _rounds(backend), "drain": drain,
             "gossip_seconds": getattr(getattr(backend, "gossip", None), "seconds", None),
             "threads": torch.get_num_threads(), "describe": backend.describe(),
             # True where this process was forked from one that had used CUDA (it could not)
             "cuda_bad_fork": torch.cuda._is_in_bad_fork()}
    backend.close()  # drains gossip: the models below are quiescent
    final = _state(model)
    consensus.pop("ballast", None)
    with atomic_open(out / f"rank{rank}.pt", "wb") as f:
        torch.save({"initial": initial, "final": final}, f)
    if backend.is_main:
        with atomic_open(out / "consensus.pt", "wb") as f:
            torch.save(consensus, f)
    write_text(out / f"rank{rank}.json", json.dumps(stats, indent=1))


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of the model's state, without the ballast (not worth writing)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k != "ballast"}


def _wait_rounds(backend: object, rounds: int, timeout: float) -> None:
    """Wait until this learner's gossip thread started ``rounds`` rounds (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while _rounds(backend) < rounds and time.monotonic() < deadline:
        time.sleep(0.005)


def _die(how: str) -> None:
    """Fail as a learner can without a word: exit, be killed, or hang (stopped)."""
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen; only SIGKILL (or SIGCONT) ends it
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        run(args)
    except Exception as e:
        rank = os.environ.get("RANK", "0")
        write_text(Path(args.out) / f"error{rank}.txt", f"{type(e).__name__}: {e}\n")
        record_error(e)  # for the launcher's message, as `asrtrain train` does
        raise


def _learner(env: dict[str, str], argv: list[str]) -> None:
    os.environ.update(env)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if key not in env:
            os.environ.pop(key, None)
    code = 0
    try:
        main(argv)
    except BaseException:  # main wrote error<rank>.txt; exit like a failed learner
        code = 1
    sys.stdout.flush()
    os._exit(code)


#: What the fork server imports once, so that a learner starts at once: torch, and what the first
#: optimizer step imports (torch._dynamo: seconds per process on a busy machine).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.optim"]


def run_local(out: Path, learners: int, argv: Sequence[str],
              timeout: float = 120.0) -> dict[int, int]:
    """Run ``learners`` synthetic learners on this machine, with torchrun's variables.

    The learners are forked from a fork server (multiprocessing's ``forkserver``), a clean process
    that imported torch once (:data:`PRELOAD`) and never ran autograd or CUDA: a learner starts at
    once, and no fork copies the threads of a process that trained (CUDA's autograd threads do not
    survive a fork). :func:`asrtrain.distributed.launch.launch` is the real launcher. Returns
    {rank: exit code}; learners still running after ``timeout`` seconds are killed and raise an
    AsrtrainError (a deadlock).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, __name__])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(learners):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        if learners > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(learners), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(learners))
        p = ctx.Process(target=_learner, args=(env, ["--out", str(out), *argv]))
        p.start()
        procs.append(p)
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if hung:
        raise AsrtrainError(
            f"synthetic learners {hung} still ran after {timeout:.0f} s (deadlock?)")
    return {r: p.exitcode for r, p in enumerate(procs)}


if __name__ == "__main__":
    main(sys.argv[1:])
