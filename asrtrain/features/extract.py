"""Feature extraction for a data dir: Kaldi fbank/MFCC via torchaudio.compliance.kaldi.

Writes ``feats.scp``, ``utt2num_frames`` and per-speaker ``cmvn.scp`` (Kaldi's
``compute-cmvn-stats --spk2utt``) into the data dir; the matrices go to arks under ``feats_dir``.
Utterances are split over ``nj`` processes by recording, so each recording is read once.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import kaldiio
import numpy as np
import torch
from tqdm import tqdm

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, read_table, write_table
from asrtrain.features.transform import cmvn_stats
from asrtrain.fileio import atomic_ark

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureOptions:
    """Kaldi feature options (names as Kaldi's command-line flags, 8 kHz telephone defaults)."""

    kind: str = "fbank"          # fbank | mfcc
    sample_rate: int = 8000
    num_mel_bins: int = 40       # fbank: 40 as the IBM system; mfcc: Kaldi's 23
    num_ceps: int = 13
    frame_length: float = 25.0   # ms
    frame_shift: float = 10.0    # ms
    dither: float = 1.0          # Kaldi's default; seeded per utterance so runs repeat exactly
    low_freq: float = 20.0
    high_freq: float = 0.0
    use_energy: bool = False
    resample: bool = False       # audio at another rate is resampled, not an error (datadir)

    @classmethod
    def from_config(cls, cfg: Mapping) -> FeatureOptions:
        names = set(cls.__dataclass_fields__)
        opts = cls(**{k: v for k, v in dict(cfg).items() if k in names})
        if opts.kind not in ("fbank", "mfcc"):
            raise AsrtrainError(f"features.kind={opts.kind!r}: expected fbank or mfcc")
        return opts


def extract(samples: np.ndarray, opts: FeatureOptions, seed: int = 0) -> np.ndarray:
    """Features of one utterance (1-D samples in int16 scale) as a float32 [frames, dim] array."""
    from torchaudio.compliance import kaldi

    wav = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).unsqueeze(0)
    torch.manual_seed(seed)
    common = dict(sample_frequency=opts.sample_rate, frame_length=opts.frame_length,
                  frame_shift=opts.frame_shift, dither=opts.dither, low_freq=opts.low_freq,
                  high_freq=opts.high_freq, energy_floor=0.0)
    if opts.kind == "fbank":
        m = kaldi.fbank(wav, num_mel_bins=opts.num_mel_bins, use_energy=opts.use_energy, **common)
    else:
        m = kaldi.mfcc(wav, num_mel_bins=opts.num_mel_bins, num_ceps=opts.num_ceps,
                       use_energy=opts.use_energy, **common)
    return m.numpy()


def _utt_seed(utt: str) -> int:
    return int.from_bytes(hashlib.sha1(utt.encode()).digest()[:4], "little")


def _extract_job(args: tuple) -> tuple[int, int, float]:
    """One parallel job: extract the features of a subset of the data dir into one ark."""
    from asrtrain.data.audio import iter_utterances

    data, opts, ark, job, show_progress = args
    torch.set_num_threads(1)
    frames = 0
    t0 = time.time()
    bar = tqdm(total=len(data.utt2spk), desc=f"{opts.kind} (job {job})", unit="utt",
               disable=None if show_progress else True, leave=False)
    with atomic_ark(ark, f"{ark[:-4]}.scp") as writer:
        for utt, samples in iter_utterances(data, opts.sample_rate, resample=opts.resample):
            m = extract(samples, opts, _utt_seed(utt))
            if m.shape[0] == 0:
                raise AsrtrainError(f"utterance {utt}: too short for one frame "
                                    f"({len(samples)} samples)")
            writer(utt, m)
            frames += m.shape[0]
            bar.update()
    bar.close()
    return job, frames, time.time() - t0


