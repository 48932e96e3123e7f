"""Epochs by global progress (issue 23): learners that do not keep in step claim the units of one
epoch order from a shared counter, so a slow learner takes less of the epoch, and the epoch is
still the whole set once. Behaviour only: no test here asserts a time."""

from __future__ import annotations

import math
import re
import threading
import time
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import straggler  # bench/straggler.py (conftest puts bench/ on the path)
import torch
from conftest import copy_exp
from test_chunks import _tagged

from asrtrain.distributed.claims import EpochClaims
from asrtrain.train.chunks import ChunkSet
from asrtrain.train.resident import ResidentChunks
from asrtrain.train.tasks import claimed

REPO = Path(__file__).resolve().parents[1]


class DictStore:
    """The store operations claims use, in memory (what torchrun's TCPStore does, one process)."""

    def __init__(self) -> None:
        self.values: dict[str, int | str] = {}

    def add(self, key: str, n: int) -> int:
        self.values[key] = int(self.values.get(key, 0)) + n
        return int(self.values[key])

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return str(self.values[key]).encode()


def _interleave(iters: list, pace: list[int]) -> list[list]:
    """Pull from each iterator ``pace[i]`` items per round until all end (learners of unequal
    speed sharing one counter): what each one got."""
    got: list[list] = [[] for _ in iters]
    live = set(range(len(iters)))
    while live:
        for i in sorted(live):
            for _ in range(pace[i]):
                try:
                    got[i].append(next(iters[i]))
                except StopIteration:
                    live.discard(i)
                    break
    return got


@pytest.mark.parametrize("loader", ["stream", "resident"])
def test_claimed_blocks_cover_the_epoch_once_and_the_fast_learner_takes_more(
        tmp_path: Path, loader: str) -> None:
    lengths = [30, 47, 63, 64, 12, 100, 80, 90, 21, 5, 44, 70, 33, 58]
    data, ali = _tagged(tmp_path, lengths)
    cs = ChunkSet(data, ali, chunk=21)
    source = cs if loader == "stream" else ResidentChunks(cs, "cpu")
    store = DictStore()
    iters = [iter(source.batches(5, r, 2, 4, block_utts=2, claim=EpochClaims(store, 1)))
             for r in range(2)]
    fast, slow = _interleave(iters, [3, 1])
    seen = []
    for batch in fast + slow:
        for f, n in zip(batch.feats, batch.lengths, strict=True):
            n = int(n)
            # each chunk's rows say (frame, utterance): the chunk, by its utterance and start
            seen.append((int(f[0, 1]), int(f[0, 0]), n))
    # the whole set's plan once: every chunk, none twice, the last partial batch included
    assert len(seen) == len(set(seen)) == len(cs)
    assert sum(b.samples for b in fast) > 2 * sum(b.samples for b in slow)
    # the same chunks as the plan of the whole set, in the same batches
    whole = [tuple(sorted(b)) for blk in cs.plan(5, 0, 1, 4, 2) for b in blk.batches.tolist()]
    assert len(whole) == len(fast) + len(slow)


def test_lockstep_shards_are_unchanged_by_claims(tmp_path: Path) -> None:
    """ssgd's batches for a seed: the shards of before, whatever the claim path added."""
    data, ali = _tagged(tmp_path, [30, 47, 63, 64, 12, 100, 80, 90, 21])
    cs = ChunkSet(data, ali, chunk=21)
    steps = cs.steps(7, 2, 2)
    for r in range(2):
        plan = [b.batches for b in cs.plan(7, r, 2, 2, 2, steps)]
        again = [b.batches for b in cs.plan(7, r, 2, 2, 2, steps, None)]
        assert all(np.array_equal(a, b) for a, b in zip(plan, again, strict=True))
        assert sum(len(b) for b in plan) == steps


def test_ctc_batches_claimed_once_and_nodes_claim_together() -> None:
    units = [[i] for i in range(11)]
    store = DictStore()
    a, b = claimed(units, EpochClaims(store, 3)), claimed(units, EpochClaims(store, 3))
    fast, slow = _interleave([a, b], [2, 1])
    assert sorted(fast + slow) == units and len(fast) > len(slow)
    # a lockstep node of two: consecutive units, its members take one each; a claim that is
    # not whole ends the node's epoch for both (at most members - 1 units left out)
    store = DictStore()
    leader, member = EpochClaims(store, 1, 2, 0, 0), EpochClaims(store, 1, 2, 1, 0)
    other = EpochClaims(store, 1, 2, 0, 1)
    got = []
    for claims in (leader, member, other, other, leader, member, leader, member):
        got.append(claims(7))
    # node 0: units 0, 1; node 1: 2 (and 3), 4 (and 5); then 6 alone is not a whole claim
    assert got == [0, 1, 2, 4, None, None, None, None]



