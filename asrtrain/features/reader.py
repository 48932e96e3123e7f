"""The one reader of stored features: ``feats.scp`` → per-speaker CMVN (``cmvn.scp``) → Δ/ΔΔ
→ the appended per-frame streams (``features.append``: fMLLR features, online i-vectors).

Training (``train/data.py``, ``train/chunks.py``), the GMM aligner (``align/model.py``) and both
decoders (``decode/ctc.py``, ``decode/hybrid.py``) read their inputs through
:class:`FeatureReader`, so a model sees at decoding time exactly what it saw in training (see
``docs/architecture.md``, "Data flow: features and checkpoints").  Frame stacking is the model's
(``BLSTM.stack_frames``); the fixed-length chunks of hybrid models are laid out by
:func:`chunk_starts`, shared by the chunk trainer and the hybrid decoder.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, read_table
from asrtrain.features.ark import load_matrix
from asrtrain.features.transform import FeatureTransform

#: The per-frame streams ``features.append`` may list, in the order they are appended.
APPEND_STREAMS = ("fmllr", "ivector")
#: What makes each stream, for the error when its directory is missing.
STREAM_HINTS = {
    "fmllr": "the align stage writes it when the last GMM pass is SAT (type: sat), or import "
             "Kaldi's with align.kaldi_fmllr",
    "ivector": "run the ivectors stage (ivector.source=kaldi imports Kaldi's)",
}


def appended_streams(features: Mapping, where: str = "features") -> list[str]:
    """The streams a features config appends (``append``, absent: none), checked: known names,
    each once, in :data:`APPEND_STREAMS` order (the order of the composed dims)."""
    value = features.get("append") or []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise AsrtrainError(f"{where}.append={value!r}: expected a list of "
                            f"{', '.join(APPEND_STREAMS)}")
    names = [str(v) for v in value]
    bad = [v for v in names if v not in APPEND_STREAMS]
    if bad or len(set(names)) != len(names):
        raise AsrtrainError(f"{where}.append={names}: expected each of "
                            f"{', '.join(APPEND_STREAMS)} at most once")
    order = [s for s in APPEND_STREAMS if s in names]
    if names != order:
        raise AsrtrainError(f"{where}.append={names}: list them in the order they are appended, "
                            f"{order}")
    return names


def stream_dirs(paths, name: str, append: Sequence[str]) -> dict[str, Path]:
    """Where set ``name``'s appended streams are (``paths``: an ``asrtrain.recipe.Paths``)."""
    where = {"fmllr": paths.fmllr_set, "ivector": paths.ivector_set}
    return {s: Path(where[s](name)) for s in append}


def ivector_rows(num_frames: int, period: int) -> int:
    """Rows of an utterance's online i-vectors: ``ivector-extract-online2`` writes
    ``(T + period - 1) / period`` = ``ceil(T / period)`` (not ``T // period + 1``: an utterance
    of 20 frames at period 10 has 2 rows, for frames 0 and 10)."""
    return max(1, math.ceil(num_frames / period))


class _MatrixTable:
    """A table of one float matrix per utterance (``self.scp``), checked as it is read: what
    the fMLLR features and the i-vectors share. ``what`` names the contents in errors, ``unit``
    what a row is."""

    name = what = unit = ""
    scp: Path

    def _open_table(self) -> None:
        self.table = read_table(self.scp)
        self._dim: int | None = None

    def check_utts(self, utts: Sequence[str]) -> None:
        missing = [u for u in utts if u not in self.table]
        if missing:
            raise AsrtrainError(f"{self.scp}: no {self.what} for {len(missing)} utterances, "
                                f"e.g. {missing[0]}; {STREAM_HINTS[self.name]}")

    def dim(self, utt: str) -> int:
        if self._dim is None:
            self._dim = int(self._load(utt).shape[1])
        return self._dim

    def _load(self, utt: str) -> np.ndarray:
        if utt not in self.table:
            raise AsrtrainError(f"{self.scp}: no {self.what} for utterance {utt}")
        m = load_matrix(self.table[utt], f"{self.scp}: utterance {utt}")
        if m.ndim != 2:
            raise AsrtrainError(f"{self.scp}: utterance {utt}: a {m.ndim}-dim array, expected "
                                f"a matrix [{self.unit}, dim]")
        return m