def compute_features(data_dirs: str | Path | list[str | Path], feats_dir: str | Path,
                     opts: FeatureOptions, nj: int = 2) -> dict[str, float]:
    """Extract features for every utterance of one or more data dirs; return throughput figures.

    All data dirs share one pool of ``nj`` worker processes (starting one costs seconds).
    """
    dirs = [Path(d) for d in (data_dirs if isinstance(data_dirs, list) else [data_dirs])]
    feats_dir = Path(feats_dir).resolve()
    feats_dir.mkdir(parents=True, exist_ok=True)
    plans = [(d, DataDir.read(d)) for d in dirs]
    jobs = []
    for data_dir, data in plans:
        # Split by audio file, so that each job decodes each of its files once (both sides of
        # a conversation, recordings sw02001-A and sw02001-B, go to the same job).
        file_of = {u: _audio_file(data, u) for u in data.utts}
        files = sorted(set(file_of.values()))
        for j in range(max(1, min(nj, len(files)))):
            mine = set(files[j::nj])
            utts = [u for u in data.utts if file_of[u] in mine]
            ark = str(feats_dir / f"raw_{opts.kind}_{data_dir.name}.{j + 1}.ark")
            jobs.append((data.subset(utts), opts, ark, j + 1, False))
    t0 = time.time()
    workers = max(1, min(nj, len(jobs)))
    if workers == 1:
        results = [_extract_job(job) for job in jobs]
    else:
        with mp.get_context("spawn").Pool(workers) as pool:
            results = []
            with tqdm(total=len(jobs), desc=f"{opts.kind} jobs", unit="job", file=sys.stderr,
                      disable=None, leave=False) as bar:
                for r in pool.imap_unordered(_extract_job, jobs):
                    results.append(r)
                    bar.update()
            # Let the workers exit on their own: leaving the block terminates them, and a worker
            # killed so never unlinks the named semaphore tqdm made in it (resource_tracker's
            # "leaked semaphore" warning at exit).
            pool.close()
            pool.join()
    elapsed = time.time() - t0
    figures = {"utterances": 0, "frames": sum(r[1] for r in results), "seconds": elapsed,
               "frames_per_second": sum(r[1] for r in results) / max(elapsed, 1e-9)}
    for data_dir, data in plans:
        mine = [job for job in jobs if Path(job[2]).name.startswith(
            f"raw_{opts.kind}_{data_dir.name}.")]
        figures["utterances"] += _finish(data_dir, data, mine, feats_dir, opts)
    log.info("%d utterances, %d frames of %s in %.1f s (%.0f frames/s, %d processes)",
             figures["utterances"], figures["frames"], opts.kind, elapsed,
             figures["frames_per_second"], workers)
    return figures


def _audio_file(data: DataDir, utt: str) -> str:
    reco = data.segments[utt].recording if data.segments else utt
    return data.reco2file_and_channel.get(reco, (reco, ""))[0]


def _finish(data_dir: Path, data: DataDir, jobs: list, feats_dir: Path,
            opts: FeatureOptions) -> int:
    """Merge the jobs' scps of one data dir, compute its CMVN stats, write its tables."""
    name = data_dir.name
    feats: dict[str, str] = {}
    for _, _, ark, _, _ in jobs:
        feats.update(read_table(ark[:-4] + ".scp"))
    missing = set(data.utts) - set(feats)
    if missing:
        raise AsrtrainError(f"{data_dir}: no features for {len(missing)} utterances, "
                            f"e.g. {sorted(missing)[0]}")
    utt2num_frames = {}
    cmvn_ark = feats_dir / f"cmvn_{opts.kind}_{name}.ark"
    dim = 0
    # One speaker's matrices at a time: SWB-2000 does not fit in memory.
    with atomic_ark(cmvn_ark, cmvn_ark.with_suffix(".scp")) as w:
        for spk, utts in data.spk2utt.items():
            mats = [kaldiio.load_mat(feats[u]) for u in utts]
            for u, m in zip(utts, mats, strict=True):
                utt2num_frames[u] = int(m.shape[0])
                dim = int(m.shape[1])
            w(spk, cmvn_stats(mats))
    cmvn = read_table(cmvn_ark.with_suffix(".scp"))
    write_table(data_dir / "feats.scp", feats)
    write_table(data_dir / "utt2num_frames", {u: str(n) for u, n in utt2num_frames.items()})
    write_table(data_dir / "cmvn.scp", cmvn)
    log.info("%s: %d utterances, %d frames of %d-dim %s", data_dir, len(feats),
             sum(utt2num_frames.values()), dim, opts.kind)
    return len(feats)
