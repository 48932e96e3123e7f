"""Alignment that scales (issue 12): likelihoods of the pdfs each graph uses only, training graphs
compiled once per transcript and reused, ``nj`` parallel jobs -- and the same alignments as the
dense, compile-every-time, one-process code they replace.

The real-speech tests reuse the espeak-ng corpus and mono pass of ``test_align.py`` (session
fixtures of tests/conftest.py).
"""

from __future__ import annotations

import filecmp
import math
import tracemalloc

import numpy as np
import pytest
import torch
from test_align import MONO

from asrtrain.align.bench import random_gmm, time_align_iteration
from asrtrain.align.gmm import DiagGmmSet, _frames_per_block
from asrtrain.align.graph import hmm_graph, phone_graph, scale_transitions
from asrtrain.align.model import (
    AcousticModel,
    GraphCache,
    Utterance,
    align,
    align_graphs,
    estimate_log_trans,
    load_data,
    read_int_table,
    transition_counts,
)
from asrtrain.align.passes import ContextItems, global_stats
from asrtrain.align.train import train_mono
from asrtrain.align.tree import TreeStats
from asrtrain.align.viterbi import viterbi_batch
from asrtrain.lang.lexicon import Lang

pytestmark = pytest.mark.timeout(600)


def mixed_gmm() -> DiagGmmSet:
    """A GMM whose pdfs have 1 to many components (padded with dead slots), then mixed up
    further by the real :meth:`DiagGmmSet.mixup`, so the padding is as training leaves it."""
    gmm = random_gmm(40, 300, 5, np.random.default_rng(3))
    gmm.mixup(400, torch.rand(40, generator=torch.Generator().manual_seed(1)) * 100 + 1)
    return gmm


def test_sparse_loglikes_equal_dense_ones_on_the_pdfs_used() -> None:
    gmm = mixed_gmm()
    x = torch.from_numpy(np.random.default_rng(0).normal(0, 1.5, (37, 5)))
    dense = gmm.loglikes(x, dtype=torch.float64)
    for pdfs in ([3], [0, 7, 39, 12], list(range(40)), [5, 5, 2]):
        idx = torch.tensor(pdfs)
        for mb in (256.0, 1e-4):    # one block, and one frame per block
            sparse = gmm.pdf_loglikes(x, idx, max_batch_mb=mb, dtype=torch.float64)
            assert sparse.shape == (37, len(pdfs))
            torch.testing.assert_close(sparse, dense[:, idx], rtol=0, atol=1e-9)
    # and each against the definition: log sum_m w_m N(x; mu_m, var_m) of one pdf
    j, t = 7, 4
    lw, mu, var = gmm.log_weights[j], gmm.means[j], gmm.vars[j]
    live = torch.isfinite(lw)
    comp = lw[live] - 0.5 * (((x[t] - mu[live]) ** 2 / var[live]).sum(-1)
                             + var[live].log().sum(-1) + 5 * math.log(2 * math.pi))
    assert abs(float(torch.logsumexp(comp, 0)) - float(dense[t, j])) < 1e-9


def test_dense_loglikes_in_memory_bounded_blocks_give_the_same_matrix() -> None:
    gmm = mixed_gmm()
    x = torch.from_numpy(np.random.default_rng(1).normal(0, 1, (50, 5)))
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 1e-4)):
        whole = gmm.loglikes(x, block=50, dtype=dtype)
        # float32 matrix products round differently with the number of rows: close, not equal
        torch.testing.assert_close(gmm.loglikes(x, max_batch_mb=1e-3, dtype=dtype), whole,
                                   rtol=0, atol=tol)


def test_block_of_frames_fits_the_memory_setting() -> None:
    # 1 MB of float32 work values at 1000 values a frame: 262 frames; never less than one
    assert _frames_per_block(1000, torch.float32, 1.0) == 262
    assert _frames_per_block(1000, torch.float64, 1.0) == 131
    assert _frames_per_block(10 ** 9, torch.float32, 1.0) == 1


