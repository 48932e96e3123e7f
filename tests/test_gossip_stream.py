"""Gossip's copies through the stream object (asrtrain/distributed/streams.py) with real gloo
learner processes (bench/synthetic.py, forked from its fork server): on the CPU the null stream
gives, bit for bit, what the gossip thread computed before it had streams; on a GPU (tests marked
cuda) the side-stream path gives the same round and keeps AD-PSGD's invariants.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import synthetic  # bench/synthetic.py (conftest puts bench/ on the path)
import torch
import torch.distributed as dist
from conftest import TEST_DEVICE

from asrtrain import AsrtrainError
from asrtrain.distributed.comm import add_flat_, flat_params
from asrtrain.distributed.learner import build_backend
from asrtrain.distributed.streams import NullStream, SideStream, streams_for
from asrtrain.distributed.topology import Schedule

SEED = 0
#: One step at zero LR; each learner waits until its thread started the round that step began,
#: and no other starts before the drain finishes it: exactly one round, between the learners'
#: different initial models.
ONE_ROUND = ["--backend", "adpsgd", "--lr", "0", "--no-sync-init", "--steps", "1",
             "--wait-rounds", "1", "--idle", "30", "--seed", str(SEED), "--timeout", "60"]


def run(out: Path, learners: int, *args: str) -> tuple[list[dict], list[dict]]:
    torch.set_num_threads(1)
    codes = synthetic.run_local(out, learners, args, timeout=90)
    assert codes == dict.fromkeys(range(learners), 0), [
        p.read_text() for p in out.glob("error*")]
    stats = [json.loads((out / f"rank{r}.json").read_text()) for r in range(learners)]
    states = [torch.load(out / f"rank{r}.pt") for r in range(learners)]
    return stats, states


def old_round(initial: list[dict[str, torch.Tensor]], me: int,
              schedule: Schedule) -> dict[str, torch.Tensor]:
    """Round 0 of learner ``me`` as the gossip thread computed it before streams: the flat CPU
    snapshot (``flat_params``), the change summed over partners in phase order, scaled by the
    schedule's weight and added with ``add_flat_``."""
    flats = []
    for state in initial:
        model = synthetic.make_model(8, 16, 0)
        model.load_state_dict(state)
        flats.append(flat_params(list(model.parameters()), torch.float32))
    model = synthetic.make_model(8, 16, 0)
    model.load_state_dict(initial[me])
    delta = torch.zeros_like(flats[me])
    partners = [j for j in schedule.partners(me, 0) if j is not None]
    for j in partners:
        delta += flats[j] - flats[me]
    if partners:
        delta *= schedule.weight
        add_flat_(list(model.parameters()), delta)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def check_one_round(tmp_path: Path, learners: int, topology: str, extra: list[str]) -> None:
    stats, states = run(tmp_path, learners, *ONE_ROUND, "--topology", topology, *extra)
    schedule = Schedule(learners, topology, SEED)
    initial = [s["initial"] for s in states]
    for me, (s, st) in enumerate(zip(stats, states, strict=True)):
        partners = [j for j in schedule.partners(me, 0) if j is not None]
        assert s["rounds"] == 1 and s["exchanges"] == len(partners), s
        expected = old_round(initial, me, schedule)
        for k, v in expected.items():
            assert torch.equal(st["final"][k], v), (me, k)
        if partners:
            assert not all(torch.equal(st["final"][k], st["initial"][k]) for k in expected)


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("learners", "topology", "extra"), [
    (2, "ring", []),
    (3, "random_ring", []),
    (4, "exponential", ["--delay-by-one"]),
])
def test_cpu_round_equals_the_old_path_bit_for_bit(tmp_path: Path, learners: int, topology: str,
                                                   extra: list[str]) -> None:
    check_one_round(tmp_path, learners, topology, extra)


