"""Feature extraction for a data dir: Kaldi fbank/MFCC via torchaudio.compliance.kaldi.

Writes ``feats.scp``, ``utt2num_frames`` and per-speaker ``cmvn.scp`` (Kaldi's
``compute-cmvn-stats --spk2utt``) into the data dir; the matrices go to arks under ``feats_dir``.
Utterances are split over ``nj`` jobs by recording, so each recording is read once; the jobs run
where the recipe's ``cmd`` says (:func:`asrtrain.jobs.run_jobs`: this machine or SLURM).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, read_table, write_table
from asrtrain.features.ark import load_matrix
from asrtrain.features.transform import cmvn_stats
from asrtrain.fileio import atomic_ark, write_text
from asrtrain.jobs import JobConfig, as_job_config, run_jobs
from asrtrain.progress import Bar
from asrtrain.settings import choice, integer, number, opt, read

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureOptions:
    """Kaldi feature options (names as Kaldi's command-line flags, 8 kHz telephone defaults):
    what the extraction of one kind of features depends on."""

    kind: str = opt("fbank", choice("fbank", "mfcc"))
    sample_rate: int = opt(8000, integer(1))
    num_mel_bins: int = opt(40, integer(1))  # fbank: 40 as the IBM system; mfcc: Kaldi's 23
    num_ceps: int = opt(13, integer(1))
    frame_length: float = opt(25.0, number(0.0, low_open=True))  # ms
    frame_shift: float = opt(10.0, number(0.0, low_open=True))   # ms
    dither: float = opt(1.0, number(0.0))  # Kaldi's default; seeded per utterance: runs repeat
    low_freq: float = opt(20.0, number(0.0))
    high_freq: float = 0.0       # Kaldi's: <= 0 is an offset from the Nyquist frequency
    use_energy: bool = False
    resample: bool = False       # audio at another rate is resampled, not an error (datadir)

    @classmethod
    def from_config(cls, cfg: Mapping, section: str = "features") -> FeatureOptions:
        """The extraction options of config section ``section``: the whole section is read and
        checked (:class:`FeaturesConfig`, or :class:`MfccConfig` for ``mfcc``) by
        :func:`asrtrain.settings.read`, so an unknown key is an error naming
        ``<section>.<key>``; the options of the extraction are returned."""
        kind = MfccConfig if section == "mfcc" else FeaturesConfig
        full = read(kind, cfg, section)
        return FeatureOptions(**{f.name: getattr(full, f.name) for f in fields(FeatureOptions)})


@dataclass(frozen=True)
class FeaturesConfig(FeatureOptions):
    """A recipe's ``features`` section (and a hybrid model's own, ``hybrid.features``): the
    extraction options, and how a model reads the features: ``norm_vars`` (per-speaker CMVN
    with variance normalisation, ``apply-cmvn --norm-vars``), ``delta_order`` (0: none, 2: Δ
    and ΔΔ, ``add-deltas``) and ``append``, the per-frame streams appended after them
    (:data:`asrtrain.features.reader.APPEND_STREAMS`). Defaults: ``conf/features/fbank40.yaml``."""

    norm_vars: bool = True
    delta_order: int = opt(0, integer(0))
    append: tuple[str, ...] = ()


@dataclass(frozen=True)
class MfccConfig(FeatureOptions):
    """A recipe's ``mfcc`` section, the GMMs' features: Kaldi's ``conf/mfcc.conf`` of s5c
    (``conf/mfcc/kaldi13.yaml``)."""

    kind: str = opt("mfcc", choice("fbank", "mfcc"))
    num_mel_bins: int = opt(23, integer(1))


def window_samples(opts: FeatureOptions) -> int:
    """Samples in one analysis window (torchaudio's and Kaldi's ``WindowSize``): audio shorter
    than this has no frame."""
    return int(opts.sample_rate * opts.frame_length * 0.001)


def extract(samples: np.ndarray, opts: FeatureOptions, seed: int = 0) -> np.ndarray:
    """Features of one utterance (1-D samples in int16 scale) as a float32 [frames, dim] array;
    audio shorter than one window is an error (torchaudio would fail on an assertion)."""
    from torchaudio.compliance import kaldi

    if len(samples) < window_samples(opts):
        raise AsrtrainError(f"{len(samples)} samples, shorter than one {opts.frame_length:g} ms "
                            f"frame ({window_samples(opts)} samples at {opts.sample_rate} Hz)")
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


#: Seconds of audio that pay for one more worker process: a spawned worker spends seconds
#: importing torch and torchaudio (4.2 s measured here, 2 busy cores), while one process makes
#: the tiny corpus's 19 minutes of fbank in 2.2 s; below an hour per worker, fewer workers win.
AUDIO_PER_WORKER_S = 3600.0


@dataclass(frozen=True)
class Output:
    """One kind of features made in the audio pass: its options and the name of the data dir
    its arks are for (``raw_<kind>_<name>[.<tag>].<job>.ark``). The arks made for another
    stage's data dir carry their pass key as ``tag``: that stage may still point at the arks of
    an earlier key, which must not change under it."""

    opts: FeatureOptions
    name: str
    tag: str = ""

    def ark(self, feats_dir: Path, job: int) -> str:
        tag = f".{self.tag}" if self.tag else ""
        return str(feats_dir / f"raw_{self.opts.kind}_{self.name}{tag}.{job}.ark")

    def record(self, feats_dir: Path) -> Path:
        """The pass record of tagged arks: their key and their scps (``finish_pass``)."""
        return feats_dir / f"raw_{self.opts.kind}_{self.name}.{self.tag}.json"


@dataclass
class JobResult:
    """What one extraction job returns: frames written per output, its time, the measured
    duration of every utterance it decoded (samples / rate), and the utterances too short for
    one frame (with their sample counts), which it skipped."""

    job: int
    frames: list[int]
    seconds: float
    durations: dict[str, float]
    short: dict[str, int]


def _extract_job(args: tuple) -> JobResult:
    """One parallel job: decode the audio of a subset of the data dir once and extract every
    output's features from it, each into its own ark. An utterance shorter than one window is
    skipped (Kaldi's compute-fbank-feats warns and goes on); the caller names and drops it."""
    from asrtrain.data.audio import iter_utterances

    data, outputs, job, show_progress = args
    opts = outputs[0][0]
    window = max(window_samples(o) for o, _ in outputs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    frames = [0] * len(outputs)
    durations: dict[str, float] = {}
    short: dict[str, int] = {}
    t0 = time.time()
    bar = Bar(total=len(data.utt2spk), desc=f"{opts.kind} (job {job})", unit="utt",
               disable=None if show_progress else True, leave=False, file=sys.stderr)
    try:
        with contextlib.ExitStack() as stack:
            writers = [stack.enter_context(atomic_ark(ark, f"{ark[:-4]}.scp"))
                       for _, ark in outputs]
            for utt, samples in iter_utterances(data, opts.sample_rate, resample=opts.resample):
                durations[utt] = len(samples) / opts.sample_rate
                if len(samples) < window:
                    short[utt] = len(samples)
                    bar.update()
                    continue
                for k, ((o, _), writer) in enumerate(zip(outputs, writers, strict=True)):
                    m = extract(samples, o, _utt_seed(utt))
                    if m.shape[0] == 0:
                        raise AsrtrainError(f"utterance {utt}: too short for one frame "
                                            f"({len(samples)} samples)")
                    writer(utt, m)
                    frames[k] += m.shape[0]
                bar.update()
    finally:
        bar.close()
        torch.set_num_threads(threads)
    return JobResult(job, frames, time.time() - t0, durations, short)


def audio_seconds(data: DataDir) -> float:
    """The data dir's seconds of audio before it is decoded, to choose the number of worker
    processes: exact with segments, else from each file's header (the WAV data chunk's or the
    SPHERE sample count, the SPHERE file of a side command), else its size (8-bit 8 kHz, the
    slowest case; another piped command counts as a minute). The log states the durations
    measured from the decoded samples instead (``compute_features``)."""
    if data.segments:
        return sum(max(0.0, s.end - s.start) for s in data.segments.values())
    return sum(_header_seconds(spec) for spec in data.wav.values())


def _header_seconds(spec: str) -> float:
    from asrtrain.data.audio import _sphere_side, check_audio_file

    spec = spec.strip()
    if spec.endswith("|"):
        side = _sphere_side(spec[:-1].strip())
        if side is None:
            return 60.0
        path = side[0]
    else:
        path = Path(spec)
    try:
        header = check_audio_file(path)
    except AsrtrainError:
        return 60.0    # the features job names the problem
    if header.frames is not None and header.rate > 0:
        return header.frames / header.rate
    return path.stat().st_size / 8000


def compute_features(data_dirs: str | Path | list[str | Path], feats_dir: str | Path,
                     opts: FeatureOptions, nj: int | JobConfig = 2, *,
                     extra: Sequence[tuple[FeatureOptions, str]] = (),
                     audio_per_worker: float = AUDIO_PER_WORKER_S) -> dict[str, float]:
    """Extract features for every utterance of one or more data dirs; return throughput figures.

    ``extra``: other kinds of features made in the same audio pass, as ``(options, suffix)``:
    their arks are written for the data dir ``<name><suffix>`` with a pass record, and a later
    ``finish_pass`` turns them into that data dir's tables (so ``mfcc`` needs no second decode
    of the audio). All data dirs share one pool of at most ``nj`` worker processes, and no more
    than one per ``audio_per_worker`` seconds of audio: a worker costs seconds to start, and
    a small set is done sooner in this process.  ``nj`` may be a stage's ``JobConfig`` (its
    ``nj``, and where the jobs run: ``cmd: slurm`` submits even a single job to the cluster).
    """
    jobs_config = as_job_config(nj)
    nj = jobs_config.nj
    dirs = [Path(d) for d in (data_dirs if isinstance(data_dirs, list) else [data_dirs])]
    for o, _ in extra:
        if (o.sample_rate, o.resample) != (opts.sample_rate, opts.resample):
            raise AsrtrainError(f"{o.kind} at {o.sample_rate} Hz (resample {o.resample}) cannot "
                                f"share the audio pass of {opts.kind} at {opts.sample_rate} Hz "
                                f"(resample {opts.resample})")
    feats_dir = Path(feats_dir).resolve()
    feats_dir.mkdir(parents=True, exist_ok=True)
    plans = [(d, DataDir.read(d)) for d in dirs]
    outputs = {d: [Output(opts, d.name)] + [Output(o, d.name + sfx, pass_key(data, o))
                                            for o, sfx in extra]
               for d, data in plans}
    for out in (o for outs in outputs.values() for o in outs if o.tag):
        out.record(feats_dir).unlink(missing_ok=True)   # the arks are about to change
    seconds = sum(audio_seconds(data) for _, data in plans)
    workers = max(1, min(nj, int(seconds // max(audio_per_worker, 1e-9))))
    jobs_of = {d: _plan_jobs(data, outputs[d], feats_dir, workers) for d, data in plans}
    jobs = [job for d, _ in plans for job in jobs_of[d]]
    workers = min(workers, len(jobs))
    t0 = time.time()
    results = iter(_run_jobs(jobs, workers, opts.kind, jobs_config))
    elapsed = time.time() - t0
    results_of = {d: [next(results) for _ in jobs_of[d]] for d, _ in plans}
    measured = sum(sum(r.durations.values()) for rs in results_of.values() for r in rs)
    frames = sum(r.frames[0] for rs in results_of.values() for r in rs)
    figures = {"utterances": 0, "frames": frames, "seconds": elapsed,
               "frames_per_second": frames / max(elapsed, 1e-9), "workers": workers,
               "audio_seconds": measured, "skipped": 0}
    for data_dir, data in plans:
        durations = {u: t for r in results_of[data_dir] for u, t in r.durations.items()}
        short = {u: n for r in results_of[data_dir] for u, n in r.short.items()}
        if short:
            data = _drop_short(data_dir, data, short, [o for o, _ in extra] + [opts])
            figures["skipped"] += len(short)
        for k, out in enumerate(outputs[data_dir]):
            scps = [job[1][k][1][:-4] + ".scp" for job in jobs_of[data_dir]]
            if k == 0:
                figures["utterances"] += _finish(data_dir, data, scps, feats_dir, opts,
                                                 durations)
            else:
                # keyed by the audio the data dir now has (short utterances dropped), so that
                # finish_pass finds these arks for it
                _write_record(replace(out, tag=pass_key(data, out.opts)), feats_dir, scps)
    log.info("%d utterances, %d frames of %s in %.1f s (%.0f frames/s, %d processes, "
             "%.1f s of audio%s)", figures["utterances"], frames, opts.kind, elapsed,
             figures["frames_per_second"], workers, measured,
             "".join(f"; {o.kind} too" for o, _ in extra))
    return figures


#: Short utterances named in the warning (the rest are counted).
SHOWN = 10


def _drop_short(data_dir: Path, data: DataDir, short: dict[str, int],
                all_opts: list[FeatureOptions]) -> DataDir:
    """Remove the utterances too short for one frame from ``data_dir``'s tables (Kaldi's
    compute-fbank-feats skips them with a warning, and utils/fix_data_dir.sh then drops them
    everywhere), with one warning naming them and their audio; an error if none is left."""
    from asrtrain.data.datadir import drop_utterances

    opts = max(all_opts, key=window_samples)
    kept = [u for u in data.utts if u not in short]

    def where(u: str) -> str:
        if data.segments:
            return f"{u} ({data.at('segments', u)}: {short[u]} samples)"
        spec = data.wav[u].strip()
        audio = data.at("wav.scp", u) if spec.endswith("|") else spec
        return f"{u} ({audio}: {short[u]} samples)"

    named = ", ".join(where(u) for u in sorted(short)[:SHOWN])
    more = f" and {len(short) - SHOWN} more" if len(short) > SHOWN else ""
    frame = (f"one {opts.frame_length:g} ms frame ({window_samples(opts)} samples at "
             f"{opts.sample_rate} Hz)")
    if not kept:
        raise AsrtrainError(f"{data_dir}: every utterance is shorter than {frame}: {named}{more}")
    log.warning("%s: %d utterance%s shorter than %s skipped and removed from the data dir, as "
                "Kaldi's compute-%s-feats and utils/fix_data_dir.sh do: %s%s", data_dir,
                len(short), "s" if len(short) > 1 else "", frame, all_opts[-1].kind, named,
                more)
    drop_utterances(data_dir, set(short))
    return data.subset(kept)


def _plan_jobs(data: DataDir, outputs: list[Output], feats_dir: Path, nj: int) -> list[tuple]:
    """The jobs of one data dir, split by audio file so that each job decodes each of its files
    once (both sides of a conversation, recordings sw02001-A and sw02001-B, go to one job)."""
    file_of = {u: _audio_file(data, u) for u in data.utts}
    files = sorted(set(file_of.values()))
    jobs = []
    for j in range(max(1, min(nj, len(files)))):
        mine = set(files[j::nj])
        utts = [u for u in data.utts if file_of[u] in mine]
        jobs.append((data.subset(utts), [(o.opts, o.ark(feats_dir, j + 1)) for o in outputs],
                     j + 1, False))
    return jobs


def _run_jobs(jobs: list[tuple], workers: int, kind: str, config: JobConfig,
              ) -> list[tuple[int, list[int], float]]:
    """Run the jobs, at most ``workers`` at once: here when one worker on this machine
    (nothing to start; a progress bar per utterance), else through the job runner."""
    here = workers == 1 and config.cmd == "local"
    return run_jobs(_extract_job, [(*job[:3], here) for job in jobs],
                    replace(config, nj=workers), f"{kind} jobs", in_process=here)


def pass_key(data: DataDir, opts: FeatureOptions) -> str:
    """What a pass's arks depend on: the options and the audio of every utterance (recording,
    segment, speaker); the same key means the same matrices, bit for bit (seeded dither)."""
    blob = json.dumps({
        "opts": asdict(opts), "utt2spk": sorted(data.utt2spk.items()),
        "segments": sorted((u, s.recording, s.start, s.end) for u, s in data.segments.items()),
        "wav": sorted(data.wav.items()),
        "reco2file_and_channel": sorted((r, *fc) for r, fc in
                                        data.reco2file_and_channel.items())}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _write_record(out: Output, feats_dir: Path, scps: list[str]) -> None:
    write_text(out.record(feats_dir), json.dumps(
        {"key": out.tag, "scps": [Path(s).name for s in scps]}) + "\n")


def pass_arks(source_dir: str | Path, name: str, feats_dir: str | Path,
              opts: FeatureOptions) -> list[Path] | None:
    """The scps of the arks an audio pass made with ``opts`` for data dir ``name`` from
    ``source_dir``'s audio, when its record says so and they are all there; else None."""
    key = pass_key(DataDir.read(source_dir), opts)
    record = Output(opts, name, key).record(Path(feats_dir).resolve())
    try:
        saved = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None
    scps = [record.parent / name for name in saved.get("scps", [])]
    if not scps or not all(s.is_file() and s.with_suffix(".ark").is_file() for s in scps):
        return None
    return scps


def finish_pass(source_dir: str | Path, data_dir: str | Path, feats_dir: str | Path,
                opts: FeatureOptions) -> bool:
    """Give ``data_dir`` (a copy of ``source_dir``) the features an earlier audio pass made for
    it (``compute_features(..., extra=...)``): True when that pass's record says its arks hold
    ``opts``' features of ``source_dir``'s audio, and the tables are written; False otherwise
    (nothing written: compute them)."""
    data_dir, feats_dir = Path(data_dir), Path(feats_dir).resolve()
    scps = pass_arks(source_dir, data_dir.name, feats_dir, opts)
    if scps is None:
        return False
    _finish(data_dir, DataDir.read(data_dir), [str(s) for s in scps], feats_dir, opts)
    log.info("%s: %s features from the features stage's audio pass", data_dir, opts.kind)
    return True


def _audio_file(data: DataDir, utt: str) -> str:
    reco = data.segments[utt].recording if data.segments else utt
    return data.reco2file_and_channel.get(reco, (reco, ""))[0]


def _finish(data_dir: Path, data: DataDir, scps: list[str], feats_dir: Path,
            opts: FeatureOptions, durations: dict[str, float] | None = None) -> int:
    """Merge the jobs' scps of one data dir, compute its CMVN stats, write its tables (with
    ``utt2dur``, the durations measured from the decoded samples, when given; an old one is
    removed otherwise)."""
    name = data_dir.name
    feats: dict[str, str] = {}
    for scp in scps:
        feats.update(read_table(scp))
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
            mats = [load_matrix(feats[u], f"{data_dir}: utterance {u}") for u in utts]
            for u, m in zip(utts, mats, strict=True):
                utt2num_frames[u] = int(m.shape[0])
                dim = int(m.shape[1])
            w(spk, cmvn_stats(mats))
    cmvn = read_table(cmvn_ark.with_suffix(".scp"))
    write_table(data_dir / "feats.scp", feats)
    write_table(data_dir / "utt2num_frames", {u: str(n) for u, n in utt2num_frames.items()})
    write_table(data_dir / "cmvn.scp", cmvn)
    if durations is not None:
        write_table(data_dir / "utt2dur", {u: f"{durations[u]:.3f}" for u in feats})
    else:
        (data_dir / "utt2dur").unlink(missing_ok=True)
    log.info("%s: %d utterances, %d frames of %d-dim %s", data_dir, len(feats),
             sum(utt2num_frames.values()), dim, opts.kind)
    return len(feats)
