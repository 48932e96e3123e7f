"""asrtrain.adapt against closed forms: splicing, LDA, MLLT, fMLLR and i-vectors on synthetic
data whose structure is known (real tensors, no mocks)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from asrtrain import AsrtrainError
from asrtrain.adapt.fmllr import FmllrStats, compose_affine, estimate_fmllr
from asrtrain.adapt.ivector import (
    ExtractorConfig,
    PosteriorOptions,
    extract_online,
    frame_ivectors,
    train_diag_ubm,
    train_ivector_extractor,
    utterance_stats,
)
from asrtrain.adapt.lda import LdaStats, apply_transform, estimate_lda
from asrtrain.adapt.mllt import MlltStats, compose, estimate_mllt, mllt_objective
from asrtrain.adapt.posteriors import FrameGaussians, component_posteriors
from asrtrain.adapt.splice import splice_frames
from asrtrain.align.gmm import DiagGmmSet

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _principal_angles_deg(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Principal angles between the column spaces of ``a`` and ``b``, in degrees."""
    qa, qb = torch.linalg.qr(a)[0], torch.linalg.qr(b)[0]
    s = torch.linalg.svdvals(qa.T @ qb).clamp(max=1.0)
    return torch.rad2deg(torch.arccos(s))


# ---------------------------------------------------------------------------- splice
def test_splice_repeats_edge_frames_like_splice_feats() -> None:
    x = torch.arange(10, dtype=F64).view(5, 2)        # frame t = [2t, 2t+1]
    out = splice_frames(x, 1, 2)
    assert out.shape == (5, 8)
    # frame 0: t-1 -> 0 (repeated), 0, 1, 2
    assert out[0].tolist() == [0, 1, 0, 1, 2, 3, 4, 5]
    # frame 4: 3, 4, 5 -> 4, 6 -> 4
    assert out[4].tolist() == [6, 7, 8, 9, 8, 9, 8, 9]
    assert out[2].tolist() == x[1:5].flatten().tolist()
    with pytest.raises(AsrtrainError, match="contexts must be >= 0"):
        splice_frames(x, -1, 3)


# ---------------------------------------------------------------------------- LDA
def _lda_data(seed: int = 0, dim: int = 24, k: int = 3, classes: int = 8, per_class: int = 4000):
    """Classes whose means differ only along ``k`` known directions ``U``, with a shared,
    correlated within-class covariance ``W``: the LDA subspace is ``W^-1 U``."""
    g = _gen(seed)
    u = torch.linalg.qr(torch.randn(dim, k, generator=g, dtype=F64))[0]
    coords = 4.0 * torch.randn(classes, k, generator=g, dtype=F64)
    mix = torch.randn(dim, dim, generator=g, dtype=F64) / math.sqrt(dim) + torch.eye(dim,
                                                                                     dtype=F64)
    within = mix @ mix.T
    labels = torch.arange(classes).repeat_interleave(per_class)
    noise = torch.randn(len(labels), dim, generator=g, dtype=F64) @ mix.T
    x = (coords @ u.T)[labels] + noise + 7.0       # a global offset, which LDA must ignore
    return x, labels, u, within


def test_lda_recovers_the_discriminant_directions() -> None:
    x, labels, u, within = _lda_data()
    stats = LdaStats.zeros(8, x.shape[1])
    for part in torch.arange(len(x)).chunk(5):          # as several jobs' accumulations
        stats.accumulate(x[part], labels[part])
    res = estimate_lda(stats, dim=10)
    assert res.matrix.shape == (10, 24)
    assert bool((res.eigenvalues[:-1] >= res.eigenvalues[1:]).all())
    # rows of the top-3 LDA directions span W^-1 U (the closed form of W^-1 B's range)
    angles = _principal_angles_deg(res.matrix[:3].T, torch.linalg.solve(within, u))
    assert float(angles.max()) < 3.0, angles
    # the 4th..10th eigenvalues are noise: between-class rank is 3
    assert float(res.eigenvalues[3]) < 0.01 * float(res.eigenvalues[2])
    # est-lda's normalisation: unit within-class covariance, diagonal between-class
    assert torch.allclose(res.matrix @ res.within @ res.matrix.T, torch.eye(10, dtype=F64),
                          atol=1e-9)
    b = res.matrix @ res.between @ res.matrix.T
    assert torch.allclose(b, torch.diag(res.eigenvalues[:10]), atol=1e-8)


