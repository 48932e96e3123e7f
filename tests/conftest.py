"""Shared fixtures: small real data dirs with real WAV audio, written per test."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

SHARED = Path(__file__).resolve().parents[2] / "shared"
REPO = Path(__file__).resolve().parents[1]
# bench/synthetic.py, the synthetic learner of the distributed tests and the benchmarks
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))


def write_datadir(root: Path, n_speakers: int = 2, utts_per_speaker: int = 3,
                  sample_rate: int = 8000, seed: int = 0) -> Path:
    """A Kaldi data dir of one WAV file per utterance (tones and noise), with text."""
    rng = np.random.default_rng(seed)
    words = ["hello", "world", "yes", "no", "maybe", "sure", "right", "okay"]
    d = root / "data"
    (root / "wav").mkdir(parents=True, exist_ok=True)
    d.mkdir(parents=True, exist_ok=True)
    wav, text, utt2spk = [], [], []
    for s in range(n_speakers):
        spk = f"spk{s}"
        for u in range(utts_per_speaker):
            utt = f"{spk}-utt{u}"
            n = int(sample_rate * (0.6 + 0.4 * rng.random()))
            t = np.arange(n) / sample_rate
            tone = np.sin(2 * np.pi * (200 + 100 * s + 50 * u) * t)
            x = 3000 * tone + 300 * rng.standard_normal(n)
            path = root / "wav" / f"{utt}.wav"
            soundfile.write(path, x.astype(np.int16), sample_rate, subtype="PCM_16")
            wav.append(f"{utt} {path}")
            text.append(f"{utt} " + " ".join(rng.choice(words, size=3)))
            utt2spk.append(f"{utt} {spk}")
    (d / "wav.scp").write_text("\n".join(sorted(wav)) + "\n")
    (d / "text").write_text("\n".join(sorted(text)) + "\n")
    (d / "utt2spk").write_text("\n".join(sorted(utt2spk)) + "\n")
    spk2utt = {}
    for line in sorted(utt2spk):
        u, s = line.split()
        spk2utt.setdefault(s, []).append(u)
    (d / "spk2utt").write_text("".join(f"{s} {' '.join(us)}\n" for s, us in spk2utt.items()))
    return d


@pytest.fixture
def datadir(tmp_path: Path) -> Path:
    return write_datadir(tmp_path)
