"""Diagonal-covariance GMMs for all pdfs at once, in torch (Kaldi's ``AmDiagGmm``).

Parameters are padded to ``[num_pdfs, max_gauss, dim]``; an unused component has weight 0
(log weight -inf).  Log-likelihoods of all pdfs for a block of frames are one matrix product
(``[x, x^2] @ [mean/var, -0.5/var]``), so alignment and decoding run batched on CPU or GPU.
Training is Viterbi (hard pdf per frame, soft component posteriors), with Kaldi's update rules:
components seen less than ``min_gaussian_occupancy`` frames keep their parameters, variances are
floored, and mixing up splits the heaviest components (:meth:`DiagGmmSet.mixup`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG_2PI = math.log(2 * math.pi)


@dataclass
class GmmStats:
    occ: torch.Tensor     # [P, M]
    sx: torch.Tensor      # [P, M, D]
    sxx: torch.Tensor     # [P, M, D]
    loglike: float = 0.0  # total log-likelihood of the accumulated frames
    frames: int = 0

    def add(self, other: GmmStats) -> None:
        """Add ``other``'s statistics to these (the tensors in place)."""
        for name in ("occ", "sx", "sxx"):
            getattr(self, name).add_(getattr(other, name))
        self.loglike += other.loglike
        self.frames += other.frames


