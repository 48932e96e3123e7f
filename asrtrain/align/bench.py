"""Timing of one GMM alignment iteration at Switchboard model sizes, for ``bench/scale.py``.

:func:`time_align_iteration` builds a random GMM with the shape of a big system (Kaldi s5c tri4:
11.5k pdfs, 200k Gaussians; IBM's: 32k pdfs), random feature frames and random but realistic
training graphs (left-to-right 3-state phones of ``frames_per_phone`` frames on average, words of
three phones with an optional 3-state silence after each; a few hundred distinct pdfs per
utterance), then times the three parts of an iteration with the toolkit's own functions:
likelihoods (only the pdfs of each utterance's graph, :meth:`DiagGmmSet.pdf_loglikes`; or every
pdf with ``dense=True``, the code before issue 12), batched Viterbi, and the accumulation of the
statistics.  Figures are per core: the process runs one torch thread and its CPU time is counted
(the wall time too, which another load on the machine inflates).

    python -m asrtrain.align.bench --gaussians 200000 --pdfs 11500 --frames 20000
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time

import numpy as np
import torch

from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.graph import HmmGraph
from asrtrain.align.model import AcousticModel, accumulate_stats
from asrtrain.align.tree import KEY_PDF_CLASS, Tree
from asrtrain.align.viterbi import viterbi_batch

SIL_PDFS = 5   # the first pdfs are silence's (shared by every utterance, as in a real tree)


def random_gmm(num_pdfs: int, gaussians: int, dim: int, rng: np.random.Generator) -> DiagGmmSet:
    """Components per pdf as Kaldi's mixing up gives them (``occupancy ** 0.2`` shares, the
    occupancies log-normal), random means, variances and weights."""
    occ = rng.lognormal(0.0, 1.5, num_pdfs)
    share = occ ** 0.2
    count = np.maximum(1, np.round(share / share.sum() * gaussians)).astype(np.int64)
    m = int(count.max())
    live = np.arange(m)[None, :] < count[:, None]
    logw = np.where(live, rng.normal(0.0, 0.5, (num_pdfs, m)), -np.inf)
    logw = logw - np.log(np.exp(logw).sum(1, keepdims=True))
    means = rng.normal(0.0, 1.0, (num_pdfs, m, dim))
    variances = rng.uniform(0.3, 2.0, (num_pdfs, m, dim))
    return DiagGmmSet(torch.from_numpy(means), torch.from_numpy(variances),
                      torch.from_numpy(logw))


def random_graph(num_frames: int, num_pdfs: int, frames_per_phone: float,
                 rng: np.random.Generator) -> HmmGraph:
    """A training graph for ``num_frames`` frames: words of 3 phones of 3 states (pdfs drawn
    from the non-silence ones), an optional 3-state silence before each word and at the end."""
    phones = max(3, int(num_frames / frames_per_phone) // 3 * 3)
    units, sil_after = [], []          # (first state) per unit; a unit = one 3-state phone
    pdf: list[int] = []
    for k in range(phones):
        units.append(len(pdf))
        pdf.extend(rng.integers(SIL_PDFS, num_pdfs, 3).tolist())
        if k % 3 == 2:                  # end of a word: an optional silence follows
            sil_after.append(len(pdf))
            pdf.extend(rng.integers(0, SIL_PDFS, 3).tolist())
    loop, fwd = math.log(0.5) * 0.1, math.log(0.5) * 0.1
    src, dst, wt = [], [], []

    def arc(a: int, b: int, w: float) -> None:
        src.append(a)
        dst.append(b)
        wt.append(w)

    for s in range(len(pdf)):
        arc(s, s, loop)
        if s % 3 != 2 or s + 1 >= len(pdf):
            if s % 3 != 2:
                arc(s, s + 1, fwd)
            continue
        arc(s, s + 1, fwd)                       # into the next unit (a silence or a word)
        if s + 1 in sil_after and s + 4 < len(pdf):
            arc(s, s + 4, fwd + math.log(0.5))   # skip the optional silence
    final = np.full(len(pdf), -np.inf, dtype=np.float32)
    final[len(pdf) - 1] = 0.0
    last_word_end = sil_after[-1] - 1
    final[last_word_end] = math.log(0.5)
    start = np.full(len(pdf), -np.inf, dtype=np.float32)
    start[0] = 0.0
    n = len(pdf)
    return HmmGraph(np.asarray(pdf, dtype=np.int64), np.zeros(n, np.int64),
                    np.arange(n, dtype=np.int64) % 3, np.zeros(n, np.int64),
                    np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                    np.asarray(wt, dtype=np.float32), start, final)


def _state_loglikes(gmm: DiagGmmSet, g: HmmGraph, x: torch.Tensor, dense: bool,
                    max_batch_mb: float) -> torch.Tensor:
    if dense:
        return gmm.loglikes(x)[:, torch.from_numpy(g.pdf)]
    uniq, inv = np.unique(g.pdf, return_inverse=True)
    ll = gmm.pdf_loglikes(x, torch.from_numpy(uniq), max_batch_mb)
    return ll[:, torch.from_numpy(inv.reshape(-1))]


def time_align_iteration(num_pdfs: int = 11500, gaussians: int = 200000, dim: int = 39,
                         frames: int = 20000, utt_frames: int = 400,
                         frames_per_phone: float = 8.0, batch_frames: int = 20000,
                         dense: bool = False, max_batch_mb: float = 256.0,
                         device: str = "cpu", seed: int = 0,
                         distinct_pdfs: int | None = None) -> dict:
    """Time one alignment iteration (likelihoods + Viterbi + accumulation) over ``frames``
    random frames in utterances of ``utt_frames``; returns frames/s per core (CPU time) and of
    the wall clock, the seconds of each part, the distinct pdfs per utterance and the peak RSS;
    ``realign_frames_per_s_per_core`` counts likelihoods and Viterbi only (a realignment).
    ``distinct_pdfs`` (about 150 or 300: short and long utterances) sets ``utt_frames`` so that
    each utterance's graph has about that many distinct pdfs.
    What is done once per model (zeroed statistics, the likelihood tables: once an iteration over
    the whole corpus) is timed apart, ``model_setup_seconds``.
    ``dense=True`` scores every pdf (what alignment did before issue 12).  Runs in one torch
    thread (the caller's thread count is restored)."""
    if distinct_pdfs is not None:   # 3 pdfs a phone, all distinct in a random graph
        utt_frames = max(1, round(distinct_pdfs / 3 * frames_per_phone))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _time_iteration(num_pdfs, gaussians, dim, frames, utt_frames, frames_per_phone,
                               batch_frames, dense, max_batch_mb, device, seed)
    finally:
        torch.set_num_threads(threads)


def _time_iteration(num_pdfs: int, gaussians: int, dim: int, frames: int, utt_frames: int,
                    frames_per_phone: float, batch_frames: int, dense: bool,
                    max_batch_mb: float, device: str, seed: int) -> dict:
    """:func:`time_align_iteration` in one thread."""
    rng = np.random.default_rng(seed)
    dev = torch.device(device)
    gmm = random_gmm(num_pdfs, gaussians, dim, rng).to(dev)
    n_utt = max(1, frames // utt_frames)
    graphs = [random_graph(utt_frames, num_pdfs, frames_per_phone, rng) for _ in range(n_utt)]
    feats = [torch.from_numpy(rng.normal(0.0, 1.0, (utt_frames, dim))).to(dev)
             for _ in range(n_utt)]
    # per model, not per frame (once an iteration over the whole corpus): timed apart
    t = time.process_time()
    stats = gmm.zero_stats()
    gmm._component_table(torch.float64)
    if dense:
        gmm.loglikes(feats[0][:1])
    else:
        gmm.pdf_loglikes(feats[0][:1], torch.tensor([0]))
    setup = time.process_time() - t
    parts = {"likelihoods": 0.0, "viterbi": 0.0, "accumulate": 0.0}
    cpu0, wall0 = time.process_time(), time.time()
    per_batch = max(1, batch_frames // utt_frames)
    failed = 0
    for i in range(0, n_utt, per_batch):
        gs, xs = graphs[i:i + per_batch], feats[i:i + per_batch]
        t = time.process_time()
        lls = [_state_loglikes(gmm, g, x, dense, max_batch_mb) for g, x in zip(gs, xs, strict=True)]
        parts["likelihoods"] += time.process_time() - t
        t = time.process_time()
        # the states' log-likelihoods as a [T, S] matrix of "pdfs" 0..S-1, so one call works
        # with the Viterbi of before issue 12 (viterbi_batch) and of after
        ident = [HmmGraph(np.arange(g.num_states), g.phone, g.hmm_state, g.word, g.src, g.dst,
                          g.weight, g.start, g.final) for g in gs]
        found = viterbi_batch(ident, lls, 0.1, dev)
        parts["viterbi"] += time.process_time() - t
        t = time.process_time()
        done = [(x, g.pdf[a.states]) for g, x, a in zip(gs, xs, found, strict=True)
                if a.states is not None]
        failed += len(gs) - len(done)
        if done:   # the batch's frames in one call, as accumulate_stats does
            gmm.accumulate(torch.cat([x for x, _ in done]),
                           torch.from_numpy(np.concatenate([p for _, p in done])).to(dev), stats)
        parts["accumulate"] += time.process_time() - t
    if dev.type == "cuda":
        torch.cuda.synchronize()
    cpu, wall = time.process_time() - cpu0, time.time() - wall0
    total = n_utt * utt_frames
    distinct = float(np.mean([len(np.unique(g.pdf)) for g in graphs]))
    used = torch.isfinite(gmm.log_weights).sum(-1).cpu().numpy()
    evals = float(np.mean([used[np.unique(g.pdf)].sum() for g in graphs]))
    return {"gaussians": gmm.num_gauss(), "num_pdfs": num_pdfs, "dim": dim, "frames": total,
            "utterances": n_utt, "failed": failed, "dense": dense, "device": device,
            "frames_per_s_per_core": round(total / max(cpu, 1e-9), 1),
            "frames_per_s_wall": round(total / max(wall, 1e-9), 1),
            "realign_frames_per_s_per_core": round(
                total / max(parts["likelihoods"] + parts["viterbi"], 1e-9), 1),
            "utt_frames": utt_frames,
            "seconds": {k: round(v, 3) for k, v in parts.items()},
            "model_setup_seconds": round(setup, 3),
            "distinct_pdfs_per_utt": round(distinct, 1),
            "gaussians_scored_per_frame": round(float(gmm.num_gauss()) if dense else evals, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def random_tree(num_pdfs: int, num_phones: int, rng: np.random.Generator) -> Tree:
    """A tree of ``num_pdfs`` leaves over phones ``1..num_phones`` of 3 states: each phone its
    own root, split on the HMM state, then each state on random left and right phone sets (a
    balanced tree of context questions, as deep as its share of the leaves needs)."""
    nodes: list[tuple] = []
    leaf = iter(range(num_pdfs))
    phones = np.arange(1, num_phones + 1)

    def grow(leaves: int) -> int:
        if leaves <= 1:
            nodes.append(("leaf", next(leaf)))
            return len(nodes) - 1
        yes = grow(leaves // 2)
        no = grow(leaves - leaves // 2)
        asked = frozenset(rng.choice(phones, num_phones // 2, replace=False).tolist())
        nodes.append(("split", int(rng.choice([0, 2])), asked, yes, no))
        return len(nodes) - 1

    shares = np.full(num_phones * 3, num_pdfs // (num_phones * 3))
    shares[:num_pdfs - int(shares.sum())] += 1
    roots = {}
    for k, p in enumerate(phones.tolist()):
        s0, s1, s2 = (grow(int(n)) for n in shares[3 * k:3 * k + 3])
        nodes.append(("split", KEY_PDF_CLASS, frozenset({1}), s1, s2))
        nodes.append(("split", KEY_PDF_CLASS, frozenset({0}), s0, len(nodes) - 1))
        roots[p] = len(nodes) - 1
    return Tree(nodes, roots, {p: p for p in roots}, num_pdfs)


def random_alignment(num_frames: int, num_phones: int, frames_per_phone: float,
                     rng: np.random.Generator) -> np.ndarray:
    """A phone-state alignment (``8 * phone + state``) of random phones of 3 states, each
    state at least one frame, ``frames_per_phone`` frames a phone on average."""
    out: list[int] = []
    extra = max(frames_per_phone / 3 - 1, 0.0)
    while len(out) < num_frames:
        p = int(rng.integers(1, num_phones + 1))
        for s in range(3):
            out.extend([p * 8 + s] * int(rng.geometric(1 / (1 + extra))))
    return np.asarray(out[:num_frames], dtype=np.int64)


def time_accumulation(num_pdfs: int = 11500, gaussians: int = 200000, dim: int = 40,
                      frames: int = 20000, utt_frames: int = 400, frames_per_phone: float = 8.0,
                      num_phones: int = 48, device: str = "cpu", seed: int = 0) -> dict:
    """Time ``gmm-acc-stats-ali`` (:func:`asrtrain.align.model.accumulate_stats`: tree lookup,
    transition counts and GMM statistics) over ``frames`` random frames aligned to random
    phones through a random tree, in one torch thread; returns frames/s per core (CPU time).
    The first call (it builds the model's tables and meets every context for the first time,
    once a pass in training) is timed apart, ``first_call_seconds``; the figure is the second,
    with the same model, as every later iteration of a pass runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rng = np.random.default_rng(seed)
        gmm = random_gmm(num_pdfs, gaussians, dim, rng)
        tree = random_tree(num_pdfs, num_phones, rng)
        trans = np.full((3, 4), -np.inf)
        for k in range(3):
            trans[k, k:k + 2] = math.log(0.5)     # loop or forward (state 2 forward: exit)
        model = AcousticModel(tree, gmm, {p: trans.copy() for p in tree.roots}, 0,
                              np.full(dim, 1e-3))
        n_utt = max(1, frames // utt_frames)
        items = [(rng.normal(0.0, 1.0, (utt_frames, dim)).astype(np.float32),
                  random_alignment(utt_frames, num_phones, frames_per_phone, rng))
                 for _ in range(n_utt)]
        t = time.process_time()
        accumulate_stats(model, items, device)
        first = time.process_time() - t
        cpu0, wall0 = time.process_time(), time.time()
        _, stats, _ = accumulate_stats(model, items, device)
        cpu, wall = time.process_time() - cpu0, time.time() - wall0
    finally:
        torch.set_num_threads(threads)
    total = n_utt * utt_frames
    return {"gaussians": gmm.num_gauss(), "num_pdfs": num_pdfs, "dim": dim, "frames": total,
            "utterances": n_utt, "device": device,
            "frames_per_s_per_core": round(total / max(cpu, 1e-9), 1),
            "frames_per_s_wall": round(total / max(wall, 1e-9), 1),
            "first_call_seconds": round(first, 3),
            "pdfs_seen": int((stats.occ.sum(-1) > 0).sum()),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pdfs", type=int, default=11500)
    ap.add_argument("--gaussians", type=int, default=200000)
    ap.add_argument("--dim", type=int, default=39)
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--utt-frames", type=int, default=400)
    ap.add_argument("--frames-per-phone", type=float, default=8.0)
    ap.add_argument("--distinct-pdfs", type=int, default=None,
                    help="realignment: about this many distinct pdfs per utterance (150, 300); "
                         "sets --utt-frames")
    ap.add_argument("--part", choices=("align", "accumulate", "both"), default="both",
                    help="time one alignment iteration, accumulate_stats, or both (one JSON "
                         "object each, one per line)")
    ap.add_argument("--dense", action="store_true", help="score every pdf (before issue 12)")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    if a.part in ("align", "both"):
        r = time_align_iteration(a.pdfs, a.gaussians, a.dim, a.frames, a.utt_frames,
                                 a.frames_per_phone, dense=a.dense, device=a.device,
                                 distinct_pdfs=a.distinct_pdfs)
        print(json.dumps({"part": "align", **r}), flush=True)
    if a.part in ("accumulate", "both"):
        r = time_accumulation(a.pdfs, a.gaussians, a.dim, a.frames, a.utt_frames,
                              a.frames_per_phone, device=a.device)
        print(json.dumps({"part": "accumulate", **r}), flush=True)


if __name__ == "__main__":
    main()
