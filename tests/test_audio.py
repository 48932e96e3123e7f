"""asrtrain.data.audio on real SPHERE files (LDC's sph2pipe test set) and real WAV/FLAC files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import soundfile

from asrtrain import AsrtrainError
from asrtrain.data.audio import (
    _sphere_side,
    check_audio_file,
    iter_utterances,
    read_recording,
    run_pipe,
    sphere_side_command,
)
from asrtrain.data.datadir import DataDir, Segment

SPH_DIR = Path(__file__).resolve().parent / "fixtures" / "sph"   # see its README
SPH_FILES = sorted(SPH_DIR.glob("*.sph"))


def _ref(sph: Path) -> np.ndarray:
    """The reference samples [channels, samples] as sph2pipe wrote them."""
    ref, _ = soundfile.read(sph.with_name(sph.stem + ".ref.wav"), dtype="int16", always_2d=True)
    return ref.T


def test_fixtures_present():
    # Seven LDC test files: PCM (both byte orders), mu-law, a-law, 1 and 2 channels, shorten.
    assert len(SPH_FILES) == 7


@pytest.mark.parametrize("sph", SPH_FILES, ids=lambda p: p.name)
def test_sphere_path_matches_sph2pipe(sph):
    samples, rate = read_recording(str(sph))
    ref = _ref(sph)
    assert rate == 20000
    assert samples.dtype == np.float32 and samples.shape == ref.shape
    np.testing.assert_array_equal(samples, ref.astype(np.float32))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sph", SPH_FILES, ids=lambda p: p.name)
def test_sphere_side_pipe_matches_sph2pipe_and_kaldiio(sph, tmp_path):
    ref = _ref(sph)
    scp = tmp_path / "wav.scp"
    lines = [f"side{c} {sphere_side_command(sph, c)}" for c in range(1, ref.shape[0] + 1)]
    scp.write_text("\n".join(lines) + "\n")
    # The venv's bin holds sph2wav, and the form is absolute, so kaldiio needs no PATH change.
    assert Path(sys.executable).parent.as_posix() in lines[0] or shutil.which("sph2wav")
    table = kaldiio.load_scp(str(scp))
    for c in range(ref.shape[0]):
        spec = lines[c].split(" ", 1)[1]
        # read_recording decodes this form in-process ...
        assert _sphere_side(spec.rstrip("|")) == (sph, c + 1)
        samples, rate = read_recording(spec)
        assert rate == 20000 and samples.shape == (1, ref.shape[1])
        np.testing.assert_array_equal(samples[0], ref[c].astype(np.float32))
        # ... which must equal running the command, as Kaldi and kaldiio do.
        piped, rate = run_pipe(spec.rstrip("|"))
        assert rate == 20000 and piped.shape == (ref.shape[1], 1)
        np.testing.assert_array_equal(piped[:, 0] * 32768, ref[c].astype(np.float64))
        k_rate, k_samples = table[f"side{c + 1}"]
        assert k_rate == 20000
        np.testing.assert_array_equal(k_samples, ref[c])


def test_failing_pipe_names_command_and_stderr():
    with pytest.raises(AsrtrainError) as e:
        read_recording("sh -c 'echo no such conversation >&2; exit 3' |")
    assert "exit status 3" in str(e.value)
    assert "echo no such conversation" in str(e.value)
    assert "no such conversation" in str(e.value).splitlines()[-1]


def test_sphere_side_form_errors(tmp_path):
    with pytest.raises(AsrtrainError, match="gone.sph: audio file not found"):
        read_recording(sphere_side_command(tmp_path / "gone.sph", 1))
    mono = SPH_DIR / "123_1ulaw_shn.sph"
    with pytest.raises(AsrtrainError, match="has 1 channels, wav.scp asks for channel 2"):
        read_recording(sphere_side_command(mono, 2))
    # Any other command runs as a pipe.
    assert _sphere_side(f"sph2wav {mono} - | sox -t wav - -t wav - remix 1 vol 2") is None


def test_missing_and_unreadable_files_named(tmp_path):
    with pytest.raises(AsrtrainError, match="nothere.wav: audio file not found"):
        read_recording(str(tmp_path / "nothere.wav"))
    junk = tmp_path / "junk.wav"
    junk.write_text("not audio\n")
    with pytest.raises(AsrtrainError, match="junk.wav: not an audio file"):
        read_recording(str(junk))
    bad = tmp_path / "bad.sph"
    bad.write_bytes(b"NIST_1A\n   1024\nsample_rate -i 8000\nend_head\n")
    with pytest.raises(AsrtrainError, match="bad.sph"):
        read_recording(str(bad))


def test_truncated_files_named_from_their_header(tmp_path):
    """A file shorter than its header says is named as truncated, whichever way it is read."""
    wav = tmp_path / "cut.wav"
    soundfile.write(wav, _tone(8000, 8000), 8000, subtype="PCM_16")
    wav.write_bytes(wav.read_bytes()[:44 + 2 * 3000])
    with pytest.raises(AsrtrainError, match=r"cut.wav: header says 8000 samples, file holds 3000 "
                                            r"\(truncated\)"):
        read_recording(str(wav))
    alaw = tmp_path / "cut_alaw.sph"   # 2 channels, 1 byte a sample, 1024-byte header
    alaw.write_bytes((SPH_DIR / "123_2alaw.sph").read_bytes()[:1024 + 2 * 5000 + 1])
    for spec in (str(alaw), sphere_side_command(alaw, 2)):
        with pytest.raises(AsrtrainError, match=r"cut_alaw.sph: header says 37120 samples, file "
                                                r"holds 5000 \(truncated\)"):
            read_recording(spec)
    shn = tmp_path / "cut_shn.sph"
    shn.write_bytes((SPH_DIR / "123_2pcle_shn.sph").read_bytes()[:1024 + 20000])
    with pytest.raises(AsrtrainError, match=r"cut_shn.sph: cannot decode shorten-compressed "
                                            r"SPHERE \(truncated"):
        read_recording(str(shn))


def test_streaming_wav_header_is_not_truncation(tmp_path):
    """A WAV written to a pipe says 0xFFFFFFFF for its length: unknown, so not an error."""
    x = _tone(4000, 8000)
    wav = tmp_path / "stream.wav"
    soundfile.write(wav, x, 8000, subtype="PCM_16")
    raw = bytearray(wav.read_bytes())
    assert raw[36:40] == b"data"
    raw[40:44] = b"\xff\xff\xff\xff"
    wav.write_bytes(bytes(raw))
    header = check_audio_file(wav)
    assert (header.rate, header.channels, header.frames) == (8000, 1, None)
    np.testing.assert_array_equal(read_recording(str(wav))[0][0], x.astype(np.float32))


@pytest.mark.parametrize("fields, message", [
    (b"sample_count -i 10\nchannel_count -i 1\nsample_n_bytes -i 2\n",
     "missing required field\\(s\\): sample_rate"),
    (b"sample_count -i 10\nsample_rate -i 8000\nchannel_count -i 0\nsample_n_bytes -i 2\n",
     "channel_count must be >= 1, got 0"),
    (b"sample_count -i ten\nsample_rate -i 8000\nchannel_count -i 1\nsample_n_bytes -i 2\n",
     "sample_count"),
])
def test_sphere_header_fields_checked(tmp_path, fields: bytes, message: str):
    sph = tmp_path / "bad.sph"
    sph.write_bytes((b"NIST_1A\n   1024\n" + fields + b"end_head\n").ljust(1024, b" ") + bytes(20))
    with pytest.raises(AsrtrainError, match=rf"bad.sph: bad NIST SPHERE header \(.*{message}"):
        check_audio_file(sph)
    with pytest.raises(AsrtrainError, match=rf"bad.sph: bad NIST SPHERE header \(.*{message}"):
        read_recording(sphere_side_command(sph, 1))


def _tone(n: int, rate: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-20000, 20000, size=n).astype(np.int16)


def test_flac_and_wav_and_sox_pipe(tmp_path):
    x = _tone(8000, 8000)
    soundfile.write(tmp_path / "a.flac", x, 8000, subtype="PCM_16")
    soundfile.write(tmp_path / "a.wav", x, 8000, subtype="PCM_16")
    for spec in (str(tmp_path / "a.flac"), str(tmp_path / "a.wav"),
                 f"sox {tmp_path / 'a.flac'} -t wav - |"):
        samples, rate = read_recording(spec)
        assert rate == 8000
        np.testing.assert_array_equal(samples[0], x.astype(np.float32))


def _datadir(tmp_path: Path, rate: int, channels: int = 1) -> tuple[DataDir, np.ndarray]:
    x = np.stack([_tone(3 * rate, rate, seed=c) for c in range(channels)], axis=1)
    soundfile.write(tmp_path / "rec.wav", x, rate, subtype="PCM_16")
    d = DataDir()
    d.wav = {"rec": str(tmp_path / "rec.wav")}
    d.segments = {"rec_a": Segment("rec", 0.10, 1.00), "rec_b": Segment("rec", 1.50, 3.20)}
    d.utt2spk = {"rec_a": "rec", "rec_b": "rec"}
    d.text = {"rec_a": "hello", "rec_b": "world"}
    return d, x


def test_iter_utterances_cuts_segments(tmp_path):
    d, x = _datadir(tmp_path, 8000)
    got = dict(iter_utterances(d, 8000))
    assert sorted(got) == ["rec_a", "rec_b"]
    np.testing.assert_array_equal(got["rec_a"], x[800:8000, 0].astype(np.float32))
    # 3.20 s runs 0.2 s past the 3 s recording: clipped, as Kaldi's extract-segments does.
    np.testing.assert_array_equal(got["rec_b"], x[12000:24000, 0].astype(np.float32))


def test_iter_utterances_whole_recordings(tmp_path):
    x = _tone(4000, 8000)
    soundfile.write(tmp_path / "u1.wav", x, 8000, subtype="PCM_16")
    d = DataDir(wav={"spk1-u1": str(tmp_path / "u1.wav")}, text={"spk1-u1": "hi"},
                utt2spk={"spk1-u1": "spk1"})
    [(utt, samples)] = list(iter_utterances(d, 8000))
    assert utt == "spk1-u1"
    np.testing.assert_array_equal(samples, x.astype(np.float32))


def test_iter_utterances_rate_mismatch_and_resample(tmp_path):
    d, _ = _datadir(tmp_path, 16000)
    with pytest.raises(AsrtrainError, match="recording rec has sample rate 16000 Hz, expected"):
        list(iter_utterances(d, 8000))
    got = dict(iter_utterances(d, 8000, resample=True))
    assert got["rec_a"].shape == (7200,) and got["rec_a"].dtype == np.float32
    assert got["rec_b"].shape == (12000,)


def test_iter_utterances_channel_choice(tmp_path):
    d, x = _datadir(tmp_path, 8000, channels=2)
    with pytest.raises(AsrtrainError, match="recording rec has 2 channels"):
        list(iter_utterances(d, 8000))
    d.reco2file_and_channel = {"rec": ("rec", "B")}
    got = dict(iter_utterances(d, 8000))
    np.testing.assert_array_equal(got["rec_a"], x[800:8000, 1].astype(np.float32))
    # The usual form: the wav.scp entry itself picks the channel.
    d.reco2file_and_channel = {}
    d.wav = {"rec": f"sox {tmp_path / 'rec.wav'} -t wav - remix 1 |"}
    got = dict(iter_utterances(d, 8000))
    np.testing.assert_array_equal(got["rec_a"], x[800:8000, 0].astype(np.float32))


def test_iter_utterances_segment_past_end(tmp_path):
    d, _ = _datadir(tmp_path, 8000)
    d.segments["rec_b"] = Segment("rec", 1.5, 4.0)
    with pytest.raises(AsrtrainError, match="utterance rec_b ends at 4.00 s"):
        list(iter_utterances(d, 8000))


def test_sox_is_installed():
    # The SPHERE side form depends on sox; make its absence a loud failure, not a skip.
    assert shutil.which("sox")
    assert subprocess.run(["sox", "--version"], capture_output=True).returncode == 0
