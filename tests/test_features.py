import json
import shutil
import subprocess
from pathlib import Path

import forked_cli
import kaldiio
import numpy as np
import pytest
import soundfile

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir
from asrtrain.features import (
    FeatureOptions,
    add_deltas,
    apply_cmvn,
    compute_features,
    extract,
    finish_pass,
)


def test_fbank_arks_scp_cmvn(datadir: Path, tmp_path: Path) -> None:
    figures = compute_features(datadir, tmp_path / "feats", FeatureOptions(), nj=2)
    d = DataDir.read(datadir)
    assert set(d.feats) == set(d.utts) and set(d.cmvn) == {"spk0", "spk1"}
    for utt, path in d.wav.items():
        n = soundfile.info(path.split()[0]).frames
        m = kaldiio.load_mat(d.feats[utt])
        # Kaldi's snip-edges framing: 1 + (samples - 200) // 80 frames at 8 kHz.
        assert m.shape == (1 + (n - 200) // 80, 40) == (d.utt2num_frames[utt], 40)
    for spk, utts in d.spk2utt.items():
        stats = kaldiio.load_mat(d.cmvn[spk])
        mats = [kaldiio.load_mat(d.feats[u]) for u in utts]
        assert stats.shape == (2, 41)
        assert stats[0, -1] == sum(m.shape[0] for m in mats)
        np.testing.assert_allclose(stats[0, :-1], sum(m.sum(0) for m in mats), rtol=1e-4)
        normed = np.concatenate([apply_cmvn(m, stats, norm_vars=True) for m in mats])
        np.testing.assert_allclose(normed.mean(0), 0, atol=1e-3)
        np.testing.assert_allclose(normed.std(0), 1, atol=1e-2)
    assert figures["frames"] == sum(d.utt2num_frames.values())


def test_parallel_jobs_give_the_same_features(datadir: Path, tmp_path: Path) -> None:
    compute_features(datadir, tmp_path / "f1", FeatureOptions(kind="mfcc", num_mel_bins=23), nj=1)
    one = {u: kaldiio.load_mat(s) for u, s in DataDir.read(datadir).feats.items()}
    # audio_per_worker=0: two worker processes however little audio there is
    figures = compute_features(datadir, tmp_path / "f2", FeatureOptions(kind="mfcc",
                                                                        num_mel_bins=23),
                               nj=2, audio_per_worker=0)
    assert figures["workers"] == 2
    two = {u: kaldiio.load_mat(s) for u, s in DataDir.read(datadir).feats.items()}
    assert one.keys() == two.keys()
    for u in one:
        assert one[u].shape[1] == 13
        np.testing.assert_array_equal(one[u], two[u])


def test_deltas_match_kaldi_filters() -> None:
    x = np.arange(10, dtype=np.float32)[:, None] ** 2  # a quadratic: delta is linear
    y = add_deltas(x, order=2)
    assert y.shape == (10, 3)
    t = 5  # away from the edges: delta of t^2 is 2t, delta-delta is 2 (Kaldi's filters)
    assert y[t, 1] == pytest.approx(2 * t) and y[t, 2] == pytest.approx(2.0)
    # At the edges Kaldi clamps frame indices: frame 0 sees frames 0,0,0,1,2.
    assert y[0, 1] == pytest.approx((-2 * 0 - 1 * 0 + 1 * 1 + 2 * 4) / 10)


def test_wrong_sample_rate_names_recording(datadir: Path, tmp_path: Path) -> None:
    d = DataDir.read(datadir)
    path = d.wav["spk1-utt2"].split()[0]
    x, _ = soundfile.read(path, dtype="int16")
    soundfile.write(path, x, 16000)
    with pytest.raises(AsrtrainError, match="spk1-utt2 has sample rate 16000"):
        compute_features(datadir, tmp_path / "feats", FeatureOptions(), nj=1)
    assert not (datadir / "feats.scp").exists()


def test_missing_audio_names_file(datadir: Path, tmp_path: Path) -> None:
    d = DataDir.read(datadir)
    Path(d.wav["spk0-utt1"]).unlink()
    with pytest.raises(AsrtrainError, match="spk0-utt1.wav: audio file not found"):
        compute_features(datadir, tmp_path / "feats", FeatureOptions(), nj=1)


def test_dither_is_repeatable() -> None:
    x = np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 100
    a, b = extract(x, FeatureOptions(), seed=7), extract(x, FeatureOptions(), seed=7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, extract(x, FeatureOptions(), seed=8))


MFCC = FeatureOptions(kind="mfcc", num_mel_bins=23)
REPO = Path(__file__).resolve().parents[1]


def _feats(data_dir: Path) -> dict[str, np.ndarray]:
    return {u: kaldiio.load_mat(s) for u, s in DataDir.read(data_dir).feats.items()}


def _copy(datadir: Path, dest: Path) -> Path:
    DataDir.read(datadir).copy_without_features(dest, source=datadir)
    return dest


def test_small_sets_are_done_in_this_process(datadir: Path, tmp_path: Path) -> None:
    figures = compute_features(datadir, tmp_path / "feats", FeatureOptions(), nj=2)
    assert figures["workers"] == 1 and 0 < figures["audio_seconds"] < 3600


def test_one_audio_pass_gives_both_kinds_as_two_passes_do(datadir: Path, tmp_path: Path) -> None:
    alone_fbank = _copy(datadir, tmp_path / "alone")
    alone_mfcc = _copy(datadir, tmp_path / "alone_mfcc")
    compute_features(alone_fbank, tmp_path / "f1", FeatureOptions(), nj=1)
    compute_features(alone_mfcc, tmp_path / "f1", MFCC, nj=1)

    shared = _copy(datadir, tmp_path / "dirs" / "set")
    compute_features(shared, tmp_path / "f2", FeatureOptions(), nj=2, audio_per_worker=0,
                     extra=[(MFCC, "_mfcc")])
    copy = _copy(shared, tmp_path / "dirs" / "set_mfcc")
    # another MFCC config than the pass made: nothing is written, the caller must compute
    assert not finish_pass(shared, copy, tmp_path / "f2", FeatureOptions(kind="mfcc",
                                                                          dither=0.5))
    assert not (copy / "feats.scp").exists()
    assert finish_pass(shared, copy, tmp_path / "f2", MFCC)
    for one, two in ((alone_fbank, shared), (alone_mfcc, copy)):
        a, b = _feats(one), _feats(two)
        assert a.keys() == b.keys() == set(DataDir.read(datadir).utts)
        for u in a:
            np.testing.assert_array_equal(a[u], b[u])
        np.testing.assert_array_equal(
            kaldiio.load_mat(DataDir.read(one).cmvn["spk0"]),
            kaldiio.load_mat(DataDir.read(two).cmvn["spk0"]))


def test_a_pass_of_other_audio_is_not_reused(datadir: Path, tmp_path: Path) -> None:
    compute_features(datadir, tmp_path / "feats", FeatureOptions(), nj=1, extra=[(MFCC, "_m")])
    copy = _copy(datadir, tmp_path / f"{datadir.name}_m")
    assert finish_pass(datadir, copy, tmp_path / "feats", MFCC)
    d = DataDir.read(datadir)
    d.subset(d.utts[1:]).write(datadir)   # one utterance fewer: other audio
    assert not finish_pass(datadir, copy, tmp_path / "feats", MFCC)


def _asrtrain(*args: str) -> subprocess.CompletedProcess:
    proc = forked_cli.run("run", "recipes/tiny", *args, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_mfcc_stage_reuses_the_features_pass_and_redoes_its_own(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    run = ("stages=[prepare,features,mfcc]", f"exp_dir={exp}", "nj=2")
    first = _asrtrain(*run)
    assert "mfcc too" in first.stderr
    assert "from the features stage's audio pass" in first.stderr
    assert "decoding the audio" not in first.stderr
    shared = _feats(exp / "data" / "eval2000_mfcc")
    assert next(iter(shared.values())).shape[1] == 13
    assert set(shared) == set(DataDir.read(exp / "data" / "eval2000").utts)

    # an MFCC option: the mfcc stage alone reruns, and decodes the audio for its new config
    second = _asrtrain(*run, "mfcc.dither=0.0")
    assert "stage features      already done" in second.stderr
    assert "decoding the audio" in second.stderr
    changed = _feats(exp / "data" / "eval2000_mfcc")
    assert changed.keys() == shared.keys()
    assert not any(np.array_equal(changed[u], shared[u]) for u in shared)

    # back to the first config, mfcc alone: the first pass's arks (never overwritten) serve
    third = _asrtrain(*run, "--stage", "mfcc", "--to", "mfcc")
    assert "from the features stage's audio pass" in third.stderr
    again = _feats(exp / "data" / "eval2000_mfcc")
    for u in shared:
        np.testing.assert_array_equal(again[u], shared[u])
    record = json.loads((exp / ".done" / "mfcc").read_text())
    assert record["config"]["mfcc"]["dither"] == 1.0
    shutil.rmtree(exp / "feats")
    # its arks gone, --stage mfcc --force decodes the audio itself
    fourth = _asrtrain(*run, "--stage", "mfcc", "--to", "mfcc", "--force")
    assert "decoding the audio" in fourth.stderr
    for u, m in _feats(exp / "data" / "eval2000_mfcc").items():
        np.testing.assert_array_equal(m, shared[u])