def test_accumulate_is_unchanged_by_the_dead_slots_it_skips() -> None:
    """Accumulation reads only the slots up to the last live component of the aligned pdfs: the
    statistics equal those of the full padded computation (written out here)."""
    gmm = mixed_gmm()
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.normal(0, 1, (60, 5)))
    pdf = torch.from_numpy(rng.integers(0, 40, 60))
    stats = gmm.zero_stats()
    gmm.accumulate(x, pdf, stats)
    inv = 1.0 / gmm.vars[pdf]
    diff = x[:, None, :] - gmm.means[pdf]
    ll = gmm.log_weights[pdf] - 0.5 * (5 * math.log(2 * math.pi) + gmm.vars[pdf].log().sum(-1)
                                       + (diff * diff * inv).sum(-1))
    post = torch.exp(ll - torch.logsumexp(ll, -1, keepdim=True))
    occ = torch.zeros_like(stats.occ).index_add_(0, pdf, post)
    sx = torch.zeros_like(stats.sx).index_add_(0, pdf, post[:, :, None] * x[:, None, :])
    torch.testing.assert_close(stats.occ, occ, rtol=0, atol=1e-12)
    torch.testing.assert_close(stats.sx, sx, rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def setup(corpus, mono):
    lang = Lang.read(corpus["lang"])
    model = AcousticModel.load(mono)
    utts, _ = load_data(corpus["train"], lang, model.delta_order)
    return lang, model, utts


def test_reweighted_graph_equals_a_fresh_compile_with_new_transitions(setup) -> None:
    lang, model, utts = setup
    cache = GraphCache().for_tree(model.tree)
    scaled = scale_transitions(model.log_trans)
    u = utts[0]
    cached = cache.get(lang, u, scaled)
    # transition probabilities re-estimated from a (made-up) skewed count: new weights
    counts: dict = {}
    transition_counts(np.array([p * 8 + s for p in model.log_trans for s in (0, 1, 1, 1, 2)]),
                      counts, model.log_trans)
    new_trans = estimate_log_trans(counts, model.log_trans, min_count=0.5)
    new_scaled = scale_transitions(new_trans)
    fresh = hmm_graph(lang, phone_graph(lang, u.words), model.tree.pdf, new_trans)
    from asrtrain.align.graph import transition_table
    again = cache.get(lang, u, new_scaled).reweighted(transition_table(new_scaled).table)
    assert cache.compiled == 1
    assert not np.array_equal(fresh.weight, cached.weight)   # the weights did change
    for name in ("pdf", "src", "dst", "weight", "start", "final", "phone", "hmm_state", "word"):
        np.testing.assert_array_equal(getattr(again, name), getattr(fresh, name), err_msg=name)


def test_cached_graphs_give_the_alignments_of_compiling_afresh(setup) -> None:
    lang, model, utts = setup
    cfg = {"batch_frames": 3000}
    cache = GraphCache()
    first = align(model, lang, utts, cfg, cache)
    assert cache.compiled == len(utts)
    # as after an iteration: new transition probabilities from that alignment
    counts: dict = {}
    for ps in first.phone_state.values():
        transition_counts(ps.astype(np.int64), counts, model.log_trans)
    model2 = AcousticModel(model.tree, model.gmm, estimate_log_trans(counts, model.log_trans),
                           model.delta_order, model.var_floor)
    cached = align(model2, lang, utts, cfg, cache)
    assert cache.compiled == len(utts)   # nothing recompiled
    fresh = align(model2, lang, utts, cfg)
    assert sorted(cached.pdf) == sorted(fresh.pdf) == sorted(u.utt for u in utts)
    for k in fresh.pdf:
        np.testing.assert_array_equal(cached.pdf[k], fresh.pdf[k])
        np.testing.assert_array_equal(cached.phone_state[k], fresh.phone_state[k])
    assert cached.loglike_per_frame == fresh.loglike_per_frame


def test_a_full_graph_cache_compiles_afresh_with_the_same_alignments(setup) -> None:
    lang, model, utts = setup
    cfg = {"batch_frames": 3000}
    small = GraphCache(max_mb=0.2)
    a = align(model, lang, utts, cfg, small)
    kept = len(small.graphs)
    assert 0 < kept < len(utts) and small.bytes <= 0.2 * 2 ** 20
    b = align(model, lang, utts, cfg, small)
    assert small.compiled == 2 * len(utts) - kept   # only the ones it could not keep, again
    for k in a.pdf:
        np.testing.assert_array_equal(a.pdf[k], b.pdf[k])


def test_nj2_gives_the_alignments_of_nj1(setup) -> None:
    lang, model, utts = setup
    one = align(model, lang, utts, {"nj": 1, "batch_frames": 3000})
    cache = GraphCache()
    two = align(model, lang, utts, {"nj": 2, "batch_frames": 3000}, cache)
    assert cache.compiled == len(utts)   # the jobs' graphs came back for the next call
    assert sorted(one.pdf) == sorted(two.pdf)
    for k in one.pdf:
        np.testing.assert_array_equal(one.pdf[k], two.pdf[k])
        np.testing.assert_array_equal(one.words[k], two.words[k])
    assert one.loglike_per_frame == two.loglike_per_frame


def test_sparse_viterbi_aligns_as_the_dense_likelihoods(setup) -> None:
    """The alignment from each graph's own pdfs equals the one from every pdf's likelihoods
    (the code before issue 12: dense matrix gathered by viterbi_batch)."""
    lang, model, utts = setup
    cache = GraphCache().for_tree(model.tree)
    scaled = scale_transitions(model.log_trans)
    graphs = [cache.get(lang, u, scaled) for u in utts[:12]]
    feats = [torch.from_numpy(u.feats) for u in utts[:12]]
    sparse = align_graphs(model.gmm, graphs, feats, 0.1, torch.device("cpu"))
    dense = viterbi_batch(graphs, [model.gmm.loglikes(x) for x in feats], 0.1)
    for s, d in zip(sparse, dense, strict=True):
        np.testing.assert_array_equal(s.states, d.states)
        assert abs(s.acoustic - d.acoustic) < 1e-3 * abs(d.acoustic)


def test_train_mono_with_two_jobs_writes_the_same_alignments(corpus, tmp_path) -> None:  # noqa: F811
    cfg = {**MONO, "num_iters": 3, "realign_iters": [1, 2, 3], "max_iter_inc": 2}
    train_mono(corpus["train"], corpus["lang"], tmp_path / "one", {**cfg, "nj": 1})
    train_mono(corpus["train"], corpus["lang"], tmp_path / "two", {**cfg, "nj": 2})
    for name in ("ali.ark", "ali_phone_state.ark"):
        assert filecmp.cmp(tmp_path / "one" / name, tmp_path / "two" / name, shallow=False)


def test_time_align_iteration_aligns_random_graphs_sparse_and_dense() -> None:
    kw = {"num_pdfs": 300, "gaussians": 3000, "dim": 13, "frames": 1200, "utt_frames": 200}
    threads = torch.get_num_threads()
    sparse = time_align_iteration(**kw)
    dense = time_align_iteration(**kw, dense=True)
    assert torch.get_num_threads() == threads   # timed in one thread, the caller's restored
    for r in (sparse, dense):
        assert r["failed"] == 0 and r["frames"] == 1200 and r["utterances"] == 6
        assert abs(r["gaussians"] - 3000) < 300
        assert r["frames_per_s_per_core"] > 0 and r["peak_rss_mb"] > 0
    # each utterance scores its own pdfs' Gaussians only: far fewer than the model's
    assert sparse["gaussians_scored_per_frame"] < dense["gaussians_scored_per_frame"] / 2
    assert 10 < sparse["distinct_pdfs_per_utt"] < 300


def _corpus_in_one_piece(items) -> tuple[np.ndarray, np.ndarray]:
    """What the stage computed before it streamed: tree statistics of the concatenated corpus."""
    keys = np.concatenate([k for k, _ in items])
    x = np.concatenate([f for _, f in items]).astype(np.float64)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    stats = np.zeros((len(uniq), 1 + 2 * x.shape[1]))
    np.add.at(stats, inv.reshape(-1), np.concatenate([np.ones((len(x), 1)), x, x * x], 1))
    return uniq, stats


def test_streamed_tree_stats_and_global_stats_are_the_corpus_wide_ones(setup, mono) -> None:  # noqa: F811
    """Per-utterance accumulation gives the same bits as the concatenated corpus (so the same
    tree, model and alignments as before the memory fix)."""
    lang, _, utts = setup
    prev = read_int_table(mono / "ali_phone_state.scp")
    items = ContextItems(utts, prev)
    stats = TreeStats.accumulate(items)
    keys, ref = _corpus_in_one_piece(list(items))
    np.testing.assert_array_equal(stats.keys, keys)
    assert stats.keys.dtype == keys.dtype
    assert np.array_equal(stats.stats, ref)          # bitwise, not close
    mean, var = global_stats(utts)
    x = np.concatenate([u.feats for u in utts]).astype(np.float64)
    assert np.array_equal(mean, x.mean(0)) and np.array_equal(var, x.var(0))


def test_tree_and_global_stats_need_no_copy_of_the_corpus() -> None:
    """Their peak allocation (tracemalloc sees numpy's) is one utterance's work, not a float64
    copy of every frame (the concatenated version took ~1.3 kB a frame)."""
    rng = np.random.default_rng(5)   # 5 phones: few contexts, as in speech (632 bytes each)
    utts = [Utterance(f"u{i}", [], rng.normal(0, 1, (1000, 39)).astype(np.float32))
            for i in range(200)]
    ali = {u.utt: (rng.integers(1, 6, 1000) * 8 + rng.integers(0, 3, 1000)).astype(np.int32)
           for u in utts}
    frames = 200 * 1000
    tracemalloc.start()
    try:
        stats = TreeStats.accumulate(ContextItems(utts, ali))
        global_stats(utts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.stats[:, 0].sum() == frames
    assert peak < 100 * frames, f"{peak / frames:.0f} bytes a frame"
