"""Frame-target chunks for hybrid training, on real kaldiio arks."""

from pathlib import Path

import kaldiio
import numpy as np
import pytest

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir
from asrtrain.train.chunks import IGNORE, ChunkSet, chunk_starts, log_priors

NUM_PDFS = 100_000


@pytest.mark.parametrize("n, starts", [(5, [0]), (21, [0]), (42, [0, 21]), (50, [0, 21, 29]),
                                       (22, [0, 1])])
def test_chunk_starts_cover_every_frame(n: int, starts: list[int]) -> None:
    assert chunk_starts(n, 21) == starts
    covered = {t for s in starts for t in range(s, min(s + 21, n))}
    assert covered == set(range(n))


@pytest.mark.parametrize("chunk", [1, 4, 21])
def test_chunk_table_lays_chunks_out_as_chunk_starts(tmp_path: Path, chunk: int) -> None:
    lengths = [1, 2, 3, 4, 5, 8, 9, 20, 21, 22, 41, 42, 43, 63, 64, 100]
    cs = ChunkSet(*_tagged(tmp_path, lengths), chunk=chunk)
    utt, start, length = cs.chunk_table()
    want = [(i, s, min(chunk, cs.num_frames[u] - s)) for i, u in enumerate(cs.utts)
            for s in chunk_starts(cs.num_frames[u], chunk)]
    assert list(zip(utt.tolist(), start.tolist(), length.tolist(), strict=True)) == want
    assert len(cs) == len(want)
    parts = [cs.chunk_rows(lo, min(lo + 3, len(lengths))) for lo in range(0, len(lengths), 3)]
    for whole, part in zip((utt, start, length), zip(*parts, strict=True), strict=True):
        assert np.array_equal(whole, np.concatenate(part))


def _tagged(tmp_path: Path, lengths: list[int]) -> tuple[Path, Path]:
    """A data dir whose feature rows say (utterance, frame), and alignments that say the same."""
    data, ali = tmp_path / "data", tmp_path / "ali"
    data.mkdir()
    ali.mkdir()
    d = DataDir()
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/f.ark,{tmp_path}/f.scp") as wf, \
            kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as wa:
        for i, n in enumerate(lengths):
            utt = f"spk{i % 2}-u{i:02d}"
            t = np.arange(n)
            wf(utt, np.stack([t, np.full(n, i), np.ones(n)], 1).astype(np.float32))
            wa(utt, (i * 1000 + t).astype(np.int32))
            d.wav[utt] = "/dev/null"
            d.text[utt] = "x"
            d.utt2spk[utt] = f"spk{i % 2}"
            d.utt2num_frames[utt] = n
    for line in (tmp_path / "f.scp").read_text().splitlines():
        k, v = line.split(maxsplit=1)
        d.feats[k] = v
    d.write(data)
    (ali / "num_pdfs").write_text(f"{NUM_PDFS}\n")
    return data, ali


def test_every_chunk_target_matches_its_frames(tmp_path: Path) -> None:
    lengths = [5, 21, 30, 47, 63, 64, 12, 100]
    data, ali = _tagged(tmp_path, lengths)
    cs = ChunkSet(data, ali, chunk=21)
    assert len(cs) == sum(len(chunk_starts(n, 21)) for n in lengths)
    seen = 0
    for batch in cs.batches(seed=3, rank=0, world=1, batch_size=4, block_utts=3):
        for f, tgt, n in zip(batch.feats, batch.targets, batch.lengths, strict=True):
            n = int(n)
            expect = (f[:n, 1] * 1000 + f[:n, 0]).long()
            assert (tgt[:n] == expect).all() and (tgt[n:] == IGNORE).all()
            assert (f[n:] == 0).all()
            seen += 1
    assert seen == len(cs)  # seed with no step cap: every chunk once


def test_shards_are_disjoint_and_steps_equal(tmp_path: Path) -> None:
    data, ali = _tagged(tmp_path, [30, 47, 63, 64, 12, 100, 80, 90, 21])
    cs = ChunkSet(data, ali, chunk=21)
    shards = [set(cs.shard(7, r, 3)) for r in range(3)]
    assert set.union(*shards) == set(cs.utts) and sum(map(len, shards)) == len(cs.utts)
    steps = cs.steps(7, 3, 2)
    for r in range(3):
        assert len(list(cs.batches(7, r, 3, 2, block_utts=2, steps=steps))) == steps


def test_priors_from_counts(tmp_path: Path) -> None:
    data, ali = _tagged(tmp_path, [3, 4])
    cs = ChunkSet(data, ali, chunk=21)
    counts = cs.pdf_counts()
    assert counts.sum() == 7 and counts[0] == 1 and counts[1003] == 1
    p = np.exp(log_priors(counts))
    assert p.sum() == pytest.approx(1.0) and (p > 0).all()


def test_bad_alignments_name_file_and_utterance(tmp_path: Path) -> None:
    data, ali = _tagged(tmp_path, [30, 40])
    with kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as wa:
        wa("spk0-u00", np.zeros(30, dtype=np.int32))
        wa("spk1-u01", np.zeros(39, dtype=np.int32))
    cs = ChunkSet(data, ali, chunk=21, max_missing=0.5)
    with pytest.raises(AsrtrainError, match="spk1-u01 has 39 frames of alignment for 40"):
        list(cs.batches(None, 0, 1, 2))
    (ali / "ali.scp").write_text((ali / "ali.scp").read_text().splitlines()[0] + "\n")
    with pytest.raises(AsrtrainError, match="1 of 2 utterances .* have no alignment"):
        ChunkSet(data, ali, chunk=21)
    (ali / "num_pdfs").unlink()
    with pytest.raises(AsrtrainError, match="num_pdfs: missing"):
        ChunkSet(data, ali, chunk=21)


