"""The fast alignment kernels (issue 22 item 3) against plain reference implementations on random
data: GMM accumulation, the sparse likelihoods, the tree lookup table, the batched frame contexts
and transition counts, and ``accumulate_stats`` whatever its batch size."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asrtrain.align.bench import random_alignment, random_gmm, random_tree
from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.model import (
    STATE_BITS,
    AcousticModel,
    accumulate_stats,
    frame_contexts,
    transition_counts,
)
from asrtrain.align.tree import KEY_PDF_CLASS, Tree


def _gmm() -> DiagGmmSet:
    """1 to many components per pdf, padded with dead slots, mixed up as training does."""
    gmm = random_gmm(30, 200, 6, np.random.default_rng(3))
    gmm.mixup(260, torch.rand(30, generator=torch.Generator().manual_seed(1)) * 100 + 1)
    return gmm


def _component_loglikes(gmm: DiagGmmSet, x: torch.Tensor, pdf: torch.Tensor) -> torch.Tensor:
    """``[N, M]`` log w + log N(x; mu, var) of each frame's pdf's slots, by the definition."""
    var = gmm.vars[pdf]
    diff = x[:, None, :] - gmm.means[pdf]
    return gmm.log_weights[pdf] - 0.5 * (gmm.dim * math.log(2 * math.pi) + var.log().sum(-1)
                                         + (diff * diff / var).sum(-1))


def _reference_stats(gmm: DiagGmmSet, x: torch.Tensor, pdf: torch.Tensor):
    ll = _component_loglikes(gmm, x, pdf)
    tot = torch.logsumexp(ll, -1)
    post = torch.exp(ll - tot[:, None])
    occ = torch.zeros_like(gmm.log_weights).index_add_(0, pdf, post)
    sx = torch.zeros_like(gmm.means).index_add_(0, pdf, post[:, :, None] * x[:, None, :])
    sxx = torch.zeros_like(gmm.means).index_add_(0, pdf, post[:, :, None] * (x * x)[:, None])
    return occ, sx, sxx, float(tot.sum())


def test_accumulate_equals_the_per_frame_definition_in_any_split() -> None:
    gmm = _gmm()
    rng = np.random.default_rng(0)
    # skewed pdfs: some pdfs get one frame, some hundreds (several frame-count groups)
    pdf = torch.from_numpy(np.minimum(rng.geometric(0.15, 900) - 1, 29))
    x = torch.from_numpy(rng.normal(0, 1.5, (900, 6)))
    occ, sx, sxx, tot = _reference_stats(gmm, x, pdf)
    whole = gmm.zero_stats()
    gmm.accumulate(x, pdf, whole)
    parts = gmm.zero_stats()
    for cut in np.split(np.arange(900), [1, 7, 300, 301]):
        gmm.accumulate(x[cut], pdf[cut], parts)
    for s in (whole, parts):
        torch.testing.assert_close(s.occ, occ, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(s.sx, sx, rtol=1e-12, atol=1e-11)
        torch.testing.assert_close(s.sxx, sxx, rtol=1e-12, atol=1e-11)
        assert s.frames == 900 and math.isclose(s.loglike, tot, rel_tol=1e-12)


def test_pdf_loglikes_equal_the_definition() -> None:
    gmm = _gmm()
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(0, 1.5, (300, 6)))
    for pdfs in ([4], [0, 29, 3, 3, 17], list(range(30))):
        idx = torch.tensor(pdfs)
        ref = torch.stack([torch.logsumexp(_component_loglikes(gmm, x, torch.full((300,), p)), -1)
                           for p in pdfs], dim=1)
        for mb in (256.0, 1e-3):       # one block; blocks of one frame
            got = gmm.pdf_loglikes(x, idx, max_batch_mb=mb, dtype=torch.float64)
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-9)
        got32 = gmm.pdf_loglikes(x, idx)
        assert got32.dtype == torch.float32
        torch.testing.assert_close(got32.double(), ref, rtol=1e-5, atol=1e-3)


def test_tree_lookup_table_equals_walking_the_tree() -> None:
    rng = np.random.default_rng(2)
    tree = random_tree(240, 8, rng)
    for _ in range(3):     # the table grows between calls: new contexts merge in sorted
        ctx = np.stack([rng.integers(0, 9, 500), rng.integers(1, 9, 500),
                        rng.integers(0, 9, 500), rng.integers(0, 3, 500)], axis=1)
        want = [tree.pdf(*map(int, row)) for row in ctx]
        np.testing.assert_array_equal(tree.pdfs(ctx), want)
    assert len(tree.pdfs(np.zeros((0, 4), dtype=np.int64))) == 0
    # a root shared by three phones that asks the central phone, a left phone past every
    # question's values, and a phone of no root (a KeyError either way)
    shared = Tree([("leaf", 0), ("leaf", 1), ("leaf", 2), ("split", 1, frozenset({2}), 0, 1),
                   ("split", KEY_PDF_CLASS, frozenset({0}), 3, 2),
                   ("split", 0, frozenset({7}), 4, 2)], {0: 5}, {1: 0, 2: 0, 3: 0}, 3)
    ctx = np.array([[7, 2, 0, 0], [7, 1, 9, 0], [7, 3, 1, 1], [600, 2, 0, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(shared.pdfs(ctx), [0, 1, 2, 2, 2])
    np.testing.assert_array_equal(shared.pdfs(ctx), [shared.pdf(*map(int, c)) for c in ctx])
    with pytest.raises(KeyError):
        shared.pdfs(np.array([[0, 4, 0, 0]]))


def _reference_contexts(phone_state: np.ndarray) -> np.ndarray:
    """frame_contexts as it was written before it was batched."""
    phones, states = phone_state // STATE_BITS, phone_state % STATE_BITS
    starts = np.ones(len(phones), dtype=bool)
    starts[1:] = (states[1:] == 0) & ((states[:-1] != 0) | (phones[1:] != phones[:-1]))
    seg = np.cumsum(starts) - 1
    seg_phone = phones[starts]
    left = np.concatenate([[0], seg_phone[:-1]])[seg]
    right = np.concatenate([seg_phone[1:], [0]])[seg]
    return np.stack([left, phones, right, states], axis=1)


def _reference_counts(alignments, log_trans) -> dict[int, np.ndarray]:
    counts: dict[int, np.ndarray] = {}
    for ps in alignments:
        phones, states = ps // STATE_BITS, ps % STATE_BITS
        for t in range(len(ps)):
            c = counts.setdefault(int(phones[t]), np.zeros_like(log_trans[int(phones[t])]))
            leaves = t + 1 == len(ps) or (states[t + 1] == 0 and (
                states[t] != 0 or phones[t + 1] != phones[t]))
            c[states[t], c.shape[1] - 1 if leaves else states[t + 1]] += 1
    return counts


def _model(rng: np.random.Generator) -> AcousticModel:
    tree = random_tree(120, 6, rng)
    gmm = random_gmm(120, 600, 5, rng)
    trans = np.full((3, 4), -np.inf)
    for k in range(3):
        trans[k, k:k + 2] = math.log(0.5)
    return AcousticModel(tree, gmm, {p: trans.copy() for p in tree.roots}, 0, np.full(5, 1e-3))


def test_accumulate_stats_equals_utterance_by_utterance_definitions() -> None:
    rng = np.random.default_rng(4)
    model = _model(rng)
    items = [(rng.normal(0, 1, (n, 5)).astype(np.float32), random_alignment(n, 6, 7.0, rng))
             for n in (40, 3, 1, 90, 57, 25)]
    # repeated phones across an utterance boundary must not merge into one phone
    items.append((items[0][0][:9], np.full(9, 2 * STATE_BITS + 0)))
    items.append((items[0][0][:4], np.full(4, 2 * STATE_BITS + 0)))
    gmm = model.gmm
    x = torch.from_numpy(np.concatenate([f for f, _ in items])).double()
    pdf = torch.from_numpy(np.concatenate(
        [[model.tree.pdf(*map(int, c)) for c in _reference_contexts(ps)] for _, ps in items]))
    occ, sx, sxx, tot = _reference_stats(gmm, x, pdf)
    counts_ref = _reference_counts([ps for _, ps in items], model.log_trans)
    for batch in (1, 50, 10 ** 6):
        _, stats, counts = accumulate_stats(model, items, batch_frames=batch)
        torch.testing.assert_close(stats.occ, occ, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(stats.sx, sx, rtol=1e-12, atol=1e-11)
        torch.testing.assert_close(stats.sxx, sxx, rtol=1e-12, atol=1e-11)
        assert math.isclose(stats.loglike, tot, rel_tol=1e-12) and stats.frames == len(x)
        assert counts.keys() == counts_ref.keys()
        for p, c in counts_ref.items():
            np.testing.assert_array_equal(counts[p], c)
    for _, ps in items:     # the one-utterance functions: the same as before they were batched
        np.testing.assert_array_equal(frame_contexts(ps), _reference_contexts(ps))
        one: dict[int, np.ndarray] = {}
        transition_counts(ps, one, model.log_trans)
        ref = _reference_counts([ps], model.log_trans)
        assert one.keys() == ref.keys()
        for p, c in ref.items():
            np.testing.assert_array_equal(one[p], c)


def _reference_viterbi(g, ll: np.ndarray) -> np.ndarray | None:
    """Viterbi through ``g`` in plain loops (float32, acoustic scale 1): each state's first
    strictly best incoming arc in arc order; the best final state, the highest on a tie."""
    score = g.start + ll[0]
    back = np.zeros((len(ll), g.num_states), dtype=np.int64)
    for t in range(1, len(ll)):
        new = np.full(g.num_states, -np.inf, dtype=np.float32)
        for a in range(len(g.src)):
            v = score[g.src[a]] + g.weight[a]
            if v > new[g.dst[a]]:
                new[g.dst[a]], back[t, g.dst[a]] = v, g.src[a]
        score = new + ll[t]
    end = score + g.final
    if not np.isfinite(end.max()):
        return None
    cur = int(np.flatnonzero(end == end.max())[-1])
    path = [cur]
    for t in range(len(ll) - 1, 0, -1):
        cur = int(back[t, cur])
        path.append(cur)
    return np.asarray(path[::-1])


def test_viterbi_equals_plain_loops_with_many_ties() -> None:
    """Utterances of different lengths in one batch (the search runs the longest first and
    stops each at its end), likelihoods of a few integer values so that paths tie often."""
    from asrtrain.align.bench import random_graph
    from asrtrain.align.viterbi import viterbi_states

    rng = np.random.default_rng(5)
    graphs = [random_graph(int(n), 40, 3.0, rng) for n in (30, 12, 45, 12, 20)]
    lls = [rng.integers(-3, 0, (n, g.num_states)).astype(np.float32)
           for n, g in zip((30, 9, 45, 12, 20), graphs, strict=True)]
    found = viterbi_states(graphs, [torch.from_numpy(x) for x in lls], acoustic_scale=1.0)
    for g, ll, a in zip(graphs, lls, found, strict=True):
        want = _reference_viterbi(g, ll)
        if want is None:
            assert a.states is None
        else:
            np.testing.assert_array_equal(a.states, want)


def test_bench_times_accumulation_and_realignment_at_a_given_size() -> None:
    """``python -m asrtrain.align.bench``'s two parts, tiny: the figures are there and the
    distinct pdfs per utterance follow ``distinct_pdfs``."""
    from asrtrain.align.bench import time_accumulation, time_align_iteration

    acc = time_accumulation(num_pdfs=60, gaussians=300, dim=5, frames=600, utt_frames=100,
                            num_phones=5)
    assert acc["frames"] == 600 and acc["frames_per_s_per_core"] > 0 and acc["pdfs_seen"] > 10
    for distinct in (15, 30):
        r = time_align_iteration(num_pdfs=300, gaussians=1500, dim=5, frames=1200,
                                 distinct_pdfs=distinct)
        assert r["failed"] == 0 and r["realign_frames_per_s_per_core"] > 0
        assert abs(r["distinct_pdfs_per_utt"] - distinct) <= distinct * 0.3