@pytest.mark.timeout(120)
def test_a_claim_on_a_store_that_went_away_names_the_lost_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The store lives in node 0's launcher: when it dies with its node, a learner of node 1
    whose next claim fails says that node 0 is lost (the backends pass Comm.guarded), not the
    store's "Connection was likely closed"."""
    from datetime import timedelta

    import torch.distributed as dist

    from asrtrain import AsrtrainError
    from asrtrain.distributed.comm import Comm
    from asrtrain.distributed.liveness import Liveness

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
                       "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)  # learner 2 of 4, on node 1 of 2
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    comm = Comm(2, 4, 0, 2, torch.device("cpu"), 5.0, Liveness(2, 4))
    store = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                          timeout=timedelta(seconds=5), wait_for_workers=False)
    claims = EpochClaims(store, 1, guard=comm.guarded)
    assert claims(10) == 0
    del server  # node 0's launcher, and its store, are gone
    with pytest.raises(AsrtrainError) as failed:
        claims(10)
    message = str(failed.value)
    assert message.startswith("rank 2: the claim of the epoch's next unit failed: node 0 is "
                              "lost: the rendezvous store"), message


COMMON = ["model.layers=1", "model.cells=48", "model.bottleneck=32", "trainer.log_every=5",
          "trainer.batch_frames=1500", "nj=2"]


@pytest.fixture(scope="module")
def exp(tiny_tri1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny recipe up to its features: a copy of conftest's tiny_tri1 (its GMM passes
    unused here), found done up to features."""
    exp = copy_exp(tiny_tri1, tmp_path_factory.mktemp("tiny") / "exp")
    prep = forked_cli.run("run", "recipes/tiny",
                          f"exp_dir={exp}", "--to", "features", *COMMON, timeout=300)
    assert prep.returncode == 0 and "nothing to do" in prep.stderr, prep.stderr[-3000:]
    return exp


def _train(exp: Path, *extra: str) -> forked_cli.Started:
    """The training stage started warm, not waited for (bench/forked_cli.py: a process of its
    own), stderr with stdout."""
    return forked_cli.popen("run", "recipes/tiny", f"exp_dir={exp}", "--stage", "train", "--to",
                            "train", *COMMON, "trainer.epochs=2", "trainer.backend=adpsgd",
                            "trainer.learners=2", *extra, merge=True)


def _metrics(run_dir: Path, epoch: int) -> dict:
    return torch.load(run_dir / f"epoch-{epoch}.pt", map_location="cpu",
                      weights_only=False)["metrics"]


@pytest.mark.timeout(600)
def test_a_slowed_adpsgd_learner_takes_less_of_each_epoch(exp: Path) -> None:
    """The real trainer, two adpsgd learners, learner 1 stopped 75% of every 200 ms from outside
    (SIGSTOP/SIGCONT): learner 0 trains more of each epoch, and each epoch is the training set
    once between them."""
    proc = _train(exp)
    stop = threading.Event()
    pid = straggler.learner_pid(proc.pid, 1)
    assert pid is not None
    slower = threading.Thread(target=straggler.slow_down, args=(pid, 4, stop), daemon=True)
    slower.start()
    try:
        out, _ = proc.communicate(timeout=500)
    finally:
        stop.set()
        slower.join()
    assert proc.returncode == 0, out[-3000:]
    utts = int(re.search(r"(\d+) training utterances", out).group(1))
    for epoch in (1, 2):
        m = _metrics(exp / "train" / "blstm_tiny", epoch)
        fast, slow = m["samples_learner_0"], m["samples_learner_1"]
        assert fast + slow == utts          # the whole set, once
        assert fast > slow                  # the fast learner took more of it
        assert m["global_samples"] == epoch * utts
        # measured at the epoch's end; 0 when the two learners' last exchange came after both
        # last steps (the waiting learner answers its partner until the drain: ci34, once)
        assert math.isfinite(m["consensus_distance"]) and m["consensus_distance"] >= 0


@pytest.mark.timeout(600)
def test_adpsgd_killed_resumes_at_its_epoch_and_the_epoch_is_still_the_set_once(
        exp: Path) -> None:
    """kill -9 of the run after its first epoch's checkpoint: the rerun resumes there, and its
    second epoch is again the whole set once (which learner took which batch may differ)."""
    run_dir = exp / "train" / "killed"
    proc = _train(exp, "model.name=killed", "trainer.epochs=3")
    deadline = time.monotonic() + 400
    while not (run_dir / "epoch-1.pt").is_file() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.kill()  # the launcher; its learners die with it (PR_SET_PDEATHSIG)
    proc.communicate()
    assert not (run_dir / "final.pt").exists()
    again = _train(exp, "model.name=killed", "trainer.epochs=3")
    out, _ = again.communicate(timeout=500)
    assert again.returncode == 0, out[-3000:]
    assert "resuming after epoch 1" in out + (exp / "log" / "train.log").read_text()
    utts = int(re.search(r"(\d+) training utterances", out).group(1))
    for epoch in (2, 3):
        m = _metrics(run_dir, epoch)
        assert m["samples_learner_0"] + m["samples_learner_1"] == utts
        assert m["global_samples"] == epoch * utts