def test_lda_remove_offset_centres_the_projection() -> None:
    x, labels, _, _ = _lda_data(seed=1, per_class=500)
    stats = LdaStats.zeros(8, x.shape[1])
    stats.accumulate(x, labels)
    m = estimate_lda(stats, dim=5, remove_offset=True).matrix
    assert m.shape == (5, 25)
    assert float(apply_transform(x, m).mean(0).abs().max()) < 1e-9


def test_lda_errors_name_what_is_wrong() -> None:
    x, labels, _, _ = _lda_data(seed=2, per_class=100)
    few = LdaStats.zeros(8, 24)
    few.accumulate(x[:20], labels[:20])
    with pytest.raises(AsrtrainError, match="20 frames for 24-dim"):
        estimate_lda(few, dim=10)
    dup = torch.cat([x, x[:, :1]], dim=1)                 # a duplicated dimension
    stats = LdaStats.zeros(8, 25)
    stats.accumulate(dup, labels)
    with pytest.raises(AsrtrainError, match="within-class covariance is singular"):
        estimate_lda(stats, dim=10)
    with pytest.raises(AsrtrainError, match="class id 8 out of range"):
        LdaStats.zeros(8, 24).accumulate(x[:3], torch.tensor([0, 1, 8]))
    with pytest.raises(AsrtrainError, match="dim 30 must be in 1..24"):
        estimate_lda(LdaStats.zeros(8, 24), dim=30)


# ---------------------------------------------------------------------------- MLLT
def _rotated_gmm_data(seed: int = 0, dim: int = 6, classes: int = 10, per_class: int = 3000):
    """Frames ``R z`` with ``z`` from diagonal Gaussians: a diagonal model fits ``R^-1 x``."""
    g = _gen(seed)
    mu = 3.0 * torch.randn(classes, dim, generator=g, dtype=F64)
    sd = 0.3 + 2.0 * torch.rand(classes, dim, generator=g, dtype=F64)
    labels = torch.arange(classes).repeat_interleave(per_class)
    z = mu[labels] + sd[labels] * torch.randn(len(labels), dim, generator=g, dtype=F64)
    rot = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=F64))[0]
    return z @ rot.T, labels, rot


def _class_gmm(x: torch.Tensor, labels: torch.Tensor) -> DiagGmmSet:
    """One diagonal Gaussian per class (pdf), estimated from the frames."""
    k = int(labels.max()) + 1
    means = torch.stack([x[labels == c].mean(0) for c in range(k)])
    var = torch.stack([x[labels == c].var(0, correction=0) for c in range(k)])
    return DiagGmmSet(means[:, None], var[:, None], torch.zeros(k, 1, dtype=F64))


def test_mllt_objective_never_decreases_and_finds_the_rotation() -> None:
    x, labels, rot = _rotated_gmm_data()
    gmm = _class_gmm(x, labels)
    stats = MlltStats.zeros(x.shape[1])
    stats.accumulate(x, component_posteriors(gmm, x, labels))
    res = estimate_mllt(stats)
    steps = torch.diff(torch.tensor(res.objective))
    assert bool((steps >= -1e-10).all()), res.objective
    assert res.improvement > 0.1
    # A R is a scaled signed permutation: each row has one dominant entry
    ar = (res.matrix @ rot).abs()
    top = ar.max(1).values
    assert float((ar.sum(1) - top).max() / top.min()) < 0.15, ar
    # one more pass of MLLT on the transformed features finds (almost) nothing more
    y = x @ res.matrix.T
    gmm2 = _class_gmm(y, labels)
    stats2 = MlltStats.zeros(x.shape[1])
    stats2.accumulate(y, component_posteriors(gmm2, y, labels))
    assert estimate_mllt(stats2).improvement < 1e-2 * res.improvement
    # the objective at the identity is the diagonal model's (-D/2 with ML variances)
    assert mllt_objective(torch.eye(6, dtype=F64), stats) == pytest.approx(-3.0)