def _plan_before(cs: ChunkSet, seed, rank, world, batch_size, block_utts=256, steps=None):
    """ChunkSet.plan as it was before the index arrays (commit eec374d), kept verbatim but for
    the tables it read from the set: the order the plan must keep, byte for byte."""
    import random

    utt = cs.chunk_table()[0]
    first = np.searchsorted(utt, np.arange(len(cs.utts) + 1)).tolist()
    index = {u: i for i, u in enumerate(cs.utts)}
    rng = random.Random(None if seed is None else seed * 7919 + rank)
    utts = list(cs.utts)
    if seed is not None:
        random.Random(seed).shuffle(utts)
    utts = utts[rank::world]
    pending: list[int] = []
    made = 0
    for i in range(0, len(utts), block_utts):
        block = utts[i: i + block_utts]
        for u in block:
            k = index[u]
            pending.extend(range(first[k], first[k + 1]))
        if seed is not None:
            rng.shuffle(pending)
        n = len(pending) // batch_size
        if steps is not None:
            n = min(n, steps - made)
        cut = n * batch_size
        yield block, np.asarray(pending[:cut], dtype=np.int64).reshape(n, batch_size)
        pending = pending[cut:]
        made += n
        if steps is not None and made >= steps:
            return
    if pending and steps is None:
        yield [], np.asarray(pending, dtype=np.int64)[None]


def test_plan_keeps_the_order_it_had_with_lists_of_names(tmp_path: Path) -> None:
    """The plan made from arrays of utterance and chunk numbers (a learner's memory) is the one
    made from lists of names and Python ints before it: same blocks, same chunk numbers, same
    dtype, for shards, steps, blocks and evaluation order; steps are the smallest shard's."""
    lengths = [int(n) for n in np.random.default_rng(3).integers(1, 140, 61)]
    cs = ChunkSet(*_tagged(tmp_path, lengths), chunk=21)
    for seed, world, batch_size, block_utts in ((1, 1, 4, 3), (2, 2, 3, 2), (7, 3, 2, 256),
                                                (13, 4, 5, 1), (None, 2, 4, 7)):
        steps = cs.steps(seed, world, batch_size) if seed is not None else None
        for rank in range(world):
            want = list(_plan_before(cs, seed, rank, world, batch_size, block_utts, steps))
            got = list(cs.plan(seed, rank, world, batch_size, block_utts, steps))
            assert len(got) == len(want) > 0
            for (utts, batches), block in zip(want, got, strict=True):
                assert block.utts == utts
                assert block.batches.dtype == batches.dtype == np.int64
                assert np.array_equal(block.batches, batches)
            if seed is not None:
                shard_chunks = [int(cs._first[k + 1] - cs._first[k])
                                for k in cs.shard_ids(seed, rank, world)]
                assert steps <= sum(shard_chunks) // batch_size
        if seed is not None:
            assert steps == min(sum(len(cs.cut(u)) for u in cs.shard(seed, r, world))
                                for r in range(world)) // batch_size
    ids = cs.shard_ids(7, 1, 3)
    assert ids.dtype == np.int32 and [cs.utts[k] for k in ids] == cs.shard(7, 1, 3)
    utt, start, length = cs.chunk_table()
    assert (utt.dtype, start.dtype, length.dtype) == (np.int32, np.int32, np.int16)


def test_claimed_blocks_name_the_utterances_their_chunks_come_from(tmp_path: Path) -> None:
    """A learner that claims blocks of the whole set's plan gets them as they are in it, with
    the utterances its chunks come from (found from the first-chunk numbers)."""
    cs = ChunkSet(*_tagged(tmp_path, [30, 47, 63, 64, 12, 100, 80, 90, 21, 5]), chunk=21)
    utt_of = cs.chunk_table()[0]
    whole = [b.batches for b in cs.plan(3, 0, 1, 4, 2)]
    order = iter([2, 0, 1, None])
    blocks = list(cs.plan(3, 0, 1, 4, 2, claim=lambda n: next(order)))
    assert [b.batches.tolist() for b in blocks] == [whole[k].tolist() for k in (2, 0, 1)]
    for b in blocks:
        assert b.utts == [cs.utts[i] for i in np.unique(utt_of[b.batches.ravel()])]


def test_a_claimed_epoch_has_blocks_enough_for_every_learner(tmp_path: Path) -> None:
    """Claimed blocks are at most 1/CLAIM_UNITS of a learner's share of the utterances, so a
    small set's few blocks of block_utts do not leave learners with none (1,448 utterances in
    blocks of 256 were 6 units for 8 learners: two trained nothing, and their gossip partners
    stalled); every chunk is still in the epoch once."""
    from asrtrain.train.chunks import CLAIM_UNITS

    cs = ChunkSet(*_tagged(tmp_path, [40 + 7 * (i % 9) for i in range(64)]), chunk=21)
    world, counts, taken = 4, [], iter(range(10**6))

    def claim_all(n: int) -> int | None:
        counts.append(n)
        k = next(taken)
        return k if k < n else None

    blocks = list(cs.plan(5, 0, world, 4, 256, claim=claim_all))
    # 64 utterances in blocks of 2 (not 256): 32 blocks, and the plan's last partial batch
    assert counts[0] == len(blocks) == CLAIM_UNITS * world + 1
    claimed = np.sort(np.concatenate([b.batches.ravel() for b in blocks]))
    assert claimed.tolist() == list(range(cs.chunk_table()[0].size))
