"""A user's own corpus, given as existing Kaldi data dirs (one per set).

Each set is a directory with ``wav.scp``, ``text``, ``utt2spk`` and optionally ``segments``,
``reco2file_and_channel``, ``stm`` and ``glm`` (as Kaldi's ``utils/validate_data_dir.sh``
accepts them). Audio may be at any sample rate: the features stage resamples it to the
configured rate when the corpus says ``resample: true``. Sets with an ``stm`` are scored as
Hub5 (sclite rules, GLM if given); sets without one are scored by plain per-utterance WER
against ``text``. An optional Kaldi dict dir (lexicon.txt, silence_phones.txt,
nonsilence_phones.txt, optional_silence.txt, extra_questions.txt) is copied for the hybrid
(lexicon) systems.

Layout expected on disk::

    <set_dir>/wav.scp                 <recording> <path> | <recording> <command> |
    <set_dir>/text                    <utterance> <words...>
    <set_dir>/utt2spk                 <utterance> <speaker>
    <set_dir>/segments                <utterance> <recording> <start> <end>     (optional)
    <set_dir>/stm, <set_dir>/glm      scoring references                         (optional)
    <dict_dir>/lexicon.txt ...        Kaldi dict dir                             (optional)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.audio import check_audio_file
from asrtrain.data.datadir import DataDir

LAYOUT = "a Kaldi data dir with wav.scp, text, utt2spk (and optionally segments, stm, glm)"
DICT_FILES = ("lexicon.txt", "silence_phones.txt", "nonsilence_phones.txt",
              "optional_silence.txt", "extra_questions.txt")
SCORING_FILES = ("stm", "glm")


@dataclass
class UserCorpus:
    """The user's sets (copied tables), their scoring files, and the dict dir files if given."""

    sets: dict[str, DataDir]
    scoring: dict[str, dict[str, bytes]] = field(default_factory=dict)
    dict_files: dict[str, bytes] | None = None


def _file_rate(spec: str) -> int | None:
    """The sample rate of a plain audio file (header checked: readable, not truncated); None
    for pipes, which only the features stage runs."""
    spec = spec.strip()
    if spec.endswith("|"):
        return None
    return check_audio_file(spec).rate


def _check_audio(where: Path, data: DataDir, lines: dict[str, int], sample_rate: int,
                 resample: bool) -> None:
    """Every recording the utterances use: its file's header, and its rate unless resampled."""
    used = ({s.recording for s in data.segments.values()} if data.segments
            else set(data.utt2spk))
    for reco in sorted(used):
        at = f"{where / 'wav.scp'}:{lines.get(reco, '?')}"
        try:
            rate = _file_rate(data.wav[reco])
        except AsrtrainError as e:
            raise AsrtrainError(f"{e} (recording {reco}, {at})") from None
        if rate is not None and rate != sample_rate and not resample:
            raise AsrtrainError(f"{at}: recording {reco} is at {rate} Hz, expected "
                                f"{sample_rate} Hz (set corpus.resample=true to resample it)")


def prepare_datadir(sets: Mapping[str, str | Path], sample_rate: int, resample: bool = True,
                    dict_dir: str | Path | None = None) -> UserCorpus:
    """Read, validate and copy the user's data dirs ``sets`` (set name -> directory).

    Every audio file named in wav.scp must exist; a file at a rate other than ``sample_rate``
    is an error unless ``resample`` (pipes are checked when the features stage reads them).
    Feature tables (feats.scp, cmvn.scp, utt2num_frames) are not copied: features are remade.
    """
    if not sets:
        raise AsrtrainError(f"corpus kind datadir: no sets given; expected set: <dir>, {LAYOUT}")
    out = UserCorpus(sets={})
    for name, where in sets.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(name)):
            raise AsrtrainError(f"corpus set name {name!r}: use letters, digits, _ . - only")
        where = Path(where)
        if not where.is_dir():
            raise AsrtrainError(f"{where}: data dir for set {name} not found; expected {LAYOUT}")
        src = DataDir.read(where)   # validates, naming file and line
        data = DataDir(wav=src.wav, text=src.text, utt2spk=src.utt2spk, segments=src.segments,
                       reco2file_and_channel=src.reco2file_and_channel)
        _check_audio(where, data, src.lines["wav.scp"], sample_rate, resample)
        out.sets[str(name)] = data
        scoring = {f: (where / f).read_bytes() for f in SCORING_FILES if (where / f).is_file()}
        if "glm" in scoring and "stm" not in scoring:
            raise AsrtrainError(f"{where / 'glm'}: a glm without an stm; add {where / 'stm'}")
        if scoring:
            out.scoring[str(name)] = scoring
    if dict_dir is not None:
        dict_dir = Path(dict_dir)
        missing = [f for f in DICT_FILES if not (dict_dir / f).is_file()]
        if missing:
            raise AsrtrainError(f"{dict_dir}: not a Kaldi dict dir, missing {', '.join(missing)}")
        out.dict_files = {f: (dict_dir / f).read_bytes() for f in DICT_FILES}
    return out
