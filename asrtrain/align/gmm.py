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
import mmap
from dataclasses import dataclass

import numpy as np
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
        self._cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._slots: torch.Tensor | None = None
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

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
        """This set on ``device`` (itself, with its likelihood tables, when already there)."""
        if self.means.device == torch.device(device):
            return self
        return DiagGmmSet(self.means.to(device), self.vars.to(device),
                          self.log_weights.to(device))

    def state_dict(self) -> dict:
        return {"means": self.means.cpu(), "vars": self.vars.cpu(),
                "log_weights": self.log_weights.cpu()}

    @classmethod
    def from_state_dict(cls, d: dict) -> DiagGmmSet:
        return cls(d["means"], d["vars"], d["log_weights"])

    # ---------------------------------------------------------------- likelihoods
    def _linear(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor,
                                                                    torch.Tensor]:
        """Live components only: ``[2D, G]`` weights, ``[G]`` constants, ``[G]`` pdf."""
        if self._cache is None or self._cache[0].dtype != dtype:
            w, g = self._padded_linear(dtype)
            live = torch.isfinite(self.log_weights)
            pdf = torch.arange(self.num_pdfs, device=w.device)[:, None].expand_as(live)[live]
            self._cache = (w[live].T.to(dtype).contiguous(), g[live].to(dtype), pdf)
        return self._cache

    def _padded_linear(self, dtype: torch.dtype = torch.float64,
                       chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
        """``[P, M, 2D]`` linear weights and ``[P, M]`` constants (-inf for unused components)
        in ``dtype`` (computed in float64): a frame's component log-likelihood is
        ``[x, x^2] . w + g``.  Made ``chunk`` pdfs at a time, so the float64 temporaries are a
        chunk's, not five model-sized ones (a 1.2 GB peak at 200k Gaussians)."""
        p, m, d = self.means.shape
        w = torch.empty(p, m, 2 * d, dtype=dtype, device=self.means.device)
        g = torch.empty(p, m, dtype=dtype, device=self.means.device)
        for i in range(0, p, chunk):
            mean, var = self.means[i:i + chunk], self.vars[i:i + chunk]
            inv = 1.0 / var
            g[i:i + chunk] = (self.log_weights[i:i + chunk]
                              - 0.5 * (d * LOG_2PI + var.log().sum(-1)
                                       + (mean ** 2 * inv).sum(-1)))
            w[i:i + chunk, :, :d] = mean * inv
            w[i:i + chunk, :, d:] = -0.5 * inv
        return w, g

    def _used(self) -> torch.Tensor:
        """``[P]`` slots up to each pdf's last live component (mixing up fills slots in order,
        so this is its number of components): slots past it are never read."""
        if self._slots is None:
            live = torch.isfinite(self.log_weights)
            slot = torch.arange(1, live.shape[1] + 1, device=live.device)
            self._slots = (live * slot).amax(-1)
        return self._slots

    def loglikes(self, x: torch.Tensor, block: int | None = None, max_batch_mb: float = 256.0,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[N, P]`` log-likelihood of every pdf for every frame (float32 by default: Kaldi
        evaluates likelihoods in float too); the sum over a pdf's components is a scatter
        log-sum-exp.  Only for decoding, where every pdf may be alive in the beam: the frames go
        through in blocks sized so that one block's ``[frames, Gaussians]`` work tensors stay
        within ``max_batch_mb`` whatever the model size (alignment uses :meth:`pdf_loglikes`)."""
        w, g, pdf = self._linear(dtype)
        if block is None:   # 4096 as before when it fits (float32 sums depend on the block)
            block = min(4096, _frames_per_block(w.shape[1] * 3 + self.num_pdfs * 3, dtype,
                                                max_batch_mb))
        out = []
        for i in range(0, x.shape[0], block):
            xb = x[i:i + block].to(dtype)
            ll = torch.cat([xb, xb * xb], dim=1) @ w + g             # [n, G]
            idx = pdf[None, :].expand_as(ll)
            m = torch.full((ll.shape[0], self.num_pdfs), -math.inf, device=ll.device,
                           dtype=dtype)
            m = m.scatter_reduce(1, idx, ll, reduce="amax", include_self=True)
            s = torch.zeros_like(m).scatter_add_(1, idx, torch.exp(ll - m.gather(1, idx)))
            out.append(m + s.log())
        return torch.cat(out) if out else x.new_zeros(0, self.num_pdfs, dtype=dtype)

    def pdf_loglikes(self, x: torch.Tensor, pdfs: torch.Tensor, max_batch_mb: float = 256.0,
                     dtype: torch.dtype = torch.float32, groups: int = 8) -> torch.Tensor:
        """``[N, len(pdfs)]`` log-likelihoods of the given pdfs only (an utterance's training
        graph holds a few hundred of the model's thousands): the components of those pdfs are
        gathered and scored in blocks of frames whose ``[frames, components]`` work tensors stay
        within ``max_batch_mb`` -- memory depends on the utterance's pdfs, not on the model's
        size.  The pdfs go in up to ``groups`` groups of similar component counts, each padded
        to its own largest count (one padding to the overall largest wastes about half).
        A group's columns are component-major (``[m, pdfs]`` slabs), so the log-sum-exp over a
        pdf's components is elementwise work across slabs, not a reduction over a short inner
        axis; the blocks are small enough (about 2 MB of scores) that the product, the max,
        the exp and the sum all run on data in the cache."""
        table, first = self._component_table(dtype)
        used = self._used()
        pdfs = pdfs.to(table.device)
        out = x.new_empty(x.shape[0], len(pdfs), dtype=dtype)
        if not len(pdfs):
            return out
        counts = used[pdfs]
        order = torch.argsort(counts, stable=True)
        parts = []
        for part in torch.tensor_split(order, min(groups, len(pdfs))):
            m = max(int(counts[part[-1]]), 1)
            sel = pdfs[part]
            k = torch.arange(m, device=table.device)[:, None]
            rows = torch.where(k < used[sel], first[sel] + k, len(table) - 1)   # [m, n_pdf]
            r = table[rows.reshape(-1)]                              # component-major rows
            parts.append((part, m, r[:, 1:].T.contiguous(), r[:, 0].contiguous()))
        cols = max(p[2].shape[1] for p in parts)
        block = min(_frames_per_block(cols * 3, dtype, max_batch_mb),
                    max(32, 2 ** 19 // cols))
        for i in range(0, x.shape[0], block):
            xb = x[i:i + block].to(dtype)
            x2 = torch.cat([xb, xb * xb], dim=1)
            for part, m, w, g in parts:
                ll = torch.addmm(g, x2, w).view(x2.shape[0], m, len(part))
                top = ll.amax(1, keepdim=True).nan_to_num_(neginf=0.0)   # a pdf of no component
                out[i:i + block, part] = ll.sub_(top).exp_().sum(1).log_().add_(top[:, 0])
        return out

    # ---------------------------------------------------------------- training
    def zero_stats(self) -> GmmStats:
        """Zero float64 statistics of this model's shape.  On the CPU they live in fresh
        anonymous memory (:func:`_untouched_zeros`): a page is zero-filled by the kernel when
        first written, so a job pays for the slots its frames reach (a pdf's used components,
        a third of the padded width at 200k Gaussians), not for writing every zero."""
        p, m, d = self.means.shape
        if self.means.device.type == "cpu":
            zeros = _untouched_zeros
        else:
            def zeros(*shape: int) -> torch.Tensor:
                return torch.zeros(shape, dtype=torch.float64, device=self.means.device)
        return GmmStats(zeros(p, m), zeros(p, m, d), zeros(p, m, d))

    def accumulate(self, x: torch.Tensor, pdf: torch.Tensor, stats: GmmStats) -> None:
        """Add frames ``x`` ``[N, D]`` aligned to ``pdf`` ``[N]`` (component posteriors soft;
        Viterbi training: one pdf per frame, so a frame scores its own pdf's components only).
        The frames are sorted by pdf (stably) and each distinct pdf's frames go through as one
        matrix: its ``[frames, 1+2D]`` rows ``[1, x, x^2]`` times its components' ``[1+2D, m]``
        table give the log-likelihoods, and the posteriors' transpose times the same rows gives
        occupancy, sum and sum of squares at once.  Pdfs with the same component count and about
        the same number of frames (powers of two) are one batched product.  Everything is
        float64 (the sums of squares need it); a frame's statistics do not depend on what else
        is in the call, so splitting the frames over calls changes sums by rounding only."""
        _, m_all, d = self.means.shape
        n = x.shape[0]
        stats.frames += n
        if not n:
            return
        table, first = self._component_table(torch.float64)
        used = self._used()
        x = x.to(table.device, torch.float64)
        pdf = pdf.to(table.device)
        z = torch.cat([torch.ones(n + 1, 1, dtype=torch.float64, device=x.device),
                       torch.cat([x, x.new_zeros(1, d)]),
                       torch.cat([x * x, x.new_zeros(1, d)])], dim=1)   # row n: padding
        order = torch.argsort(pdf, stable=True)
        pdfs, count = torch.unique_consecutive(pdf[order], return_counts=True)
        start = torch.cumsum(count, 0) - count
        m = used[pdfs]
        cpad = torch.pow(2, torch.ceil(torch.log2(count.double()))).long()
        key = m * (1 << 40) + cpad
        by_key = torch.argsort(key, stable=True)
        keys, sizes = torch.unique_consecutive(key[by_key], return_counts=True)
        order_pad = torch.cat([order, order.new_tensor([n])])
        total = x.new_zeros(())
        for k, sel in zip(keys.tolist(), torch.split(by_key, sizes.tolist()), strict=True):
            mk, ck = k >> 40, k & ((1 << 40) - 1)
            j = torch.arange(ck, device=x.device)
            valid = j[None, :] < count[sel, None]                        # [u, ck]
            rows = torch.where(valid, start[sel, None] + j[None, :], n)  # into order_pad
            zg = z[order_pad[rows]]                                      # [u, ck, 1+2D]
            w = table[first[pdfs[sel], None] + torch.arange(mk, device=x.device)]  # [u, mk, .]
            ll = torch.bmm(zg, w.transpose(1, 2))                        # [u, ck, mk]
            tot = torch.logsumexp(ll, -1, keepdim=True)
            post = torch.exp(ll - tot) * valid[:, :, None]
            total += torch.where(valid, tot[:, :, 0], 0.0).sum()
            acc = torch.bmm(post.transpose(1, 2), zg)                    # [u, mk, 1+2D]
            slot = (pdfs[sel, None] * m_all + torch.arange(mk, device=x.device)).reshape(-1)
            acc = acc.reshape(-1, 1 + 2 * d)
            stats.occ.view(-1).index_add_(0, slot, acc[:, 0])
            stats.sx.view(-1, d).index_add_(0, slot, acc[:, 1:1 + d])
            stats.sxx.view(-1, d).index_add_(0, slot, acc[:, 1 + d:])
        stats.loglike += float(total)

    def _component_table(self, dtype: torch.dtype,
                         chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
        """``[G + 1, 1+2D]`` rows ``[gconst, mean/var, -0.5/var]`` in ``dtype`` (computed in
        float64) of every slot up to each pdf's last live component (:meth:`_used`), pdf by
        pdf, then a row that scores -inf (padding); and ``[P]`` each pdf's first row.  A
        component's log-likelihood is ``[1, x, x^2] . row``.  Kept until the model changes;
        made from the used slots only (a third of the padded ``[P, M, 2D]`` at 200k
        Gaussians), a chunk of pdfs at a time.  float64 for accumulation, float32 for
        alignment."""
        if dtype not in self._tables:
            used = self._used()
            first = torch.cumsum(used, 0) - used
            d = self.dim
            table = torch.empty(int(used.sum()) + 1, 1 + 2 * d, dtype=dtype,
                                device=used.device)
            table[-1] = 0.0
            table[-1, 0] = -math.inf
            slots = torch.arange(self.means.shape[1], device=used.device)
            for i in range(0, self.num_pdfs, chunk):     # a chunk's temporaries at a time
                live = slots[None, :] < used[i:i + chunk, None]
                mean, var = self.means[i:i + chunk][live], self.vars[i:i + chunk][live]
                inv = 1.0 / var
                rows = table[int(first[i]):int(first[i]) + len(mean)]
                rows[:, 0] = self.log_weights[i:i + chunk][live] - 0.5 * (
                    d * LOG_2PI + var.log().sum(-1) + (mean * mean * inv).sum(-1))
                rows[:, 1:1 + d] = mean * inv
                rows[:, 1 + d:] = -0.5 * inv
            self._tables[dtype] = (table, first)
        return self._tables[dtype]

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
        self._cache = self._slots = None
        self._tables = {}

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
        self._cache = self._slots = None
        self._tables = {}


def _untouched_zeros(*shape: int) -> torch.Tensor:
    """A float64 CPU tensor of zeros in its own anonymous mapping, unmapped when the tensor goes.
    Not ``torch.zeros`` (writes every page) nor ``np.zeros`` (asks for huge pages, whose first
    fault can stall on memory compaction: a second per call seen on a busy machine)."""
    n = math.prod(shape)
    buf = mmap.mmap(-1, max(n, 1) * 8)
    return torch.from_numpy(np.frombuffer(buf, dtype=np.float64, count=n).reshape(shape))


def _frames_per_block(values_per_frame: int, dtype: torch.dtype, max_mb: float) -> int:
    """Frames per block so that ``values_per_frame`` values of ``dtype`` per frame fit in
    ``max_mb`` megabytes (at least one frame)."""
    size = torch.tensor([], dtype=dtype).element_size()
    return max(1, int(max_mb * 2 ** 20 // (max(values_per_frame, 1) * size)))
