"""The one reader of stored features: ``feats.scp`` → per-speaker CMVN (``cmvn.scp``) → Δ/ΔΔ.

Training (``train/data.py``, ``train/chunks.py``), the GMM aligner (``align/model.py``) and both
decoders (``decode/ctc.py``, ``decode/hybrid.py``) read their inputs through
:class:`FeatureReader`, so a model sees at decoding time exactly what it saw in training (see
``docs/architecture.md``, "Data flow: features and checkpoints").  Frame stacking is the model's
(``BLSTM.stack_frames``); the fixed-length chunks of hybrid models are laid out by
:func:`chunk_starts`, shared by the chunk trainer and the hybrid decoder.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import kaldiio
import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir
from asrtrain.features.transform import FeatureTransform


class FeatureReader:
    """Transformed features of the utterances of one data dir.

    ``delta_order`` (0: none, 2: Δ and ΔΔ) and ``norm_vars`` (CMVN variance normalisation) are
    the ``features`` config group's.  ``require_cmvn``: a missing ``cmvn.scp`` is an error (else
    features are used without CMVN, as for data dirs written without it); ``need_num_frames``:
    so is a missing ``utt2num_frames`` (what batching by length needs); ``input_dim``: every
    utterance must come out with that many dimensions (a model's input); ``hint``: what to do
    when ``feats.scp`` is missing.  ``data``: the data dir already read (else read here).

    Every problem raises :class:`AsrtrainError` naming the file and the utterance or speaker.
    """

    def __init__(self, data_dir: str | Path, delta_order: int = 0, norm_vars: bool = False, *,
                 require_cmvn: bool = False, need_num_frames: bool = False,
                 input_dim: int | None = None, hint: str = "run the features stage",
                 data: DataDir | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.data = data if data is not None else DataDir.read(self.data_dir)
        self.input_dim = input_dim
        self.feats_scp = self.data_dir / "feats.scp"
        self.cmvn_scp = self.data_dir / "cmvn.scp"
        if not self.data.feats:
            raise AsrtrainError(f"{self.feats_scp}: missing; {hint}")
        if need_num_frames and not self.data.utt2num_frames:
            raise AsrtrainError(f"{self.data_dir / 'utt2num_frames'}: missing; {hint}")
        missing = [u for u in self.data.utts if u not in self.data.feats]
        if missing:
            raise AsrtrainError(f"{self.feats_scp}: no features for {len(missing)} utterances, "
                                f"e.g. {missing[0]}; {hint}")
        if require_cmvn and not self.data.cmvn:
            raise AsrtrainError(f"{self.cmvn_scp}: missing; {hint}")
        self.transform = FeatureTransform(self._read_cmvn(), self.data.utt2spk, norm_vars,
                                          delta_order)
        self._dim: int | None = None

    def _read_cmvn(self) -> dict[str, np.ndarray]:
        stats = {}
        for spk, spec in self.data.cmvn.items():
            try:
                stats[spk] = np.asarray(kaldiio.load_mat(spec))
            except Exception as e:
                raise AsrtrainError(f"{self.cmvn_scp}: speaker {spk}: cannot read the statistics "
                                    f"{spec}: {e}") from e
            if stats[spk].ndim != 2 or stats[spk].shape[0] != 2:
                raise AsrtrainError(f"{self.cmvn_scp}: speaker {spk}: statistics of shape "
                                    f"{stats[spk].shape}, expected [2, dim + 1]")
        if stats:
            for utt in self.data.utts:
                if self.data.utt2spk[utt] not in stats:
                    raise AsrtrainError(f"{self.cmvn_scp}: no stats for speaker "
                                        f"{self.data.utt2spk[utt]} (utterance {utt})")
        return stats

    @property
    def utts(self) -> list[str]:
        """The data dir's utterances, in its (sorted) order."""
        return self.data.utts

    @property
    def num_frames(self) -> dict[str, int]:
        """Frames per utterance from ``utt2num_frames`` (no feature is read)."""
        return self.data.utt2num_frames

    @property
    def dim(self) -> int:
        """Dimensions of the transformed features (from the first utterance's raw features)."""
        if self._dim is None:
            self._dim = self.transform.output_dim(self.raw(self.utts[0]).shape[1])
        return self._dim

    def raw(self, utt: str) -> np.ndarray:
        """The stored features of ``utt``, as ``feats.scp`` points at them."""
        spec = self.data.feats.get(utt)
        if spec is None:
            raise AsrtrainError(f"{self.feats_scp}: no features for utterance {utt}")
        try:
            return kaldiio.load_mat(spec)
        except Exception as e:
            raise AsrtrainError(f"{self.feats_scp}: utterance {utt}: cannot read {spec}: "
                                f"{e}") from e

    def __getitem__(self, utt: str) -> np.ndarray:
        """``utt``'s features after CMVN and deltas: float32 [frames, dim], writeable."""
        m = self.raw(utt)
        if m.ndim != 2:
            raise AsrtrainError(f"{self.feats_scp}: utterance {utt}: a {m.ndim}-dim array, "
                                "expected a matrix [frames, dim]")
        stats = self.transform.cmvn.get(self.data.utt2spk[utt]) if self.transform.cmvn else None
        if stats is not None and stats.shape[1] != m.shape[1] + 1:
            raise AsrtrainError(f"{self.cmvn_scp}: speaker {self.data.utt2spk[utt]} has "
                                f"{stats.shape[1] - 1}-dim statistics, but utterance {utt} has "
                                f"{m.shape[1]}-dim features in {self.feats_scp}; rerun the "
                                "features stage")
        out = np.asarray(self.transform(utt, m), dtype=np.float32)
        if self.input_dim is not None and out.shape[1] != self.input_dim:
            raise AsrtrainError(f"{self.feats_scp}: utterance {utt} has {out.shape[1]}-dim "
                                f"features after the transform, the model takes "
                                f"{self.input_dim}; use the model's feature config")
        return out if out.flags.writeable else out.copy()

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        """(utterance, transformed features) in the data dir's order."""
        for utt in self.utts:
            yield utt, self[utt]

    def batch(self, utts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``utts``' features zero padded to [batch, frames, dim], and their lengths."""
        mats = [torch.from_numpy(self[u]) for u in utts]
        lengths = torch.tensor([m.shape[0] for m in mats])
        return torch.nn.utils.rnn.pad_sequence(mats, batch_first=True), lengths


def length_batches(lengths: Sequence[int], batch_frames: int,
                   seed: int | None = None) -> list[list[int]]:
    """Index lists of batches holding at most ``batch_frames`` padded frames.

    Items are sorted by length (so padding is small), cut into batches, and the batch order
    shuffled with ``seed`` (None keeps it sorted, for evaluation and decoding).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if seed is not None:
        # Mix items of similar length so that batches differ between epochs.
        rng = random.Random(seed)
        order = sorted(order, key=lambda i: lengths[i] * (1 + 0.1 * rng.random()))
    out, cur, longest = [], [], 0
    for i in order:
        n = lengths[i]
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


def chunk_starts(num_frames: int, chunk: int) -> list[int]:
    """Start frames of an utterance's chunks: consecutive, the last one ending on the last frame."""
    if num_frames <= chunk:
        return [0]
    starts = list(range(0, num_frames - chunk + 1, chunk))
    if starts[-1] + chunk < num_frames:
        starts.append(num_frames - chunk)
    return starts
