"""The one audio reader: a wav.scp value in, samples out (int16 scale, float32).

A wav.scp value is either a file path (WAV, FLAC, ... via soundfile; NIST SPHERE, including the
shorten-compressed SPHERE of Switchboard/Fisher/CallHome, via soundfile or ``desphere``) or a Kaldi
pipe ``<command> |`` whose standard output is a WAV file.

For the two-channel LDC SPHERE files the corpus preparers write one wav.scp line per conversation
side, as Kaldi's ``sph2pipe -f wav -p -c 1 x.sph |`` does, with the tools installed here::

    sw02001-A /venv/bin/sph2wav /ldc/sw02001.sph - | /usr/bin/sox -t wav - -t wav - remix 1 |

(``sph2wav`` is desphere's command; ``sox ... remix N`` keeps channel N.) Kaldi binaries, kaldiio
and :func:`read_recording` all read that form.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import soundfile

from asrtrain import AsrtrainError

if TYPE_CHECKING:  # annotations only: datadir reaches this module through the corpora
    from asrtrain.data.datadir import DataDir

#: How far a segment may run past the end of its recording before it is an error, in seconds
#: (Kaldi's extract-segments --max-overshoot default).
MAX_OVERSHOOT = 0.5

_SPHERE_MAGIC = b"NIST_1A\n"


def _tool_env() -> dict[str, str]:
    """The environment for wav.scp pipes: the venv's bin (sph2wav) on PATH even if not activated."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _decode_wav_bytes(data: bytes, what: str) -> tuple[np.ndarray, int]:
    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError) as e:
        raise AsrtrainError(f"{what}: output is not audio soundfile can read ({e})") from None
    return samples, rate


@dataclass(frozen=True)
class AudioHeader:
    """What an audio file's header declares: rate, channels and (when it says) its length."""

    rate: int
    channels: int
    frames: int | None


#: WAV data sizes that writers use when they cannot seek back (a pipe): the length is unknown.
_STREAMING_SIZES = (0, 0xFFFFFFFF)
_STREAMING_MIN = 0x7FFF0000


#: The largest SPHERE header read (real ones are 1024 bytes; a garbage size must not fill memory).
_MAX_SPHERE_HEADER = 1 << 20


def _is_sphere(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(_SPHERE_MAGIC)) == _SPHERE_MAGIC


def _sphere_header(path: Path):
    import desphere

    with open(path, "rb") as f:
        head = f.read(1024)
        parts = head.split(b"\n", 2)
        if len(parts) > 1 and parts[1].strip().isdigit() and int(parts[1]) > len(head):
            head += f.read(min(int(parts[1]), _MAX_SPHERE_HEADER) - len(head))
    try:
        # desphere checks the fields too: sample_count, sample_rate, channel_count and
        # sample_n_bytes present, integers, and the last three at least 1.
        return desphere.SphereHeader.parse(head)
    except desphere.DesphereError as e:
        raise AsrtrainError(f"{path}: bad NIST SPHERE header ({e})") from None


def _truncated(path: Path, declared: int, held: int) -> AsrtrainError:
    return AsrtrainError(f"{path}: header says {declared} samples, file holds {held} (truncated)")


def _is_shorten(header) -> bool:
    return "shorten" in str(header.sample_coding).lower()


def _check_sphere(path: Path):
    """A SPHERE header, and for uncompressed codings its sample count against the file size
    (shorten-compressed files are checked once decoded, in :func:`_read_sphere`)."""
    header = _sphere_header(path)
    frame_bytes = header.channel_count * header.sample_n_bytes
    if not _is_shorten(header) and frame_bytes > 0:
        held = (path.stat().st_size - header.header_size) // frame_bytes
        if held < header.sample_count:
            raise _truncated(path, header.sample_count, held)
    return header


