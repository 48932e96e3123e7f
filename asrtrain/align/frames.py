"""Frame-level statistics that the pass jobs (:mod:`asrtrain.align.passjobs`) and the passes
(:mod:`asrtrain.align.passes`, :mod:`asrtrain.align.sat`) share: silence masks and weights
(``weight-silence-post``), frame batches under a memory bound, the global moments, and the
speakers' fMLLR estimation (``gmm-est-fmllr``, ``compose-transforms``) and ``final.alimdl``'s
statistics (``gmm-acc-stats-twofeats``) of SAT passes.  It imports no pass module, so jobs and
passes build on it without a circle (docs/architecture.md, "Layers")."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.adapt.fmllr import FmllrStats, compose_affine, estimate_fmllr
from asrtrain.adapt.posteriors import FrameGaussians, component_posteriors
from asrtrain.align.config import GmmConfig
from asrtrain.align.gmm import DiagGmmSet, GmmStats
from asrtrain.align.model import (
    STATE_BITS,
    AcousticModel,
    Utterance,
    frame_contexts,
    pdfs_of,
)
from asrtrain.align.tree import Tree
from asrtrain.lang.lexicon import Lang

log = logging.getLogger(__name__)


@dataclass
class Moments:
    """Frames, sum and sum of squares of features, float64: the global mean and variance
    (``gmm-init-mono``'s start, every pass's variance floor) summed over jobs."""

    n: float = 0.0
    s1: np.ndarray | None = None
    s2: np.ndarray | None = None

    def accumulate(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        if self.s1 is None:
            self.s1, self.s2 = np.zeros(x.shape[1]), np.zeros(x.shape[1])
        self.n += len(x)
        self.s1 += x.sum(0)
        self.s2 += (x * x).sum(0)

    def add(self, other: Moments) -> None:
        if other.s1 is None:
            return
        if self.s1 is None:
            self.s1, self.s2 = np.zeros_like(other.s1), np.zeros_like(other.s2)
        self.n += other.n
        self.s1 += other.s1
        self.s2 += other.s2

    def mean_var(self) -> tuple[np.ndarray, np.ndarray]:
        if self.s1 is None or self.n <= 0:
            raise AsrtrainError("no frames to estimate the global mean and variance from")
        mean = self.s1 / self.n
        return mean, np.maximum(self.s2 / self.n - mean * mean, 0.0)


def silence_phone_mask(lang: Lang) -> np.ndarray:
    """``[num phone ids]`` True for the silence phones (Kaldi's ``silence.csl``)."""
    mask = np.zeros(len(lang.phones.phones), dtype=bool)
    for p in lang.phones.real_phone_ids:
        mask[p] = lang.phones.is_silence(p)
    return mask


def frame_weights(phone_state: np.ndarray, silence: np.ndarray,
                  silence_weight: float) -> np.ndarray:
    """Per frame 1, or ``silence_weight`` on a silence phone (``weight-silence-post``);
    ``silence`` is :func:`silence_phone_mask`."""
    phones = np.asarray(phone_state, dtype=np.int64) // STATE_BITS
    return np.where(silence[phones], silence_weight, 1.0)


def batch_frames(gmm: DiagGmmSet, max_batch_mb: float) -> int:
    """Frames per batch of Gaussian-posterior statistics (MLLT, fMLLR, ``[frames, components,
    dim]`` float64 work tensors, about four of them) within ``max_batch_mb``."""
    live = torch.isfinite(gmm.log_weights).sum(-1)
    per_frame = 4 * 8 * max(int(live.max()) if live.numel() else 1, 1) * gmm.dim
    return max(1, int(max_batch_mb * 2 ** 20 // per_frame))


def frame_batches(items: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], frames: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(feats, pdfs, weights)`` of utterances joined into batches of about ``frames`` frames
    (one call per batch, not per utterance: the statistics' cost per call is mostly fixed)."""
    buf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n = 0
    for item in items:
        if not len(item[0]):
            continue
        buf.append(item)
        n += len(item[0])
        if n >= frames:
            yield tuple(np.concatenate(parts) for parts in zip(*buf, strict=True))
            buf, n = [], 0
    if buf:
        yield tuple(np.concatenate(parts) for parts in zip(*buf, strict=True))


_FMLLR_DEFAULTS = GmmConfig()


def silence_pdfs(tree: Tree, lang: Lang) -> np.ndarray:
    """The pdf ids on the trees of the silence phones (sorted)."""
    roots = {tree.roots[tree.root_of[p]] for p in lang.phones.real_phone_ids
             if lang.phones.is_silence(p) and p in tree.root_of}
    out, stack = set(), list(roots)
    while stack:
        node = tree.nodes[stack.pop()]
        if node[0] == "leaf":
            out.add(int(node[1]))
        else:
            stack.extend([node[3], node[4]])
    return np.array(sorted(out), dtype=np.int64)


def estimate_transforms(model: AcousticModel, utts: list[Utterance],
                        pdf_alignments: Mapping[str, np.ndarray], silence: np.ndarray,
                        cfg: Mapping | GmmConfig | None = None,
                        posterior_model: AcousticModel | None = None,
                        report: dict | None = None) -> dict[str, np.ndarray]:
    """Each speaker's fMLLR ``[dim, dim+1]`` (float32) for ``utts`` as they are (``u.feats``:
    the features the transform applies to) from per-frame pdf ids (an alignment or a best
    path): ``gmm-est-fmllr`` with ``model``'s Gaussians, their posteriors from
    ``posterior_model`` when given (``gmm-post-to-gpost $alimdl | gmm-est-fmllr-gpost $mdl``,
    align_fmllr.sh), frames of ``silence`` pdfs weighted ``silence_weight``.  Speakers under
    ``fmllr_min_count`` frames keep the identity (logged).  Options (``cfg``, as
    :class:`GmmConfig`): ``silence_weight``, ``fmllr_min_count``, ``fmllr_num_iters``,
    ``device``, ``max_batch_mb``.  ``report`` gets the figures: speakers, identity, frames,
    objective improvement per frame."""
    opt = _options(cfg)
    device = torch.device(opt["device"])
    post_model = posterior_model or model
    if post_model.gmm.means.shape != model.gmm.means.shape:
        raise AsrtrainError(f"fMLLR: the posterior model's GMMs {tuple(post_model.gmm.means.shape)}"
                            f" do not match the model's {tuple(model.gmm.means.shape)}")
    gmm, post_gmm = model.gmm.to(device), post_model.gmm.to(device)
    sil = np.zeros(model.num_pdfs, dtype=bool)
    sil[np.asarray(silence, dtype=np.int64)] = True
    by_spk: dict[str, list[Utterance]] = {}
    for u in utts:
        by_spk.setdefault(u.speaker, []).append(u)
    speakers = sorted(by_spk)
    dim = gmm.dim
    per_spk = 3 * dim * (dim + 1) ** 2 * 8            # G, its inverse, work: float64
    group = max(1, int(opt["max_batch_mb"] * 2 ** 20 // per_spk))
    batch = batch_frames(gmm, opt["max_batch_mb"])
    out: dict[str, np.ndarray] = {}
    tot = {"speakers": len(speakers), "identity": 0, "frames": 0.0, "gain": 0.0}
    for i in range(0, len(speakers), group):
        names = speakers[i:i + group]
        stats = FmllrStats.zeros(len(names), dim, device)
        for j, spk in enumerate(names):
            frames = (_weighted_frames(u, pdf_alignments, sil, opt["silence_weight"])
                      for u in by_spk[spk])
            for x, pdf, w in frame_batches(frames, batch):
                _accumulate_fmllr(stats, j, x, pdf, w, gmm, post_gmm, device)
        res = estimate_fmllr(stats, int(opt["fmllr_num_iters"]), float(opt["fmllr_min_count"]),
                             names)
        for j, spk in enumerate(names):
            out[spk] = res.transforms[j].float().cpu().numpy()
        tot["identity"] += len(res.fallback)
        tot["frames"] += float(stats.beta.sum())
        tot["gain"] += float((res.improvement * stats.beta).sum())
    if report is not None:
        adapted = max(tot["frames"], 1e-10)
        report.update(speakers=tot["speakers"], identity=tot["identity"],
                      frames=round(tot["frames"], 1),
                      objf_improvement_per_frame=tot["gain"] / adapted)
    return out


def _options(cfg: Mapping | GmmConfig | None) -> dict:
    """The fMLLR options from a config (a GmmConfig, or any mapping: others keys ignored)."""
    d = asdict(cfg) if isinstance(cfg, GmmConfig) else dict(cfg or {})
    keys = ("silence_weight", "fmllr_min_count", "fmllr_num_iters", "device", "max_batch_mb")
    return {k: d.get(k, getattr(_FMLLR_DEFAULTS, k)) for k in keys}


def _weighted_frames(u: Utterance, pdf_alignments: Mapping[str, np.ndarray],
                     silence: np.ndarray, silence_weight: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An utterance's frames with weight > 0, their pdfs and weights (none if unaligned)."""
    pdf = pdf_alignments.get(u.utt)
    if pdf is None:
        return u.feats[:0], np.zeros(0, np.int64), np.zeros(0)
    pdf = np.asarray(pdf, dtype=np.int64)
    if len(pdf) != len(u.feats):
        raise AsrtrainError(f"fMLLR: utterance {u.utt} has {len(pdf)} aligned frames, its "
                            f"features {len(u.feats)}")
    w = np.where(silence[pdf], silence_weight, 1.0)
    keep = w > 0
    return u.feats[keep], pdf[keep], w[keep]


def _accumulate_fmllr(stats: FmllrStats, spk: int, x: np.ndarray, pdf: np.ndarray,
                      w: np.ndarray, gmm: DiagGmmSet, post_gmm: DiagGmmSet,
                      device: torch.device) -> None:
    """Add weighted frames to speaker ``spk``'s statistics: Gaussians of ``gmm``, their
    posteriors from ``post_gmm``."""
    xt = torch.from_numpy(x).to(device)
    p = torch.from_numpy(pdf).to(device)
    g = component_posteriors(post_gmm, xt, p, torch.from_numpy(w).to(device))
    if post_gmm is not gmm:
        m = g.post.shape[1]
        g = FrameGaussians(g.post, gmm.means[p, :m], gmm.vars[p, :m])
    stats.accumulate(xt, g, spk)


def compose_transforms(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray]
                       ) -> dict[str, np.ndarray]:
    """``compose-transforms --b-is-affine=true new old``: apply ``old`` then ``new``."""
    out = {}
    for spk, w in new.items():
        a = torch.from_numpy(np.asarray(w, dtype=np.float64))
        b = torch.from_numpy(np.asarray(old[spk], dtype=np.float64))
        out[spk] = compose_affine(a, b).float().numpy()
    return out


def alimdl_stats(model: AcousticModel, utts: list[Utterance], unadapted: Mapping[str, np.ndarray],
                 phone_state: Mapping[str, np.ndarray], device: torch.device | str = "cpu"
                 ) -> tuple[GmmStats, Moments]:
    """``gmm-acc-stats-twofeats``: component posteriors of ``model`` on the adapted features
    ``u.feats``, statistics of the unadapted ones (``unadapted[utt]``), and their moments (the
    variance floor)."""
    device = torch.device(device)
    gmm = model.gmm.to(device)
    stats = gmm.zero_stats()
    moments = Moments()
    for u in utts:
        ps = phone_state.get(u.utt)
        if ps is None:
            continue
        pdf = torch.from_numpy(pdfs_of(model.tree, frame_contexts(ps))).to(device)
        post = component_posteriors(gmm, torch.from_numpy(u.feats).to(device), pdf).post
        x = torch.from_numpy(unadapted[u.utt]).to(device).double()
        m = post.shape[1]   # the slots up to the last live component
        stats.occ[:, :m].index_add_(0, pdf, post)
        stats.sx[:, :m].index_add_(0, pdf, post[:, :, None] * x[:, None, :])
        stats.sxx[:, :m].index_add_(0, pdf, post[:, :, None] * (x * x)[:, None, :])
        moments.accumulate(unadapted[u.utt])
    return stats, moments
