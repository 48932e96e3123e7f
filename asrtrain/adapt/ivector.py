"""Diagonal UBM and i-vector extractor, as Kaldi's online recipe (``steps/online/nnet2``):
``train_diag_ubm.sh`` (``gmm-global-init-from-feats``, ``gmm-global-est``),
``train_ivector_extractor.sh`` (``ivector-extractor-init``, ``ivector-extractor-acc-stats``,
``ivector-extractor-est``), ``ivector-extract`` and ``ivector-extract-online2``.

The model is Kaldi's ``IvectorExtractor`` without weight projection: frame ``x`` given
component ``c`` and i-vector ``w`` is ``N(M_c w, Sigma_c)`` (full ``Sigma_c``) with prior
``w ~ N([prior_offset, 0, ...], I)``, so ``M_c[:, 0] * prior_offset`` is the component mean.
Component posteriors come from the diagonal UBM (top ``num_gselect``, pruned below
``min_post``, scaled by ``posterior_scale``) and stay fixed, so the Baum-Welch statistics of the
utterances are computed once and every EM iteration is a batched solve over utterances.
The i-vectors returned have the prior offset taken off their first dimension (as
``ivector-extract`` writes them).
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.progress import Bar

log = logging.getLogger(__name__)
LOG_2PI = math.log(2 * math.pi)


# ---------------------------------------------------------------------------- diagonal UBM
@dataclass
class DiagUbm:
    log_weights: torch.Tensor   # [C]
    means: torch.Tensor         # [C, D]
    vars: torch.Tensor          # [C, D]

    @property
    def num_gauss(self) -> int:
        return self.means.shape[0]

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    def to(self, device: torch.device | str) -> DiagUbm:
        return DiagUbm(self.log_weights.to(device), self.means.to(device), self.vars.to(device))

    def loglikes(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, C]`` log weight + log-likelihood of every component (``gmm-gselect`` scores)."""
        inv = 1.0 / self.vars
        gconst = self.log_weights - 0.5 * (self.dim * LOG_2PI + self.vars.log().sum(-1)
                                           + (self.means ** 2 * inv).sum(-1))
        x = x.to(self.means)
        return gconst + x @ (self.means * inv).T - 0.5 * (x * x) @ inv.T

    def posteriors(self, x: torch.Tensor, num_gselect: int = 5, min_post: float = 0.025,
                   scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``gmm-global-get-post --n=num_gselect --min-post=min_post | scale-post``: the
        indices ``[N, n]`` and posteriors ``[N, n]`` of each frame's best components (pruned
        ones have posterior 0; the rest renormalised to sum to ``scale``)."""
        ll = self.loglikes(x)
        top, idx = ll.topk(min(num_gselect, self.num_gauss), dim=1)
        post = torch.softmax(top, dim=1)
        post = torch.where(post >= min_post, post, torch.zeros_like(post))
        post = post / post.sum(1, keepdim=True)
        return idx, post * scale


def _check_frames(x: torch.Tensor, need: int, what: str) -> None:
    if x.dim() != 2:
        raise AsrtrainError(f"{what}: frames must be [frames, dim], got {tuple(x.shape)}")
    if x.shape[0] < need:
        raise AsrtrainError(f"{what}: {x.shape[0]} frames; need at least {need}")
    if not bool(torch.isfinite(x).all()):
        raise AsrtrainError(f"{what}: the frames hold non-finite values")


def _ubm_em_step(ubm: DiagUbm, x: torch.Tensor, block: int, min_variance: float,
                 min_gaussian_weight: float) -> tuple[DiagUbm, float]:
    """One EM iteration over ``x`` (``gmm-global-acc-stats`` + ``gmm-global-est``); components
    whose weight falls below ``min_gaussian_weight`` are removed (Kaldi's
    ``--remove-low-count-gaussians``). Returns the new UBM and the log-likelihood per frame."""
    c, d = ubm.num_gauss, ubm.dim
    occ = torch.zeros(c, dtype=torch.float64, device=x.device)
    sx = torch.zeros(c, d, dtype=torch.float64, device=x.device)
    sxx = torch.zeros(c, d, dtype=torch.float64, device=x.device)
    tot = 0.0
    for i in range(0, len(x), block):
        xb = x[i:i + block].double()
        ll = ubm.loglikes(xb)
        norm = torch.logsumexp(ll, dim=1)
        post = torch.exp(ll - norm[:, None])
        tot += float(norm.sum())
        occ += post.sum(0)
        sx += post.T @ xb
        sxx += post.T @ (xb * xb)
    keep = occ / occ.sum() >= min_gaussian_weight
    if not bool(keep.all()):
        log.info("diag UBM: removing %d of %d components with weight < %g",
                 int((~keep).sum()), c, min_gaussian_weight, extra=STAGE_LOG_ONLY)
    occ, sx, sxx = occ[keep], sx[keep], sxx[keep]
    mean = sx / occ[:, None]
    var = (sxx / occ[:, None] - mean * mean).clamp(min=min_variance)
    return DiagUbm((occ / occ.sum()).log(), mean, var), tot / len(x)


def _split_ubm(ubm: DiagUbm, target: int, perturb: float, gen: torch.Generator) -> DiagUbm:
    """``DiagGmm::Split``: split the heaviest component until ``target`` components; the two
    halves' means move apart by ``perturb`` standard deviations along a random direction."""
    lw, means, var = ubm.log_weights.clone(), ubm.means.clone(), ubm.vars.clone()
    while len(lw) < target:
        k = int(torch.argmax(lw))
        step = perturb * var[k].sqrt() * torch.randn(ubm.dim, generator=gen,
                                                     dtype=torch.float64).to(var)
        lw[k] -= math.log(2)
        lw = torch.cat([lw, lw[k:k + 1]])
        means = torch.cat([means, (means[k] + step)[None]])
        means[k] -= step
        var = torch.cat([var, var[k:k + 1]])
    return DiagUbm(lw, means, var)


