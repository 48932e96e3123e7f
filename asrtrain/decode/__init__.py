"""Decoding: CTC greedy search to words and CTM; HCLG graph decoding for GMM and hybrid models.

Every decoder writes one decode-dir layout (docs/architecture.md)::

    <out_dir>/ctm          words in recording time, sclite's CTM
    <out_dir>/text         <utt> <words...>
    <out_dir>/score/       asrtrain.score.score_decode's reports of this ctm/text
    <out_dir>/decode.json  graph decoders: settings, the chosen one, every candidate's WER, RTF
    <out_dir>/trans.{ark,scp}  SAT passes (decode_fmllr.sh, asrtrain/decode/fmllr.py): each
                           speaker's composed fMLLR transform; decode.json adds ``first_pass``,
                           the speaker-independent first pass's WER

The graph decoders try several settings (acoustic scales, LM weights x insertion penalties):
``score_candidates`` scores each candidate's words through ``score_decode`` in a temporary
decode dir, and ``write_decode_dir`` writes the chosen one.  Where the choice is made is the
recipe's ``score.tune_on`` (``tuning_set``): on each test set itself (Kaldi's habit, an
optimistic figure) or on the dev set, whose best setting the test sets are then decoded with
(a held-out figure; ``note_tuned_on`` records it in the test set's ``decode.json``).  Their
options are typed configs with the defaults in one place, here: ``GmmDecodeConfig`` and
``HybridDecodeConfig`` (``from_config`` reads the YAML mapping with :func:`asrtrain.settings.read`,
which rejects unknown keys and values of the wrong type).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Hashable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from asrtrain import AsrtrainError
from asrtrain.sections import sets_settings
from asrtrain.settings import check, choice, integer, number, opt, read, sequence

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from asrtrain.data.datadir import DataDir
    from asrtrain.decode.ctc import TimedWord
    from asrtrain.score import Counts

_K = TypeVar("_K", bound=Hashable)


# ---------------------------------------------------------------------------- typed configs
@dataclass(frozen=True)
class CtcDecodeConfig:
    """The CTC ``decode`` section (``conf/decode/ctc_greedy.yaml``): the decoder ``kind`` (greedy
    search, the one there is), ``batch_frames`` per forward pass, and which of the training
    run's models is decoded, ``checkpoint`` best | last | average of the ``average_n`` epochs of
    lowest dev loss (:class:`asrtrain.models.average.CheckpointChoice`)."""

    kind: str = opt("ctc_greedy", choice("ctc_greedy"))
    batch_frames: int = opt(20000, integer(1))
    checkpoint: str = "average"
    average_n: int = opt(5, integer(1))

    def __post_init__(self) -> None:
        from asrtrain.models.average import CheckpointChoice

        CheckpointChoice(self.checkpoint, self.average_n)

    @classmethod
    def from_config(cls, cfg: Mapping | CtcDecodeConfig | None,
                    section: str = "decode") -> CtcDecodeConfig:
        """The section read by :func:`asrtrain.settings.read`."""
        return read(cls, cfg, section)


@dataclass(frozen=True)
class GmmDecodeConfig:
    """``decode_gmm``'s options: the acoustic scales tried (the best on the scored set is
    kept), kaldi-decoder's FasterDecoder ``beam``/``max_active``, the transition scales of the
    alignment that times the words, and the torch device of the GMM likelihoods."""

    beam: float = opt(13.0, number(0, low_open=True))
    max_active: int = opt(7000, integer(1))
    self_loop_scale: float = opt(0.1, number(0))
    transition_scale: float = opt(1.0, number(0))
    device: str = "cpu"
    acoustic_scales: tuple[float, ...] = opt((1 / 12, 0.1),
                                             sequence(number(0, low_open=True), least=1))

    def __post_init__(self) -> None:   # a config's values are checked by name as read (opt)
        check(bool(self.acoustic_scales) and min(self.acoustic_scales) > 0,
               f"gmm decode: acoustic_scales {list(self.acoustic_scales)}: need at least one, "
               "all positive")
        check(self.beam > 0 and self.max_active > 0,
               f"gmm decode: beam {self.beam} and max_active {self.max_active} must be positive")

    @classmethod
    def from_config(cls, cfg: Mapping | GmmDecodeConfig | None,
                    section: str = "gmm decode") -> GmmDecodeConfig:
        """The options of ``cfg`` read by :func:`asrtrain.settings.read`, errors naming
        ``<section>.<key>``."""
        return read(cls, cfg, section)


@dataclass(frozen=True)
class HybridDecodeConfig:
    """``decode_hybrid``'s options (see asrtrain/decode/hybrid.py's docstring): ``decoder``
    lattice | faster, the pseudo log-likelihood scales, the search beams, the LM weights
    ``min_lmwt..max_lmwt`` x insertion penalties ``wips`` swept (``lmwt``/``wip`` fix them
    instead), chunks per forward pass, torch CPU threads (0: leave as is) and device; and
    which of the training run's models is decoded, ``checkpoint`` best | last | average (of the
    ``average_n`` epochs of lowest dev loss: asrtrain.models.average; the default, average of 5,
    and the figures it was chosen on are in conf/decode/ctc_greedy.yaml: on the tiny recipe the
    hybrid gave 2.87% WER with each choice)."""

    decoder: str = "lattice"
    beam: float = 15.0
    lattice_beam: float = 8.0
    max_active: int = 7000
    lmwt: int | None = None
    min_lmwt: int = 7
    max_lmwt: int = 17
    wip: float | None = None
    wips: tuple[float, ...] = (0.0, 0.5, 1.0)
    acoustic_scale: float = 0.1
    prior_scale: float = 1.0
    batch_chunks: int = 256
    threads: int = 0
    device: str = "cpu"
    checkpoint: str = "average"
    average_n: int = 5

    def __post_init__(self) -> None:
        from asrtrain.models.average import CheckpointChoice

        CheckpointChoice(self.checkpoint, self.average_n)
        check(self.decoder in ("lattice", "faster"),
               f"decode.decoder={self.decoder!r}: expected lattice or faster")
        check(self.decoder == "lattice" or self.wip in (None, 0.0),
               f"decode.wip={self.wip}: the faster decoder gives no lattice to add an insertion "
               "penalty to; use decoder=lattice")
        check(min(self.acoustic_scale, self.beam, self.lattice_beam, self.max_active,
                   self.batch_chunks) > 0 and self.prior_scale >= 0 and self.threads >= 0,
               "decode: acoustic_scale, beam, lattice_beam, max_active and batch_chunks must be "
               "positive, prior_scale and threads not negative")
        lmwts = [m for m, _ in self.settings()] or [0]
        check(bool(self.settings()) and min(lmwts) > 0,
               f"decode: LM weights {self.min_lmwt}..{self.max_lmwt} (lmwt {self.lmwt}) and "
               f"insertion penalties {list(self.wips)} (wip {self.wip}): need at least one of "
               "each, LM weights positive")

    @classmethod
    def from_config(cls, cfg: Mapping | HybridDecodeConfig | None,
                    section: str = "decode") -> HybridDecodeConfig:
        """The options of ``cfg`` read by :func:`asrtrain.settings.read`, errors naming
        ``<section>.<key>``."""
        return read(cls, cfg, section)

    def settings(self) -> list[tuple[int, float]]:
        """The (LM weight, insertion penalty) pairs to try, in sweep order."""
        lmwts = [self.lmwt] if self.lmwt is not None else list(
            range(self.min_lmwt, self.max_lmwt + 1))
        wips = [0.0] if self.decoder == "faster" else (
            [self.wip] if self.wip is not None else list(self.wips))
        return [(lmwt, wip) for lmwt in lmwts for wip in wips]

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# ---------------------------------------------------------------------------- parallel jobs
#: Seconds of audio that pay for one more decoding job: a spawned job spends seconds importing
#: torch and reading the graph and the model, and the tiny test set's 197 s decode in 9.5 s
#: (hybrid, search 8.5 s).
AUDIO_PER_JOB_S = 600.0


def job_shares(utts: list[_K], nj: int, audio_seconds: float = float("inf"),
               audio_per_job: float = AUDIO_PER_JOB_S) -> list[list[_K]]:
    """``utts`` in contiguous shares of nearly equal size (none empty) for parallel jobs: at
    most ``nj``, and at most one per ``audio_per_job`` seconds of ``audio_seconds``."""
    n = max(1, int(min(nj, audio_seconds // max(audio_per_job, 1e-9), len(utts))))
    bounds = [round(i * len(utts) / n) for i in range(n + 1)]
    return [utts[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


# ---------------------------------------------------------------------------- decode dirs
def can_score(data_dir: Path) -> bool:
    """Whether ``score_decode`` has a reference in ``data_dir`` (an stm or a text)."""
    return (Path(data_dir) / "stm").is_file() or (Path(data_dir) / "text").is_file()


def write_words(out_dir: Path, words: Mapping[str, list[str]],
                timed: Mapping[str, list[TimedWord]], data: DataDir) -> None:
    """``out_dir/text`` (every utterance of ``data``, empty where there are no ``words``) and
    ``out_dir/ctm`` (the ``timed`` words in recording time)."""
    from asrtrain.data.datadir import write_table
    from asrtrain.decode.ctc import write_ctm

    write_table(Path(out_dir) / "text", {u: " ".join(words.get(u, [])) for u in data.utts})
    write_ctm(Path(out_dir) / "ctm", dict(timed), data)


def score_candidates(candidates: Mapping[_K, tuple[Mapping[str, list[str]],
                                                   Mapping[str, list[TimedWord]]]],
                     data: DataDir, data_dir: Path) -> dict[_K, dict[str, Counts]]:
    """``score_decode`` counts of each candidate's (words, timed words), each written to a
    temporary decode dir; empty when ``data_dir`` has nothing to score against."""
    from asrtrain.score import score_decode

    if not can_score(data_dir):
        return {}
    out = {}
    with tempfile.TemporaryDirectory(prefix="asrtrain-sweep.") as tmp:
        for i, (key, (words, timed)) in enumerate(candidates.items()):
            cand = Path(tmp) / str(i)
            write_words(cand, words, timed, data)
            out[key] = score_decode(data_dir, cand)
    return out


def write_decode_dir(out_dir: Path, words: Mapping[str, list[str]],
                     timed: Mapping[str, list[TimedWord]], data: DataDir, data_dir: Path,
                     summary: dict) -> dict[str, Counts]:
    """Write the chosen words as the decode-dir layout, score them (``summary["wer"]``, plain
    numbers) and write ``summary`` to ``decode.json``; returns the counts ({} if unscored)."""
    from asrtrain.fileio import atomic_dir, write_text
    from asrtrain.score import counts_json, score_decode

    counts: dict[str, Counts] = {}
    with atomic_dir(out_dir) as tmp:
        write_words(tmp, words, timed, data)
        if can_score(data_dir):
            counts = score_decode(data_dir, tmp)
            summary["wer"] = counts_json(counts)
        write_text(tmp / "decode.json", json.dumps(summary, indent=1) + "\n")
    return counts


# ---------------------------------------------------------------------------- held-out choice
TUNE_ON = ("auto", "test", "dev")


def tuning_set(cfg: DictConfig) -> str | None:
    """The set whose best decoding setting (LM weight and insertion penalty, GMM acoustic scale)
    the test sets are decoded with, from ``score.tune_on``; None when each test set keeps its
    own best, as Kaldi's scoring does (an optimistic figure).

    ``dev`` chooses on ``sets.dev``, ``test`` on the test set itself; ``auto`` (the default) holds
    the choice out on the dev set for your own corpora (``corpus.kind: datadir``), whose figure
    nobody can check against a published one, and keeps Kaldi's habit for the LDC and tiny
    recipes, so their figures compare with Kaldi's."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, "score.tune_on", default="auto")
    if value not in TUNE_ON:
        raise AsrtrainError(f"score.tune_on={value!r}: expected one of {', '.join(TUNE_ON)}")
    on_dev = value == "dev" or (value == "auto"
                                and OmegaConf.select(cfg, "corpus.kind") == "datadir")
    return sets_settings(cfg).dev if on_dev else None


def tuning_config(cfg: DictConfig) -> dict[str, str]:
    """``score.tune_on``'s share of a decoding stage's digest, as it resolves: the dev set when
    the choice is held out there, ``test`` when each test set chooses on itself (``auto``
    resolves to one of them, so changing ``auto`` to what it meant reruns nothing)."""
    return {"score.tune_on": tuning_set(cfg) or "test"}


def check_tuning_set(data_dir: Path, key: str) -> None:
    """A dev set to choose on must have something to score against."""
    if not can_score(data_dir):
        raise AsrtrainError(f"score.tune_on: {data_dir} has no stm or text to choose the "
                            f"{key} on; give the dev set a text, or set score.tune_on=test")


def note_tuned_on(out_dir: Path, dev: str) -> None:
    """Record in ``out_dir/decode.json`` that its one (fixed) setting is the best one on the
    dev set ``dev``: the decoder only saw a fixed setting and says so."""
    from asrtrain.fileio import write_text

    path = Path(out_dir) / "decode.json"
    summary = json.loads(path.read_text())
    from asrtrain.report import selection

    summary["tuned_on"] = dev
    summary["selection"] = selection(Path(out_dir).name, 1, dev)
    write_text(path, json.dumps(summary, indent=1) + "\n")
