"""Training data for CTC models: whole utterances with their unit sequences, batched by frames.

Every learner builds the same batch list for an epoch (same seed), then takes its shard: batches
``data_rank, data_rank + data_world, ...``, cut to the same count on every learner so that
synchronous backends never wait for a learner that has run out of data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.features.reader import FeatureReader, length_batches

log = logging.getLogger(__name__)


@dataclass
class Batch:
    utts: list[str]
    feats: torch.Tensor       # [batch, frames, dim], zero padded
    lengths: torch.Tensor     # [batch]
    targets: torch.Tensor     # concatenated unit ids
    target_lengths: torch.Tensor

    @property
    def frames(self) -> int:
        return int(self.lengths.sum())


class UtteranceSet:
    """The utterances of one data dir with features (feats.scp) and unit targets."""

    def __init__(self, data_dir: str | Path, encode, delta_order: int = 0,
                 norm_vars: bool = False, subsample: int = 1, max_frames: int = 3000) -> None:
        self.data_dir = Path(data_dir)
        self.reader = FeatureReader(self.data_dir, delta_order, norm_vars, need_num_frames=True,
                                    hint="run the features stage")
        data = self.reader.data
        self.items: list[tuple[str, int, list[int]]] = []
        too_long = f"too long (over trainer.max_utt_frames={max_frames} frames)"
        too_short = (f"too short for their targets (fewer frames after {subsample}-frame "
                     "stacking than units)")
        dropped: dict[str, list[str]] = {too_long: [], too_short: []}
        for utt in data.utts:
            n = data.utt2num_frames[utt]
            ids = encode(data.text[utt])
            if n > max_frames:
                dropped[too_long].append(utt)
            elif n // subsample < len(ids):
                dropped[too_short].append(utt)
            else:
                self.items.append((utt, n, ids))
        for why, utts in dropped.items():
            if utts:   # named, so they can be found and fixed (first few)
                log.warning("%s: %d of %d utterances dropped, %s: %s%s", self.data_dir, len(utts),
                            len(data.utts), why, " ".join(utts[:10]),
                            " ..." if len(utts) > 10 else "")
        if not self.items:
            raise AsrtrainError(f"{self.data_dir}: no usable utterances")
        first = self.load(self.items[0][0])
        self.dim = first.shape[1]

    def __len__(self) -> int:
        return len(self.items)

    @property
    def total_frames(self) -> int:
        return sum(n for _, n, _ in self.items)

    def load(self, utt: str) -> np.ndarray:
        """``utt``'s features after CMVN and deltas (see :class:`FeatureReader`)."""
        return self.reader[utt]

    def batches(self, batch_frames: int, seed: int | None) -> list[list[int]]:
        """Index lists of batches holding at most ``batch_frames`` padded frames, by length
        (:func:`length_batches`; ``seed`` None keeps them sorted, for evaluation)."""
        return length_batches([n for _, n, _ in self.items], batch_frames, seed)

    def collate(self, idx: list[int]) -> Batch:
        utts = [self.items[i][0] for i in idx]
        feats, lengths = self.reader.batch(utts)
        targets = [torch.tensor(self.items[i][2], dtype=torch.long) for i in idx]
        return Batch(utts, feats, lengths, torch.cat(targets),
                     torch.tensor([len(t) for t in targets]))


def shard(batches: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This learner's share of ``batches``; every learner gets the same number."""
    per = len(batches) // world
    if per == 0:
        raise AsrtrainError(f"{len(batches)} batches cannot feed {world} learners: use a smaller "
                            "trainer.batch_frames or fewer learners")
    return batches[rank::world][:per]


def iterate(dataset: UtteranceSet, batches: list[list[int]]) -> Iterator[Batch]:
    for idx in batches:
        yield dataset.collate(idx)
