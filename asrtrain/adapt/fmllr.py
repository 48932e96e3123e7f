"""fMLLR (constrained MLLR) per speaker, as Kaldi's ``gmm-est-fmllr --fmllr-update-type=full``.

The transform ``W = [A b]`` maps a frame ``x`` to ``A x + b``. With ``xi = [x; 1]``, Kaldi's
``FmllrDiagGmmAccs`` statistics are ``beta = sum gamma``, ``K = sum gamma (mu / var) xi^T`` and,
per dimension ``i``, ``G_i = sum gamma / var_i xi xi^T``; the auxiliary function is
``beta log|det A| + tr(W K^T) - 1/2 sum_i w_i G_i w_i^T``. ``ComputeFmllrMatrixDiagGmmFull``
maximises it row by row: with ``p`` the row's cofactors (extended by 0),
``w_i = (alpha p + k_i) G_i^-1`` where ``alpha`` solves ``e2 alpha^2 + e1 alpha - beta = 0``
(``e2 = p G_i^-1 p^T``, ``e1 = p G_i^-1 k_i^T``), the root of higher auxiliary function.
Every speaker is estimated at once: the rows are sequential, the speakers a batch dimension.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.adapt.mllt import checked_inverse
from asrtrain.adapt.posteriors import FrameGaussians

log = logging.getLogger(__name__)


@dataclass
class FmllrStats:
    beta: torch.Tensor   # [S]
    K: torch.Tensor      # [S, D, D+1]
    G: torch.Tensor      # [S, D, D+1, D+1]

    @classmethod
    def zeros(cls, num_speakers: int, dim: int, device: torch.device | str = "cpu"
              ) -> FmllrStats:
        z = dict(dtype=torch.float64, device=device)
        return cls(torch.zeros(num_speakers, **z), torch.zeros(num_speakers, dim, dim + 1, **z),
                   torch.zeros(num_speakers, dim, dim + 1, dim + 1, **z))

    @property
    def dim(self) -> int:
        return self.K.shape[1]

    def accumulate(self, x: torch.Tensor, gauss: FrameGaussians, speaker: int | torch.Tensor
                   ) -> None:
        """Add frames ``x`` ``[N, D]`` (features as the model sees them before this speaker's
        transform) with their Gaussians' posteriors, for ``speaker`` (one index, or ``[N]``)."""
        d = self.dim
        if x.dim() != 2 or x.shape[1] != d:
            raise AsrtrainError(f"gmm-est-fmllr: frames of shape {tuple(x.shape)}, stats are "
                                f"{d}-dim")
        x = x.to(self.K)
        spk = torch.as_tensor(speaker, device=x.device).expand(x.shape[0]) \
            if not torch.is_tensor(speaker) or speaker.dim() == 0 else speaker.to(x.device)
        if len(spk) and (int(spk.min()) < 0 or int(spk.max()) >= self.beta.shape[0]):
            raise AsrtrainError(f"gmm-est-fmllr: speaker index {int(spk.max())} out of range "
                                f"(stats for {self.beta.shape[0]} speakers)")
        post = gauss.post.to(x)
        inv = 1.0 / gauss.vars.to(x)
        xi = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)             # [N, D+1]
        mean_term = (post[:, :, None] * gauss.means.to(x) * inv).sum(1)     # [N, D]
        prec_term = (post[:, :, None] * inv).sum(1)                         # [N, D]
        # G_i is symmetric: its upper triangle from the frames' xi xi^T products, then mirrored
        # (half the products and the memory of the full [N, D, D+1] outer products)
        up, lo = torch.triu_indices(d + 1, d + 1, device=x.device)
        for s in torch.unique(spk).tolist():
            sel = spk == s
            xs = xi[sel]
            self.beta[s] += post[sel].sum()
            self.K[s] += mean_term[sel].T @ xs
            pairs = torch.index_select(xs, 1, up) * torch.index_select(xs, 1, lo)
            tri = prec_term[sel].T @ pairs                                  # [D, (D+1)(D+2)/2]
            g = torch.empty_like(self.G[s])
            g[:, up, lo] = tri
            g[:, lo, up] = tri
            self.G[s] += g

    def add(self, other: FmllrStats) -> None:
        self.beta += other.beta
        self.K += other.K
        self.G += other.G


@dataclass
class FmllrResult:
    transforms: torch.Tensor                 # [S, D, D+1]
    objective: list[torch.Tensor] = field(default_factory=list)  # [S] per frame, per iteration
    improvement: torch.Tensor | None = None  # [S] per frame, over the identity
    fallback: list[int] = field(default_factory=list)  # speakers left at the identity


def identity_transforms(num_speakers: int, dim: int, device: torch.device | str = "cpu"
                        ) -> torch.Tensor:
    w = torch.zeros(num_speakers, dim, dim + 1, dtype=torch.float64, device=device)
    w[:, :, :dim] = torch.eye(dim, dtype=torch.float64, device=device)
    return w


def fmllr_objective(w: torch.Tensor, stats: FmllrStats) -> torch.Tensor:
    """``[S]`` auxiliary function per frame: ``(beta log|det A| + tr(W K^T)
    - 1/2 sum_i w_i G_i w_i^T) / beta`` (Kaldi's ``FmllrAuxFuncDiagGmm`` less constants)."""
    d = stats.dim
    logdet = torch.linalg.slogdet(w[:, :, :d])[1]
    lin = (w * stats.K).sum((1, 2))
    quad = torch.einsum("sij,sijk,sik->s", w, stats.G, w)
    return (stats.beta * logdet + lin - 0.5 * quad) / stats.beta.clamp(min=1e-10)