class FmllrFrames(_MatrixTable):
    """The fMLLR features of a set: ``feats.scp`` of its ``_fmllr`` data dir, one matrix per
    utterance with the frames of the set's fbank features (no CMVN: speaker-adapted already)."""

    name, what, unit = "fmllr", "fMLLR features", "frames"

    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir)
        self.scp = self.dir / "feats.scp"
        if not self.scp.is_file():
            raise AsrtrainError(f"{self.scp}: missing (the fMLLR features the input appends); "
                                f"{STREAM_HINTS['fmllr']}")
        self._open_table()

    def _load(self, utt: str) -> np.ndarray:
        m = super()._load(utt)
        if not np.isfinite(m).all():
            raise AsrtrainError(f"{self.scp}: utterance {utt} has NaN or infinite fMLLR "
                                "features")
        return m

    def frames(self, utt: str, num_frames: int, against: Path) -> np.ndarray:
        """``utt``'s fMLLR features [num_frames, dim] float32; ``against``: the fbank
        ``feats.scp`` whose ``num_frames`` frames they must have."""
        m = self._load(utt)
        if m.shape[0] != num_frames:
            raise AsrtrainError(f"{self.scp}: utterance {utt} has {m.shape[0]} frames of fMLLR "
                                f"features, {against} has {num_frames}; rewrite the fMLLR "
                                "features from these features (rerun align)")
        if self._dim is not None and m.shape[1] != self._dim:
            raise AsrtrainError(f"{self.scp}: utterance {utt} has {m.shape[1]}-dim fMLLR "
                                f"features, the others {self._dim}")
        return m.astype(np.float32, copy=False)