def test_mllt_stats_per_gaussian_equal_per_pair() -> None:
    """Scatter per Gaussian then divided by its variances (the fast path, when the Gaussians'
    ids are known) gives the statistics of every (frame, Gaussian) pair."""
    x, labels, _ = _rotated_gmm_data(seed=5, per_class=200)
    gmm = _class_gmm(x, labels)
    gmm.mixup(20, torch.full((10,), 200.0))                   # 2 components per pdf
    gauss = component_posteriors(gmm, x, labels)
    fast, slow = MlltStats.zeros(6), MlltStats.zeros(6)
    fast.accumulate(x, gauss, max_batch_mb=0.1)
    slow.accumulate(x, FrameGaussians(gauss.post, gauss.means, gauss.vars), max_batch_mb=0.1)
    assert fast.beta == pytest.approx(slow.beta)
    assert torch.allclose(fast.G, slow.G, rtol=1e-10, atol=1e-8)


def test_mllt_composes_with_lda() -> None:
    x, labels, _, _ = _lda_data(seed=3, per_class=300)
    lda_stats = LdaStats.zeros(8, 24)
    lda_stats.accumulate(x, labels)
    lda = estimate_lda(lda_stats, dim=6, remove_offset=True).matrix
    y = apply_transform(x, lda)
    gmm = _class_gmm(y, labels)
    stats = MlltStats.zeros(6)
    stats.accumulate(y, component_posteriors(gmm, y, labels))
    mllt = estimate_mllt(stats).matrix
    both = compose(mllt, lda)
    assert both.shape == (6, 25)
    assert torch.allclose(apply_transform(x, both), apply_transform(y, mllt), atol=1e-9)


def test_mllt_refuses_too_little_count() -> None:
    stats = MlltStats.zeros(6)
    x, labels, _ = _rotated_gmm_data(per_class=3)
    short = x[labels < 1]
    stats.accumulate(short, component_posteriors(_class_gmm(x, labels), short,
                                                 labels[labels < 1]))
    with pytest.raises(AsrtrainError, match="3.0 frames of count for 6-dim"):
        estimate_mllt(stats)


# ---------------------------------------------------------------------------- fMLLR
def _fmllr_setup(seed: int, dim: int = 5, comps: int = 12, frames: int = 20000):
    """A GMM (one pdf), frames sampled from it with their component ids, and a random affine
    distortion ``y = A0 x + b0``."""
    g = _gen(seed)
    means = 3.0 * torch.randn(1, comps, dim, generator=g, dtype=F64)
    var = 0.3 + torch.rand(1, comps, dim, generator=g, dtype=F64)
    gmm = DiagGmmSet(means, var, torch.full((1, comps), -math.log(comps), dtype=F64))
    comp = torch.randint(0, comps, (frames,), generator=g)
    x = means[0, comp] + var[0, comp].sqrt() * torch.randn(frames, dim, generator=g, dtype=F64)
    a0 = torch.eye(dim, dtype=F64) + 0.3 * torch.randn(dim, dim, generator=g, dtype=F64)
    b0 = torch.randn(dim, generator=g, dtype=F64)
    return gmm, x, comp, a0, b0


