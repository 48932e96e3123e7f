"""Stage ``ivectors`` on the tiny corpus through the real CLI: online i-vectors of every set (files,
shapes, Kaldi's row count), resumable inner steps, a config change retrains what it must, the
import of Kaldi's ``ivector_online.scp``, and a property of speaker i-vectors on held-out speakers.
The estimators' closed forms are tests/test_adapt.py's; the online rules are checked here too."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import forked_cli
import kaldiio
import numpy as np
import pytest
import torch
from conftest import copy_exp
from omegaconf import OmegaConf
from test_e2e import SMALL, asrtrain

from asrtrain.adapt import ivector_sets as iv
from asrtrain.adapt.ivector import (
    DiagUbm,
    IvectorExtractor,
    PosteriorOptions,
    carry_state,
    extract_online,
    online_ivectors,
    online_ivectors_batch,
    online_stats,
    utterance_stats,
)
from asrtrain.adapt.ivector_sets import pseudo_speakers
from asrtrain.data.datadir import DataDir
from asrtrain.features.reader import ivector_rows as expected_rows
from asrtrain.jobs import JobConfig
from asrtrain.recipe import needs_ivectors

SETS = ("train_nodup", "train_dev", "eval2000")
STAGE = ["--stage", "ivectors", "--to", "ivectors"]


def run(exp: Path, *args: str) -> subprocess.CompletedProcess:
    return asrtrain("run", "recipes/tiny", f"exp_dir={exp}", *SMALL, *args, timeout=900)


def fails(exp: Path, *args: str) -> str:
    """The run's one error line (exit 1, no traceback)."""
    proc = forked_cli.run("run", "recipes/tiny",
                          f"exp_dir={exp}", *SMALL, *args, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("asrtrain: error: "), proc.stderr[-3000:]
    return line


@pytest.fixture(scope="module")
def features_exp(tiny_tri1: Path, tmp_path_factory) -> Path:
    """The tiny recipe's data and features (stages prepare .. features): a copy of conftest's
    tiny_tri1 (its GMM passes unused here), found done up to features."""
    exp = copy_exp(tiny_tri1, tmp_path_factory.mktemp("iv") / "exp")
    assert "nothing to do" in run(exp, "--to", "features").stderr
    return exp


@pytest.fixture(scope="module")
def exp(features_exp: Path, tmp_path_factory) -> Path:
    """A copy of ``features_exp`` with the ivectors stage run (the tiny ivector config)."""
    exp = tmp_path_factory.mktemp("iv_run") / "exp"
    shutil.copytree(features_exp, exp)
    run(exp, *STAGE)
    return exp


def num_frames(exp: Path, name: str) -> dict[str, int]:
    return DataDir.read(exp / "data" / name).utt2num_frames


def read_ivectors(exp: Path, name: str) -> dict[str, np.ndarray]:
    return dict(kaldiio.load_scp(str(exp / "ivectors" / name / "ivector_online.scp")))


# ---------------------------------------------------------------------------- the stage
def test_every_set_has_online_ivectors_with_ceil_rows(exp: Path) -> None:
    for name in SETS:
        out = exp / "ivectors" / name
        assert (out / "ivector_period").read_text() == "10\n"
        frames, ivs = num_frames(exp, name), read_ivectors(exp, name)
        assert sorted(ivs) == sorted(frames)
        for utt, m in ivs.items():
            assert m.dtype == np.float32 and m.shape == (math.ceil(frames[utt] / 10), 100), utt
            assert np.isfinite(m).all()
    info = OmegaConf.load(exp / "ivectors" / "extractor" / "info.json")
    for part in ("ubm", "extractor"):
        assert info[part].seconds > 0 and info[part].frames_per_s > 0
    assert info.ubm.num_gauss == 64 and info.extractor.ivector_dim == 100
    assert info.extractor.peak_rss_mb >= info.extractor.rss_before_mb > 0
    assert sorted(info.extraction) == sorted(SETS)
    for name in SETS:     # the recipe's nj=2: two jobs, each its ark, one scp over both
        assert info.extraction[name].jobs == 2
        arks = sorted(p.name for p in (exp / "ivectors" / name).glob("*.ark"))
        assert arks == ["ivector_online.1.ark", "ivector_online.2.ark"], arks
        assert not list((exp / "ivectors" / name).glob("ivector_online.*.scp"))
    assert info.ubm.jobs == 2 and info.extractor.jobs == 2
    assert (exp / ".done" / "ivectors").is_file()
    log = (exp / "log" / "ivectors.log").read_text()
    assert "i-vector extractor: {'iter': 4" in log      # per-iteration figures: stage log only


def test_a_rerun_skips_and_a_killed_extraction_resumes_at_its_set(exp: Path) -> None:
    assert "nothing to do" in run(exp, *STAGE).stderr
    # how the work is launched is not in the digest: other nj, threads, batch size rerun nothing
    assert "nothing to do" in run(exp, *STAGE, "nj=3", "threads=2", "cmd=local",
                                  "ivector.online.batch_frames=5000").stderr
    ark = exp / "ivectors" / "train_nodup" / "ivector_online.1.ark"
    before = ark.stat().st_mtime_ns
    # as a run killed during eval2000's extraction leaves it: no stage record, no set marker
    (exp / ".done" / "ivectors").unlink()
    (exp / "ivectors" / "eval2000" / ".done").unlink()
    out = run(exp, *STAGE).stderr
    for what in ("diag UBM", "extractor", "train_nodup extraction", "train_dev extraction"):
        assert f"ivectors {what}: done already, skipped" in out
    assert "ivectors eval2000 extracted" in out and ark.stat().st_mtime_ns == before


def test_a_config_change_redoes_what_depends_on_it(exp: Path) -> None:
    old = read_ivectors(exp, "train_dev")
    out = run(exp, *STAGE, "ivector.online.utts_per_spk_max=1").stderr
    assert "config changed: ivector.online.utts_per_spk_max: 2 -> 1" in out
    assert "diag UBM: done already" in out and "extractor: done already" in out
    new = read_ivectors(exp, "train_dev")
    spk2utt = DataDir.read(exp / "data" / "train_dev").spk2utt
    first, second = next(utts for utts in spk2utt.values() if len(utts) > 1)[:2]
    assert np.array_equal(old[first], new[first])          # first of a pair: no state before
    assert not np.allclose(old[second], new[second])       # second: no longer carries the first
    out = run(exp, *STAGE, "ivector.online.utts_per_spk_max=1",
              "ivector.extractor.num_iters=3").stderr
    assert "diag UBM: done already" in out and "extractor: done already" not in out
    assert "ivectors extractor:" in out
    assert not np.allclose(new[first], read_ivectors(exp, "train_dev")[first])


def test_speakers_differ_more_than_their_utterances(exp: Path) -> None:
    """Whole-utterance i-vectors (last row, no state carried) of the held-out sets' speakers:
    two utterances of one speaker are closer than utterances of two speakers."""
    run(exp, *STAGE, "ivector.online.utts_per_spk_max=1")
    for name in ("train_dev", "eval2000"):
        data = DataDir.read(exp / "data" / name)
        ivs = read_ivectors(exp, name)
        x = torch.tensor(np.stack([ivs[u][-1] for u in data.utts]), dtype=torch.float64)
        spk = [data.utt2spk[u] for u in data.utts]
        same = torch.tensor([[a == b for b in spk] for a in spk])
        same &= ~torch.eye(len(spk), dtype=torch.bool)
        dist = torch.cdist(x, x)
        diff = ~same & ~torch.eye(len(spk), dtype=torch.bool)
        within, between = float(dist[same].mean()), float(dist[diff].mean())
        assert within < 0.8 * between, (name, within, between)


# ---------------------------------------------------------------------------- Kaldi import
def write_kaldi_dir(src: dict[str, np.ndarray], where: Path, period: int = 10) -> Path:
    """A dir as extract_ivectors_online.sh leaves it: ark + scp (absolute paths, kaldiio's
    writer as copy-feats) and ivector_period."""
    where.mkdir(parents=True)
    with kaldiio.WriteHelper(f"ark,scp:{where / 'ivector_online.1.ark'},"
                             f"{where / 'ivector_online.scp'}") as w:
        for utt, m in src.items():
            w(utt, m)
    (where / "ivector_period").write_text(f"{period}\n")
    return where


@pytest.fixture(scope="module")
def kaldi(exp: Path, features_exp: Path, tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """A fresh exp (features only) and Kaldi-style dirs made from ``exp``'s i-vectors."""
    root = tmp_path_factory.mktemp("kaldi")
    dirs = {n: write_kaldi_dir(read_ivectors(exp, n), root / f"ivectors_{n}") for n in SETS}
    fresh = root / "exp"
    shutil.copytree(features_exp, fresh)
    return fresh, dirs


def kaldi_args(dirs: dict[str, Path]) -> list[str]:
    return ["ivector.source=kaldi",
            "ivector.kaldi_dirs={" + ", ".join(f"{n}: {d}" for n, d in dirs.items()) + "}"]


def test_kaldi_ivectors_are_imported(kaldi, exp: Path) -> None:
    fresh, dirs = kaldi
    out = run(fresh, *STAGE, *kaldi_args(dirs)).stderr
    assert "ivectors eval2000: imported 43 utterances' 100-dim i-vectors (period 10)" in out
    for name in SETS:
        mine, theirs = read_ivectors(fresh, name), read_ivectors(exp, name)
        assert sorted(mine) == sorted(theirs)
        assert all(np.array_equal(mine[u], theirs[u]) for u in mine)
        assert (fresh / "ivectors" / name / "ivector_period").read_text() == "10\n"


def test_kaldi_import_names_a_missing_utterance(kaldi, tmp_path: Path) -> None:
    fresh, dirs = kaldi
    scp = dirs["eval2000"] / "ivector_online.scp"
    lines = scp.read_text().splitlines()
    bad = tmp_path / "ivectors_eval2000"
    bad.mkdir()
    (bad / "ivector_online.scp").write_text("\n".join(lines[:5] + lines[6:]) + "\n")
    (bad / "ivector_period").write_text("10\n")
    line = fails(fresh, *STAGE, *kaldi_args({**dirs, "eval2000": bad}))
    assert f"{bad / 'ivector_online.scp'}: no i-vectors for utterance {lines[5].split()[0]}" \
        in line


def test_kaldi_import_names_wrong_rows(kaldi, tmp_path: Path, exp: Path) -> None:
    fresh, dirs = kaldi
    src = read_ivectors(exp, "train_dev")
    utt = sorted(src)[3]
    src[utt] = np.concatenate([src[utt], src[utt][-1:]])     # floor(T / 10) + 1 when T % 10
    bad = write_kaldi_dir(src, tmp_path / "ivectors_train_dev")
    line = fails(fresh, *STAGE, *kaldi_args({**dirs, "train_dev": bad}))
    frames = num_frames(exp, "train_dev")[utt]
    assert f"{bad / 'ivector_online.scp'}: utterance {utt} has {len(src[utt])} i-vector rows" \
        in line and f"need ceil({frames}/10) = {math.ceil(frames / 10)}" in line


def test_kaldi_import_needs_a_dir_for_every_set(kaldi) -> None:
    fresh, dirs = kaldi
    line = fails(fresh, *STAGE, *kaldi_args({n: d for n, d in dirs.items() if n != "eval2000"}))
    assert "ivector.kaldi_dirs has no directory for set eval2000" in line


# ---------------------------------------------------------------------------- the online rules
def small_model(dim: int = 3, gauss: int = 4, rank: int = 5) -> tuple[DiagUbm, IvectorExtractor]:
    g = torch.Generator().manual_seed(0)
    ubm = DiagUbm(torch.full((gauss,), -math.log(gauss), dtype=torch.float64),
                  3 * torch.randn(gauss, dim, generator=g, dtype=torch.float64),
                  torch.ones(gauss, dim, dtype=torch.float64))
    return ubm, IvectorExtractor.init_from_ubm(ubm, rank)


@pytest.mark.parametrize("frames, rows", [(1, 1), (10, 1), (11, 2), (20, 2), (21, 3)])
def test_online_rows_are_ceil_and_row_k_has_seen_frames_up_to_k_period(frames, rows) -> None:
    ubm, ext = small_model()
    x = torch.randn(frames, 3, generator=torch.Generator().manual_seed(frames),
                    dtype=torch.float64)
    opts = PosteriorOptions(posterior_scale=1.0)
    out = extract_online(ext, ubm, x, opts, period=10)
    assert out.shape == (rows, 5) == (expected_rows(frames, 10), 5)
    last = ext.extract(utterance_stats(ubm, [x[:10 * (rows - 1) + 1]], opts)[0])[0]
    assert torch.allclose(out[-1], last, atol=1e-9)


@pytest.mark.parametrize("frames", [1, 10, 20, 451])
def test_the_sparse_online_estimator_equals_the_dense_statistics(frames) -> None:
    """``online_ivectors`` (per-row increments of the selected components, as Kaldi's online
    estimator) gives ``extract_online``'s rows and the last row's statistics, with a carried
    state too."""
    ubm, ext = small_model(dim=4, gauss=16, rank=6)
    g = torch.Generator().manual_seed(frames)
    before = 3 * torch.randn(55, 4, generator=g, dtype=torch.float64)
    opts = PosteriorOptions(num_gselect=3, posterior_scale=0.1)
    state = carry_state(online_stats(ubm, before, opts, 10), 1000, 0.1)
    x = 3 * torch.randn(frames, 4, generator=g, dtype=torch.float64)
    rows, last = online_ivectors(ext, ubm, x, opts, 10, state)
    assert torch.allclose(rows, extract_online(ext, ubm, x, opts, 10, state), atol=1e-10)
    dense = online_stats(ubm, x, opts, 10, state)
    assert torch.allclose(last.gamma, dense.gamma[-1:]) and torch.allclose(last.X, dense.X[-1:])


def test_carried_state_is_the_last_row_scaled_to_max_remembered_frames() -> None:
    ubm, ext = small_model()
    x = torch.randn(300, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    opts = PosteriorOptions(posterior_scale=0.5)
    stats = online_stats(ubm, x, opts, period=10)
    kept = carry_state(stats, max_remembered_frames=1000, posterior_scale=0.5)
    assert torch.equal(kept.gamma, stats.gamma[-1:]) and torch.equal(kept.X, stats.X[-1:])
    small = carry_state(stats, max_remembered_frames=100, posterior_scale=0.5)
    assert math.isclose(float(small.gamma.sum()), 50.0)
    assert torch.allclose(small.X * float(stats.gamma[-1].sum()) / 50.0, stats.X[-1:])
    # the next utterance starts from the state: its first row sees the state and its frame 0
    y = x[:25]
    carried = online_stats(ubm, y, opts, 10, initial=kept)
    assert torch.allclose(carried.gamma, online_stats(ubm, y, opts, 10).gamma + kept.gamma)


def test_pseudo_speakers_cut_each_speaker_into_runs() -> None:
    spk2utt = {"a": ["a1", "a2", "a3"], "b": ["b1"]}
    assert pseudo_speakers(spk2utt, 2) == [["a1", "a2"], ["a3"], ["b1"]]
    assert pseudo_speakers(spk2utt, 0) == [["a1", "a2", "a3"], ["b1"]]


def test_stages_auto_runs_ivectors_when_the_hybrid_input_appends_them() -> None:
    def cfg(**kw):
        return OmegaConf.create({"systems": ["ctc", "gmm", "hybrid"], **kw})
    assert not needs_ivectors(cfg(features={"kind": "fbank"}))
    assert needs_ivectors(cfg(features={"append": ["fmllr", "ivector"]}))
    assert needs_ivectors(cfg(features={}, hybrid={"features": {"append": ["ivector"]}}))
    assert not needs_ivectors(cfg(features={"append": ["ivector"]},
                                  hybrid={"features": {"append": ["fmllr"]}}))
    assert not needs_ivectors(OmegaConf.create({"systems": ["ctc"],
                                                "features": {"append": ["ivector"]}}))


def test_a_stage_without_the_group_or_a_bad_value_is_one_line(features_exp: Path) -> None:
    line = fails(features_exp, *STAGE, "ivector.online.period=0")
    assert "ivector.online.period=0: expected an integer >= 1" in line
    line = fails(features_exp, *STAGE, "ivector.source=hmm")
    assert "ivector.source='hmm': expected one of train, kaldi" in line
    line = fails(features_exp, *STAGE, "~ivector")
    assert "stage ivectors needs the ivector config group" in line


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_the_batched_online_estimator_equals_one_utterance_at_a_time(dtype, tol) -> None:
    """``online_ivectors_batch`` on several pseudo-speakers at once gives what
    ``online_ivectors`` + ``carry_state`` give one utterance after another (float32: to its
    precision), and an utterance's rows do not depend on what else is in the batch."""
    ubm, ext = small_model(dim=4, gauss=16, rank=6)
    g = torch.Generator().manual_seed(3)
    lengths = [1, 10, 20, 451, 33, 57, 300, 11]
    follows = [False, True, False, True, True, False, True, True]
    feats = [3 * torch.randn(n, 4, generator=g, dtype=torch.float64) for n in lengths]
    opts = PosteriorOptions(num_gselect=3, posterior_scale=0.1)
    out = online_ivectors_batch(ext, ubm, feats, follows, opts, 10, 50.0, dtype=dtype)
    state = None
    for x, f, rows in zip(feats, follows, out, strict=True):
        ref, last = online_ivectors(ext, ubm, x, opts, 10, state if f else None)
        state = carry_state(last, 50.0, opts.posterior_scale)
        assert rows.dtype == dtype and rows.shape == ref.shape
        assert float((rows.double() - ref).abs().max()) <= tol * max(1.0, float(ref.abs().max()))
    alone = online_ivectors_batch(ext, ubm, feats[5:], follows[5:], opts, 10, 50.0, dtype=dtype)
    for a, b in zip(alone, out[5:], strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------- jobs
UBM_OPTS = {"num_gauss": 32, "num_utts": 100, "num_frames": 20000, "num_iters_init": 4,
            "num_iters": 2, "num_gselect": 10, "min_gaussian_weight": 1e-4, "seed": 0}
IE_OPTS = {"num_utts": 150, "ivector_dim": 20, "num_iters": 2, "num_gselect": 5,
           "min_post": 0.025, "posterior_scale": 0.1, "gaussian_min_count": 10,
           "variance_floor_factor": 0.1, "seed": 0}
ONLINE = {"period": 10, "utts_per_spk_max": 2, "max_remembered_frames": 1000,
          "batch_frames": 3000}


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-6) -> bool:
    return float((a - b).abs().max()) <= rel * float(b.abs().max())


def test_models_and_ivectors_do_not_depend_on_nj(features_exp: Path, tmp_path: Path) -> None:
    """The UBM, the extractor and the online i-vectors with nj=1, 2, 3 (jobs in processes for
    2 and 3): the same to 1e-6 relative (the jobs' statistics are summed in job order; an
    utterance's i-vectors depend on its pseudo-speaker only, so they are identical)."""
    train = iv.SetFrames(features_exp / "data" / "train_nodup")
    dev = iv.SetFrames(features_exp / "data" / "train_dev")
    post = PosteriorOptions(5, 0.025, 0.1)
    got = []
    for nj in (1, 2, 3):
        jobs = JobConfig(nj=nj)
        ubm, ubm_info = iv.train_ubm(train, UBM_OPTS, 2, jobs, "cpu")
        ext, ie_info = iv.train_extractor(train, ubm, IE_OPTS, 2, jobs, "cpu")
        out = tmp_path / f"nj{nj}"
        info = iv.extract_set(dev, ubm, ext, ONLINE, post, out, jobs)
        assert ubm_info["jobs"] == ie_info["jobs"] == info["jobs"] == nj
        assert ubm_info["utterances"] == 100 and ie_info["utterances"] == 150
        ivs = dict(kaldiio.load_scp(str(out / "ivector_online.scp")))
        assert sorted(ivs) == sorted(dev.utts)
        assert sorted(p.name for p in out.glob("*.ark")) == [
            f"ivector_online.{j}.ark" for j in range(1, nj + 1)]
        got.append((ubm, ext, ivs))
    ubm1, ext1, ivs1 = got[0]
    for ubm, ext, ivs in got[1:]:
        assert ubm.num_gauss == ubm1.num_gauss
        for a, b in ((ubm.log_weights, ubm1.log_weights), (ubm.means, ubm1.means),
                     (ubm.vars, ubm1.vars), (ext.M, ext1.M), (ext.sigma_inv, ext1.sigma_inv)):
            assert _close(a, b)
        for utt, m in ivs.items():
            ref = ivs1[utt]
            assert np.abs(m - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max()), utt


def test_a_job_runs_in_a_fresh_interpreter(features_exp: Path, tmp_path: Path) -> None:
    """As ``cmd: slurm`` runs it: the job function and its argument pickled, run by a new
    Python that imports nothing of ours first; the statistics equal those of this process."""
    import pickle

    train = iv.SetFrames(features_exp / "data" / "train_nodup")
    ubm, _ = iv.train_ubm(train, {**UBM_OPTS, "num_iters": 0}, 2, JobConfig(), "cpu")
    job = iv.UbmAccJob(train.source, train.utts[:40], 2, ubm, ubm, 10)
    (tmp_path / "job.pkl").write_bytes(pickle.dumps((iv.ubm_acc_job, job)))
    code = ("import pickle, sys; fn, arg = pickle.load(open(sys.argv[1], 'rb')); "
            "pickle.dump(fn(arg), open(sys.argv[2], 'wb'))")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "job.pkl"),
                    str(tmp_path / "out.pkl")], check=True, cwd=tmp_path, timeout=300)
    theirs, _ = pickle.loads((tmp_path / "out.pkl").read_bytes())
    mine, _ = iv.ubm_acc_job(job)
    assert theirs.frames == mine.frames > 0
    for a, b in ((theirs.occ, mine.occ), (theirs.sx, mine.sx), (theirs.sxx, mine.sxx)):
        assert _close(a, b, 1e-12)


def test_the_stage_runs_at_the_recipes_threads() -> None:
    """The stage's own process runs at ``threads`` (its in-process jobs with it), not at
    torch's default, and gets its count back afterwards."""
    from asrtrain.stages.ivectors import _threads

    before = torch.get_num_threads()
    with _threads(1):
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    assert torch.get_num_threads() == before


def test_subsets_are_evenly_spaced_and_splits_keep_speakers() -> None:
    utts = [f"u{i:03d}" for i in range(10)]
    assert iv.subset_utterances(utts, 5) == ["u000", "u002", "u004", "u006", "u008"]
    assert iv.subset_utterances(utts, 0) == utts == iv.subset_utterances(utts, 20)