class OnlineIvectors(_MatrixTable):
    """Online i-vectors of a set (Kaldi's ``extract_ivectors_online.sh``): one matrix per
    utterance in ``ivector_online.scp``, a row every ``ivector_period`` frames; frame ``t``
    takes row ``t // period`` (nnet3's rule), so an utterance of ``T`` frames needs
    ``ceil(T / period)`` rows."""

    name, what, unit = "ivector", "i-vectors", "rows"

    def __init__(self, ivector_dir: str | Path) -> None:
        self.dir = Path(ivector_dir)
        self.scp = self.dir / "ivector_online.scp"
        period = self.dir / "ivector_period"
        for p in (self.scp, period):
            if not p.is_file():
                raise AsrtrainError(f"{p}: missing (the i-vectors the input appends); "
                                    f"{STREAM_HINTS['ivector']}")
        try:
            self.period = int(period.read_text().split()[0])
        except (ValueError, IndexError):
            self.period = 0
        if self.period < 1:
            raise AsrtrainError(f"{period}: expected a positive number of frames, got "
                                f"{period.read_text().strip()!r}")
        self._open_table()

    def num_rows(self, num_frames: int) -> int:
        """The rows an utterance of ``num_frames`` frames uses."""
        return ivector_rows(num_frames, self.period)

    def rows(self, utt: str, num_frames: int) -> np.ndarray:
        """The rows of ``utt`` its ``num_frames`` frames use, float32 [ceil(T / period), dim],
        checked: enough rows, finite, the set's dimension."""
        m = self._load(utt)
        need = self.num_rows(num_frames)
        if m.shape[0] < need:
            raise AsrtrainError(f"{self.scp}: utterance {utt} has {m.shape[0]} i-vector rows, "
                                f"its {num_frames} frames need {need} (one per "
                                f"{self.period} frames, {self.dir / 'ivector_period'})")
        m = m[:need]
        if not np.isfinite(m).all():
            raise AsrtrainError(f"{self.scp}: utterance {utt} has NaN or infinite i-vector "
                                "values")
        if self._dim is not None and m.shape[1] != self._dim:
            raise AsrtrainError(f"{self.scp}: utterance {utt} has {m.shape[1]}-dim i-vectors, "
                                f"the others {self._dim}")
        return m.astype(np.float32, copy=False)

    def frames(self, utt: str, num_frames: int, against: Path | None = None) -> np.ndarray:
        """``utt``'s i-vector of every frame, [num_frames, dim]: row ``t // period``."""
        return self.rows(utt, num_frames)[np.arange(num_frames) // self.period]


def open_streams(dirs: Mapping[str, str | Path] | None) -> list[FmllrFrames | OnlineIvectors]:
    """The appended streams of ``dirs`` ({stream: directory}), in :data:`APPEND_STREAMS`
    order."""
    dirs = dict(dirs or {})
    bad = [s for s in dirs if s not in APPEND_STREAMS]
    if bad:
        raise AsrtrainError(f"appended stream {bad[0]!r}: expected one of "
                            f"{', '.join(APPEND_STREAMS)}")
    kinds = {"fmllr": FmllrFrames, "ivector": OnlineIvectors}
    return [kinds[s](dirs[s]) for s in APPEND_STREAMS if s in dirs]


class FeatureReader:
    """Transformed features of the utterances of one data dir.

    ``delta_order`` (0: none, 2: Δ and ΔΔ) and ``norm_vars`` (CMVN variance normalisation) are
    the ``features`` config group's.  ``require_cmvn``: a missing ``cmvn.scp`` is an error (else
    features are used without CMVN, as for data dirs written without it); ``need_num_frames``:
    so is a missing ``utt2num_frames`` (what batching by length needs); ``input_dim``: every
    utterance must come out with that many dimensions (a model's input); ``hint``: what to do
    when ``feats.scp`` is missing.  ``data``: the data dir already read (else read here).
    ``streams``: {stream: directory} of the streams ``features.append`` appends after the
    transformed features (:func:`stream_dirs`); every utterance must have them.

    Every problem raises :class:`AsrtrainError` naming the file and the utterance or speaker.
    """

    def __init__(self, data_dir: str | Path, delta_order: int = 0, norm_vars: bool = False, *,
                 require_cmvn: bool = False, need_num_frames: bool = False,
                 input_dim: int | None = None, hint: str = "run the features stage",
                 data: DataDir | None = None,
                 streams: Mapping[str, str | Path] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.data = data if data is not None else DataDir.read(self.data_dir)
        self.input_dim = input_dim
        self.feats_scp = self.data_dir / "feats.scp"
        self.cmvn_scp = self.data_dir / "cmvn.scp"
        if not self.data.feats:
            raise AsrtrainError(f"{self.feats_scp}: missing; {hint}")
        if need_num_frames and not self.data.utt2num_frames:
            raise AsrtrainError(f"{self.data_dir / 'utt2num_frames'}: missing; {hint}")
        missing = [u for u in self.data.utts if u not in self.data.feats]
        if missing:
            raise AsrtrainError(f"{self.feats_scp}: no features for {len(missing)} utterances, "
                                f"e.g. {missing[0]}; {hint}")
        if require_cmvn and not self.data.cmvn:
            raise AsrtrainError(f"{self.cmvn_scp}: missing; {hint}")
        self.transform = FeatureTransform(self._read_cmvn(), self.data.utt2spk, norm_vars,
                                          delta_order)
        self.streams = open_streams(streams)
        for stream in self.streams:
            stream.check_utts(self.data.utts)
        self._dim: int | None = None

    def _read_cmvn(self) -> dict[str, np.ndarray]:
        stats = {}
        for spk, spec in self.data.cmvn.items():
            stats[spk] = load_matrix(spec, f"{self.cmvn_scp}: speaker {spk}: the statistics")
            if stats[spk].ndim != 2 or stats[spk].shape[0] != 2:
                raise AsrtrainError(f"{self.cmvn_scp}: speaker {spk}: statistics of shape "
                                    f"{stats[spk].shape}, expected [2, dim + 1]")
        if stats:
            for utt in self.data.utts:
                if self.data.utt2spk[utt] not in stats:
                    raise AsrtrainError(f"{self.cmvn_scp}: no stats for speaker "
                                        f"{self.data.utt2spk[utt]} (utterance {utt})")
        return stats

    @property
    def utts(self) -> list[str]:
        """The data dir's utterances, in its (sorted) order."""
        return self.data.utts

    @property
    def num_frames(self) -> dict[str, int]:
        """Frames per utterance from ``utt2num_frames`` (no feature is read)."""
        return self.data.utt2num_frames

    @property
    def dim(self) -> int:
        """Dimensions of the composed input (from the first utterance's stored matrices)."""
        if self._dim is None:
            first = self.utts[0]
            self._dim = self.transform.output_dim(self.raw(first).shape[1]) + sum(
                s.dim(first) for s in self.streams)
        return self._dim

    def stream(self, name: str) -> FmllrFrames | OnlineIvectors | None:
        """The appended stream ``name``, or None when the input does not append it."""
        return next((s for s in self.streams if s.name == name), None)

    def describe(self) -> str:
        """The input's parts and their sizes, e.g. ``fbank 40 + Δ/ΔΔ = 120 | fmllr 40 |
        ivector 100``: what an input-size error shows."""
        first = self.utts[0]
        raw = self.raw(first).shape[1]
        order = self.transform.delta_order
        deltas = "Δ" if order == 1 else "Δ/ΔΔ"
        parts = [f"{self.feats_scp.name} {raw}" + (
            f" + {deltas} = {self.transform.output_dim(raw)}" if order else "")]
        parts += [f"{s.name} {s.dim(first)} ({s.scp})" for s in self.streams]
        return " | ".join(parts)

    def raw(self, utt: str) -> np.ndarray:
        """The stored features of ``utt``, as ``feats.scp`` points at them."""
        spec = self.data.feats.get(utt)
        if spec is None:
            raise AsrtrainError(f"{self.feats_scp}: no features for utterance {utt}")
        return load_matrix(spec, f"{self.feats_scp}: utterance {utt}")

    def __getitem__(self, utt: str) -> np.ndarray:
        """``utt``'s features after CMVN and deltas: float32 [frames, dim], writeable."""
        m = self.raw(utt)
        if m.ndim != 2:
            raise AsrtrainError(f"{self.feats_scp}: utterance {utt}: a {m.ndim}-dim array, "
                                "expected a matrix [frames, dim]")
        stats = self.transform.cmvn.get(self.data.utt2spk[utt]) if self.transform.cmvn else None
        if stats is not None and stats.shape[1] != m.shape[1] + 1:
            raise AsrtrainError(f"{self.cmvn_scp}: speaker {self.data.utt2spk[utt]} has "
                                f"{stats.shape[1] - 1}-dim statistics, but utterance {utt} has "
                                f"{m.shape[1]}-dim features in {self.feats_scp}; rerun the "
                                "features stage")
        out = np.asarray(self.transform(utt, m), dtype=np.float32)
        if self.streams:
            out = np.concatenate([out] + [s.frames(utt, len(m), self.feats_scp)
                                          for s in self.streams], axis=1)
        if self.input_dim is not None and out.shape[1] != self.input_dim:
            raise AsrtrainError(f"{self.feats_scp}: utterance {utt} has {out.shape[1]}-dim "
                                f"input ({self.describe()}), the model takes "
                                f"{self.input_dim}; read it with the model's features config")
        return out if out.flags.writeable else out.copy()

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        """(utterance, transformed features) in the data dir's order."""
        for utt in self.utts:
            yield utt, self[utt]

    def batch(self, utts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``utts``' features zero padded to [batch, frames, dim], and their lengths."""
        mats = [torch.from_numpy(self[u]) for u in utts]
        lengths = torch.tensor([m.shape[0] for m in mats])
        return torch.nn.utils.rnn.pad_sequence(mats, batch_first=True), lengths


def length_batches(lengths: Sequence[int], batch_frames: int,
                   seed: int | None = None) -> list[list[int]]:
    """Index lists of batches holding at most ``batch_frames`` padded frames.

    Items are sorted by length (so padding is small), cut into batches, and the batch order
    shuffled with ``seed`` (None keeps it sorted, for evaluation and decoding).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if seed is not None:
        # Mix items of similar length so that batches differ between epochs.
        rng = random.Random(seed)
        order = sorted(order, key=lambda i: lengths[i] * (1 + 0.1 * rng.random()))
    out, cur, longest = [], [], 0
    for i in order:
        n = lengths[i]
        if cur and max(longest, n) * (len(cur) + 1) > batch_frames:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    if seed is not None:
        random.Random(seed + 1).shuffle(out)
    return out


def chunk_starts(num_frames: int, chunk: int) -> list[int]:
    """Start frames of an utterance's chunks: consecutive, the last one ending on the last frame."""
    if num_frames <= chunk:
        return [0]
    starts = list(range(0, num_frames - chunk + 1, chunk))
    if starts[-1] + chunk < num_frames:
        starts.append(num_frames - chunk)
    return starts