def train_diag_ubm(x: torch.Tensor, num_gauss: int = 512, num_gauss_init: int = 0,
                   num_iters_init: int = 20, num_iters: int = 4, num_frames: int = 500000,
                   min_gaussian_weight: float = 1e-4, min_variance: float = 1e-3,
                   perturb: float = 0.2, seed: int = 0, block: int = 20000) -> tuple[DiagUbm,
                                                                                     list]:
    """``train_diag_ubm.sh``: initialise from ``num_frames`` random frames
    (``gmm-global-init-from-feats``: ``num_gauss_init`` components at random frames with the
    global variance, default half of ``num_gauss``, EM for ``num_iters_init`` iterations, mixing
    up in equal steps over the first half), then ``num_iters`` EM iterations on all frames.
    Returns the UBM and the log-likelihood per frame of each iteration."""
    _check_frames(x, 2 * num_gauss, "train_diag_ubm")
    gen = torch.Generator().manual_seed(seed)
    x = x.double()
    sub = x[torch.randperm(len(x), generator=gen)[:num_frames].to(x.device)]
    init = num_gauss_init or max(1, num_gauss // 2)
    pick = torch.randperm(len(sub), generator=gen)[:init].to(x.device)
    var = sub.var(0).clamp(min=min_variance)
    ubm = DiagUbm(torch.full((init,), -math.log(init), dtype=torch.float64, device=x.device),
                  sub[pick].clone(), var.expand(init, -1).clone())
    half = max(1, num_iters_init // 2)
    inc = max(1, math.ceil((num_gauss - init) / half))
    history = []
    bar = Bar(total=num_iters_init + num_iters, desc="diag UBM", unit="iter", file=sys.stderr,
               disable=None, leave=False)
    for it in range(num_iters_init + num_iters):
        data = sub if it < num_iters_init else x
        ubm, ll = _ubm_em_step(ubm, data, block, min_variance,
                               min_gaussian_weight if it >= num_iters_init else 0.0)
        history.append({"iter": it, "loglike_per_frame": ll, "num_gauss": ubm.num_gauss})
        log.info("diag UBM iter %d: %.4f per frame, %d components", it, ll, ubm.num_gauss,
                 extra=STAGE_LOG_ONLY)
        if it < half and ubm.num_gauss < num_gauss:
            ubm = _split_ubm(ubm, min(num_gauss, ubm.num_gauss + inc), perturb, gen)
        bar.update()
    bar.close()
    return ubm, history


@dataclass
class UbmAccs:
    """``gmm-global-acc-stats``: the components' occupancies ``[C]``, first and second order
    sums ``[C, D]``, and the frames' total log-likelihood; summed over jobs by :meth:`add`."""

    occ: torch.Tensor
    sx: torch.Tensor
    sxx: torch.Tensor
    loglike: float = 0.0
    frames: int = 0

    def add(self, other: UbmAccs) -> UbmAccs:
        return UbmAccs(self.occ + other.occ, self.sx + other.sx, self.sxx + other.sxx,
                       self.loglike + other.loglike, self.frames + other.frames)


def accumulate_ubm(ubm: DiagUbm, x: torch.Tensor, gselect: DiagUbm | None = None,
                   num_gselect: int = 30, block: int = 20000) -> UbmAccs:
    """``gmm-global-acc-stats --gselect``: each frame's posteriors over the ``num_gselect``
    components ``gselect`` scores best (``gmm-gselect``: train_diag_ubm.sh selects them once,
    with the initial UBM, and keeps them for every iteration), or over all when ``gselect`` is
    None; float64."""
    c, d = ubm.num_gauss, ubm.dim
    z = dict(dtype=torch.float64, device=ubm.means.device)
    acc = UbmAccs(torch.zeros(c, **z), torch.zeros(c, d, **z), torch.zeros(c, d, **z))
    for i in range(0, len(x), block):
        xb = x[i:i + block].to(**z)
        ll = ubm.loglikes(xb)
        if gselect is not None and num_gselect < c:
            sel = gselect.loglikes(xb).topk(num_gselect, dim=1).indices
            top = ll.gather(1, sel)
            norm = torch.logsumexp(top, dim=1)
            post = torch.zeros_like(ll).scatter_(1, sel, torch.exp(top - norm[:, None]))
        else:
            norm = torch.logsumexp(ll, dim=1)
            post = torch.exp(ll - norm[:, None])
        acc.loglike += float(norm.sum())
        acc.occ += post.sum(0)
        acc.sx += post.T @ xb
        acc.sxx += post.T @ (xb * xb)
    acc.frames += len(x)
    return acc


def update_ubm(ubm: DiagUbm, acc: UbmAccs, min_gaussian_weight: float = 1e-4,
               remove_low_count: bool = False, min_variance: float = 1e-3
               ) -> tuple[DiagUbm, int]:
    """``gmm-global-est``: weights, means and variances from the statistics. Components whose
    weight is under ``min_gaussian_weight`` are removed when ``remove_low_count`` (train_diag_ubm.sh
    does it at the last iteration only: the Gaussian selection indexes the initial components),
    else keep their mean and variance. Returns the UBM and how many components were removed."""
    total = float(acc.occ.sum())
    if total <= 0:
        raise AsrtrainError("diag UBM: no frames in the statistics")
    weight = acc.occ / total
    low = weight < min_gaussian_weight
    occ = acc.occ.clamp(min=1e-300)[:, None]
    mean = torch.where(low[:, None], ubm.means.to(acc.sx), acc.sx / occ)
    var = torch.where(low[:, None], ubm.vars.to(acc.sx),
                      (acc.sxx / occ - mean * mean).clamp(min=min_variance))
    removed = 0
    if remove_low_count and bool(low.any()):
        keep = ~low
        removed = int(low.sum())
        weight, mean, var = weight[keep] / weight[keep].sum(), mean[keep], var[keep]
    else:
        weight = weight.clamp(min=1e-10)
        weight = weight / weight.sum()
    return DiagUbm(weight.log(), mean, var), removed


# ---------------------------------------------------------------------------- statistics
@dataclass
class PosteriorOptions:
    """How frames' component posteriors are taken from the UBM (the online recipe's values)."""

    num_gselect: int = 5
    min_post: float = 0.025
    posterior_scale: float = 0.1


@dataclass
class UttStats:
    """Zeroth and first order Baum-Welch statistics of utterances (or speakers)."""

    gamma: torch.Tensor   # [U, C]
    X: torch.Tensor       # [U, C, D]

    def __len__(self) -> int:
        return self.gamma.shape[0]

    def sum_by(self, group: torch.Tensor, num_groups: int) -> UttStats:
        """Statistics summed per group (``group[u]`` of utterance ``u``): per-speaker
        i-vectors as ``extract_ivectors.sh`` makes them from ``spk2utt``."""
        if group.shape != (len(self),):
            raise AsrtrainError(f"i-vector stats: {group.numel()} group ids for {len(self)} "
                                "utterances")
        if len(group) and (int(group.min()) < 0 or int(group.max()) >= num_groups):
            raise AsrtrainError(f"i-vector stats: group id {int(group.max())} out of range "
                                f"(0..{num_groups - 1})")
        group = group.to(self.gamma.device)
        gamma = self.gamma.new_zeros(num_groups, self.gamma.shape[1]).index_add_(
            0, group, self.gamma)
        xs = self.X.new_zeros(num_groups, *self.X.shape[1:]).index_add_(0, group, self.X)
        return UttStats(gamma, xs)


def utterance_stats(ubm: DiagUbm, utts: list[torch.Tensor], opts: PosteriorOptions,
                    second_order: bool = False) -> tuple[UttStats, torch.Tensor | None]:
    """Each utterance's ``(gamma, X)``; with ``second_order``, also the total ``S_c = sum
    gamma x x^T`` ``[C, D, D]`` the variance update needs."""
    c, d = ubm.num_gauss, ubm.dim
    dev = ubm.means.device
    gamma = torch.zeros(len(utts), c, dtype=torch.float64, device=dev)
    xs = torch.zeros(len(utts), c, d, dtype=torch.float64, device=dev)
    s = torch.zeros(c, d * d, dtype=torch.float64, device=dev) if second_order else None
    for u, x in enumerate(utts):
        x = x.to(dev, torch.float64)
        if x.dim() != 2 or x.shape[1] != d:
            raise AsrtrainError(f"i-vector stats: utterance {u} has shape {tuple(x.shape)}; "
                                f"the UBM is {d}-dim")
        idx, post = ubm.posteriors(x, opts.num_gselect, opts.min_post, opts.posterior_scale)
        gamma[u].index_add_(0, idx.flatten(), post.flatten())
        rows = (post[:, :, None] * x[:, None, :]).reshape(-1, d)
        xs[u].index_add_(0, idx.flatten(), rows)
        if s is not None:
            outer = (x[:, :, None] * x[:, None, :]).reshape(len(x), d * d)
            for k in range(idx.shape[1]):
                s.index_add_(0, idx[:, k], post[:, k, None] * outer)
    return UttStats(gamma, xs), (s.view(c, d, d) if s is not None else None)


# ---------------------------------------------------------------------------- the extractor
@dataclass
class IvectorExtractor:
    M: torch.Tensor           # [C, D, R]
    sigma_inv: torch.Tensor   # [C, D, D]
    prior_offset: float = 100.0
    _derived: tuple | None = field(default=None, repr=False)

    @property
    def ivector_dim(self) -> int:
        return self.M.shape[2]

    @classmethod
    def init_from_ubm(cls, ubm: DiagUbm, ivector_dim: int = 100, seed: int = 0
                      ) -> IvectorExtractor:
        """``ivector-extractor-init`` on ``gmm-global-to-fgmm``: ``Sigma_c`` the UBM's
        (diagonal) variances, ``M_c`` random normal with the first column ``mean_c / 100``."""
        if ivector_dim < 2:
            raise AsrtrainError(f"ivector_dim must be >= 2, got {ivector_dim}")
        gen = torch.Generator().manual_seed(seed)
        c, d = ubm.num_gauss, ubm.dim
        m = torch.randn(c, d, ivector_dim, generator=gen, dtype=torch.float64).to(ubm.means)
        m[:, :, 0] = ubm.means / 100.0
        return cls(m, torch.diag_embed(1.0 / ubm.vars), 100.0)

    def derived(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``Sigma_c^-1 M_c`` ``[C, D, R]`` and ``M_c^T Sigma_c^-1 M_c`` ``[C, R, R]``."""
        if self._derived is None:
            sm = self.sigma_inv @ self.M
            u = self.M.transpose(1, 2) @ sm
            self._derived = (sm, (u + u.transpose(1, 2)) / 2)
        return self._derived

    def posterior(self, stats: UttStats, block: int = 256) -> tuple[torch.Tensor,
                                                                    torch.Tensor]:
        """The i-vector posteriors of each row of ``stats``: means ``[U, R]`` (with the prior
        offset in dimension 0) and covariances ``[U, R, R]`` (``GetIvectorDistribution``:
        precision ``I + sum_c gamma_c M_c^T Sigma_c^-1 M_c``, linear term
        ``sum_c M_c^T Sigma_c^-1 X_c + prior_offset e_0``)."""
        sm, u = self.derived()
        r = self.ivector_dim
        means, covs = [], []
        eye = torch.eye(r, dtype=torch.float64, device=self.M.device)
        for i in range(0, len(stats), block):
            g, x = stats.gamma[i:i + block], stats.X[i:i + block]
            lin = torch.einsum("ucd,cdr->ur", x, sm)
            lin[:, 0] += self.prior_offset
            prec = eye + torch.einsum("uc,crs->urs", g, u)
            chol = torch.linalg.cholesky(prec)
            means.append(torch.cholesky_solve(lin[:, :, None], chol)[:, :, 0])
            covs.append(torch.cholesky_inverse(chol))
        return torch.cat(means), torch.cat(covs)

    def extract(self, stats: UttStats) -> torch.Tensor:
        """``ivector-extract``: ``[U, R]`` i-vectors, prior offset removed."""
        mean, _ = self.posterior(stats)
        mean[:, 0] -= self.prior_offset
        return mean


def online_stats(ubm: DiagUbm, x: torch.Tensor, opts: PosteriorOptions, period: int = 10,
                 initial: UttStats | None = None) -> UttStats:
    """The statistics ``ivector-extract-online2 --ivector-period=period`` sees at frames
    ``0, period, 2 period, ...``: row ``k`` holds frames ``0 .. k * period`` (inclusive), so
    an utterance of ``T`` frames has ``ceil(T / period)`` rows (the program's
    ``(T + period - 1) / period``). ``initial`` (one row): the adaptation state carried over
    from the speaker's earlier utterances (:func:`carry_state`), added to every row."""
    if period < 1:
        raise AsrtrainError(f"ivector period must be >= 1, got {period}")
    c, d = ubm.num_gauss, ubm.dim
    x = x.to(ubm.means.device, torch.float64)
    rows = (len(x) + period - 1) // period
    idx, post = ubm.posteriors(x, opts.num_gselect, opts.min_post, opts.posterior_scale)
    row_of = (torch.arange(len(x), device=x.device) + period - 1) // period   # first row >= t
    seen = row_of < rows        # frames after the last row's frame are in no row (T % period)
    idx, post, x, row_of = idx[seen], post[seen], x[seen], row_of[seen]
    flat = row_of[:, None] * c + idx                                         # [T, n]
    gamma = torch.zeros(rows * c, dtype=torch.float64, device=x.device)
    gamma.index_add_(0, flat.flatten(), post.flatten())
    xs = torch.zeros(rows * c, d, dtype=torch.float64, device=x.device)
    xs.index_add_(0, flat.flatten(), (post[:, :, None] * x[:, None, :]).reshape(-1, d))
    gamma, xs = gamma.view(rows, c).cumsum(0), xs.view(rows, c, d).cumsum(0)
    if initial is not None:
        gamma, xs = gamma + initial.gamma.to(gamma), xs + initial.X.to(xs)
    return UttStats(gamma, xs)


def extract_online(extractor: IvectorExtractor, ubm: DiagUbm, x: torch.Tensor,
                   opts: PosteriorOptions, period: int = 10,
                   initial: UttStats | None = None) -> torch.Tensor:
    """``[ceil(T / period), R]`` i-vectors, row ``k`` from the statistics up to frame
    ``k * period`` (Kaldi's ``EstimateIvectorsOnline``, solved exactly where Kaldi runs
    conjugate gradient to convergence); ``initial``: see :func:`online_stats`."""
    return extractor.extract(online_stats(ubm, x, opts, period, initial))


def online_ivectors(extractor: IvectorExtractor, ubm: DiagUbm, x: torch.Tensor,
                    opts: PosteriorOptions, period: int = 10,
                    initial: UttStats | None = None, block: int = 256
                    ) -> tuple[torch.Tensor, UttStats]:
    """:func:`extract_online`'s i-vectors, computed as Kaldi's online estimator does: each
    frame adds ``gamma_c M_c^T Sigma_c^-1 M_c`` and ``M_c^T Sigma_c^-1 gamma_c x`` of its few
    selected components (``num_gselect``) to the i-vector's precision and linear term, so the
    work per row is that of its frames' components, not of all ``C`` (10x less at 512
    Gaussians; sparse products of the per-row increments, then a running sum). Returns the
    rows ``[ceil(T / period), R]`` and the statistics at the last row (the state to carry,
    :func:`carry_state`)."""
    if period < 1:
        raise AsrtrainError(f"ivector period must be >= 1, got {period}")
    c, d = ubm.num_gauss, ubm.dim
    dev = ubm.means.device
    x = x.to(dev, torch.float64)
    rows = (len(x) + period - 1) // period
    idx, post = ubm.posteriors(x, opts.num_gselect, opts.min_post, opts.posterior_scale)
    row_of = (torch.arange(len(x), device=dev) + period - 1) // period
    seen = row_of < rows
    idx, post, x, row_of = idx[seen], post[seen], x[seen], row_of[seen]
    n = idx.shape[1]
    sm, u = extractor.derived()
    r = extractor.ivector_dim
    at = torch.stack([row_of[:, None].expand(-1, n).flatten(), idx.flatten()])
    dgamma = torch.sparse_coo_tensor(at, post.flatten(), (rows, c),
                                     check_invariants=False).coalesce()
    quad = torch.sparse.mm(dgamma, u.reshape(c, r * r)).view(rows, r, r).cumsum(0)
    cols = (idx[:, :, None] * d + torch.arange(d, device=dev)).flatten()
    at = torch.stack([row_of[:, None].expand(-1, n * d).flatten(), cols])
    vals = (post[:, :, None] * x[:, None, :]).flatten()
    dx = torch.sparse_coo_tensor(at, vals, (rows, c * d), check_invariants=False).coalesce()
    lin = torch.sparse.mm(dx, sm.reshape(c * d, r)).cumsum(0)
    gamma = torch.zeros(c, dtype=torch.float64, device=dev).index_add_(
        0, idx.flatten(), post.flatten())
    xs = torch.zeros(c, d, dtype=torch.float64, device=dev).index_add_(
        0, idx.flatten(), (post[:, :, None] * x[:, None, :]).reshape(-1, d))
    if initial is not None:
        g0, x0 = initial.gamma[0].to(gamma), initial.X[0].to(xs)
        gamma, xs = gamma + g0, xs + x0
        quad = quad + torch.einsum("c,crs->rs", g0, u)
        lin = lin + torch.einsum("cd,cdr->r", x0, sm)
    lin[:, 0] += extractor.prior_offset
    eye = torch.eye(r, dtype=torch.float64, device=dev)
    out = []
    for i in range(0, rows, block):
        chol = torch.linalg.cholesky(eye + quad[i:i + block])
        out.append(torch.cholesky_solve(lin[i:i + block, :, None], chol)[:, :, 0])
    means = torch.cat(out)
    means[:, 0] -= extractor.prior_offset
    return means, UttStats(gamma[None], xs[None])


def carry_state(stats: UttStats, max_remembered_frames: float, posterior_scale: float
                ) -> UttStats:
    """The adaptation state an utterance hands to the speaker's next one (Kaldi's
    ``OnlineIvectorExtractorAdaptationState::LimitFrames``): the statistics at its last frame
    (last row of ``stats``), scaled down so that their count is at most
    ``max_remembered_frames * posterior_scale``; the prior is not scaled (it is added at
    solve time), so the carried data never outweighs it by more than that."""
    gamma, xs = stats.gamma[-1:], stats.X[-1:]
    limit = max_remembered_frames * posterior_scale
    count = float(gamma.sum())
    scale = limit / count if count > limit else 1.0
    return UttStats(gamma * scale, xs * scale)


def frame_ivectors(rows: torch.Tensor, num_frames: int, period: int = 10) -> torch.Tensor:
    """``[T, R]``: frame ``t`` gets row ``t // period`` (how online i-vectors are attached to
    the frames of a neural network's input)."""
    return rows[torch.arange(num_frames, device=rows.device) // period]


# ---------------------------------------------------------------------------- EM
@dataclass
class ExtractorAccs:
    """``IvectorExtractorStats``: ``Y_c = sum X_c w^T``, ``R_c = sum gamma_c E[w w^T]`` and the
    prior's ``sum E[w]``, ``sum E[w w^T]``."""

    Y: torch.Tensor
    R: torch.Tensor
    ivector_sum: torch.Tensor
    ivector_scatter: torch.Tensor
    num_ivectors: int


def accumulate_extractor(extractor: IvectorExtractor, stats: UttStats, block: int = 256
                         ) -> ExtractorAccs:
    """The E step (``ivector-extractor-acc-stats``) over all utterances, in blocks."""
    c, d, r = extractor.M.shape
    z = dict(dtype=torch.float64, device=extractor.M.device)
    acc = ExtractorAccs(torch.zeros(c, d, r, **z), torch.zeros(c, r, r, **z),
                        torch.zeros(r, **z), torch.zeros(r, r, **z), len(stats))
    for i in range(0, len(stats), block):
        part = UttStats(stats.gamma[i:i + block], stats.X[i:i + block])
        mean, cov = extractor.posterior(part, block)
        second = cov + mean[:, :, None] * mean[:, None, :]
        acc.Y += torch.einsum("ucd,ur->cdr", part.X, mean)
        acc.R += torch.einsum("uc,urs->crs", part.gamma, second)
        acc.ivector_sum += mean.sum(0)
        acc.ivector_scatter += second.sum(0)
    return acc


def _floor_covariances(sigma: torch.Tensor, floor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``SpMatrix::ApplyFloor``: each ``Sigma_c`` raised so that ``Sigma_c >= floor`` (in the
    positive-definite order); returns the floored matrices and how many eigenvalues moved."""
    lf = torch.linalg.cholesky(floor)
    eye = torch.eye(floor.shape[0], dtype=floor.dtype, device=floor.device)
    lfi = torch.linalg.solve_triangular(lf, eye, upper=False)
    t = lfi @ sigma @ lfi.T
    ev, vec = torch.linalg.eigh((t + t.transpose(1, 2)) / 2)
    moved = int((ev < 1).sum())
    t = vec @ torch.diag_embed(ev.clamp(min=1.0)) @ vec.transpose(1, 2)
    return lf @ t @ lf.T, moved


def _acoustic_auxf(m: torch.Tensor, sigma: torch.Tensor, acc: ExtractorAccs,
                   gamma: torch.Tensor, s: torch.Tensor) -> float:
    """Expected log-likelihood of the frames given the i-vector posteriors (total)."""
    d = m.shape[1]
    sinv = torch.linalg.inv(sigma)
    resid = s - m @ acc.Y.transpose(1, 2) - acc.Y @ m.transpose(1, 2) + m @ acc.R @ \
        m.transpose(1, 2)
    logdet = torch.linalg.slogdet(sigma)[1]
    return float((-0.5 * gamma * (d * LOG_2PI + logdet)).sum()
                 - 0.5 * (sinv * resid).sum())


def update_extractor(extractor: IvectorExtractor, acc: ExtractorAccs, gamma: torch.Tensor,
                     s: torch.Tensor, variance_floor_factor: float = 0.1,
                     gaussian_min_count: float = 100.0) -> dict:
    """The M step (``ivector-extractor-est``): ``M_c = Y_c R_c^-1``, ``Sigma_c = (S_c -
    M_c Y_c^T) / gamma_c`` floored at ``variance_floor_factor`` times the average covariance,
    then the prior update (``UpdatePrior``): the i-vector space is transformed so that the
    i-vectors' mean is ``[prior_offset, 0, ...]`` and their covariance the identity."""
    c, d, r = extractor.M.shape
    sigma_old = torch.linalg.inv(extractor.sigma_inv)
    before = _acoustic_auxf(extractor.M, sigma_old, acc, gamma, s)
    ok = gamma >= gaussian_min_count
    if not bool(ok.any()):   # Kaldi asserts here (UpdateVariances: var_floor_count > 0)
        raise AsrtrainError(f"i-vector extractor: no component has a count of at least "
                            f"gaussian_min_count={gaussian_min_count:g} (the largest is "
                            f"{float(gamma.max()):.1f}: frames times the posterior scale); use "
                            "fewer Gaussians, more data or a lower gaussian_min_count")
    if not bool(ok.all()):
        log.warning("i-vector extractor: %d of %d components have count < %g and keep their "
                    "parameters", int((~ok).sum()), c, gaussian_min_count)
    m_new = torch.linalg.solve(acc.R, acc.Y.transpose(1, 2)).transpose(1, 2)
    m = torch.where(ok[:, None, None], m_new, extractor.M)
    sig = (s - m @ acc.Y.transpose(1, 2)) / gamma.clamp(min=1e-10)[:, None, None]
    sig = (sig + sig.transpose(1, 2)) / 2
    floor = variance_floor_factor * (gamma[ok, None, None] * sig[ok]).sum(0) / gamma[ok].sum()
    sig, floored = _floor_covariances(sig, floor)
    sig = torch.where(ok[:, None, None], sig, sigma_old)
    after = _acoustic_auxf(m, sig, acc, gamma, s)
    m, offset, prior_gain = _update_prior(m, acc, extractor.prior_offset)
    extractor.M, extractor.sigma_inv, extractor.prior_offset = m, torch.linalg.inv(sig), offset
    extractor._derived = None
    frames = float(gamma.sum())
    return {"auxf_per_frame": after / frames, "auxf_impr_per_frame": (after - before) / frames,
            "prior_impr_per_frame": prior_gain * acc.num_ivectors / frames,
            "floored_eigenvalues": floored, "prior_offset": offset}


def _update_prior(m: torch.Tensor, acc: ExtractorAccs, old_offset: float
                  ) -> tuple[torch.Tensor, float, float]:
    """Kaldi's ``UpdatePrior``: ``V = H T`` with ``T`` whitening the i-vectors' covariance and
    ``H`` a Householder reflection sending their mean to a multiple of ``e_0``; ``M_c V^-1``
    keeps every ``M_c w`` while the prior becomes ``N(offset e_0, I)``. Returns the new ``M``,
    the new offset and the prior's likelihood gain per i-vector (``PriorDiagnostics``)."""
    r = m.shape[2]
    mean = acc.ivector_sum / acc.num_ivectors
    covar = acc.ivector_scatter / acc.num_ivectors - torch.outer(mean, mean)
    covar = (covar + covar.T) / 2
    s, p = torch.linalg.eigh(covar)
    floored = int((s < 1e-7).sum())
    if floored:
        log.warning("i-vector prior: floored %d eigenvalues of the i-vectors' covariance",
                    floored)
    s = s.clamp(min=1e-7)
    t = p.T / s.sqrt()[:, None]
    xdir = t @ mean
    xdir = xdir / xdir.norm()
    v = t
    if float(xdir[0]) < 1.0 - 1e-12:
        alpha = 1.0 / (math.sqrt(2.0) * math.sqrt(1.0 - float(xdir[0])))
        a = alpha * xdir
        a[0] -= alpha
        v = (torch.eye(r, dtype=m.dtype, device=m.device) - 2 * torch.outer(a, a)) @ t
    offset = float((v @ mean)[0])
    centred = mean.clone()
    centred[0] -= old_offset
    old_like = -0.5 * float(torch.trace(covar) + centred.dot(centred))
    new_like = -0.5 * (r + float(torch.linalg.slogdet(covar)[1]))
    return m @ torch.linalg.inv(v), offset, new_like - old_like


@dataclass
class ExtractorConfig:
    """``train_ivector_extractor.sh`` options (Kaldi's defaults but ``num_iters``)."""

    ivector_dim: int = 100
    num_iters: int = 10
    variance_floor_factor: float = 0.1
    gaussian_min_count: float = 100.0
    seed: int = 0
    posteriors: PosteriorOptions = field(default_factory=PosteriorOptions)


def train_ivector_extractor(ubm: DiagUbm,
                            utts: list[torch.Tensor] | Callable[[], Iterable[list[torch.Tensor]]],
                            cfg: ExtractorConfig | None = None) -> tuple[IvectorExtractor,
                                                                          list[dict]]:
    """Initialise from the UBM and run ``cfg.num_iters`` EM iterations; on the UBM's device.

    ``utts`` is a list of ``[T, D]`` tensors (utterances' or speakers', as the recipe chooses),
    whose Baum-Welch statistics are then computed once and kept (``C * D`` float64 per
    utterance), or, for sets whose statistics do not fit, a callable returning blocks of them
    afresh (e.g. read from arks): each iteration then recomputes the statistics block by block,
    as Kaldi's ``ivector-extractor-acc-stats`` does, and holds one block's. Both give the same
    extractor. Returns it and one dict per iteration (auxf per frame, its improvement, seconds).
    """
    cfg = cfg or ExtractorConfig()
    blocks = utts if callable(utts) else _cached_blocks(ubm, utts, cfg.posteriors)
    ext = IvectorExtractor.init_from_ubm(ubm, cfg.ivector_dim, cfg.seed)
    totals: tuple[torch.Tensor, torch.Tensor] | None = None
    history = []
    for it in Bar(range(cfg.num_iters), desc="i-vector extractor", unit="iter",
                   file=sys.stderr, disable=None, leave=False):
        t0 = time.time()
        acc, seen = _accumulate_blocks(ext, ubm, blocks, cfg.posteriors, totals is None)
        if totals is None:
            totals = check_totals(seen, ubm)
        gamma, s = totals
        entry = {"iter": it, **update_extractor(ext, acc, gamma, s, cfg.variance_floor_factor,
                                                cfg.gaussian_min_count)}
        entry["seconds"] = round(time.time() - t0, 3)
        history.append(entry)
        log.info("i-vector extractor: %s", entry, extra=STAGE_LOG_ONLY)
    return ext, history


def _cached_blocks(ubm: DiagUbm, utts: list[torch.Tensor], opts: PosteriorOptions
                   ) -> Callable[[], Iterable[tuple[UttStats, torch.Tensor]]]:
    """The statistics of ``utts`` computed once, handed out as one block."""
    if not utts:
        raise AsrtrainError("train_ivector_extractor: no utterances")
    stats, s = utterance_stats(ubm, utts, opts, second_order=True)
    return lambda: [(stats, s)]


def _accumulate_blocks(ext: IvectorExtractor, ubm: DiagUbm, blocks: Callable,
                       opts: PosteriorOptions, second_order: bool
                       ) -> tuple[ExtractorAccs, tuple | None]:
    """One E step over all blocks; on the first pass also the totals ``gamma_c``, ``S_c`` and
    the frame count."""
    acc = None
    gamma = s = None
    for block in blocks():
        if isinstance(block, tuple):
            stats, s_b = block
        else:
            stats, s_b = utterance_stats(ubm, block, opts, second_order=second_order)
        part = accumulate_extractor(ext, stats)
        acc = part if acc is None else add_accs(acc, part)
        if second_order:
            g_b = stats.gamma.sum(0)
            gamma = g_b if gamma is None else gamma + g_b
            s = s_b if s is None else s + s_b
    if acc is None:
        raise AsrtrainError("train_ivector_extractor: no utterances")
    return acc, (gamma, s) if second_order else None


def add_accs(a: ExtractorAccs, b: ExtractorAccs) -> ExtractorAccs:
    return ExtractorAccs(a.Y + b.Y, a.R + b.R, a.ivector_sum + b.ivector_sum,
                         a.ivector_scatter + b.ivector_scatter, a.num_ivectors + b.num_ivectors)


def check_totals(totals: tuple, ubm: DiagUbm) -> tuple[torch.Tensor, torch.Tensor]:
    gamma, s = totals
    count = float(gamma.sum())
    if count < 10 * ubm.num_gauss:
        raise AsrtrainError(f"train_ivector_extractor: a total count of {count:.0f} (frames "
                            f"times the posterior scale) for a {ubm.num_gauss}-component UBM; "
                            f"need at least {10 * ubm.num_gauss}")
    return gamma, s


# ---------------------------------------------------------------------------- batched online
def online_ivectors_batch(extractor: IvectorExtractor, ubm: DiagUbm, feats: list[torch.Tensor],
                          follows: list[bool], opts: PosteriorOptions, period: int = 10,
                          max_remembered_frames: float = 1000.0,
                          dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """``ivector-extract-online2`` on many utterances at once: the i-vectors ``[ceil(T /
    period), R]`` of each of ``feats`` (prior offset removed), as :func:`online_ivectors` with
    :func:`carry_state` between utterances, where ``follows[i]`` says that utterance ``i``
    starts from the adaptation state utterance ``i - 1`` left (the same pseudo-speaker).

    The work of all utterances is shared by each tensor op: the UBM's top ``num_gselect``
    components of every frame (``gmm-gselect`` on the diagonal UBM, posteriors over those,
    pruned below ``min_post``: Kaldi's ``VectorToPosteriorEntry``), the statistics of each
    (row, component) pair, then the rows' precisions ``sum_c gamma_c M_c^T Sigma_c^-1 M_c`` and
    linear terms as two sparse products, a running sum per utterance, and one batched Cholesky
    solve. The state carried over is Kaldi's too (``OnlineIvectorEstimationStats``: the linear
    and quadratic terms, scaled down to ``max_remembered_frames`` frames' count, prior kept).
    Posteriors are float64; the products and the solve are ``dtype``. The linear term is of the
    features less each component's mean ``M_c[:, 0] * prior_offset``, so the solve gives the
    i-vector less the prior mean directly (no cancellation in float32). Each utterance's rows
    depend on its own frames (and the state) only: the same whatever else is in the batch.
    """
    if period < 1:
        raise AsrtrainError(f"ivector period must be >= 1, got {period}")
    if len(follows) != len(feats):
        raise AsrtrainError(f"online i-vectors: {len(follows)} 'follows' flags for "
                            f"{len(feats)} utterances")
    if not feats or not any(len(x) for x in feats):
        return [torch.zeros(0, extractor.ivector_dim, dtype=dtype) for _ in feats]
    c, d, r = extractor.M.shape
    dev = ubm.means.device
    sm, u, mu = _online_terms(extractor, dtype)
    rows = [(len(x) + period - 1) // period for x in feats]
    # frames after the last row's frame are in no row (Kaldi's last GetFrame is at its frame)
    used = [(n - 1) * period + 1 if n else 0 for n in rows]
    x = torch.cat([f[:k] for f, k in zip(feats, used, strict=True)]).to(dev, torch.float64)
    if x.shape[1] != d:
        raise AsrtrainError(f"online i-vectors: {x.shape[1]}-dim features, the extractor is "
                            f"{d}-dim")
    used_t = torch.tensor(used, device=dev)
    rows_t = torch.tensor(rows, device=dev)
    row_start = rows_t.cumsum(0) - rows_t
    utt = torch.repeat_interleave(torch.arange(len(feats), device=dev), used_t)
    t = torch.arange(len(x), device=dev) - (used_t.cumsum(0) - used_t)[utt]
    row = row_start[utt] + (t + period - 1) // period                 # frame t: rows >= t
    total_rows = int(rows_t.sum())
    idx, post = ubm.posteriors(x, opts.num_gselect, opts.min_post, opts.posterior_scale)
    keep = post.flatten() > 0
    key = (row[:, None] * c + idx).flatten()[keep]
    pair_post = post.flatten()[keep]
    pair_x = x.repeat_interleave(idx.shape[1], dim=0)[keep]
    keys, inv = torch.unique(key, sorted=True, return_inverse=True)
    gamma = torch.zeros(len(keys), dtype=torch.float64, device=dev).index_add_(0, inv, pair_post)
    xs = torch.zeros(len(keys), d, dtype=torch.float64, device=dev).index_add_(
        0, inv, pair_post[:, None] * pair_x)
    comp, key_row = keys % c, keys // c
    xs -= gamma[:, None] * mu[comp].double()           # centred on the components' means
    crow = torch.zeros(total_rows + 1, dtype=torch.int64, device=dev)
    crow[1:] = torch.bincount(key_row, minlength=total_rows).cumsum(0)
    cols = (comp[:, None] * d + torch.arange(d, device=dev)).flatten()
    with warnings.catch_warnings():     # "sparse CSR support is in beta": we use mm only
        warnings.simplefilter("ignore", UserWarning)
        quad = torch.sparse_csr_tensor(crow, comp, gamma.to(dtype), (total_rows, c),
                                       check_invariants=False) @ u
        lin = torch.sparse_csr_tensor(crow * d, cols, xs.to(dtype).flatten(),
                                      (total_rows, c * d), check_invariants=False) @ sm
    count = torch.zeros(total_rows, dtype=torch.float64, device=dev).index_add_(
        0, key_row, gamma)
    limit = max_remembered_frames * opts.posterior_scale
    state = None
    for i, n in enumerate(rows):
        if n == 0:      # no frames: the state passes through (or starts afresh)
            state = state if follows[i] else None
            continue
        a, b = int(row_start[i]), int(row_start[i]) + n
        quad[a:b].cumsum_(0)
        lin[a:b].cumsum_(0)
        total = float(count[a:b].sum())
        if follows[i] and state is not None:
            quad[a:b] += state[0]
            lin[a:b] += state[1]
            total += state[2]
        scale = limit / total if total > limit else 1.0
        state = (quad[b - 1] * scale, lin[b - 1] * scale, total * scale)
    prec = quad.view(total_rows, r, r)
    prec.diagonal(dim1=1, dim2=2).add_(1.0)             # the prior's identity
    chol, info = torch.linalg.cholesky_ex(prec)
    if bool(info.any()):
        raise AsrtrainError("online i-vectors: a precision matrix is not positive definite "
                            f"(Cholesky failed at {int((info > 0).sum())} rows); is the "
                            "extractor trained?")
    w = torch.cholesky_solve(lin[:, :, None], chol)[:, :, 0]
    return list(w.split(rows))


def _online_terms(extractor: IvectorExtractor, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Sigma_c^-1 M_c`` as ``[C * D, R]``, ``M_c^T Sigma_c^-1 M_c`` as ``[C, R * R]`` (in
    ``dtype``) and the components' means ``M_c[:, 0] * prior_offset`` ``[C, D]`` (float64)."""
    c, d, r = extractor.M.shape
    sm, u = extractor.derived()
    mu = extractor.M[:, :, 0] * extractor.prior_offset
    return sm.reshape(c * d, r).to(dtype), u.reshape(c, r * r).to(dtype), mu
