"""Training data for CTC models: whole utterances with their unit sequences, batched by frames.

Every learner builds the same batch list for an epoch (same seed), then takes its shard: batches
``data_rank, data_rank + data_world, ...``, cut to the same count on every learner so that
synchronous backends never wait for a learner that has run out of data.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kaldiio
import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir
from asrtrain.features.transform import FeatureTransform

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


def load_transform(data: DataDir, data_dir: Path, delta_order: int,
                   norm_vars: bool) -> FeatureTransform:
    """The CMVN + deltas pipeline for ``data_dir`` (reads its per-speaker cmvn.scp)."""
    cmvn = {}
    if data.cmvn:
        try:
            cmvn = {spk: kaldiio.load_mat(spec) for spk, spec in data.cmvn.items()}
        except Exception as e:
            raise AsrtrainError(f"{data_dir}/cmvn.scp: cannot read the statistics: {e}") from e
    return FeatureTransform(cmvn, data.utt2spk, norm_vars, delta_order)


class UtteranceSet:
    """The utterances of one data dir with features (feats.scp) and unit targets."""

    def __init__(self, data_dir: str | Path, encode, delta_order: int = 0,
                 norm_vars: bool = False, subsample: int = 1, max_frames: int = 3000) -> None:
        self.data_dir = Path(data_dir)
        data = DataDir.read(self.data_dir)
        if not data.feats or not data.utt2num_frames:
            raise AsrtrainError(f"{self.data_dir}: no feats.scp/utt2num_frames "
                                "(run the features stage)")
        self.feats = data.feats
        self.transform = load_transform(data, self.data_dir, delta_order, norm_vars)
        self.items: list[tuple[str, int, list[int]]] = []
        dropped = {"too long": 0, "too short for the targets": 0}
        for utt in data.utts:
            n = data.utt2num_frames[utt]
            ids = encode(data.text[utt])
            if n > max_frames:
                dropped["too long"] += 1
            elif n // subsample < len(ids):
                dropped["too short for the targets"] += 1
            else:
                self.items.append((utt, n, ids))
        for why, k in dropped.items():
            if k:
                log.warning("%s: %d utterances dropped: %s", self.data_dir, k, why)
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
        try:
            m = kaldiio.load_mat(self.feats[utt])
        except Exception as e:
            raise AsrtrainError(f"{self.data_dir}/feats.scp: utterance {utt}: cannot read "
                                f"{self.feats[utt]}: {e}") from e
        m = self.transform(utt, m)
        return m if m.flags.writeable else m.copy()

    def batches(self, batch_frames: int, seed: int | None) -> list[list[int]]:
        """Index lists of batches holding at most ``batch_frames`` padded frames.

        Utterances are sorted by length (so padding is small), cut into batches, and the batch
        order shuffled with ``seed`` (None keeps it sorted, for evaluation).
        """
        order = sorted(range(len(self.items)), key=lambda i: self.items[i][1])
        if seed is not None:
            # Mix utterances of similar length so that batches differ between epochs.
            rng = random.Random(seed)
            order = sorted(order, key=lambda i: self.items[i][1] * (1 + 0.1 * rng.random()))
        out, cur, longest = [], [], 0
        for i in order:
            n = self.items[i][1]
            if cur and max(longest, n) * (len(cur) + 1) > batch_frames:
                out.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, n)
        if cur:
            out.append(cur)
        if seed is not None:
            random.Random(seed + 1).shuffle(out)
        return out

    def collate(self, idx: list[int]) -> Batch:
        utts = [self.items[i][0] for i in idx]
        mats = [torch.from_numpy(self.load(u)) for u in utts]
        lengths = torch.tensor([m.shape[0] for m in mats])
        feats = torch.nn.utils.rnn.pad_sequence(mats, batch_first=True)
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