def _wav_declared_frames(path: Path) -> tuple[int, int] | None:
    """``(frames the 'data' chunk declares, frames the file holds)`` of a RIFF WAV file, or None
    when it is not one or its writer could not say (streaming sizes)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        riff = f.read(12)
        if len(riff) < 12 or riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
            return None
        block_align = 0
        while True:
            chunk = f.read(8)
            if len(chunk) < 8:
                return None
            name, length = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if name == b"fmt ":
                fmt = f.read(length + (length & 1))
                block_align = struct.unpack("<H", fmt[12:14])[0] if len(fmt) >= 14 else 0
            elif name == b"data":
                if block_align == 0 or length in _STREAMING_SIZES or length >= _STREAMING_MIN:
                    return None
                return length // block_align, (size - f.tell()) // block_align
            else:
                f.seek(length + (length & 1), os.SEEK_CUR)


def check_audio_file(path: str | Path) -> AudioHeader:
    """The header of the plain audio file ``path``, checked before any sample is decoded.

    A missing file, a header that cannot be parsed and a file shorter than its header says
    (SPHERE ``sample_count``, a WAV ``data`` chunk) are errors naming the file: a truncated copy
    would otherwise surface later as a segment "past the end" of its recording.
    """
    path = Path(path)
    if path.is_dir():
        raise AsrtrainError(f"{path}: is a directory, not an audio file")
    if not path.is_file():
        raise AsrtrainError(f"{path}: audio file not found")
    if _is_sphere(path):
        header = _check_sphere(path)
        return AudioHeader(header.sample_rate, header.channel_count, header.sample_count)
    try:
        info = soundfile.info(str(path))
    except (soundfile.LibsndfileError, RuntimeError) as e:
        raise AsrtrainError(f"{path}: not an audio file soundfile can read ({e})") from None
    frames = _wav_declared_frames(path)
    if frames is not None and frames[1] < frames[0]:
        raise _truncated(path, *frames)
    return AudioHeader(int(info.samplerate), int(info.channels),
                       frames[0] if frames is not None else None)


def _read_sphere(path: Path) -> tuple[np.ndarray, int]:
    import desphere

    header = _check_sphere(path)
    if not _is_shorten(header):
        # PCM, mu-law and a-law SPHERE: libsndfile decodes these directly (and faster).
        samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
        return samples, rate
    try:
        wav = desphere.transcode_bytes(path.read_bytes())
    except desphere.DesphereError as e:
        raise AsrtrainError(f"{path}: cannot decode shorten-compressed SPHERE ({e})") from None
    samples, rate = _decode_wav_bytes(wav, str(path))
    if samples.shape[0] < header.sample_count:
        raise _truncated(path, header.sample_count, samples.shape[0])
    return samples, rate


def _read_file(path: Path) -> tuple[np.ndarray, int]:
    """A plain audio file (its header checked first: a truncated file is named as such)."""
    check_audio_file(path)
    if _is_sphere(path):
        return _read_sphere(path)
    try:
        return soundfile.read(path, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError) as e:
        raise AsrtrainError(f"{path}: not an audio file soundfile can read ({e})") from None


def _sphere_side(command: str) -> tuple[Path, int] | None:
    """``(sph, channel)`` if ``command`` is exactly what :func:`sphere_side_command` writes."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if (len(words) == 13 and Path(words[0]).name == "sph2wav" and words[2:4] == ["-", "|"]
            and Path(words[4]).name == "sox"
            and words[5:12] == ["-t", "wav", "-", "-t", "wav", "-", "remix"]
            and words[12].isdigit() and int(words[12]) >= 1):
        return Path(words[1]), int(words[12])
    return None


# The last SPHERE file decoded in-process: sides A and B of a conversation are two recordings
# read one after the other, and decoding (shorten especially) is the costly part.
_last_sphere: tuple[tuple, np.ndarray, int] | None = None


def _read_sphere_cached(path: Path) -> tuple[np.ndarray, int]:
    global _last_sphere
    if not path.is_file():
        raise AsrtrainError(f"{path}: audio file not found")
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if _last_sphere is None or _last_sphere[0] != key:
        samples, rate = _read_sphere(path)
        _last_sphere = (key, samples, rate)
    return _last_sphere[1], _last_sphere[2]


def run_pipe(command: str) -> tuple[np.ndarray, int]:
    """Run a wav.scp command and read the WAV it writes: ``(samples [samples, channels], rate)``.

    soundfile's float scale (1.0 = 32768).
    """
    proc = subprocess.run(command, shell=True, capture_output=True, env=_tool_env())
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace").strip()
        raise AsrtrainError(f"wav.scp command failed with exit status {proc.returncode}: "
                            f"{command}\n{stderr}")
    if not proc.stdout:
        raise AsrtrainError(f"wav.scp command wrote no audio: {command}")
    return _decode_wav_bytes(proc.stdout, f"wav.scp command {command!r}")


def read_recording(spec: str) -> tuple[np.ndarray, int]:
    """Read a wav.scp value; return ``(samples [channels, samples] float32, int16 scale, rate)``.

    ``spec`` is a file path or a pipe ``<command> |``. A failing command raises
    :class:`AsrtrainError` naming the command and quoting its stderr. The SPHERE side form the
    corpus preparers write (``sph2wav x.sph - | sox ... remix N |``) is decoded in-process, with
    the same result as running it (tests check both) but without two processes per side and
    without decoding a conversation twice for its two sides.
    """
    spec = spec.strip()
    if spec.endswith("|"):
        command = spec[:-1].strip()
        side = _sphere_side(command)
        if side is not None:
            both, rate = _read_sphere_cached(side[0])
            if side[1] > both.shape[1]:
                raise AsrtrainError(f"{side[0]}: has {both.shape[1]} channels, wav.scp asks for "
                                    f"channel {side[1]} ({command})")
            samples = both[:, side[1] - 1:side[1]]
        else:
            samples, rate = run_pipe(command)
    else:
        samples, rate = _read_file(Path(spec))
    # soundfile scales int16 by 1/32768, so this gives back the exact integers for 16-bit audio.
    return np.ascontiguousarray(samples.T * 32768.0, dtype=np.float32), int(rate)


