"""LDA on spliced frames, as Kaldi's ``acc-lda`` (statistics per class = pdf) and ``est-lda``.

``est-lda`` makes the within-class covariance ``W`` the identity and then diagonalises the
between-class covariance ``B``: with ``W = C C^T`` (Cholesky), the eigenvectors ``U`` of
``C^-1 B C^-T`` sorted by decreasing eigenvalue give ``lda = U[:, :dim]^T C^-1``, so the
projected features have unit within-class covariance and decorrelated, sorted class means.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from asrtrain import AsrtrainError

log = logging.getLogger(__name__)


@dataclass
class LdaStats:
    """Kaldi's ``LdaEstimate`` accumulators: per-class count and sum, total second moment."""

    count: torch.Tensor     # [C]
    sums: torch.Tensor      # [C, D]
    scatter: torch.Tensor   # [D, D] sum of x x^T over all frames

    @classmethod
    def zeros(cls, num_classes: int, dim: int, device: torch.device | str = "cpu") -> LdaStats:
        z = dict(dtype=torch.float64, device=device)
        return cls(torch.zeros(num_classes, **z), torch.zeros(num_classes, dim, **z),
                   torch.zeros(dim, dim, **z))

    @property
    def dim(self) -> int:
        return self.sums.shape[1]

    def accumulate(self, x: torch.Tensor, classes: torch.Tensor,
                   weight: torch.Tensor | None = None) -> None:
        """Add frames ``x`` ``[N, D]`` of classes ``[N]`` (pdf ids from an alignment, as
        ``ali-to-post | acc-lda``), optionally weighted (silence weight)."""
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise AsrtrainError(f"acc-lda: frames of shape {tuple(x.shape)}, stats are "
                                f"{self.dim}-dim")
        if classes.shape != (x.shape[0],):
            raise AsrtrainError(f"acc-lda: {x.shape[0]} frames but {classes.numel()} class ids")
        c = self.count.shape[0]
        if len(classes) and (int(classes.min()) < 0 or int(classes.max()) >= c):
            raise AsrtrainError(f"acc-lda: class id {int(classes.max())} out of range "
                                f"(0..{c - 1})")
        x = x.to(self.sums)
        w = torch.ones(len(x), dtype=x.dtype, device=x.device) if weight is None \
            else weight.to(x)
        classes = classes.to(x.device)
        self.count.index_add_(0, classes, w)
        self.sums.index_add_(0, classes, x * w[:, None])
        self.scatter.addmm_((x * w[:, None]).T, x)

    def add(self, other: LdaStats) -> None:
        """Sum another job's statistics into these (Kaldi ``sum-lda-accs``)."""
        self.count += other.count
        self.sums += other.sums
        self.scatter += other.scatter


@dataclass
class LdaResult:
    matrix: torch.Tensor        # [dim, D], or [dim, D + 1] with the offset column
    eigenvalues: torch.Tensor   # [D] of W^-1/2 B W^-1/2, sorted decreasing
    within: torch.Tensor        # [D, D] within-class covariance
    between: torch.Tensor       # [D, D] between-class covariance


def scatter_matrices(stats: LdaStats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(total mean, within-class covariance, between-class covariance)``, all normalised by
    the total count (Kaldi's ``LdaEstimate::GetStats``)."""
    n = float(stats.count.sum())
    d = stats.dim
    if n <= d:
        raise AsrtrainError(f"est-lda: {n:.0f} frames for {d}-dim features; need more than "
                            f"{d} frames (and many more in practice)")
    mean = stats.sums.sum(0) / n
    total = stats.scatter / n - torch.outer(mean, mean)
    seen = stats.count > 0
    class_means = stats.sums[seen] / stats.count[seen, None]
    between = (class_means.T * (stats.count[seen] / n)) @ class_means - torch.outer(mean, mean)
    return mean, total - between, between


def estimate_lda(stats: LdaStats, dim: int = 40, remove_offset: bool = False) -> LdaResult:
    """The LDA matrix of ``est-lda --dim=dim`` (``--remove-offset`` adds a last column so that
    the projected global mean is zero)."""
    if not 0 < dim <= stats.dim:
        raise AsrtrainError(f"est-lda: dim {dim} must be in 1..{stats.dim} (the spliced dim)")
    mean, within, between = scatter_matrices(stats)
    classes = int((stats.count > 0).sum())
    if classes - 1 < dim:
        log.warning("est-lda: %d classes give a between-class rank of at most %d < dim %d; "
                    "the last directions are noise", classes, classes - 1, dim)
    ev = torch.linalg.eigvalsh(within)
    tiny = int((ev <= 1e-10 * ev.max().abs()).sum())
    if tiny:
        raise AsrtrainError(
            f"est-lda: the within-class covariance is singular ({tiny} of {stats.dim} "
            f"eigenvalues <= 0 or tiny, smallest {float(ev.min()):.3g}); constant or "
            "duplicated feature dimensions, or fewer frames than dimensions per class?")
    chol = torch.linalg.cholesky(within)
    inv_chol = torch.linalg.solve_triangular(
        chol, torch.eye(stats.dim, dtype=chol.dtype, device=chol.device), upper=False)
    proj_between = inv_chol @ between @ inv_chol.T
    evals, evecs = torch.linalg.eigh((proj_between + proj_between.T) / 2)
    order = torch.argsort(evals, descending=True)
    evals, evecs = evals[order], evecs[:, order]
    matrix = evecs[:, :dim].T @ inv_chol
    if remove_offset:
        matrix = torch.cat([matrix, -(matrix @ mean)[:, None]], dim=1)
    return LdaResult(matrix, evals, within, between)


def apply_transform(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``transform-feats``: ``x A^T``, or ``x A^T + b`` when ``matrix`` is ``[A b]``."""
    d = x.shape[1]
    if matrix.shape[1] == d:
        return x.to(matrix) @ matrix.T
    if matrix.shape[1] == d + 1:
        return x.to(matrix) @ matrix[:, :d].T + matrix[:, d]
    raise AsrtrainError(f"transform-feats: a {tuple(matrix.shape)} matrix cannot apply to "
                        f"{d}-dim features")