class DiagGmmSet:
    def __init__(self, means: torch.Tensor, variances: torch.Tensor,
                 log_weights: torch.Tensor) -> None:
        self.means = means.double()
        self.vars = variances.double()
        self.log_weights = log_weights.double()
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None

    # ---------------------------------------------------------------- shapes
    @property
    def num_pdfs(self) -> int:
        return self.means.shape[0]

    @property
    def dim(self) -> int:
        return self.means.shape[2]

    def num_gauss(self) -> int:
        return int(torch.isfinite(self.log_weights).sum())

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_single_gaussians(cls, count: torch.Tensor, sx: torch.Tensor, sxx: torch.Tensor,
                              var_floor: torch.Tensor) -> DiagGmmSet:
        """One Gaussian per pdf from its (count, sum, sum of squares) (Kaldi gmm-init-model)."""
        n = count.double().clamp(min=1e-10)[:, None]
        mean = sx.double() / n
        var = torch.maximum(sxx.double() / n - mean * mean, var_floor.double())
        return cls(mean[:, None], var[:, None], torch.zeros(len(count), 1, dtype=torch.float64))

    def to(self, device: torch.device | str) -> DiagGmmSet:
        return DiagGmmSet(self.means.to(device), self.vars.to(device),
                          self.log_weights.to(device))

    def state_dict(self) -> dict:
        return {"means": self.means.cpu(), "vars": self.vars.cpu(),
                "log_weights": self.log_weights.cpu()}

    @classmethod
    def from_state_dict(cls, d: dict) -> DiagGmmSet:
        return cls(d["means"], d["vars"], d["log_weights"])

    # ---------------------------------------------------------------- likelihoods
    def _linear(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Live components only, float32: ``[2D, G]`` weights, ``[G]`` constants, ``[G]`` pdf."""
        if self._cache is None:
            inv = 1.0 / self.vars
            gconst = (self.log_weights - 0.5 * (self.dim * LOG_2PI + self.vars.log().sum(-1)
                                                + (self.means ** 2 * inv).sum(-1)))
            w = torch.cat([self.means * inv, -0.5 * inv], dim=-1)   # [P, M, 2D]
            live = torch.isfinite(self.log_weights)
            pdf = torch.arange(self.num_pdfs, device=w.device)[:, None].expand_as(live)[live]
            self._cache = (w[live].T.float().contiguous(), gconst[live].float(), pdf)
        return self._cache

    def loglikes(self, x: torch.Tensor, block: int = 4096) -> torch.Tensor:
        """``[N, P]`` float32 log-likelihood of every pdf for every frame (Kaldi evaluates
        likelihoods in float too); the sum over a pdf's components is a scatter log-sum-exp."""
        w, g, pdf = self._linear()
        out = []
        for i in range(0, x.shape[0], block):
            xb = x[i:i + block].float()
            ll = torch.cat([xb, xb * xb], dim=1) @ w + g             # [n, G]
            idx = pdf[None, :].expand_as(ll)
            m = torch.full((ll.shape[0], self.num_pdfs), -math.inf, device=ll.device)
            m = m.scatter_reduce(1, idx, ll, reduce="amax", include_self=True)
            s = torch.zeros_like(m).scatter_add_(1, idx, torch.exp(ll - m.gather(1, idx)))
            out.append(m + s.log())
        return torch.cat(out) if out else x.new_zeros(0, self.num_pdfs)

    # ---------------------------------------------------------------- training
    def zero_stats(self) -> GmmStats:
        p, m, d = self.means.shape
        z = dict(dtype=torch.float64, device=self.means.device)
        return GmmStats(torch.zeros(p, m, **z), torch.zeros(p, m, d, **z),
                        torch.zeros(p, m, d, **z))

    def accumulate(self, x: torch.Tensor, pdf: torch.Tensor, stats: GmmStats) -> None:
        """Add frames ``x`` ``[N, D]`` aligned to ``pdf`` ``[N]`` (component posteriors soft)."""
        x = x.to(self.means.dtype)
        inv = 1.0 / self.vars[pdf]                          # [N, M, D]
        diff = x[:, None, :] - self.means[pdf]
        ll = (self.log_weights[pdf] - 0.5 * (self.dim * LOG_2PI + self.vars[pdf].log().sum(-1)
                                             + (diff * diff * inv).sum(-1)))   # [N, M]
        tot = torch.logsumexp(ll, dim=-1)
        post = torch.exp(ll - tot[:, None])                 # [N, M]
        stats.occ.index_add_(0, pdf, post)
        stats.sx.index_add_(0, pdf, post[:, :, None] * x[:, None, :])
        stats.sxx.index_add_(0, pdf, post[:, :, None] * (x * x)[:, None, :])
        stats.loglike += float(tot.sum())
        stats.frames += x.shape[0]

    def update(self, stats: GmmStats, var_floor: torch.Tensor,
               min_gaussian_occupancy: float = 10.0) -> None:
        """Maximum-likelihood update; weights from all occupancies of a pdf."""
        occ = stats.occ
        live = torch.isfinite(self.log_weights)
        ok = (occ >= min_gaussian_occupancy) & live
        n = occ.clamp(min=1e-10)[:, :, None]
        mean = stats.sx / n
        var = torch.maximum(stats.sxx / n - mean * mean, var_floor.to(mean))
        self.means = torch.where(ok[:, :, None], mean, self.means)
        self.vars = torch.where(ok[:, :, None], var, self.vars)
        tot = occ.sum(-1, keepdim=True)
        w = torch.where(live, occ.clamp(min=1e-5), torch.zeros_like(occ))
        new_lw = torch.where(live, (w / w.sum(-1, keepdim=True)).log(), -math.inf)
        self.log_weights = torch.where(tot > 0, new_lw, self.log_weights)
        self._cache = None

    def mixup(self, target: int, occ_per_pdf: torch.Tensor, power: float = 0.2,
              perturb: float = 0.2) -> None:
        """Split components until about ``target`` in total (Kaldi ``gmm-mixup``): pdf ``j`` gets
        a target proportional to ``occ_j ** power``; the heaviest component is split in two, the
        means moved apart by ``perturb`` standard deviations."""
        occ = occ_per_pdf.double().cpu().clamp(min=0)
        alloc = occ ** power
        share = alloc / alloc.sum().clamp(min=1e-10) * target
        want = torch.floor(share).long()
        # largest remainders get the Gaussians that flooring lost, so the total reaches target
        left = target - int(want.sum())
        if left > 0:
            want[torch.argsort(share - want, descending=True)[:left]] += 1
        want = want.clamp(min=1)
        have = torch.isfinite(self.log_weights).sum(-1).cpu()
        want = torch.maximum(want, have)
        extra = int((want - have).max())
        if extra <= 0:
            return
        p, m, d = self.means.shape
        pad = dict(dtype=self.means.dtype, device=self.means.device)
        self.means = torch.cat([self.means, torch.zeros(p, extra, d, **pad)], dim=1)
        self.vars = torch.cat([self.vars, torch.ones(p, extra, d, **pad)], dim=1)
        self.log_weights = torch.cat([self.log_weights,
                                      torch.full((p, extra), -math.inf, **pad)], dim=1)
        for j in torch.nonzero(want > have).flatten().tolist():
            for _ in range(int(want[j] - have[j])):
                k = int(torch.argmax(self.log_weights[j]))
                slot = int(torch.isfinite(self.log_weights[j]).sum())
                half = self.log_weights[j, k] - math.log(2)
                delta = perturb * self.vars[j, k].sqrt()
                self.means[j, slot] = self.means[j, k] + delta
                self.means[j, k] = self.means[j, k] - delta
                self.vars[j, slot] = self.vars[j, k]
                self.log_weights[j, k] = half
                self.log_weights[j, slot] = half
        self._cache = None
