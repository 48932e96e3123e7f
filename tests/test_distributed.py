"""The distributed backends with real gloo learner processes on this machine.

Learners are forked from a fork server that imported torch once (synthetic.run_local: a learner
starts at once) with torchrun's environment variables, and run the synthetic learner
(bench/synthetic.py), a training loop that uses only the Backend interface.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import synthetic  # bench/synthetic.py (conftest puts bench/ on the path)
import torch


def spawn(out: Path, learners: int, *args: str, timeout: float = 90.0) -> dict[int, int]:
    """Run ``learners`` synthetic learners; {rank: exit code}. A hang fails the test."""
    torch.set_num_threads(1)
    return synthetic.run_local(out, learners, args, timeout)


def results(out: Path, learners: int) -> tuple[list[dict], list[dict]]:
    stats = [json.loads((out / f"rank{r}.json").read_text()) for r in range(learners)]
    states = [torch.load(out / f"rank{r}.pt") for r in range(learners)]
    return stats, states


def mean_state(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([s[k].double() for s in states]).mean(0) for k in states[0]}


def relative_distance(states: list[dict[str, torch.Tensor]]) -> float:
    """Mean ||x_i - x_bar|| / ||x_bar|| (what Backend.consensus_distance reports)."""
    avg = mean_state(states)
    norm = sum(float(v.pow(2).sum()) for v in avg.values()) ** 0.5
    dists = [sum(float((s[k].double() - avg[k]).pow(2).sum()) for k in avg) ** 0.5
             for s in states]
    return sum(dists) / len(dists) / norm


TRAIN = ["--steps", "12", "--batch", "12", "--lr", "0.1", "--decay-samples", "50"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """One process on the global batch of 12."""
    out = tmp_path_factory.mktemp("single")
    assert spawn(out, 1, *TRAIN) == {0: 0}
    stats, states = results(out, 1)
    assert stats[0]["backend"] == "single"
    assert stats[0]["global_samples"] == 12 * 12
    return states[0]["final"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("backend", "learners", "extra"), [
    # Uneven local step counts: agree_min makes every learner run the smallest (12).
    ("ssgd", 3, ["--steps", "14,12,13", "--agree-steps"]),
    ("hadpsgd", 4, ["--per-node", "4"]),  # one node: hadpsgd is SSGD
])
def test_synchronous_equals_one_process_on_global_batch(
        tmp_path: Path, reference: dict[str, torch.Tensor], backend: str, learners: int,
        extra: list[str]) -> None:
    codes = spawn(tmp_path, learners, "--backend", backend, *TRAIN, *extra)
    assert codes == dict.fromkeys(range(learners), 0), list(tmp_path.glob("error*"))
    stats, states = results(tmp_path, learners)
    for s, st in zip(stats, states, strict=True):
        assert s["global_samples"] == 12 * 12  # the LR schedule saw the global progress
        for k, v in reference.items():
            assert torch.allclose(st["final"][k], v, atol=1e-5), (s["rank"], k)
            assert not torch.equal(st["final"][k], st["initial"][k])  # it trained
    consensus = torch.load(tmp_path / "consensus.pt")
    for k, v in reference.items():
        assert torch.allclose(consensus[k], v, atol=1e-5)


ZERO_LR = ["--lr", "0", "--no-sync-init", "--batch", "8", "--sleep", "0.005", "--jitter", "0.01",
           "--timeout", "30"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("learners", "topology", "extra"), [
    (2, "ring", []),
    (3, "random_ring", []),
    (4, "exponential", ["--delay-by-one"]),
    (5, "ring", []),
    (8, "random_ring", ["--delay-by-one"]),
])
def test_adpsgd_zero_lr_keeps_mean_and_reaches_consensus(
        tmp_path: Path, learners: int, topology: str, extra: list[str]) -> None:
    # Uneven step counts and random per-step delays: learners are out of step all the time.
    steps = ",".join(str(25 + 3 * r) for r in range(learners))
    codes = spawn(tmp_path, learners, "--backend", "adpsgd", "--topology", topology,
                  "--steps", steps, "--idle", "0.02", *ZERO_LR, *extra)
    assert codes == dict.fromkeys(range(learners), 0), list(tmp_path.glob("error*"))
    stats, states = results(tmp_path, learners)
    initial = [s["initial"] for s in states]
    final = [s["final"] for s in states]
    before, after = mean_state(initial), mean_state(final)
    for k in before:
        assert torch.allclose(before[k], after[k], atol=1e-5), k
    start = relative_distance(initial)
    assert start > 0.3
    assert relative_distance(final) < 1e-3 * start
    assert stats[0]["final_distance"] < 1e-3 * start
    total = sum(s["samples"] for s in stats)
    for s in stats:
        assert s["exchanges"] > 0
        # Read after a consensus: its drain shares every learner's own count, so each learner
        # knows the exact total (the gossiped counters alone miss steps after the last exchange).
        assert s["global_samples"] == total
    consensus = torch.load(tmp_path / "consensus.pt")
    for k in before:
        assert torch.allclose(consensus[k].double(), before[k], atol=1e-5)


@pytest.mark.timeout(120)
def test_a_learner_without_a_step_keeps_its_partners_gossiping(tmp_path: Path) -> None:
    """A learner whose share of the epoch is empty (a claimed epoch can leave one with nothing)
    reaches the epoch's end (the consensus's drain_gossip) at once: it keeps answering its
    partners' rounds at the idle pace until every learner is there, so the others' averaging
    goes on while they step. Held at once (before 608544b), every round that paired it waited
    for the end of the others' steps, and on the fixed ring of 4 that stalls them all at their
    first round."""
    codes = spawn(tmp_path, 4, "--backend", "adpsgd", "--topology", "ring",
                  "--steps", "0,30,30,30", "--sleep", "0.01", "--idle", "0.02")
    assert codes == dict.fromkeys(range(4), 0), list(tmp_path.glob("error*"))
    stats, _ = results(tmp_path, 4)
    assert stats[0]["steps"] == 0 and stats[0]["exchanges"] > 0
    # every stepping learner kept gossiping during its 30 steps (a round a step when the
    # thread keeps up, the idle pace otherwise), not one round and a wait
    assert min(s["rounds"] for s in stats[1:]) >= 8, [s["rounds"] for s in stats]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["adpsgd", "hadpsgd"])
def test_the_drain_reports_the_barriers_own_time_not_the_wait_for_a_slow_learner(
        tmp_path: Path, backend: str) -> None:
    """The epoch summary's gossip_hold_s is the least wait in the drain's barrier: the last
    learner to arrive waits only for the barrier itself, the others for it too (learner 3 takes
    4x as long a step: the others wait ~1.8 s). Every learner reports the same hold and the
    same round limit, reached by every member."""
    codes = spawn(tmp_path, 4, "--backend", backend, "--per-node", "2", "--steps", "30",
                  "--sleep", "0.02", "--slow", "3:4", "--idle", "0.02")
    assert codes == dict.fromkeys(range(4), 0), list(tmp_path.glob("error*"))
    stats, _ = results(tmp_path, 4)
    drains = [s["drain"] for s in stats]
    assert set(drains[0]) == {"gossip_hold_s", "gossip_rounds", "gossip_drain_s"}
    assert len({(d["gossip_hold_s"], d["gossip_rounds"]) for d in drains}) == 1, drains
    # not the fast learners' wait (~1.8 s: how much longer the slow learner's steps took)
    waited = max(x["elapsed"] for x in stats) - min(x["elapsed"] for x in stats)
    assert 0 <= drains[0]["gossip_hold_s"] < 0.5 * waited, (drains, waited)
    assert drains[0]["gossip_rounds"] >= 1 and all(d["gossip_drain_s"] >= 0 for d in drains)
    members = stats if backend == "adpsgd" else stats[::2]  # hadpsgd: the node leaders
    assert all(s["rounds"] >= drains[0]["gossip_rounds"] for s in members)


@pytest.mark.timeout(120)
def test_adpsgd_learns(tmp_path: Path) -> None:
    codes = spawn(tmp_path, 3, "--backend", "adpsgd", "--steps", "40", "--batch", "36",
                  "--lr", "0.1", "--decay-samples", "1e9", "--start-samples", "5000")
    assert codes == {0: 0, 1: 0, 2: 0}, list(tmp_path.glob("error*"))
    x, y = synthetic.make_data(256, 8, 0)
    model = synthetic.make_model(8, 16, 0)
    start = float(torch.nn.functional.mse_loss(model(x), y).detach())
    model.load_state_dict(torch.load(tmp_path / "consensus.pt"))
    end = float(torch.nn.functional.mse_loss(model(x), y).detach())
    assert end < 0.7 * start
    stats, _ = results(tmp_path, 3)
    # Read after the final consensus, whose drain makes the counters exact: every learner knows
    # all learners' samples (5000 of them came from the resumed run's checkpoint).
    total = sum(s["samples"] for s in stats)
    assert all(s["global_samples"] == 5000 + total for s in stats)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("learners", "per_node"), [(3, 1), (4, 2)])
def test_hadpsgd_gossips_between_nodes(tmp_path: Path, learners: int, per_node: int) -> None:
    codes = spawn(tmp_path, learners, "--backend", "hadpsgd", "--per-node", str(per_node),
                  "--steps", "30", "--idle", "0.02", *ZERO_LR)
    assert codes == dict.fromkeys(range(learners), 0), list(tmp_path.glob("error*"))
    stats, states = results(tmp_path, learners)
    leaders = [s for s in stats if s["rank"] % per_node == 0]
    assert all(s["exchanges"] > 0 for s in leaders)  # the AD-PSGD exchange ran
    assert all(s["exchanges"] == 0 for s in stats if s["rank"] % per_node)
    for node in range(learners // per_node):
        first = states[node * per_node]
        for r in range(node * per_node + 1, (node + 1) * per_node):
            # Replicas of a node start from the leader and stay bit-identical.
            for k in first["final"]:
                assert torch.equal(first["initial"][k], states[r]["initial"][k])
                assert torch.equal(first["final"][k], states[r]["final"][k])
    initial = [s["initial"] for s in states]
    final = [s["final"] for s in states]
    before, after = mean_state(initial), mean_state(final)
    for k in before:
        assert torch.allclose(before[k], after[k], atol=1e-5), k
    assert relative_distance(final) < 1e-3 * relative_distance(initial)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["ssgd", "adpsgd"])
def test_dead_learner_stops_the_others_naming_it(tmp_path: Path, backend: str) -> None:
    start = time.monotonic()
    codes = spawn(tmp_path, 4, "--backend", backend, "--steps", "400", "--sleep", "0.01",
                  "--die-rank", "2", "--die-step", "5", "--timeout", "20", timeout=120)
    assert codes[2] == 3
    assert all(codes[r] == 1 for r in (0, 1, 3)), codes
    for r in (0, 1, 3):
        message = (tmp_path / f"error{r}.txt").read_text()
        assert "AsrtrainError" in message and "rank 2 stopped" in message, message
    assert time.monotonic() - start < 100


@pytest.mark.timeout(120)
def test_learners_start_clean_after_the_parent_used_cuda(tmp_path: Path) -> None:
    """A learner must not be a fork of a process that used CUDA (on a GPU machine such a child
    fails: "Unable to handle autograd's threading in combination with fork-based
    multiprocessing"). Asking CUDA anything marks this process the way CUDA use does; the
    learners, forked from a fork server that never touched CUDA, must not inherit the mark."""
    torch.cuda.is_available()  # initialises the CUDA driver: from now on a fork here is bad
    pid = os.fork()
    if pid == 0:  # the control: a plain fork of this process is marked
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 3:
        pytest.skip("this torch build does not mark forks after CUDA use (no CUDA support)")
    codes = spawn(tmp_path, 2, "--backend", "adpsgd", "--steps", "3")
    assert codes == {0: 0, 1: 0}, list(tmp_path.glob("error*"))
    stats, _ = results(tmp_path, 2)
    assert [s["cuda_bad_fork"] for s in stats] == [False, False]


def test_a_learner_records_its_first_error_whole_when_two_threads_fail_at_once(
        tmp_path: Path) -> None:
    """The training loop and the gossip thread may fail together: torchrun's agent reads one
    JSON record (two writers of one file once left one record with the end of the other's
    after it, and the agent died on the JSON). A process of its own: what it recorded is kept
    for the process's life."""
    import subprocess
    import sys

    error_file = tmp_path / "error.json"
    code = ("import threading\n"
            "from asrtrain import AsrtrainError\n"
            "from asrtrain.distributed.liveness import record_error\n"
            "record_error(AsrtrainError('rank 0: the first failure'))\n"
            "go = threading.Barrier(8)\n"
            "def fail(k):\n"
            "    go.wait()\n"
            "    record_error(AsrtrainError('rank 0: a later failure ' + 'x' * (50 * k)))\n"
            "ts = [threading.Thread(target=fail, args=(k,)) for k in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ,
                                            "TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(error_file.read_text())["message"] == "rank 0: the first failure"
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]   # no temporary left
