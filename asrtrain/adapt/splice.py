"""Frame splicing, as Kaldi's ``splice-feats --left-context=L --right-context=R``."""

from __future__ import annotations

import torch

from asrtrain import AsrtrainError


def splice_frames(x: torch.Tensor, left: int = 3, right: int = 3) -> torch.Tensor:
    """``[T, D]`` -> ``[T, D * (left + 1 + right)]``: frame ``t`` followed by its neighbours
    ``t-left .. t+right`` in order, the first and last frames repeated at the edges (Kaldi's
    ``SpliceFrames``), so LDA sees the same spliced vectors as Kaldi's ``tri3``."""
    if x.dim() != 2:
        raise AsrtrainError(f"splice: features must be [frames, dim], got shape {tuple(x.shape)}")
    if left < 0 or right < 0:
        raise AsrtrainError(f"splice: contexts must be >= 0, got left={left} right={right}")
    t = x.shape[0]
    if t == 0:
        return x.new_zeros(0, x.shape[1] * (left + 1 + right))
    idx = torch.arange(-left, right + 1, device=x.device)[None, :] + torch.arange(
        t, device=x.device)[:, None]
    return x[idx.clamp(0, t - 1)].reshape(t, -1)
