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
        self._table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.chunk_table()[0])

    def load(self, utt: str) -> tuple[np.ndarray, np.ndarray]:
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
        utts = list(self.utts)
        if seed is not None:
            random.Random(seed).shuffle(utts)
        return utts[rank::world]

    def steps(self, seed: int | None, world: int, batch_size: int) -> int:
        """Steps every learner runs this epoch: the smallest shard's full batches."""
        first = self._first_chunk()
        index = self._index()
        counts = [sum(first[index[u] + 1] - first[index[u]] for u in self.shard(seed, r, world))
                  for r in range(world)]
        steps = min(counts) // batch_size
        if steps == 0:
            raise AsrtrainError(f"{self.data_dir}: a learner's share has {min(counts)} chunks, "
                                f"less than one batch of {batch_size}: lower the batch size")
        return steps

    def chunk_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every chunk of the set, numbered utterance by utterance in ``self.utts`` order:
        (utterance index, start frame, frames) per chunk, from ``utt2num_frames``, laid out as
        :func:`chunk_starts` lays them (computed for all utterances at once: SWB-2000 has
        tens of millions of chunks)."""
        if self._table is None:
            c = self.chunk
            n = np.asarray([self.num_frames[u] for u in self.utts], dtype=np.int64)
            full = np.where(n > c, (n - c) // c + 1, 1)  # chunks starting at multiples of c
            count = full + (full * c < n)                # and one ending on the last frame
            utt = np.repeat(np.arange(len(n)), count)
            k = np.arange(len(utt)) - np.repeat(np.cumsum(count) - count, count)
            start = np.where(k < full[utt], k * c, n[utt] - c)
            self._table = (utt, start, np.minimum(c, n[utt] - start))
        return self._table

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
        ``world`` 1, ending with its partial batch) is the epoch's one order, and this learner
        takes the blocks whose numbers ``claim(number of blocks)`` hands it until it returns
        None (:class:`asrtrain.distributed.claims.EpochClaims`: a counter all learners share).
        Such a block's ``utts`` are those its batches' chunks come from (some left over from an
        earlier block), so the block can be read by itself.
        """
        if claim is not None:
            yield from self._claimed(seed, batch_size, block_utts, claim)
            return
        rng = random.Random(None if seed is None else seed * 7919 + rank)
        first, index = self._first_chunk(), self._index()
        pending: list[int] = []
        made = 0
        utts = self.shard(seed, rank, world)
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
            yield EpochBlock(block, np.asarray(pending[:cut], dtype=np.int64).reshape(
                n, batch_size))
            pending = pending[cut:]
            made += n
            if steps is not None and made >= steps:
                return
        if pending and steps is None:
            yield EpochBlock([], np.asarray(pending, dtype=np.int64)[None])

    def _claimed(self, seed: int | None, batch_size: int, block_utts: int,
                 claim: Callable[[int], int | None]) -> Iterator[EpochBlock]:
        blocks = [b.batches for b in self.plan(seed, 0, 1, batch_size, block_utts)]
        utt_of = self.chunk_table()[0]
        while (k := claim(len(blocks))) is not None:
            needed = np.unique(utt_of[blocks[k].ravel()]).tolist()
            yield EpochBlock([self.utts[i] for i in needed], blocks[k])

    def _first_chunk(self) -> list[int]:
        """Number of each utterance's first chunk, and the number of chunks at the end."""
        utt = self.chunk_table()[0]
        return np.searchsorted(utt, np.arange(len(self.utts) + 1)).tolist()

    def _index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.utts)}

    def batches(self, seed: int | None, rank: int, world: int, batch_size: int,
                block_utts: int = 256, steps: int | None = None,
                claim: Callable[[int], int | None] | None = None) -> Iterator[ChunkBatch]:
        """This learner's batches for one epoch, streamed from the arks block by block
        (``seed`` None: in order, every chunk); the order is :meth:`plan`'s."""
        first, index = self._first_chunk(), self._index()
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
        counts = np.zeros(self.num_pdfs, dtype=np.int64)
        for u in self.utts:
            counts += np.bincount(load_matrix(self.ali[u], f"{self.ali_dir}/ali.scp: utterance "
                                              f"{u}").astype(np.int64),
                                  minlength=self.num_pdfs)
        return counts


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
