"""Shared fixtures: small real data dirs with real WAV audio, written per test; the device.

Device: the suite runs on the CPU, also on a machine with a GPU. Unless ``ASRTRAIN_TEST_DEVICE``
is ``cuda``, this file hides the GPUs (``CUDA_VISIBLE_DEVICES=''``) before anything imports
torch, so every test, every trainer it runs in-process and every learner or CLI process it starts
sees no CUDA and trains on the CPU: the same results on every machine, and no CUDA state (driver,
autograd's device threads) in the pytest process that a fork could copy. Tests that need a GPU
are marked ``@pytest.mark.cuda`` and take the ``device`` fixture; they run only in a session of
their own, ``ASRTRAIN_TEST_DEVICE=cuda pytest -m cuda`` (a CUDA session runs no other test), and
are skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

#: ``cpu`` (the default: GPUs hidden) or ``cuda`` (only the tests marked ``cuda`` run).
TEST_DEVICE = os.environ.get("ASRTRAIN_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_initialized():
            raise RuntimeError("tests/conftest.py: CUDA was initialised before the CPU pin")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

REPO = Path(__file__).resolve().parents[1]
#: The developers' folder beside a checkout (design notes, fixture originals). A user's clone has
#: none, so no test may read it: every fixture a test reads is in tests/fixtures/, with its
#: provenance. The audit hook below makes a read there an error in every test of this process,
#: so CI, which has the folder beside its clone, proves the suite does not need it.
OUTSIDE = REPO.parent / "shared"


def _no_reads_outside(event: str, args: tuple) -> None:
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.startswith(str(OUTSIDE) + os.sep) or os.path.abspath(path).startswith(
                str(OUTSIDE) + os.sep):
            raise PermissionError(f"{path}: tests must not read {OUTSIDE} (a user's clone has "
                                  "no such folder): copy the file into tests/fixtures/ with its "
                                  "provenance")


sys.addaudithook(_no_reads_outside)
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


def pytest_configure(config: pytest.Config) -> None:
    if TEST_DEVICE not in ("cpu", "cuda"):
        raise pytest.UsageError(f"ASRTRAIN_TEST_DEVICE={TEST_DEVICE!r}: use cpu or cuda")
    config.addinivalue_line(
        "markers", "cuda: needs a GPU; runs only with ASRTRAIN_TEST_DEVICE=cuda (pytest -m cuda)")


def _gpus() -> int:
    """GPUs torch sees (NVML first: the count does not mark the process against forking)."""
    import torch

    return torch.cuda.device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_DEVICE == "cpu":
        skip = pytest.mark.skip(reason="needs a GPU: the suite pins the CPU; run "
                                "ASRTRAIN_TEST_DEVICE=cuda pytest -m cuda")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
        return
    gpus = _gpus() if any("cuda" in item.keywords for item in items) else 0
    for item in items:
        if "cuda" not in item.keywords:
            item.add_marker(pytest.mark.skip(
                reason="ASRTRAIN_TEST_DEVICE=cuda runs only the tests marked cuda; the others "
                       "run in the default (CPU-pinned) session"))
        elif gpus == 0:
            item.add_marker(pytest.mark.skip(
                reason="ASRTRAIN_TEST_DEVICE=cuda but torch sees no CUDA device"))


@pytest.fixture
def device(request: pytest.FixtureRequest):
    """The device of this test: ``cuda`` for a test marked cuda, else the CPU."""
    import torch

    return torch.device("cuda" if "cuda" in request.keywords else "cpu")