@pytest.mark.timeout(120)
def test_nccl_gossip_on_cpu_learners_is_one_error_line(tmp_path: Path) -> None:
    codes = synthetic.run_local(tmp_path, 2, ["--backend", "adpsgd", "--gossip-backend", "nccl",
                                              "--steps", "2"], timeout=90)
    assert codes == {0: 1, 1: 1}
    for r in range(2):
        message = (tmp_path / f"error{r}.txt").read_text()
        assert message.startswith("AsrtrainError: trainer.gossip_backend=nccl needs learners on "
                                  "GPUs (this one is on cpu)"), message
        assert len(message.splitlines()) == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["adpsgd", "hadpsgd"])
def test_nccl_gossip_on_cpu_fails_before_the_learner_joins(monkeypatch: pytest.MonkeyPatch,
                                                          backend: str) -> None:
    # Rank 1 of 2 with nobody at the rendezvous: the error comes at once, before joining (it
    # came after, and a learner that gave up took rank 0's store away from the other, whose
    # error was then a store timeout: stop 38's CI). Joining would fail after timeout_s with
    # another message (the wait is in C++, where the hang guard's signal cannot end it).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(AsrtrainError, match=r"^trainer.gossip_backend=nccl needs learners on "
                                                r"GPUs \(this one is on cpu\)"):
            build_backend({"backend": backend, "gossip_backend": "nccl", "cpu": True,
                           "timeout_s": 20})
    finally:
        torch.set_num_threads(threads)
    assert not dist.is_initialized()


def test_cpu_parameters_get_the_null_stream_without_touching_cuda() -> None:
    streams = streams_for([torch.zeros(3)])
    assert type(streams) is NullStream and not streams.pin_memory
    assert not torch.cuda.is_initialized()


@pytest.mark.cuda
@pytest.mark.timeout(150)
@pytest.mark.parametrize("extra", [[], ["--delay-by-one"]])
def test_gpu_round_through_the_side_stream_equals_the_old_path(
        tmp_path: Path, device: torch.device, extra: list[str]) -> None:
    # Two learners share the GPU (gloo groups): the side stream, pinned buffers and events run.
    assert type(streams_for([torch.zeros(1, device=device)])) is SideStream
    check_one_round(tmp_path, 2, "ring", ["--device", "cuda:0", *extra])


@pytest.mark.cuda
@pytest.mark.timeout(150)
def test_gpu_gossip_during_training_keeps_the_mean_and_reaches_consensus(
        tmp_path: Path, device: torch.device) -> None:
    # Zero LR: the steps (on the main stream) change nothing, gossip (on the side stream) mixes;
    # an update lost or half-copied between the two would move the mean.
    # (The settings of test_distributed's zero-LR test, on the GPU.)
    stats, states = run(tmp_path, 3, "--backend", "adpsgd", "--lr", "0", "--no-sync-init",
                        "--steps", "25,28,31", "--batch", "8", "--sleep", "0.005", "--jitter",
                        "0.01", "--idle", "0.02", "--device", "cuda:0")
    initial = [s["initial"] for s in states]
    final = [s["final"] for s in states]
    before, after = mean(initial), mean(final)
    for k in before:
        assert torch.allclose(before[k], after[k], atol=1e-5), k
    assert all(s["exchanges"] > 0 for s in stats)
    assert spread(final) < 1e-3 * spread(initial)


def mean(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([s[k].double() for s in states]).mean(0) for k in states[0]}


def spread(states: list[dict[str, torch.Tensor]]) -> float:
    """The largest distance of a learner's model from the mean model."""
    avg = mean(states)
    return max(sum(float((s[k].double() - avg[k]).pow(2).sum()) for k in avg) ** 0.5
               for s in states)


@pytest.mark.cuda
@pytest.mark.timeout(150)
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="NCCL gossip needs two GPUs: NCCL refuses two ranks on one GPU "
                           "(Duplicate GPU detected)")
@pytest.mark.parametrize("extra", [[], ["--delay-by-one"]])
def test_nccl_round_between_two_gpus_equals_the_old_path(tmp_path: Path,
                                                         extra: list[str]) -> None:
    check_one_round(tmp_path, 2, "ring", ["--device", "learner", "--gossip-backend", "nccl",
                                          *extra])
