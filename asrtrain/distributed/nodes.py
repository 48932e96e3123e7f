"""Several machines: what ``asrtrain run`` does on a node other than node 0.

The same command runs on every node, as torchrun's own multi-node launch is run (each node with
its ``trainer.node_rank``, all with node 0's ``trainer.rdzv_endpoint``), over an exp dir the nodes
share (a cluster's shared file system). Node 0 is the pipeline: it holds the exp dir's lock, runs
the data stages, prepares the training directory (moving old checkpoints aside, writing the
learners' ``config.yaml``), writes checkpoints, stage records and the final model, exactly as a
one-node run does. A node of rank ``k > 0`` writes none of that and takes no part in the data
stages: for each training stage of the run whose trainer spans several nodes (``train``,
``train_hybrid``) it waits until node 0 has recorded the stages that training reads, then starts
its own torchrun agent, whose learners meet node 0's at the rendezvous and read the
``config.yaml`` node 0 wrote (torchrun starts no learner before every agent has joined, and node
0's agent starts only after that file is written). A node ``k`` run holds a lock of its own,
``exp/.node<k>.lock``, so two of them on one exp dir stop as two node-0 runs do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError

log = logging.getLogger("asrtrain")

#: The stages that start learners through torchrun (their trainer may span several nodes).
TRAIN_STAGES = ("train", "train_hybrid")
#: How often a waiting node looks at node 0's stage records, and how often it says it waits.
POLL_S = 2.0
SAY_EVERY_S = 60.0


def stage_trainer(name: str, cfg: DictConfig):
    """The trainer settings in effect for training stage ``name`` (a ``TrainerConfig``)."""
    from asrtrain.train.config import TrainerConfig

    if name == "train_hybrid":
        from asrtrain.stages.train_hybrid import _trainer

        return TrainerConfig.from_config(_trainer(cfg))
    return TrainerConfig.from_config(cfg.trainer)


def node_rank(cfg: DictConfig) -> int:
    """This run's node: the ``node_rank`` of the recipe's training stages that span several nodes
    (0 when none does). Stages that disagree are an error: a node is one machine."""
    ranks = {}
    for name in TRAIN_STAGES:
        if name in [str(s) for s in cfg.get("stages") or ()]:
            try:
                t = stage_trainer(name, cfg)
            except AsrtrainError:
                if OmegaConf.select(cfg, "trainer.node_rank", default=0) in (0, None):
                    continue  # node 0: the pipeline's checks name the bad setting, when (and
                raise         # only when) the stage is to run; never run node k as node 0
            if t.nnodes > 1:
                ranks[name] = t.node_rank
    if len(set(ranks.values())) > 1:
        raise AsrtrainError("the training stages run on different nodes ("
                            + ", ".join(f"{n}: node_rank {r}" for n, r in ranks.items())
                            + "): give one trainer.node_rank per machine")
    return next(iter(ranks.values()), 0)


def _base(read: str) -> str:
    return read.split(":", 1)[0]  # "lang:units" reads a part of stage lang


def pending_inputs(cfg: DictConfig, stages: dict, name: str) -> list[str]:
    """The stages that ``name`` reads whose records are not up to date now (node 0 has yet to
    run them), read afresh from the exp dir."""
    from asrtrain.pipeline import Pipeline

    decisions = {d.stage: d for d in Pipeline(cfg, stages).plan()}
    return [r for r in dict.fromkeys(_base(r) for r in stages[name].reads)
            if r in decisions and decisions[r].run]


def node_lock(exp: Path, rank: int):
    """Hold ``exp/.node<rank>.lock``: one run per node and exp dir."""
    from asrtrain.pipeline import exp_lock

    return exp_lock(exp, f".node{rank}.lock", f"(node {rank} of it)")


def wait_for_inputs(cfg: DictConfig, stages: dict, name: str, rank: int,
                    poll_s: float = POLL_S) -> None:
    """Wait until node 0 has recorded every stage that ``name`` reads."""
    said = 0.0
    while pending := pending_inputs(cfg, stages, name):
        if time.monotonic() - said >= SAY_EVERY_S:
            log.info("node %d: stage %s waits for node 0 to finish %s", rank, name,
                     ", ".join(pending))
            said = time.monotonic()
        time.sleep(poll_s)


def model_dir(name: str, cfg: DictConfig, paths) -> Path:
    """The training directory of training stage ``name`` (node 0 writes its ``config.yaml``)."""
    if name == "train_hybrid":
        from asrtrain.stages.train_hybrid import hybrid_config

        return paths.model_dir(str(hybrid_config(cfg, paths).model.name))
    return paths.model_dir(str(cfg.model.name))


def run_node(cfg: DictConfig, stages: dict, start: str | None = None, stop: str | None = None,
             force: bool | Collection[str] = False, dry_run: bool = False) -> list[str]:
    """``asrtrain run`` on node ``k > 0``: this node's learners of each training stage that node
    0 runs in the range (the same plan as node 0's from the same command); return their names."""
    from asrtrain.distributed.launch import launch
    from asrtrain.pipeline import Pipeline

    rank = node_rank(cfg)
    pipeline = Pipeline(cfg, stages)
    decisions = pipeline.plan(start, stop, force)
    todo = [d for d in decisions if d.run and d.in_range]
    pipeline.check(todo)
    mine = [d.stage for d in todo
            if d.stage in TRAIN_STAGES and stage_trainer(d.stage, cfg).nnodes > 1]
    if dry_run:
        for d in decisions:
            if not d.in_range:
                what = "outside --stage/--to"
            elif d.stage in mine:
                t = stage_trainer(d.stage, cfg)
                reads = ", ".join(dict.fromkeys(_base(r) for r in stages[d.stage].reads))
                what = (f"node {rank} of {t.nnodes}: starts this node's {t.learners} learners "
                        f"once node 0 has {reads} ({'; '.join(d.reasons)})")
            else:
                what = "node 0's" + (" (done)" if not d.run else "")
            print(f"{d.stage:<14} {what}", flush=True)
        return mine
    if not mine:
        log.info("node %d: nothing to do here (node 0 runs every stage but the training "
                 "stages' learners, and no training stage in range runs)", rank)
        return []
    with node_lock(pipeline.paths.exp, rank):
        for name in mine:
            t = stage_trainer(name, cfg)
            wait_for_inputs(cfg, stages, name, rank)
            config = (model_dir(name, cfg, pipeline.paths) / "config.yaml").resolve()
            log.info("node %d of %d: stage %s: starting this node's %d learners (rendezvous "
                     "at %s)", rank, t.nnodes, name, t.learners, t.rdzv_endpoint)
            t0 = time.time()
            launch([str(config)], learners=t.learners, nnodes=t.nnodes, node_rank=rank,
                   rdzv_endpoint=t.rdzv_endpoint, threads=t.threads)
            log.info("node %d: stage %s: this node's learners done in %.1f s", rank, name,
                     time.time() - t0)
    return mine
