"""What is applied to stored features at load time: per-speaker CMVN and Δ/ΔΔ (as Kaldi does).

CMVN statistics use Kaldi's layout (``compute-cmvn-stats``): a ``2 × (dim + 1)`` matrix whose first
row holds the per-dimension sums and the frame count, the second the sums of squares.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


def cmvn_stats(feats: Iterable[np.ndarray]) -> np.ndarray:
    """Accumulate Kaldi CMVN statistics over the feature matrices of one speaker."""
    stats: np.ndarray | None = None
    for m in feats:
        m = np.asarray(m, dtype=np.float64)
        if stats is None:
            stats = np.zeros((2, m.shape[1] + 1), dtype=np.float64)
        stats[0, :-1] += m.sum(0)
        stats[1, :-1] += (m * m).sum(0)
        stats[0, -1] += m.shape[0]
    if stats is None:
        raise ValueError("no features to accumulate CMVN statistics over")
    return stats


def apply_cmvn(feats: np.ndarray, stats: np.ndarray, norm_vars: bool = False) -> np.ndarray:
    """Normalise ``feats`` with Kaldi CMVN ``stats`` (``apply-cmvn [--norm-vars]``)."""
    count = stats[0, -1]
    mean = stats[0, :-1] / count
    out = feats - mean
    if norm_vars:
        var = stats[1, :-1] / count - mean * mean
        out = out / np.sqrt(np.maximum(var, 1e-10))
    return out.astype(np.float32)


@functools.lru_cache(maxsize=16)
def _delta_scales(order: int, window: int) -> tuple[np.ndarray, ...]:
    # Kaldi's DeltaFeatures: each order's filter is the previous one convolved with the
    # regression window, normalised by sum(j^2); edges are handled by clamping frame indices.
    scales = [np.ones(1)]
    for _ in range(order):
        prev = scales[-1]
        cur = np.zeros(len(prev) + 2 * window)
        for j in range(-window, window + 1):
            cur[j + window: j + window + len(prev)] += j * prev
        scales.append(cur / sum(j * j for j in range(-window, window + 1)))
    for scale in scales:
        scale.flags.writeable = False  # shared by every caller (cached)
    return tuple(scales)


def add_deltas(feats: np.ndarray, order: int = 2, window: int = 2) -> np.ndarray:
    """Append Δ (and ΔΔ) exactly as Kaldi's ``add-deltas`` computes them."""
    if order == 0:
        return np.asarray(feats, dtype=np.float32)
    feats = np.asarray(feats, dtype=np.float64)
    t = feats.shape[0]
    scales = _delta_scales(order, window)[1:]
    # Edge frames repeated as far as the widest filter reaches (Kaldi clamps the index): each
    # tap is then a slice of this copy, not a gather.
    reach = (len(scales[-1]) - 1) // 2
    padded = np.concatenate([np.repeat(feats[:1], reach, 0), feats,
                             np.repeat(feats[-1:], reach, 0)]) if t else feats
    parts = [feats]
    for scale in scales:
        half = (len(scale) - 1) // 2
        out = np.zeros_like(feats)
        for k, s in enumerate(scale):
            if s != 0.0:
                start = reach + k - half
                out += s * padded[start: start + t]
        parts.append(out)
    return np.concatenate(parts, axis=1).astype(np.float32)


@dataclass
class FeatureTransform:
    """The load-time pipeline for one data dir: CMVN by speaker, then deltas."""

    cmvn: Mapping[str, np.ndarray]
    utt2spk: Mapping[str, str]
    norm_vars: bool = False
    delta_order: int = 0

    def __call__(self, utt: str, feats: np.ndarray) -> np.ndarray:
        if self.cmvn:
            feats = apply_cmvn(feats, self.cmvn[self.utt2spk[utt]], self.norm_vars)
        return add_deltas(feats, self.delta_order)

    def output_dim(self, raw_dim: int) -> int:
        return raw_dim * (self.delta_order + 1)
