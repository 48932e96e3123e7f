"""The cluster simulator (asrtrain.simulate) against the real backends: real gloo learner
processes (bench/synthetic.py, forked as in tests/test_distributed.py) and the simulator on the
same model, data and schedule; the simulator's averaging is the backends' own code; the
`asrtrain simulate` command on a real experiment."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import science  # bench/science.py
import synthetic  # bench/synthetic.py (conftest puts bench/ on the path)
import torch
from conftest import copy_exp
from sim_agreement import (  # bench/sim_agreement.py: the checks behind docs/science.md's table
    CTC_RUN,
    DIM,
    HIDDEN,
    LEARN,
    SEEDS,
    SSGD_RUN,
    TINY_HYBRID,
    SyntheticWorkload,
    heldout,
    spawn,
)

from asrtrain import AsrtrainError
from asrtrain.distributed import allreduce, gossip, topology
from asrtrain.distributed.backend import DistributedBackend
from asrtrain.distributed.registry import SimShape, register_backend
from asrtrain.simulate import engine
from asrtrain.simulate.engine import SimConfig, Simulator
from asrtrain.simulate.speeds import learner_factors
from asrtrain.simulate.timing import EXCHANGE, GossipClock, gossip_events, sync_segments

REPO = Path(__file__).resolve().parents[1]

def test_simulator_calls_the_functions_the_backends_call() -> None:
    """Not copies: the very function objects, and the backends call them too (a copy on either
    side that drifts would break this, or the numeric agreement tests below)."""
    assert engine.gossip_change is gossip.gossip_change
    assert engine.flatten_grads is allreduce.flatten_grads
    assert engine.mean_of_sum_ is allreduce.mean_of_sum_
    assert engine.Schedule is topology.Schedule
    assert "gossip_change" in gossip.Gossip._finish.__code__.co_names
    called = allreduce.GradientAllreduce.__call__.__code__.co_names
    assert {"flatten_grads", "mean_of_sum_", "set_grads_"} <= set(called)


@pytest.mark.parametrize(("members", "scheme"), [(4, "ring"), (5, "ring"), (6, "random_ring"),
                                                 (8, "exponential")])
def test_a_zero_lr_round_is_the_schedules_mixing_matrix(members: int, scheme: str) -> None:
    """With equal speeds and no learning, round r maps the stacked models by W_r exactly."""
    work = SyntheticWorkload(6, 4 * members, 0.0, 1.0)
    starts = [torch.randn(sum(p.numel() for p in work.model.parameters()),
                          generator=torch.Generator().manual_seed(m)) for m in range(members)]
    sim = Simulator(SimConfig(members, "adpsgd", topology=scheme, seed=3, idle_s=1e9,
                              log_every=0), work, initial=lambda m: starts[m])
    sim.run()
    sched = topology.Schedule(members, scheme, 3)
    w = np.eye(members)
    for r in range(sim.clock.rounds):
        w = sched.mixing_matrix(r) @ w
    expected = torch.from_numpy(w) @ torch.stack(starts).double()
    got = torch.stack([x.detach().double() for x in sim.x])
    assert sim.clock.rounds == 6
    assert torch.allclose(got, expected, atol=1e-5)


# -- agreement with real gloo learners ---------------------------------------------------------

@pytest.mark.timeout(180)
def test_ssgd_equals_four_real_gloo_learners(tmp_path: Path) -> None:
    spawn(tmp_path, 4, "--backend", "ssgd", "--steps", "12", "--batch", "12", "--lr", "0.1",
          "--decay-samples", "50")
    real = torch.load(tmp_path / "rank0.pt")
    sim = Simulator(SimConfig(4, "ssgd", speed="hetero:0.5"),
                    SyntheticWorkload(12, 12, 0.1, 50.0))
    traj = sim.run()
    assert traj.epochs[0]["samples"] == 12 * 12
    final = sim.final_state()
    for k, v in real["final"].items():
        assert not torch.equal(v, real["initial"][k])  # it trained
        assert torch.allclose(final[k], v, atol=1e-5), k


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("backend", "learners", "per_node", "scheme", "extra"), [
    ("adpsgd", 4, 1, "ring", []),
    ("adpsgd", 4, 1, "random_ring", []),
    ("adpsgd", 4, 1, "exponential", ["--delay-by-one"]),
    ("hadpsgd", 8, 2, "random_ring", []),  # 4 nodes of 2: the leaders gossip
])
def test_zero_lr_consensus_distance_per_round_equals_real(
        tmp_path: Path, backend: str, learners: int, per_node: int, scheme: str,
        extra: list[str]) -> None:
    """Real learners from their own random models (a node from its leader's), no learning, out
    of step (delays, jitter): after every drain the consensus distance is the simulator's after
    as many rounds. The harness reads learner 0's round count just after the drain is released
    (bench/synthetic.py), when its gossip thread may have started a round or two more: the
    count is an upper bound, so the match is sought at it or up to 2 rounds before (the
    distance shrinks ~3x a round, so no other round is within the tolerance). The first drain
    (step 0) is no exception: a learner that has arrived at a drain answers its partners at
    the idle pace until all have arrived, so on a loaded machine rounds may run before it
    (stop 38's CI: the first point was round 1's distance)."""
    stats = spawn(tmp_path, learners, "--backend", backend, "--per-node", str(per_node),
                  "--topology", scheme, "--steps", "24", "--log-every", "4", "--no-sync-init",
                  "--lr", "0", "--batch", "16", "--sleep", "0.005", "--jitter", "0.01",
                  "--idle", "0.02", "--seed", "2", *extra)
    points = stats[0]["distances"]  # (step, distance, rounds) after a drain
    rounds = max(p[2] for p in points)
    assert rounds >= 6
    starts = [torch.nn.utils.parameters_to_vector(
        synthetic.make_model(DIM, HIDDEN, 2 + 1000 * (r + 1)).parameters()).detach()
        for r in range(0, learners, per_node)]  # each node's leader
    sim = Simulator(SimConfig(learners, backend, per_node=per_node, topology=scheme, seed=2,
                              delay_by_one=bool(extra), idle_s=1e9, log_every=1),
                    SyntheticWorkload(rounds + 1, 16, 0.0, 1.0, seed=2),
                    initial=lambda m: starts[m])
    first = sim.distance()
    traj = sim.run()
    by_round = {0: first, **{p["rounds"]: p["distance"] for p in traj.points}}
    exact = 0
    for _step, distance, r in points:
        near = [q for q in range(max(0, r - 2), r + 1)
                if by_round[q] == pytest.approx(distance, rel=1e-4, abs=1e-7 * first)]
        assert near, (r, distance, [by_round[q] for q in range(max(0, r - 2), r + 1)])
        exact += r in near
    assert exact >= len(points) // 2  # mostly the count itself
    assert min(by_round.values()) < 0.5 * first  # gossip moved them


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "per_node", "delay_by_one"), [
    ("adpsgd", 1, False), ("adpsgd", 1, True), ("hadpsgd", 2, False)])
def test_learning_heldout_loss_within_the_real_runs_spread(
        tmp_path: Path, backend: str, per_node: int, delay_by_one: bool) -> None:
    """Four real learners at ~30 ms a step (gossip keeps up: a round a step) against the
    simulator at the same pace, over four seeds (data, model, ring): the mean held-out loss of
    the simulator is within the spread of the real runs' (docs/science.md states it)."""
    real, sim = [], []
    for seed in SEEDS:
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        stats = spawn(out, 4, *LEARN, "--backend", backend, "--per-node", str(per_node),
                      "--seed", str(seed), *(["--delay-by-one"] if delay_by_one else []))
        assert all(s["rounds"] >= 20 for s in stats[::per_node])  # the pace the simulator has
        real.append(heldout(torch.load(out / "consensus.pt"), seed))
        s = Simulator(SimConfig(4, backend, per_node=per_node, delay_by_one=delay_by_one,
                                seed=seed, step_s=0.03, jitter=0.2, exchange_s=0.005,
                                log_every=0),
                      SyntheticWorkload(40, 36, 0.1, 1e9, seed))
        sim.append(s.run().epochs[-1]["heldout_loss"])
    start = statistics.mean(heldout(synthetic.make_model(DIM, HIDDEN, s).state_dict(), s)
                            for s in SEEDS)
    spread = max(real) - min(real)
    assert statistics.mean(real) < 0.5 * start  # they learned
    assert abs(statistics.mean(sim) - statistics.mean(real)) <= spread, (real, sim)


# -- the simulator alone ---------------------------------------------------------------------------

def test_speed_models_and_their_errors() -> None:
    assert learner_factors("equal", 4, 0).tolist() == [1.0] * 4
    slow = learner_factors("straggler:2:4", 16, 5)
    assert sorted(slow.tolist()) == [1.0] * 14 + [4.0, 4.0]
    assert (learner_factors("hetero:0.3", 8, 1) == learner_factors("hetero:0.3", 8, 1)).all()
    with pytest.raises(AsrtrainError, match="simulate --speed 'fast'"):
        learner_factors("fast", 4, 0)


def test_a_straggler_holds_up_its_partners_rounds_not_their_steps() -> None:
    """Equal members gossip a round a step; with one 4x slower member the others still step at
    their pace, and idle rounds (every idle_s) keep the rounds going."""
    sched = topology.Schedule(4, "ring")
    ends = [np.arange(1, 11) * f for f in (1.0, 1.0, 1.0, 4.0)]
    events, end = gossip_events(sched, [e.astype(float) for e in ends], 0.0, GossipClock(),
                                False, 2.0, 0.0, 0)
    assert end == 40.0
    exchanges = [e for e in events if e[3] == EXCHANGE]
    assert all(e[0] >= 1.0 for e in exchanges)  # nobody gossips before its first step
    assert max(e[1] for e in exchanges) + 1 >= 20  # idle rounds at 2 s past the fast ones


def test_learners_wait_for_each_other_where_the_real_trainer_syncs() -> None:
    """The real trainer's consensus distance (every trainer.log_every global steps) is
    collective: all learners wait there; the simulator cuts its epochs at the same steps."""
    assert sync_segments(10, 0, 0) == [(0, 10)]
    assert sync_segments(10, 15, 20) == [(0, 5), (5, 10)]
    assert sync_segments(10, 0, 5) == [(0, 5), (5, 10)]
    runs = {}
    for every in (0, 2):
        cfg = SimConfig(4, "adpsgd", jitter=0.5, step_s=0.1, idle_s=1e9,
                        sync_every=every, log_every=0)
        runs[every] = Simulator(cfg, SyntheticWorkload(10, 16, 0.05, 1e9)).run().epochs[0]
    assert runs[0]["samples"] == runs[2]["samples"] == 160
    assert runs[2]["time"] > runs[0]["time"]  # the fast ones waited at every sync


def test_hadpsgd_nodes_and_reproducible_by_seed() -> None:
    cfg = SimConfig(16, "hadpsgd", per_node=4, topology="exponential", epochs=2,
                    speed="hetero:0.3", jitter=0.1, step_s=0.1, log_every=2)
    a = Simulator(cfg, SyntheticWorkload(10, 64, 0.05, 1e9))
    b = Simulator(cfg, SyntheticWorkload(10, 64, 0.05, 1e9))
    assert len(a.x) == 4  # one model per node
    ta, tb = a.run(), b.run()
    assert ta.points == tb.points and ta.epochs == tb.epochs
    assert ta.epochs[-1]["samples"] == 2 * 10 * 64
    assert ta.epochs[-1]["heldout_loss"] < ta.epochs[0]["heldout_loss"] * 1.5
    assert ta.config["spectral_gap"] == pytest.approx(topology.spectral_gap(16, "exponential", 4))


@register_backend("test_pair_sgd")
class PairSGDBackend(DistributedBackend):
    """A fourth backend, defined here and not in the package: learners paired into nodes of two
    that average gradients, the pairs gossiping (H-AD-PSGD's shape). Only its declaration
    matters to the simulator: no line of asrtrain/simulate names it."""

    lockstep = "node"
    sim_shape = SimShape(sync="node", gossip=True)


def test_a_fourth_backend_is_simulated_from_its_registered_shape() -> None:
    """The simulator asks the registry: a backend registered in this file with H-AD-PSGD's
    shape simulates exactly as hadpsgd does; one that is not registered, or declares no shape,
    is refused in one line naming the registered backends."""
    assert "test_pair_sgd" not in Path(engine.__file__).read_text()
    runs = {}
    for name in ("test_pair_sgd", "hadpsgd"):
        cfg = SimConfig(8, name, per_node=2, topology="random_ring", jitter=0.2, step_s=0.1,
                        exchange_s=0.02, log_every=2)
        sim = Simulator(cfg, SyntheticWorkload(8, 32, 0.05, 1e9))
        assert len(sim.x) == 4  # one member per pair
        runs[name] = sim.run()
    assert runs["test_pair_sgd"].epochs == runs["hadpsgd"].epochs
    assert runs["test_pair_sgd"].points == runs["hadpsgd"].points
    assert SimConfig(8, "ssgd").members() == 1 and SimConfig(8, "adpsgd").members() == 8
    with pytest.raises(AsrtrainError) as bad:
        SimConfig(4, "nope").check()
    assert "\n" not in str(bad.value)
    assert str(bad.value).startswith("simulate: backend 'nope' is not registered: use one of ")
    assert {"adpsgd", "hadpsgd", "ssgd", "test_pair_sgd"} <= set(
        str(bad.value).split(": use one of ")[1].split(", "))
    register_backend("test_shapeless")(type("Shapeless", (DistributedBackend,), {}))
    with pytest.raises(AsrtrainError, match=r"^simulate: backend 'test_shapeless' .* declares "
                                            r"no sim_shape"):
        SimConfig(4, "test_shapeless").check()
    with pytest.raises(AsrtrainError, match="never meet"):
        SimShape(sync="learner", gossip=False)


def make_exp(out: Path) -> list[str]:
    """Features and small GMM alignments of the tiny corpus in ``out``; the overrides that
    name them (the stages before align, less the CTC model's). The passes and the hybrid input
    are bench/science.py's: mono and tri1, every later pass of the recipe deleted, 40 log-mel
    filterbanks; the stages those the tests run (none the recipe may add, which train_hybrid would
    read)."""
    base = [f"exp_dir={out}", "nj=2", science.STAGES]
    args = [*base, *science.recipe_overrides(base)]
    for span in (["--to", "features"], ["--stage", "lm", "--to", "align"]):
        proc = asrtrain("run", "recipes/tiny", *args, *span, timeout=1500)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return args


@pytest.fixture(scope="module")
def exp(tiny_tri1: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A tiny experiment with features and small GMM alignments, and the overrides that name
    it: a copy of conftest's tiny_tri1 (made in this session by this code, never borrowed from
    elsewhere on the machine: its digests would depend on where and with what code it was
    made), the same passes as bench/science.py's, so make_exp's runs find them done."""
    out = copy_exp(tiny_tri1, tmp_path_factory.mktemp("sim") / "exp")
    return out, make_exp(out)


def asrtrain(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return forked_cli.run(*args, timeout=timeout)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("system", "stage", "settings", "name"), [
    ("hybrid", "train_hybrid", SSGD_RUN, "hybrid.model.name=h_ssgd"),
    ("ctc", "train", CTC_RUN, "model.name=c_ssgd")])  # CTC: with the recipe's SpecAugment
def test_simulated_ssgd_equals_the_real_trainer(exp: tuple[Path, list[str]], tmp_path: Path,
                                                system: str,
                                                stage: str, settings: list[str],
                                                name: str) -> None:
    """The real trainer with 4 gloo learners (torchrun, through `asrtrain run`) and
    `asrtrain simulate` with 4 learners give the same model over 2 epochs, to rounding: the
    same batches (each epoch's shards), SpecAugment draws, optimizer, clipping, LR schedule and
    gradient averaging."""
    exp_dir, recipe = exp
    real = asrtrain("run", "recipes/tiny", *recipe, "--stage", stage, "--to", stage,
                    *settings, name, "trainer.backend=ssgd", "trainer.learners=4")
    assert real.returncode == 0, real.stderr[-3000:]
    out = tmp_path / "ssgd.json"
    sim = asrtrain("simulate", "recipes/tiny", *recipe, *settings, "--system", system,
                   "--learners", "4", "--backend", "ssgd", "--log-every", "20", "--out", str(out))
    assert sim.returncode == 0, sim.stderr[-3000:]
    trained = torch.load(exp_dir / "train" / name.split("=")[1] / "final.pt", map_location="cpu",
                         weights_only=False)
    simulated = torch.load(out.with_suffix(".pt"))
    for k, v in trained["model"].items():
        assert torch.allclose(simulated[k], v, atol=1e-5), k
    traj = json.loads(out.read_text())
    assert traj["epochs"][-1]["samples"] == trained["metrics"]["global_samples"]
    assert traj["epochs"][-1]["heldout_loss"] == pytest.approx(trained["metrics"]["dev_loss"],
                                                               rel=1e-5)


@pytest.mark.timeout(600)
def test_simulate_command_on_the_hybrid_task(exp: tuple[Path, list[str]], tmp_path: Path) -> None:
    out = tmp_path / "traj.json"
    proc = forked_cli.run("simulate", "recipes/tiny", *exp[1],
                          *TINY_HYBRID, "hybrid.trainer.batch_chunks=8", "hybrid.trainer.epochs=1",
                          "trainer.topology=ring",
                          "--learners", "16", "--backend", "adpsgd", "--speed", "straggler:1:4",
                          "--log-every", "5", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traj = json.loads(out.read_text())
    assert traj["config"]["learners"] == 16 and traj["config"]["topology"] == "ring"
    assert len(traj["epochs"]) == 1 and np.isfinite(traj["epochs"][0]["heldout_loss"])
    assert traj["points"] and all(p["distance"] >= 0 for p in traj["points"])
    assert (out.parent / "traj.pt").is_file()
    bad = forked_cli.run("simulate", "recipes/tiny", *exp[1], "--learners", "6", "--backend",
                         "hadpsgd", "--per-node", "4", "--out", str(out), timeout=300)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1].startswith("asrtrain: error: simulate: per_node=4")


def test_the_time_model_sets_the_simulated_time() -> None:
    """With a bandwidth the simulator's clock is the time model's: SSGD's steps take the compute
    plus the ring allreduce of the model's bytes; AD-PSGD's steps take the compute alone and
    its rounds thin out to the model's rate when an exchange is slower than a step."""
    work = SyntheticWorkload(20, 16, 0.05, 1e9)
    nbytes = sum(p.numel() * 4 for p in work.model.parameters())
    bw = nbytes / 0.05  # a model's bytes take 50 ms
    ssgd = SimConfig(4, "ssgd", step_s=0.1, bandwidth=bw, latency_s=1e-3)
    traj = Simulator(ssgd, work).run()
    allreduce = 2 * 3 / 4 * 0.05 + 2 * 3 * 1e-3
    assert traj.config["time_model"]["allreduce_s"] == pytest.approx(allreduce)
    assert traj.epochs[0]["time"] == pytest.approx(20 * (0.1 + allreduce))
    for delay in (False, True):
        cfg = SimConfig(8, "adpsgd", step_s=0.05, bandwidth=bw, delay_by_one=delay,
                        idle_s=1e9, log_every=0)
        sim = Simulator(cfg, SyntheticWorkload(20, 32, 0.05, 1e9))
        row = sim.run().epochs[0]
        model = sim.timing
        assert model is not None and model.round_s > 0.05  # slower than a step
        assert row["time"] >= 20 * 0.05
        assert abs(row["rounds"] - 20 * model.rounds_per_step) <= 2
    with pytest.raises(AsrtrainError, match="bandwidth=-1"):
        SimConfig(4, "ssgd", bandwidth=-1).check()
