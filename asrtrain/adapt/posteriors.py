"""Gaussian posteriors of aligned frames, the input of the MLLT and fMLLR accumulators."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from asrtrain import AsrtrainError

if TYPE_CHECKING:   # asrtrain.align builds on asrtrain.adapt: no import at run time (a cycle)
    from asrtrain.align.gmm import DiagGmmSet

LOG_2PI = math.log(2 * math.pi)


@dataclass
class FrameGaussians:
    """Per frame, the Gaussians of its pdf and their posteriors (``M`` = most components of a
    pdf; absent components have posterior 0 and variance 1)."""

    post: torch.Tensor    # [N, M] posterior (times the frame's weight)
    means: torch.Tensor   # [N, M, D]
    vars: torch.Tensor    # [N, M, D]
    ids: torch.Tensor | None = None   # [N, M] global component ids (pdf * M + slot), if known


def component_posteriors(gmm: DiagGmmSet, x: torch.Tensor, pdf: torch.Tensor,
                         weight: torch.Tensor | None = None) -> FrameGaussians:
    """The components of each frame's aligned pdf and their posteriors given the frame, scaled
    by ``weight`` (e.g. silence weighting), as Kaldi's accumulators do inside ``AccumulateForGmm``
    (``gmm-acc-mllt``, ``gmm-est-fmllr`` from ``ali-to-post``)."""
    if x.dim() != 2 or x.shape[1] != gmm.dim:
        raise AsrtrainError(f"posteriors: features of shape {tuple(x.shape)} do not match the "
                            f"GMM's dim {gmm.dim}")
    if pdf.shape != (x.shape[0],):
        raise AsrtrainError(f"posteriors: {x.shape[0]} frames but {pdf.numel()} pdf ids")
    if len(pdf) and (int(pdf.min()) < 0 or int(pdf.max()) >= gmm.num_pdfs):
        raise AsrtrainError(f"posteriors: pdf id {int(pdf.max())} out of range "
                            f"(the GMM has {gmm.num_pdfs} pdfs)")
    x = x.to(gmm.means)
    m = _slots_used(gmm)   # mixing up pads every pdf to the largest count ever reached
    var = gmm.vars[pdf, :m]
    means = gmm.means[pdf, :m]
    diff = x[:, None, :] - means
    ll = gmm.log_weights[pdf, :m] - 0.5 * (gmm.dim * LOG_2PI + var.log().sum(-1)
                                           + (diff * diff / var).sum(-1))
    post = torch.softmax(ll, dim=-1).nan_to_num(0.0)
    if weight is not None:
        post = post * weight.to(post)[:, None]
    ids = pdf[:, None] * gmm.means.shape[1] + torch.arange(m, device=pdf.device)
    return FrameGaussians(post, means, var, ids)


def _slots_used(gmm: DiagGmmSet) -> int:
    """Component slots up to the last live one of any pdf (slots past it are never read)."""
    live = torch.isfinite(gmm.log_weights)
    slot = torch.arange(1, live.shape[1] + 1, device=live.device)
    return max(int((live * slot).amax()), 1) if live.numel() else 1