def estimate_fmllr(stats: FmllrStats, num_iters: int = 40, min_count: float = 500.0,
                   speakers: list[str] | None = None) -> FmllrResult:
    """Every speaker's transform (Kaldi's ``FmllrOptions``: ``--fmllr-num-iters=40``,
    ``--fmllr-min-count=500``); speakers with no more count keep the identity (logged)."""
    s, d = stats.beta.shape[0], stats.dim
    names = speakers or [str(i) for i in range(s)]
    if len(names) != s:
        raise AsrtrainError(f"gmm-est-fmllr: {len(names)} speaker names for stats of {s}")
    ok = stats.beta > min_count
    res = FmllrResult(identity_transforms(s, d, stats.K.device))
    res.fallback = torch.nonzero(~ok).flatten().tolist()
    for i in res.fallback:
        log.warning("gmm-est-fmllr: speaker %s has count %.1f <= min-count %g; identity "
                    "transform", names[i], float(stats.beta[i]), min_count)
    if not bool(ok.any()):
        res.improvement = torch.zeros(s, dtype=torch.float64)
        return res
    sub = FmllrStats(stats.beta[ok], stats.K[ok], stats.G[ok])
    ginv = _inverse_g(sub.G, [n for n, k in zip(names, ok.tolist(), strict=True) if k])
    w = res.transforms[ok].clone()
    start = fmllr_objective(w, sub)
    objective = [start]
    # the row sweeps in numpy on the host: ~20 small products a row, where torch's per-call
    # cost was 3x numpy's on a CPU (and a GPU would only launch kernels)
    w_np = w.cpu().numpy()
    k_np, beta_np = sub.K.cpu().numpy(), sub.beta.cpu().numpy()
    ginv_np = ginv.cpu().numpy()
    for _ in range(num_iters):
        # A^-1, exact at each iteration's start and kept by rank-one updates row to row
        a_inv = np.linalg.inv(w_np[:, :, :d])
        for i in range(d):
            _update_row(w_np, i, k_np, beta_np, ginv_np[:, i], a_inv)
        objective.append(fmllr_objective(torch.from_numpy(w_np).to(w.device), sub))
    res.transforms[ok] = torch.from_numpy(w_np).to(w.device)
    res.objective = [_scatter(o, ok) for o in objective]
    res.improvement = res.objective[-1] - res.objective[0]
    for j in torch.nonzero(ok).flatten().tolist():
        log.info("gmm-est-fmllr: speaker %s: objf improvement %.4f per frame over %.1f frames",
                 names[j], float(res.improvement[j]), float(stats.beta[j]), extra=STAGE_LOG_ONLY)
    return res


def _update_row(w: np.ndarray, i: int, k_all: np.ndarray, beta: np.ndarray, ginv: np.ndarray,
                a_inv: np.ndarray) -> None:
    """Row ``i`` of every speaker's ``W`` (``[S, D, D+1]``) to its optimum given the other rows
    (in place), and ``a_inv`` (``A^-1``, ``[S, D, D]``) to the new ``A``'s inverse (in place):
    the row changes ``A`` by ``e_i delta^T``, so Sherman-Morrison updates it in ``O(D^2)``
    instead of Kaldi's inversion of ``A`` at every row (``O(D^3)``). ``k_all``: ``K``,
    ``ginv``: every speaker's ``G_i^-1``, ``[S, D+1, D+1]``."""
    d = w.shape[1]
    cof = a_inv[:, :, i].copy()                                  # row i of A^-T, [S, D]
    p = np.zeros((len(w), 1, d + 1))
    p[:, 0, :d] = cof
    k = k_all[:, i:i + 1]                                        # [S, 1, D+1]
    gp = ginv @ p.transpose(0, 2, 1)                             # [S, D+1, 1]
    e2 = (p @ gp)[:, 0, 0]
    e1 = (k @ gp)[:, 0, 0]
    disc = np.sqrt(e1 * e1 + 4 * e2 * beta)
    roots = np.stack([(-e1 - disc) / (2 * e2), (-e1 + disc) / (2 * e2)])      # [2, S]
    auxf = beta * np.log(np.abs(roots * e2 + e1)) - 0.5 * roots ** 2 * e2
    alpha = np.where(auxf[0] > auxf[1], roots[0], roots[1])
    row = (alpha[:, None, None] * p + k) @ ginv                  # [S, 1, D+1]
    delta = row[:, :, :d] - w[:, i:i + 1, :d]                    # [S, 1, D]
    w[:, i] = row[:, 0]
    v = delta @ a_inv                                            # delta^T A^-1, [S, 1, D]
    a_inv -= (cof / (1.0 + v[:, 0, i:i + 1]))[:, :, None] * v


def _inverse_g(g: torch.Tensor, names: list[str]) -> torch.Tensor:
    """``G_i^-1`` of every speaker and row, or an error naming the speakers whose are singular."""
    inv, singular = checked_inverse(g)
    bad_spk = torch.nonzero(singular.any(1)).flatten().tolist()
    if bad_spk:
        raise AsrtrainError(f"gmm-est-fmllr: singular statistics for {len(bad_spk)} "
                            f"speaker(s): {', '.join(names[j] for j in bad_spk[:5])} (a "
                            "constant feature dimension, or frames that span no affine space)")
    return inv


def _scatter(values: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(ok.shape[0], dtype=values.dtype, device=values.device)
    out[ok] = values
    return out


def compose_affine(outer: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
    """``compose-transforms --b-is-affine=true``: ``[S, D, D+1]`` transforms that apply
    ``inner`` then ``outer`` (``train_sat.sh`` estimates on transformed features, then
    composes the new transform with the old)."""
    d = inner.shape[-2]
    a = outer[..., :d] @ inner
    a[..., d] += outer[..., d]
    return a
