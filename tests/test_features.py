from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir
from asrtrain.features import FeatureOptions, add_deltas, apply_cmvn, compute_features, extract


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
    compute_features(datadir, tmp_path / "f2", FeatureOptions(kind="mfcc", num_mel_bins=23), nj=2)
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