def test_fmllr_recovers_the_inverse_of_a_known_affine_transform() -> None:
    """Two speakers with different distortions, estimated in one batch; the Gaussian
    posteriors are the components the frames were drawn from."""
    stats = FmllrStats.zeros(2, 5)
    truth = []
    for spk in range(2):
        gmm, x, comp, a0, b0 = _fmllr_setup(seed=10 + spk)
        y = x @ a0.T + b0
        post = torch.nn.functional.one_hot(comp, 12).to(F64)
        m, v = gmm.means[0].expand(len(x), -1, -1), gmm.vars[0].expand(len(x), -1, -1)
        stats.accumulate(y, FrameGaussians(post, m, v), spk)   # each speaker its own GMM
        inv = torch.linalg.inv(a0)
        truth.append(torch.cat([inv, -(inv @ b0)[:, None]], dim=1))
    res = estimate_fmllr(stats, speakers=["spkA", "spkB"])
    for spk in range(2):
        err = (res.transforms[spk] - truth[spk]).abs().max()
        assert float(err) < 0.05, (spk, err)
    objective = torch.stack(res.objective)                   # [iters + 1, S]
    assert bool((torch.diff(objective, dim=0) >= -1e-9).all())
    assert bool((res.improvement > 0).all())
    assert res.fallback == []


@pytest.mark.cuda
def test_fmllr_statistics_on_cuda_give_the_cpu_transforms(device: torch.device) -> None:
    """Statistics kept on a GPU (``align.passes.<pass>.device=cuda``): the row sweeps run on
    the host, and the transforms and objectives come back on the statistics' device, equal to
    the CPU's."""
    stats = FmllrStats.zeros(2, 5)
    for spk in range(2):
        gmm, x, comp, a0, b0 = _fmllr_setup(seed=10 + spk)
        post = torch.nn.functional.one_hot(comp, 12).to(F64)
        m, v = gmm.means[0].expand(len(x), -1, -1), gmm.vars[0].expand(len(x), -1, -1)
        stats.accumulate(x @ a0.T + b0, FrameGaussians(post, m, v), spk)
    on_gpu = FmllrStats(stats.beta.to(device), stats.K.to(device), stats.G.to(device))
    cpu, gpu = estimate_fmllr(stats), estimate_fmllr(on_gpu)
    assert gpu.transforms.device.type == device.type
    assert gpu.objective[-1].device.type == device.type
    assert float((gpu.transforms.cpu() - cpu.transforms).abs().max()) < 1e-9
    assert float((gpu.improvement.cpu() - cpu.improvement).abs().max()) < 1e-9


def test_fmllr_from_model_posteriors_as_train_sat_does() -> None:
    """Posteriors from the model on the currently transformed features, a transform estimated
    on those, composed with the old one (``train_sat.sh``'s loop): converges to the inverse."""
    gmm, x, comp, a0, b0 = _fmllr_setup(seed=3, frames=15000)
    y = x @ (0.5 * a0 + 0.5 * torch.eye(5, dtype=F64)).T + 0.5 * b0   # a milder distortion
    pdf = torch.zeros(len(y), dtype=torch.long)
    w = torch.cat([torch.eye(5, dtype=F64), torch.zeros(5, 1, dtype=F64)], dim=1)[None]
    gains = []
    for _ in range(4):
        cur = apply_transform(y, w[0])
        stats = FmllrStats.zeros(1, 5)
        stats.accumulate(cur, component_posteriors(gmm, cur, pdf), 0)
        res = estimate_fmllr(stats)
        gains.append(float(res.improvement[0]))
        w = compose_affine(res.transforms, w)
    a = 0.5 * a0 + 0.5 * torch.eye(5, dtype=F64)
    inv = torch.linalg.inv(a)
    truth = torch.cat([inv, -(inv @ (0.5 * b0))[:, None]], dim=1)
    assert float((w[0] - truth).abs().max()) < 0.05
    assert gains[0] > 0.1 and gains[-1] < 0.01 * gains[0], gains


