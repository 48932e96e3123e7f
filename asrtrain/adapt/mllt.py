"""MLLT (a.k.a. global STC), as Kaldi's ``gmm-acc-mllt`` / ``est-mllt`` (``MlltAccs``).

A square transform ``A`` of the features is chosen to maximise the likelihood of the diagonal
GMMs, ``beta log|det A| - 1/2 sum_i a_i G_i a_i^T`` with ``G_i = sum gamma / var_i (x-mu)(x-mu)^T``
(Gales 1999, eq. 4): each row in turn gets its closed-form optimum given the others,
``a_i = c_i G_i^-1 sqrt(beta / (c_i G_i^-1 c_i^T))`` with ``c_i`` the row's cofactors. As in
``train_lda_mllt.sh``, the statistics are taken in the current feature space, the update starts
from the identity, and the result is composed with the previous matrix (:func:`compose`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from asrtrain import AsrtrainError
from asrtrain.adapt.posteriors import FrameGaussians

log = logging.getLogger(__name__)


@dataclass
class MlltStats:
    beta: float
    G: torch.Tensor   # [D, D, D]: G[i] for feature dimension i

    @classmethod
    def zeros(cls, dim: int, device: torch.device | str = "cpu") -> MlltStats:
        return cls(0.0, torch.zeros(dim, dim, dim, dtype=torch.float64, device=device))

    @property
    def dim(self) -> int:
        return self.G.shape[0]

    def accumulate(self, x: torch.Tensor, gauss: FrameGaussians, max_batch_mb: float = 256.0
                   ) -> None:
        """Add frames ``x`` ``[N, D]`` with their Gaussians' posteriors (``gmm-acc-mllt``)."""
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise AsrtrainError(f"gmm-acc-mllt: frames of shape {tuple(x.shape)}, stats are "
                                f"{self.dim}-dim")
        d = self.dim
        diff = (x.to(self.G)[:, None, :] - gauss.means.to(self.G)).reshape(-1, d)   # [K, D]
        post = gauss.post.to(self.G).reshape(-1)
        keep = post > 0
        inv_var = (1.0 / gauss.vars.to(self.G)).reshape(-1, d)[keep]
        diff, post = diff[keep], post[keep]
        block = max(1, int(max_batch_mb * 2 ** 20 // (d * d * 8)))
        if gauss.ids is None:       # every (frame, Gaussian) pair: K * D^3
            w = post[:, None] * inv_var
            for i in range(0, len(diff), block):
                self._add_pairs(diff[i:i + block], w[i:i + block])
            self.beta += float(gauss.post.sum())
            return
        # per Gaussian scatter first, then G_i += sum_g S_g / var_gi: K * D^2 + Gauss * D^3
        uniq, which = torch.unique(gauss.ids.reshape(-1)[keep.to(gauss.ids.device)].to(
            diff.device), return_inverse=True)
        first = torch.full((len(uniq),), len(which), dtype=torch.long, device=diff.device)
        first.scatter_reduce_(0, which, torch.arange(len(which), device=diff.device), "amin")
        scatter = diff.new_zeros(len(uniq), d * d)
        for i in range(0, len(diff), block):
            db, pb = diff[i:i + block], post[i:i + block, None, None]
            scatter.index_add_(0, which[i:i + block],
                               (pb * db[:, :, None] * db[:, None, :]).reshape(len(db), d * d))
        self.G.view(d, d * d).addmm_(inv_var[first].T, scatter)
        self.beta += float(gauss.post.sum())

    def _add_pairs(self, diff: torch.Tensor, w: torch.Tensor) -> None:
        """``G_i += sum_k w_ki diff_k diff_k^T`` for a block of pairs."""
        d = self.dim
        self.G.view(d * d, d).addmm_((w[:, :, None] * diff[:, None, :]).reshape(len(diff),
                                                                                d * d).T, diff)

    def add(self, other: MlltStats) -> None:
        self.beta += other.beta
        self.G += other.G


@dataclass
class MlltResult:
    matrix: torch.Tensor                          # [D, D]
    objective: list[float] = field(default_factory=list)   # per frame, after each iteration
    improvement: float = 0.0                      # per frame, over the identity


def mllt_objective(a: torch.Tensor, stats: MlltStats) -> float:
    """``(beta log|det A| - 1/2 sum_i a_i G_i a_i^T) / beta`` (constants dropped)."""
    quad = torch.einsum("ij,ijk,ik->", a, stats.G, a)
    return float(stats.beta * torch.linalg.slogdet(a)[1] - 0.5 * quad) / stats.beta


def estimate_mllt(stats: MlltStats, num_iters: int = 200, tol: float = 1e-8) -> MlltResult:
    """``est-mllt``: the row-by-row update from the identity, ``num_iters`` sweeps over the rows
    (Kaldi's ``MlltAccs::Update``: 200) or until a sweep gains less than ``tol`` per frame.
    Statistics are exact (``gmm-acc-mllt``'s ``--rand-prune`` is not applied)."""
    d = stats.dim
    if stats.beta < 10 * d:
        if stats.beta <= d:
            raise AsrtrainError(f"est-mllt: {stats.beta:.1f} frames of count for {d}-dim "
                                f"features; need more than {d}")
        log.warning("est-mllt: very little count (%.1f) for %d dims", stats.beta, d)
    ginv = _inverse_stats(stats.G, "est-mllt")
    a = torch.eye(d, dtype=torch.float64, device=stats.G.device)
    start = mllt_objective(a, stats)
    res = MlltResult(a)
    for _ in range(num_iters):
        for i in range(d):
            c = torch.linalg.inv(a)[:, i]          # row i of A^-T: the cofactors / det(A)
            gc = ginv[i] @ c
            a[i] = gc * math.sqrt(stats.beta / float(c @ gc))
        res.objective.append(mllt_objective(a, stats))
        if len(res.objective) > 1 and res.objective[-1] - res.objective[-2] < tol:
            break
    res.improvement = res.objective[-1] - start
    return res


def checked_inverse(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverses of a batch of square matrices ``g`` [..., n, n], and which of them are
    singular (a failed inversion, or a condition number past 1e14) [...]: the callers name them."""
    inv, info = torch.linalg.inv_ex(g)
    cond = torch.linalg.cond(g)
    return inv, (info != 0) | ~torch.isfinite(cond) | (cond > 1e14)


def _inverse_stats(g: torch.Tensor, what: str) -> torch.Tensor:
    """``G_i^-1`` for every ``i``, or an error naming the dimensions whose ``G_i`` is singular."""
    inv, singular = checked_inverse(g)
    bad = torch.nonzero(singular).flatten().tolist()
    if bad:
        raise AsrtrainError(f"{what}: the statistics G_i of {len(bad)} of {g.shape[0]} "
                            f"dimensions are singular (first: {bad[:5]}); too few frames or a "
                            "constant feature dimension")
    return inv


def compose(outer: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    """``compose-transforms``: apply ``inner`` then ``outer``. ``inner`` may be affine
    (``[A b]``, e.g. LDA with offset, fMLLR); ``outer`` square or affine."""
    d = inner.shape[0]
    lin = outer[:, :d]
    out = lin @ inner
    if outer.shape[1] == d + 1:
        if inner.shape[1] == inner.shape[0]:
            out = torch.cat([out, outer[:, d:]], dim=1)
        else:
            out[:, -1] += outer[:, d]
    return out


def transform_means(means: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``gmm-transform-means``: the GMMs' means ``[..., D]`` in the new feature space
    (variances are re-estimated by the next iteration, as in ``train_lda_mllt.sh``)."""
    return means @ matrix.to(means).T
