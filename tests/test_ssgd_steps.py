"""ssgd's learners take the same number of steps in every epoch, not only the first: a learner
with one step more than the others waits in a gradient allreduce that nobody else joins."""

import random

import pytest

from asrtrain import AsrtrainError
from asrtrain.features.reader import length_batches
from asrtrain.train.data import shard


def _lengths(seed: int, n: int) -> list[int]:
    """Utterance lengths in frames spread as the tiny recipe's (100 to 1,500 frames)."""
    rng = random.Random(seed)
    return [rng.randint(100, 1500) for _ in range(n)]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_learner_has_the_same_steps_in_every_epoch(world: int) -> None:
    lengths = _lengths(world, 174)
    for epoch in range(1, 7):
        # as CTCTask.epoch: the epoch's order from seed + epoch, then each learner's shard
        batches = length_batches(lengths, 1500, 1 + epoch)
        shards = [shard(batches, r, world) for r in range(world)]
        steps = {len(s) for s in shards}
        assert steps == {len(batches) // world}, (epoch, steps)
        taken = [tuple(b) for s in shards for b in s]
        assert len(taken) == len(set(taken))  # no batch twice
        assert set(taken) <= {tuple(b) for b in batches}
        # at most world - 1 batches of the epoch are left out
        assert len(batches) - len(taken) < world


def test_an_epoch_too_small_for_the_learners_is_one_clear_error() -> None:
    batches = length_batches([1400, 1400, 1400], 1500, 2)
    with pytest.raises(AsrtrainError, match="3 batches cannot feed 4 learners"):
        shard(batches, 0, 4)
