"""Frame-level training data for hybrid models: fixed-length chunks with pdf-id targets.

IBM trained its BLSTM with frame cross-entropy on 21-frame chunks; one chunk is one "sample" of
the global batch. Each utterance is cut into consecutive chunks (the last one ends on the last
frame, overlapping its predecessor; an utterance shorter than a chunk is one padded chunk).
Targets come from the alignment stage: one pdf id per frame, an int32 vector per utterance.

Shuffling without holding a corpus in memory: each learner takes its share of the utterances
(shuffled with the epoch's seed), reads them in blocks of ``block_utts`` utterances, and shuffles
the chunks within a block and the blocks' remainders together (Kaldi's egs are shuffled in the
same spirit). Every learner runs the same number of steps: the minimum over the shards, which all
learners compute from ``utt2num_frames`` without reading any feature. Learners that need not keep
in step (``adpsgd``) instead claim blocks of one plan of the whole set (``plan``'s ``claim``), so a
fast learner takes more of the epoch and the epoch is still every chunk once.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.data.datadir import read_table
from asrtrain.features.ark import load_matrix
from asrtrain.features.reader import FeatureReader, chunk_starts

log = logging.getLogger(__name__)

IGNORE = -100
#: Claimed epochs (``plan``'s ``claim``): the fewest blocks each learner's share is cut into.
CLAIM_UNITS = 8


@dataclass
class ChunkBatch:
    feats: torch.Tensor      # [chunks, chunk, dim]
    lengths: torch.Tensor    # [chunks]
    targets: torch.Tensor    # [chunks, chunk], IGNORE on padding

    @property
    def samples(self) -> int:
        return int(self.feats.shape[0])

    @property
    def frames(self) -> int:
        return int(self.lengths.sum())


@dataclass
class EpochBlock:
    """One block of an epoch's plan: the utterances read for it, and the batches that are
    full once they are in (chunk numbers, [batches, batch size])."""

    utts: list[str]
    batches: np.ndarray


def read_alignments(ali_dir: str | Path) -> tuple[dict[str, str], int]:
    """The ``ali.scp`` (utterance → int32 pdf-id vector) and ``num_pdfs`` of an align dir."""
    ali_dir = Path(ali_dir)
    scp, num = ali_dir / "ali.scp", ali_dir / "num_pdfs"
    for p in (scp, num):
        if not p.is_file():
            raise AsrtrainError(f"{p}: missing; the alignment stage writes ali.scp and "
                                "num_pdfs (or import Kaldi alignments with align.source=kaldi)")
    try:
        num_pdfs = int(num.read_text().split()[0])
    except (ValueError, IndexError):
        raise AsrtrainError(f"{num}: expected the number of pdfs") from None
    return read_table(scp), num_pdfs


class ChunkSet:
    """The chunks of one data dir (feats.scp, cmvn.scp) with targets from an alignment dir;
    ``streams``: the per-frame streams appended to its features ({stream: directory},
    ``features.reader.stream_dirs``), the composed input of ``features.reader``."""

    def __init__(self, data_dir: str | Path, ali_dir: str | Path, chunk: int = 21,
                 delta_order: int = 0, norm_vars: bool = False,
                 max_missing: float = 0.05,
                 streams: Mapping[str, str | Path] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.reader = FeatureReader(self.data_dir, delta_order, norm_vars, need_num_frames=True,
                                    streams=streams)
        data = self.reader.data
        self.ali, self.num_pdfs = read_alignments(ali_dir)
        self.ali_dir = Path(ali_dir)
        self.chunk = chunk
        self.utts = [u for u in data.utts if u in self.ali]
        missing = len(data.utts) - len(self.utts)
        if missing > max_missing * len(data.utts) or not self.utts:
            raise AsrtrainError(f"{self.ali_dir}/ali.scp: {missing} of {len(data.utts)} "
                                f"utterances of {self.data_dir} have no alignment (more than "
                                f"{max_missing:.0%}); align this data dir")
        if missing:
            log.warning("%s: %d utterances without alignment are left out", self.data_dir,
                        missing)
        self.num_frames = {u: data.utt2num_frames[u] for u in self.utts}
        self.dim = self.reader.dim
        self.num_utts = len(self.utts)
        # what an epoch's plan needs of the set, per utterance only: its first chunk's number
        counts = chunk_counts(np.fromiter((self.num_frames[u] for u in self.utts),
                                          dtype=np.int64, count=self.num_utts), chunk)
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._forgotten = False

    def __len__(self) -> int:
        return int(self._first[-1])

    def forget_tables(self) -> None:
        """Drop the per-utterance tables (the data dir's, ``ali.scp``'s, the appended streams'
        ``.scp``, the utterance names and frame counts) once the chunks are resident in a chunk
        store: a learner then keeps, per utterance, only its first chunk's number (8 bytes),
        which is all :meth:`plan` and :meth:`steps` read. At ~2 KiB an utterance as Python
        objects these tables were a learner's private memory that grew with the corpus (~3 GB a
        learner at SWB-2000's 1.7M utterances); freed, part of their pages stay with the
        allocator (bench/store.py: 0.62 MiB an hour is left of 1.45). Reading the arks
        (:meth:`batches`, :meth:`cut`), :meth:`chunk_table`, :meth:`pdf_counts` and a store's
        key need them: afterwards they are one error."""
        tables = [v for v in vars(self.reader.data).values() if isinstance(v, dict)]
        tables += [self.ali, self.num_frames, self.reader.transform.cmvn]
        tables += [stream.table for stream in self.reader.streams]
        for table in tables:  # in place: the reader's transform holds utt2spk and cmvn too
            table.clear()
        self.utts = []
        self._forgotten = True

    def need_tables(self, what: str) -> None:
        if self._forgotten:
            raise AsrtrainError(f"{self.data_dir}: {what} reads the per-utterance tables, which "
                                "this learner dropped once its chunks were resident "
                                "(ChunkSet.forget_tables)")

    def load(self, utt: str) -> tuple[np.ndarray, np.ndarray]:
        self.need_tables("reading an utterance")
        feats = self.reader[utt]
        return feats, self.alignment(utt, feats.shape[0])

    def alignment(self, utt: str, num_frames: int, dtype: type = np.int64) -> np.ndarray:
        """``utt``'s pdf ids, checked against its ``num_frames`` frames of features and the
        number of pdfs; an error names ``ali.scp`` and the utterance."""
        ali = load_matrix(self.ali[utt], f"{self.ali_dir}/ali.scp: utterance {utt}").astype(dtype)
        if ali.shape != (num_frames,):
            raise AsrtrainError(f"{self.ali_dir}/ali.scp: utterance {utt} has {ali.shape[0]} "
                                f"frames of alignment for {num_frames} frames of features")
        if ali.size and (ali.min() < 0 or ali.max() >= self.num_pdfs):
            raise AsrtrainError(f"{self.ali_dir}/ali.scp: utterance {utt} has pdf ids outside "
                                f"[0, {self.num_pdfs})")
        return ali

    def cut(self, utt: str) -> list[tuple[np.ndarray, np.ndarray]]:
        feats, ali = self.load(utt)
        if feats.shape[0] != self.num_frames[utt]:
            raise AsrtrainError(f"{self.data_dir}/utt2num_frames: utterance {utt} has "
                                f"{self.num_frames[utt]} frames, its features "
                                f"{feats.shape[0]}; rerun the features stage")
        return [(feats[s: s + self.chunk], ali[s: s + self.chunk])
                for s in chunk_starts(feats.shape[0], self.chunk)]

    # ------------------------------------------------------------------ epochs and shards
    def shard(self, seed: int | None, rank: int, world: int) -> list[str]:
        """The names of the utterances of learner ``rank``'s shard (see :meth:`shard_ids`)."""
        self.need_tables("naming a shard's utterances")
        return [self.utts[k] for k in self.shard_ids(seed, rank, world).tolist()]

    def shard_ids(self, seed: int | None, rank: int, world: int) -> np.ndarray:
        """The numbers (in ``self.utts`` order) of the utterances of learner ``rank``'s shard
        this epoch: every ``world``-th of the set shuffled with ``seed`` (None: in order).

        The shuffle is ``random.Random(seed).shuffle`` of the set, as it was of the names (it
        permutes by the length only, so the order is the same), but of an ``array`` of
        utterance numbers, 4 bytes each where they fit int32 (< 2^31 utterances), not a list
        of Python objects; the whole set's permutation is made (this learner's shard depends on
        all of it) and dropped once the shard is taken, which is copied out of it."""
        return self._order(seed)[rank::world].copy()

    def _order(self, seed: int | None) -> np.ndarray:
        """The epoch's order of the utterance numbers (1.6 s for SWB-2000's 1.7M)."""
        n = self.num_utts
        wide = n >= 1 << 31
        order = array("q" if wide else "i", range(n))
        if seed is not None:
            random.Random(seed).shuffle(order)
        return np.frombuffer(order, dtype=np.int64 if wide else np.int32)

    def steps(self, seed: int | None, world: int, batch_size: int) -> int:
        """Steps every learner runs this epoch: the smallest shard's full batches (every
        shard from one shuffle of the set, not one shuffle a shard)."""
        per_utt = np.diff(self._first)[self._order(seed)]
        counts = [int(per_utt[r::world].sum()) for r in range(world)]
        steps = min(counts) // batch_size
        if steps == 0:
            raise AsrtrainError(f"{self.data_dir}: a learner's share has {min(counts)} chunks, "
                                f"less than one batch of {batch_size}: lower the batch size")
        return steps

    def chunk_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every chunk of the set, numbered utterance by utterance in ``self.utts`` order:
        (utterance index, start frame, frames) per chunk, from ``utt2num_frames``, laid out as
        :func:`chunk_starts` lays them (computed for all utterances at once: SWB-2000 has
        tens of millions of chunks).
        Made afresh at each call, not kept: it is per chunk (its dtypes the narrowest that
        hold the set: the utterance number int32 below 2^31 utterances, the start int32 below
        2^31 frames an utterance, the frames int16 for chunks below 2^15 frames); the store
        keeps what batches need of it (:mod:`asrtrain.train.resident`)."""
        return self.chunk_rows(0, self.num_utts)

    def chunk_rows(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of :meth:`chunk_table` of utterances ``lo`` to ``hi`` (numbers in
        ``self.utts`` order), chunks ``_first[lo]`` to ``_first[hi]``: a writer of the store
        makes the table a slice at a time."""
        self.need_tables("the chunk table")
        c = self.chunk
        n = np.fromiter((self.num_frames[u] for u in self.utts[lo: hi]), dtype=np.int64,
                        count=hi - lo)
        full, count = _full_and_count(n, c)
        local = np.repeat(np.arange(len(n)), count)
        k = np.arange(len(local), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        start = np.where(k < full[local], k * c, n[local] - c)
        del k
        length = np.minimum(c, n[local] - start).astype(narrowest(c, np.int16))
        utt = (local + lo).astype(narrowest(self.num_utts))
        return utt, start.astype(narrowest(int(n.max(initial=0)))), length

    def plan(self, seed: int | None, rank: int, world: int, batch_size: int,
             block_utts: int = 256, steps: int | None = None,
             claim: Callable[[int], int | None] | None = None) -> Iterator[EpochBlock]:
        """This learner's epoch as chunk numbers (see :meth:`chunk_table`), block by block.

        The one definition of an epoch's order, for the streaming and the resident loaders
        alike: the shard of :meth:`shard`, read ``block_utts`` utterances at a time; each
        block's chunks join those left over and are shuffled together (``random.shuffle``
        permutes by the list's length only, so shuffling chunk numbers orders the chunks as
        shuffling the chunks themselves did), and full batches are taken from the front.
        ``steps`` caps the batches; ``seed`` None keeps every chunk in order and ends with the
        partial batch (evaluation).

        ``claim`` (learners that do not keep in step): the plan of the whole set (``rank`` 0 of
        ``world`` 1, ending with its partial batch, in blocks of at most 1/``CLAIM_UNITS`` of a
        learner's share of the utterances) is the epoch's one order, and this learner
        takes the blocks whose numbers ``claim(number of blocks)`` hands it until it returns
        None (:class:`asrtrain.distributed.claims.EpochClaims`: a counter all learners share).
        Such a block's ``utts`` are those its batches' chunks come from (some left over from an
        earlier block), so the block can be read by itself.
        """
        if claim is not None:
            # at least CLAIM_UNITS blocks a learner: a small set's few blocks of ``block_utts``
            # would leave learners with none (1,448 utterances in blocks of 256: 6 for 8)
            small = -(-self.num_utts // (CLAIM_UNITS * max(world, 1)))
            yield from self._claimed(seed, batch_size, max(1, min(block_utts, small)), claim)
            return
        rng = random.Random(None if seed is None else seed * 7919 + rank)
        first = self._first
        pending = array("q")  # the chunk numbers read and not yet batched: int64, no objects
        made = 0
        ids = self.shard_ids(seed, rank, world)
        for i in range(0, len(ids), block_utts):
            block = ids[i: i + block_utts].tolist()
            for k in block:
                pending.extend(range(first[k], first[k + 1]))
            if seed is not None:
                rng.shuffle(pending)  # the permutation of a list of the same length
            n = len(pending) // batch_size
            if steps is not None:
                n = min(n, steps - made)
            cut = n * batch_size
            yield EpochBlock([self.utts[k] for k in block] if not self._forgotten else [],
                             np.frombuffer(pending[:cut], dtype=np.int64).reshape(n, batch_size))
            pending = pending[cut:]
            made += n
            if steps is not None and made >= steps:
                return
        if pending and steps is None:
            yield EpochBlock([], np.frombuffer(pending, dtype=np.int64)[None])

    def _claimed(self, seed: int | None, batch_size: int, block_utts: int,
                 claim: Callable[[int], int | None]) -> Iterator[EpochBlock]:
        blocks = [b.batches for b in self.plan(seed, 0, 1, batch_size, block_utts)]
        while (k := claim(len(blocks))) is not None:
            # the utterance of each chunk: the last whose first chunk is at or before it
            needed = np.unique(np.searchsorted(self._first, blocks[k].ravel(), "right") - 1)
            names = [] if self._forgotten else [self.utts[i] for i in needed.tolist()]
            yield EpochBlock(names, blocks[k])

    def _first_chunk(self) -> np.ndarray:
        """Number of each utterance's first chunk, and the number of chunks at the end."""
        return self._first

    def batches(self, seed: int | None, rank: int, world: int, batch_size: int,
                block_utts: int = 256, steps: int | None = None,
                claim: Callable[[int], int | None] | None = None) -> Iterator[ChunkBatch]:
        """This learner's batches for one epoch, streamed from the arks block by block
        (``seed`` None: in order, every chunk); the order is :meth:`plan`'s."""
        self.need_tables("the streaming loader")
        first, index = self._first.tolist(), {u: i for i, u in enumerate(self.utts)}
        held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for block in self.plan(seed, rank, world, batch_size, block_utts, steps, claim):
            if claim is not None:  # a claimed block is read whole; what it leaves is another's
                held = {}
            for u in block.utts:
                k = index[u]
                for c, piece in zip(range(first[k], first[k + 1]), self.cut(u), strict=True):
                    held[c] = piece
            for ids in block.batches:
                yield self.collate([held.pop(int(c)) for c in ids])

    def collate(self, chunks: list[tuple[np.ndarray, np.ndarray]]) -> ChunkBatch:
        b, d = len(chunks), chunks[0][0].shape[1]
        if all(f.shape[0] == self.chunk for f, _ in chunks):  # every chunk whole: one copy
            return ChunkBatch(
                torch.from_numpy(np.stack([f for f, _ in chunks]).astype(np.float32, copy=False)),
                torch.full((b,), self.chunk, dtype=torch.long),
                torch.from_numpy(np.stack([a for _, a in chunks]).astype(np.int64, copy=False)))
        feats = torch.zeros(b, self.chunk, d)
        targets = torch.full((b, self.chunk), IGNORE, dtype=torch.long)
        lengths = torch.empty(b, dtype=torch.long)
        for i, (f, a) in enumerate(chunks):
            n = f.shape[0]
            feats[i, :n] = torch.as_tensor(np.array(f, dtype=np.float32))
            targets[i, :n] = torch.from_numpy(a)
            lengths[i] = n
        return ChunkBatch(feats, lengths, targets)

    def pdf_counts(self) -> np.ndarray:
        """How often each pdf id occurs in the alignments (for the priors of decoding)."""
        self.need_tables("the pdf counts")
        counts = np.zeros(self.num_pdfs, dtype=np.int64)
        for u in self.utts:
            counts += np.bincount(load_matrix(self.ali[u], f"{self.ali_dir}/ali.scp: utterance "
                                              f"{u}").astype(np.int64),
                                  minlength=self.num_pdfs)
        return counts


def chunk_counts(num_frames: np.ndarray, chunk: int) -> np.ndarray:
    """Chunks of each utterance of ``num_frames`` frames, as :func:`chunk_starts` lays them."""
    return _full_and_count(num_frames, chunk)[1]


def _full_and_count(n: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    full = np.where(n > c, (n - c) // c + 1, 1)  # chunks starting at multiples of c
    return full, full + (full * c < n)           # and one ending on the last frame


def narrowest(largest: int, small: type = np.int32) -> type:
    """The integer dtype for values in [0, ``largest``]: ``small`` (int32, or int16 where asked)
    when it holds them, else int64."""
    return small if largest <= np.iinfo(small).max else np.int64


def log_priors(counts: np.ndarray) -> np.ndarray:
    """Log prior of each pdf from alignment counts, add-one smoothed (no -inf for unseen pdfs)."""
    p = (counts + 1.0) / (counts.sum() + len(counts))
    return np.log(p).astype(np.float32)


def prefetch(it: Iterator, depth: int = 4) -> Iterator:
    """Run ``it`` in a background thread so reading arks overlaps with training."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def work() -> None:
        try:
            for item in it:
                q.put(item)
            q.put(done)
        except BaseException as e:  # handed to the consumer, who raises it
            q.put(e)

    threading.Thread(target=work, daemon=True, name="chunk-prefetch").start()
    while True:
        item = q.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