def test_fmllr_min_count_falls_back_to_identity_and_errors_name_speakers() -> None:
    gmm, x, comp, a0, b0 = _fmllr_setup(seed=4, frames=2000)
    stats = FmllrStats.zeros(2, 5)
    pdf = torch.zeros(len(x), dtype=torch.long)
    stats.accumulate(x[:30], component_posteriors(gmm, x[:30], pdf[:30]), 0)
    stats.accumulate(x[30:], component_posteriors(gmm, x[30:], pdf[30:]), 1)
    res = estimate_fmllr(stats, min_count=50.0)
    assert res.fallback == [0]
    assert torch.equal(res.transforms[0, :, :5], torch.eye(5, dtype=F64))
    assert float(res.transforms[0, :, 5].abs().max()) == 0.0
    flat = x[30:].clone()
    flat[:, 2] = 1.0                                           # a constant dimension
    bad = FmllrStats.zeros(2, 5)
    bad.accumulate(flat, component_posteriors(gmm, flat, pdf[30:]), 1)
    with pytest.raises(AsrtrainError, match="singular statistics for 1 speaker.*: sw02001-B"):
        estimate_fmllr(bad, speakers=["sw02001-A", "sw02001-B"])
    with pytest.raises(AsrtrainError, match="speaker index 5 out of range"):
        bad.accumulate(x[:2], component_posteriors(gmm, x[:2], pdf[:2]), 5)


# ---------------------------------------------------------------------------- i-vectors
D, C, R = 6, 8, 6


@pytest.fixture(scope="module")
def ivector_model():
    """A UBM and a 6-dim extractor trained on 120 utterances whose component means move with a
    3-dim speaker factor (the structure an i-vector extractor models)."""
    g = _gen(20)
    means = 4.0 * torch.randn(C, D, generator=g, dtype=F64)
    var = 0.5 + torch.rand(C, D, generator=g, dtype=F64)
    basis = torch.randn(C, D, 3, generator=g, dtype=F64)
    utts, factors = [], torch.randn(120, 3, generator=g, dtype=F64)
    for y in factors:
        c = torch.randint(0, C, (250,), generator=g)
        utts.append(means[c] + basis[c] @ y
                    + var[c].sqrt() * torch.randn(250, D, generator=g, dtype=F64))
    ubm, ubm_hist = train_diag_ubm(torch.cat(utts), num_gauss=C, num_iters_init=8, num_iters=3)
    cfg = ExtractorConfig(ivector_dim=R, num_iters=6, gaussian_min_count=10.0,
                          posteriors=PosteriorOptions(posterior_scale=1.0))
    ext, hist = train_ivector_extractor(ubm, utts, cfg)
    return ubm, ubm_hist, ext, hist, cfg, utts, factors


def test_diag_ubm_training_mixes_up_and_improves(ivector_model) -> None:
    ubm, hist, *_ = ivector_model
    assert ubm.num_gauss == C
    assert [h["num_gauss"] for h in hist][0] == C // 2
    lls = [h["loglike_per_frame"] for h in hist]
    assert lls[-1] > lls[0] + 0.5
    assert torch.allclose(ubm.log_weights.exp().sum(), torch.tensor(1.0, dtype=F64))
    with pytest.raises(AsrtrainError, match="10 frames; need at least 16"):
        train_diag_ubm(torch.zeros(10, D, dtype=F64), num_gauss=C)


