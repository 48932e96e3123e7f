"""``asrtrain simulate RECIPE [overrides]``: a cluster of 16-256 learners simulated in this
process on the recipe's real task (its features and, for the hybrid system, alignments must have
been made by ``asrtrain run``). The backend, topology, delay-by-one, seed, epochs and every
optimisation setting are the recipe's trainer settings (``trainer.topology=ring``,
``hybrid.trainer.batch_chunks=32``, ...); the cluster's size and speeds are options."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from asrtrain.fileio import atomic_open, write_text

log = logging.getLogger("asrtrain")


@click.command("simulate", context_settings={"ignore_unknown_options": True})
@click.argument("recipe", type=click.Path(exists=True, file_okay=False))
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--system", type=click.Choice(["hybrid", "ctc"]), default="hybrid",
              show_default=True, help="Which of the recipe's models to train.")
@click.option("--learners", type=int, required=True, help="Simulated learners (e.g. 16-256).")
@click.option("--backend", default=None,
              help="A registered backend that declares a simulation shape (ssgd, adpsgd, "
                   "hadpsgd, ...). Default: the recipe's trainer.backend.")
@click.option("--per-node", type=int, default=None,
              help="hadpsgd: learners per node (default: trainer.per_node).")
@click.option("--speed", default="equal", show_default=True,
              help="equal | hetero[:SIGMA] | straggler[:COUNT[:FACTOR]]")
@click.option("--step-s", type=float, default=0.1, show_default=True,
              help="Simulated seconds of a nominal learner's step.")
@click.option("--jitter", type=float, default=0.0, show_default=True,
              help="Per-step time variation, a fraction of the step.")
@click.option("--exchange-s", type=float, default=0.0, show_default=True,
              help="Simulated seconds of one pairwise gossip exchange.")
@click.option("--gbit-s", type=float, default=0.0, show_default=True,
              help="The time model: a node's NIC in Gb/s (0: off, exchanges take --exchange-s). "
                   "--step-s is then the compute; the allreduce and the exchanges cost the "
                   "model's bytes (docs/science.md, 'The time model').")
@click.option("--latency-s", type=float, default=0.0, show_default=True,
              help="The time model: seconds of a message's latency.")
@click.option("--nodes", type=int, default=0, show_default=True,
              help="The time model: machines (0: one per hadpsgd node, else one per learner).")
@click.option("--idle-s", type=float, default=None,
              help="Gossip round interval when idle (default: trainer.gossip_idle_s).")
@click.option("--log-every", type=int, default=1, show_default=True,
              help="A trajectory point every N gossip rounds (ssgd: steps).")
@click.option("--sync-every", type=int, default=0, show_default=True,
              help="All learners wait and drain gossip every N global steps (0: at epoch ends "
                   "only, as the real trainer does for adpsgd and hadpsgd).")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="The trajectory (JSON); the final consensus model goes beside it (.pt).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging (every trajectory point).")
def simulate_command(recipe: str, overrides: tuple[str, ...], system: str, learners: int,
                     backend: str | None, per_node: int | None, speed: str, step_s: float,
                     jitter: float, exchange_s: float, gbit_s: float, latency_s: float,
                     nodes: int, idle_s: float | None, log_every: int,
                     sync_every: int, out: str, verbose: bool) -> None:
    """Simulate LEARNERS learners training RECIPE's model in one process (docs/science.md)."""
    import torch

    from asrtrain.logs import setup_logging
    from asrtrain.recipe import compose_recipe
    from asrtrain.simulate.engine import SimConfig, Simulator
    from asrtrain.simulate.workload import TaskWorkload, system_config
    from asrtrain.train.config import TrainerConfig

    setup_logging(verbose)
    cfg = system_config(compose_recipe(recipe, overrides), system)
    t = TrainerConfig.from_config(cfg.trainer)
    sim_cfg = SimConfig(learners, backend or t.backend, per_node or t.per_node or 1, t.topology,
                        t.delay_by_one, t.epochs, t.seed, speed, step_s, jitter, exchange_s,
                        idle_s if idle_s is not None else t.gossip_idle_s, t.grad_clip,
                        log_every, sync_every, bandwidth=gbit_s * 1e9 / 8,
                        latency_s=latency_s, nodes=nodes)
    sim_cfg.check()
    sim = Simulator(sim_cfg, TaskWorkload(cfg))
    log.info("simulate: %d learners, %s, %s, %d epochs of %s", learners, sim_cfg.backend,
             sim_cfg.topology, sim_cfg.epochs, cfg.model.name)
    traj = sim.run()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(traj.to_json(), indent=1) + "\n")
    with atomic_open(path.with_suffix(".pt"), "wb") as f:
        torch.save(sim.final_state(), f)
    last = traj.epochs[-1]
    click.echo(f"simulated {learners} learners ({sim_cfg.backend}): held-out loss "
               f"{last['heldout_loss']:.4f}, consensus distance {last['distance']:.2e}, "
               f"{last['time']:.1f} simulated s; trajectory {path}")