def sphere_side_command(sph: str | Path, channel: int) -> str:
    """The wav.scp value reading channel ``channel`` (1 = side A, 2 = side B) of a SPHERE file."""
    sph2wav = Path(sys.executable).parent / "sph2wav"
    sph2wav_cmd = str(sph2wav) if sph2wav.exists() else shutil.which("sph2wav")
    if sph2wav_cmd is None:
        raise AsrtrainError("the sph2wav command (from the desphere package) is not installed; "
                            "pip install desphere")
    sox = shutil.which("sox")
    if sox is None:
        raise AsrtrainError("the sox command is not installed (needed to pick a SPHERE channel "
                            "in wav.scp); apt-get install sox")
    return (f"{shlex.quote(sph2wav_cmd)} {shlex.quote(str(sph))} - | "
            f"{shlex.quote(sox)} -t wav - -t wav - remix {int(channel)} |")


def _pick_channel(samples: np.ndarray, reco: str, datadir: DataDir) -> np.ndarray:
    if samples.shape[0] == 1:
        return samples[0]
    side = datadir.reco2file_and_channel.get(reco, (None, None))[1]
    index = {"A": 0, "B": 1, "1": 0, "2": 1}.get(side) if side is not None else None
    if index is None or index >= samples.shape[0]:
        raise AsrtrainError(
            f"{datadir.at('wav.scp', reco)}: recording {reco} has {samples.shape[0]} channels; "
            f"make its wav.scp entry "
            f"produce one (e.g. '<file> ... | sox -t wav - -t wav - remix 1 |') or give its "
            f"channel (A/B) in reco2file_and_channel")
    return samples[index]


def iter_utterances(datadir: DataDir, sample_rate: int,
                    resample: bool = False) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(utt_id, samples)`` (1-D float32, int16 scale) for every utterance of ``datadir``.

    Each recording is read once and its segments are cut from it (Kaldi's extract-segments:
    sample indices rounded, an end up to 0.5 s past the recording is clipped). A recording whose
    rate is not ``sample_rate`` is an error, unless ``resample`` asks to convert it.
    """
    by_reco: dict[str, list[tuple[str, float, float | None]]] = {}
    for utt in datadir.utts:
        if datadir.segments:
            seg = datadir.segments.get(utt)
            if seg is None:
                raise AsrtrainError(f"{datadir.at('utt2spk', utt)}: utterance {utt} has no "
                                    "segment")
            by_reco.setdefault(seg.recording, []).append((utt, seg.start, seg.end))
        else:
            by_reco.setdefault(utt, []).append((utt, 0.0, None))
    for reco in sorted(by_reco):
        if reco not in datadir.wav:
            raise AsrtrainError(f"{datadir.at('wav.scp', reco)}: recording {reco} is missing")
        try:
            samples, rate = read_recording(datadir.wav[reco])
        except AsrtrainError as e:
            raise AsrtrainError(f"{datadir.at('wav.scp', reco)}: recording {reco}: {e}") from None
        channel = _pick_channel(samples, reco, datadir)
        if rate != sample_rate:
            if not resample:
                raise AsrtrainError(f"{datadir.at('wav.scp', reco)}: recording {reco} has "
                                    f"sample rate {rate} Hz, expected {sample_rate} Hz "
                                    "(resample it, or set corpus.resample=true)")
            import torch
            import torchaudio.functional

            channel = torchaudio.functional.resample(
                torch.from_numpy(channel), rate, sample_rate).numpy()
            rate = sample_rate
        n = channel.shape[0]
        for utt, start, end in by_reco[reco]:
            if end is None:
                yield utt, channel
                continue
            first = int(round(start * rate))
            last = int(round(end * rate))
            if last > n:
                if end - n / rate > MAX_OVERSHOOT:
                    raise AsrtrainError(
                        f"{datadir.at('segments', utt)}: utterance {utt} ends at {end:.2f} s, "
                        f"after the end of recording {reco} ({n / rate:.2f} s)")
                last = n
            if first >= last:
                raise AsrtrainError(f"{datadir.at('segments', utt)}: utterance {utt} "
                                    f"({start:.2f}-{end:.2f} s) is empty in recording {reco} "
                                    f"({n / rate:.2f} s)")
            yield utt, channel[first:last]