def test_ivector_extractor_em_improves_and_normalises_the_prior(ivector_model) -> None:
    ubm, _, ext, hist, cfg, utts, factors = ivector_model
    assert hist[0]["auxf_impr_per_frame"] > 0.1
    assert all(h["auxf_impr_per_frame"] > -1e-9 for h in hist), hist
    assert hist[-1]["auxf_impr_per_frame"] < 0.05 * hist[0]["auxf_impr_per_frame"]
    # the prior update makes the training i-vectors' distribution N(0, I): mean of the
    # posterior means ~ 0, their scatter plus the mean posterior covariance ~ I (the last M step
    # came after the prior was fitted, and moves dimension 0, the mean's, most: 0.89 here)
    stats = utterance_stats(ubm, utts, cfg.posteriors)[0]
    ivecs = ext.extract(stats)
    _, cov = ext.posterior(stats)
    assert ivecs.shape == (len(utts), R)
    assert float(ivecs.mean(0).abs().max()) < 0.05
    second = ivecs.T @ ivecs / len(ivecs) + cov.mean(0)
    assert torch.allclose(second, torch.eye(R, dtype=F64), atol=0.15), second
    assert torch.allclose(second[1:, 1:], torch.eye(R - 1, dtype=F64), atol=0.02), second
    # the i-vectors carry the utterances' speaker factors: a linear map recovers them
    design = torch.cat([ivecs, torch.ones(len(ivecs), 1, dtype=F64)], dim=1)
    fit = design @ torch.linalg.lstsq(design, factors).solution
    r2 = 1 - ((factors - fit) ** 2).sum(0) / ((factors - factors.mean(0)) ** 2).sum(0)
    assert float(r2.min()) > 0.95, r2


def _utterance_from_ubm(ubm, frames: int, seed: int):
    g = _gen(seed)
    comp = torch.multinomial(ubm.log_weights.exp(), frames, replacement=True, generator=g)
    noise = torch.randn(frames, ubm.dim, generator=g, dtype=F64)
    return comp, ubm.means[comp] + ubm.vars[comp].sqrt() * noise


def test_ivector_of_a_mean_shift_points_along_the_shift(ivector_model) -> None:
    """An utterance from the UBM, then the same frames with component ``c``'s frames moved by
    ``delta``: the i-vector moves along ``L^-1 gamma_c M_c^T Sigma_c^-1 delta`` (the closed
    form when the posteriors stay put), and twice the shift moves it twice as far along the
    same direction."""
    ubm, _, ext, _, cfg, _, _ = ivector_model
    comp, x = _utterance_from_ubm(ubm, 3000, seed=22)
    c = int(torch.argmax(ubm.log_weights))
    delta = 0.3 * ubm.vars[c].sqrt() * torch.tensor([1.0, -1.0, 0.5, 0.0, 1.0, -0.5], dtype=F64)
    shifted = [x + k * delta * (comp == c)[:, None].to(F64) for k in (0, 1, 2)]
    stats = utterance_stats(ubm, shifted, cfg.posteriors)[0]
    ivecs = ext.extract(stats)
    moved1, moved2 = ivecs[1] - ivecs[0], ivecs[2] - ivecs[0]
    _, cov = ext.posterior(stats)
    sm, _ = ext.derived()
    expected = cov[1] @ (stats.gamma[1, c] * (sm[c].T @ delta))
    cos = torch.nn.functional.cosine_similarity
    assert float(cos(moved1, expected, dim=0)) > 0.95
    assert float(cos(moved1, moved2, dim=0)) > 0.95
    ratio = float(moved2.norm() / moved1.norm())
    assert 1.7 < ratio < 2.3, ratio


def test_online_ivectors_equal_batch_at_the_last_frame(ivector_model) -> None:
    ubm, _, ext, _, cfg, _, _ = ivector_model
    _, x = _utterance_from_ubm(ubm, 401, seed=23)             # rows at frames 0, 10, .., 400
    rows = extract_online(ext, ubm, x, cfg.posteriors, period=10)
    assert rows.shape == (41, R)
    batch = ext.extract(utterance_stats(ubm, [x], cfg.posteriors)[0])[0]
    assert torch.allclose(rows[-1], batch, atol=1e-9)
    # row k is the batch i-vector of the frames 0 .. 10 k
    mid = ext.extract(utterance_stats(ubm, [x[:201]], cfg.posteriors)[0])[0]
    assert torch.allclose(rows[20], mid, atol=1e-9)
    # the first i-vector has seen frame 0 only
    first = ext.extract(utterance_stats(ubm, [x[:1]], cfg.posteriors)[0])[0]
    assert torch.allclose(rows[0], first, atol=1e-9)
    assert not torch.allclose(rows[0], rows[1], atol=1e-3)
    per_frame = frame_ivectors(rows, len(x), period=10)
    assert per_frame.shape == (401, R) and torch.equal(per_frame[19], rows[1])


def test_speaker_ivectors_pool_their_utterances(ivector_model) -> None:
    ubm, _, ext, _, cfg, _, _ = ivector_model
    _, x = _utterance_from_ubm(ubm, 900, seed=24)
    parts = [x[:300], x[300:500], x[500:], x[:100]]
    stats = utterance_stats(ubm, parts, cfg.posteriors)[0]
    spk = stats.sum_by(torch.tensor([0, 0, 0, 1]), 2)
    whole = utterance_stats(ubm, [x, x[:100]], cfg.posteriors)[0]
    assert torch.allclose(ext.extract(spk), ext.extract(whole), atol=1e-9)
    with pytest.raises(AsrtrainError, match="group id 2 out of range"):
        stats.sum_by(torch.tensor([0, 1, 2, 0]), 2)


def test_extractor_training_streamed_in_blocks_equals_cached(ivector_model) -> None:
    ubm, _, _, _, cfg, utts, _ = ivector_model
    small = ExtractorConfig(ivector_dim=R, num_iters=2, gaussian_min_count=10.0,
                            posteriors=cfg.posteriors)
    cached, hist_a = train_ivector_extractor(ubm, utts, small)
    calls = []

    def blocks():
        calls.append(1)
        return (utts[i:i + 25] for i in range(0, len(utts), 25))

    streamed, hist_b = train_ivector_extractor(ubm, blocks, small)
    assert len(calls) == 2
    assert torch.allclose(cached.M, streamed.M, atol=1e-8)
    assert torch.allclose(cached.sigma_inv, streamed.sigma_inv, atol=1e-8)
    assert hist_a[-1]["auxf_per_frame"] == pytest.approx(hist_b[-1]["auxf_per_frame"])
    with pytest.raises(AsrtrainError, match="total count of 50 .* need at least 80"):
        train_ivector_extractor(ubm, [utts[0][:50]], small)


def test_bad_shapes_and_ids_are_named() -> None:
    gmm, x, _, _, _ = _fmllr_setup(seed=6, frames=10)
    with pytest.raises(AsrtrainError, match=r"features of shape \(10, 4\) do not match the "
                                            "GMM's dim 5"):
        component_posteriors(gmm, x[:, :4], torch.zeros(10, dtype=torch.long))
    with pytest.raises(AsrtrainError, match="10 frames but 9 pdf ids"):
        component_posteriors(gmm, x, torch.zeros(9, dtype=torch.long))
    with pytest.raises(AsrtrainError, match="pdf id 3 out of range"):
        component_posteriors(gmm, x, torch.full((10,), 3, dtype=torch.long))
    with pytest.raises(AsrtrainError, match=r"a \(4, 7\) matrix cannot apply to 5-dim"):
        apply_transform(x, torch.zeros(4, 7, dtype=F64))
    with pytest.raises(AsrtrainError, match=r"must be \[frames, dim\]"):
        splice_frames(torch.zeros(3))
    with pytest.raises(AsrtrainError, match="1 speaker names for stats of 2"):
        estimate_fmllr(FmllrStats.zeros(2, 5), speakers=["a"])


def test_bench_runs_and_reports_time_and_memory() -> None:
    out = subprocess.run([sys.executable, "-m", "asrtrain.adapt.bench", "--frames", "4000",
                          "--dim", "5", "--gauss", "8", "--ivector-dim", "4", "--iters", "2"],
                         capture_output=True, text=True, timeout=600, check=True)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["gauss"] == 8 and rec["iters"] == 2 and len(rec["auxf_per_frame"]) == 2
    assert rec["auxf_per_frame"][1] > rec["auxf_per_frame"][0]
    assert rec["extractor_peak_rss_mb"] >= rec["rss_before_extractor_mb"] > 0
