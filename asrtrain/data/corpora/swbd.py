"""Switchboard-1 Release 2 (LDC97S62) with the Mississippi State (ms98) transcripts and lexicon.

Switchboard-1 is about 2,400 two-sided telephone conversations (8 kHz, 2-channel SPHERE, ~300 h)
between 543 US speakers on 70 topics. The ISIP/Mississippi State "ms98" re-transcription
(``swb_ms98_transcriptions.tar.gz``, free from ISIP) gives word transcripts per conversation
side and the lexicon ``sw-ms98-dict.text``.

This module follows Kaldi ``egs/swbd/s5c`` exactly: ``local/swbd1_data_prep.sh``,
``local/swbd1_map_words.pl``, ``local/swbd1_prepare_dict.sh`` (with ``format_acronyms_dict.py``
and ``map_acronyms_transcripts.py``), and the subsets of ``run.sh`` (``train_dev`` = first 4000
utterances, ``train_nodev`` = the rest, ``train_nodup`` = ``remove_dup_utts.sh 300``).
Not reproduced: ``local/dict.patch`` (Kaldi's hand fixes to a few ms98 pronunciations) and the
``conv.tab`` speaker-PIN option (speakers are conversation sides, the s5c default).

Layout expected on disk::

    <audio_dir>/                       LDC97S62, unpacked any way (searched for *.sph, as Kaldi)
        swb1_d1/data/sw02001.sph ...   2-channel SPHERE; side A = channel 1, side B = channel 2
    <transcripts_dir>/                 swb_ms98_transcriptions/ (or the directory holding it)
        sw-ms98-dict.text
        20/2001/sw2001A-ms98-a-trans.text  (also *-word.text, unused)
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.corpora.ldc import (
    check_times,
    find_sphere,
    keep_recordings_in_use,
    read_lines,
    require_dir,
    side_tables,
)
from asrtrain.data.datadir import DataDir, Segment, remove_dup_utts

log = logging.getLogger(__name__)

AUDIO_LAYOUT = "LDC97S62 (Switchboard-1 Release 2): <dir>/swb1_d1/data/sw02001.sph ..."
TRANSCRIPTS_LAYOUT = ("the ms98 transcripts: <dir>/swb_ms98_transcriptions/sw-ms98-dict.text and "
                      "<dir>/swb_ms98_transcriptions/20/2001/sw2001A-ms98-a-trans.text ...")

#: Single-letter pronunciations in the ms98 phone set (the role of Kaldi's MSU_single_letter.txt):
#: they complete the lexicon (ms98 lacks e.g. W) and define which words are acronyms.
SINGLE_LETTERS = {
    "A": "ey", "B": "b iy", "C": "s iy", "D": "d iy", "E": "iy", "F": "eh f", "G": "jh iy",
    "H": "ey ch", "I": "ay", "J": "jh ey", "K": "k ey", "L": "eh l", "M": "eh m", "N": "eh n",
    "O": "ow", "P": "p iy", "Q": "k y uw", "R": "aa r", "S": "eh s", "T": "t iy", "U": "y uw",
    "V": "v iy", "W": "d ah b ax l y uw", "X": "eh k s", "Y": "w ay", "Z": "z iy",
}

#: The silence and noise entries swbd1_prepare_dict.sh puts in front of the lexicon.
SILENCE_ENTRIES = ["!sil sil", "[vocalized-noise] spn", "[noise] nsn", "[laughter] lau",
                   "<unk> spn"]
SILENCE_PHONES = ["sil", "spn", "nsn", "lau"]
#: .sph files in a full copy of LDC97S62 (some copies lack 3 of the 2438 conversations).
LDC97S62_SPH = (2435, 2438)
OPTIONAL_SILENCE = "sil"


@dataclass
class DictDir:
    """A Kaldi dict dir (data/local/dict): lexicon lines and phone lists, written as files."""

    lexicon: list[str]
    nonsilence_phones: list[str]
    silence_phones: list[str] = field(default_factory=lambda: list(SILENCE_PHONES))
    optional_silence: str = OPTIONAL_SILENCE
    extra_questions: list[str] = field(default_factory=list)
    #: acronyms.map lines (word, acronym form, spelled back): scoring maps hypotheses back with
    #: the third column, as s5c's local/map_acronyms_ctm.py does (i._b._m. -> i b m).
    acronyms: list[str] = field(default_factory=list)

    def files(self) -> dict[str, str]:
        """File name -> content, as swbd1_prepare_dict.sh leaves them."""
        def lines(xs: list[str]) -> str:
            return "".join(f"{x}\n" for x in xs)
        return {"lexicon.txt": lines(self.lexicon),
                "silence_phones.txt": lines(self.silence_phones),
                "nonsilence_phones.txt": lines(self.nonsilence_phones),
                "optional_silence.txt": f"{self.optional_silence}\n",
                "extra_questions.txt": lines(self.extra_questions),
                "acronyms.map": lines(self.acronyms)}


@dataclass
class SwbdCorpus:
    """What prepare_swbd makes: the data dirs by set name and the dict dir."""

    sets: dict[str, DataDir]
    dict_dir: DictDir


# ------------------------------------------------------------------------- word mapping
# swbd1_map_words.pl, one substitution per line, in its order (each applied once, as Perl s///).
_LAUGHTER_WORD = re.compile(r"^\[LAUGHTER-(.+)\](|-)$", re.I)   # [LAUGHTER-STORY] -> STORY
_MISPRONOUNCED = re.compile(r"^\[(.+)/.+\](|-)$")               # [IT'N/ISN'T] -> IT'N
_PARTIAL_START = re.compile(r"^(|-)\[[^\]\[]+\](.+)$")          # -[AN]Y -> -Y
_PARTIAL_END = re.compile(r"^(.+)\[[^\]\[]+\](|-)$")            # AB[SOLUTE]- -> AB-
_BAD_PARTIAL = re.compile(r"([^\]\[]+)\[.+\]$")                 # EX[SPECIALLY]-/ESPECIALLY] -> EX
_CURLY = re.compile(r"^\{(.+)\}$")                              # {YUPPIEDOM} -> YUPPIEDOM
_INNER = re.compile(r"[A-Z]\[([^\]\[])+\][A-Z]", re.I)          # AMMU[N]IT- (see map_word)
_SENSE = re.compile(r"_\d")                                     # THEM_1 -> THEM


def map_word(word: str) -> str:
    """One word through swbd1_map_words.pl (partial words, laughter-words, {}, _1 senses)."""
    word = _LAUGHTER_WORD.sub(r"\1\2", word, count=1)
    word = _MISPRONOUNCED.sub(r"\1\2", word, count=1)
    word = _PARTIAL_START.sub(r"-\2", word, count=1)
    word = _PARTIAL_END.sub(r"\1-", word, count=1)
    word = _BAD_PARTIAL.sub(r"\1", word, count=1)
    word = _CURLY.sub(r"\1", word, count=1)
    # Perl's replacement is "$1-$3" with no third group: the last bracketed character and "-"
    # (so AMMU[N]IT- becomes AMMN-T-, not the AMMU-IT- its comment hopes for). Kept as Kaldi has it.
    word = _INNER.sub(lambda m: f"{m.group(1)}-", word, count=1)
    return _SENSE.sub("", word, count=1)


# ------------------------------------------------------------------------- dictionary
def _read_ms98_dict(path: Path) -> list[str]:
    # sw-ms98-dict.text: '#' comment header, then "<word> <phone> <phone> ..." lines, e.g.
    #   a ax
    #   -[an]y iy
    #   [laughter-story] s t ao r iy
    # Kaldi: grep -v '^#' | awk 'NF>0' | sort
    out = []
    for lineno, line in read_lines(path):
        if line.startswith("#") or not line.split():
            continue
        if len(line.split()) < 2:
            raise AsrtrainError(f"{path}:{lineno}: expected '<word> <phones...>', "
                                f"got {line.strip()!r}")
        out.append(line)
    if not out:
        raise AsrtrainError(f"{path}: no lexicon entries")
    return sorted(out)


def _acronyms(lexicon3: list[str]) -> tuple[list[str], list[str]]:
    """format_acronyms_dict.py: IBM -> i._b._m., BBCs -> b._b._c.s, BBC's -> b._b._c.'s.

    Returns the rewritten lexicon lines and the acronyms.map lines
    ``<word>\t<acronym form>\t<spelled back>`` (``ibm\ti._b._m.\ti b m``), sorted and unique.
    """
    out: list[str] = []
    mapping: set[str] = set()
    for lex in lexicon3:
        word = lex.split()[0]
        pron = lex[len(word) + 1:].strip()

        def spelled(letters: str) -> str:
            return " ".join(SINGLE_LETTERS[c.upper()] for c in letters)

        stem, suffix, back = None, "", ""
        if re.match(r"^[A-Za-z]+$|^[A-Za-z]+'s$|^[A-Za-z]+s$", word):
            if word[-2:] == "'s" and pron[-1] in "sz":
                if spelled(word[:-2]) == pron[:-2]:
                    stem, suffix, back = word[:-2], ".'s", "'s"
            elif word[-1] == "s" and pron[-1] in "sz":
                if word[:-1] and spelled(word[:-1]) == pron[:-2]:
                    stem, suffix, back = word[:-1], ".s", "'s"
            elif "'" not in word and word[-1] != "s":
                if spelled(word) == pron:
                    stem, suffix = word, "."
        if stem is None:
            out.append(lex)
            continue
        mapped = "".join(c.lower() + "._" for c in stem[:-1]) + stem[-1].lower() + suffix
        mapping.add(f"{word}\t{mapped}\t{' '.join(stem.lower())}{back}")
        out.append(f"{mapped} {pron}")
    return out, sorted(mapping)


def _prepare_dict(dict_file: Path) -> tuple[DictDir, dict[str, str]]:
    """swbd1_prepare_dict.sh: the dict dir and the acronym map used on the transcripts."""
    lexicon1 = _read_ms98_dict(dict_file)
    phones = {p for line in lexicon1 for p in line.split()[1:]}
    # Kaldi: ... | grep -v sil (a substring match), printed in awk's hash order; we sort.
    nonsilence = sorted(p for p in phones if "sil" not in p)
    lexicon2 = (SILENCE_ENTRIES + lexicon1
                + [f"{letter} {pron}" for letter, pron in SINGLE_LETTERS.items()])
    lexicon3 = sorted({" ".join([map_word(line.split()[0])] + line.split()[1:])
                       for line in lexicon2})
    lexicon4, acronyms_map = _acronyms(lexicon3)
    lexicon5 = sorted({line.lower() for line in ["i ay"] + lexicon4})
    # map_acronyms_transcripts.py reads the map into a dict: for a repeated word the last wins.
    acronyms = {line.split("\t")[0]: line.split("\t")[1] for line in acronyms_map}
    return (DictDir(lexicon=lexicon5, nonsilence_phones=nonsilence, acronyms=acronyms_map),
            acronyms)


def _map_acronyms(words: list[str], acronyms: dict[str, str]) -> list[str]:
    """map_acronyms_transcripts.py on one utterance's words (then everything is lowercased)."""
    items = list(words)
    n = len(items)
    # First pass: an uppercase I between single uppercase letters is part of an acronym.
    for i in range(n):
        if items[i] == "I":
            x = 0
            while i - 1 - x >= 0 and re.match(r"^[A-Z]$", items[i - 1 - x]):
                x += 1
            y = 0
            while i + 1 + y < n and re.match(r"^[A-Z]$", items[i + 1 + y]):
                y += 1
            if x + y > 0:
                for j in range(i - x, i + y + 1):
                    items[j] = acronyms.get(items[j], items[j])
    # Second pass: every other mapped word, but not the pronoun I/i.
    items = [acronyms[w] if w in acronyms and w not in ("I", "i") else w for w in items]
    return [w.lower() for w in items]


# ------------------------------------------------------------------------- transcripts
_MS98_ID = re.compile(r"^sw(\d{4})([AB])-ms98-a-\d+$")
_SILENCE = re.compile(r"\s\[SILENCE\](\s|$)", re.I)
_ASIDE = re.compile(r"<[BE]_ASIDE>", re.I)


def _read_transcripts(trans_files: list[Path]) -> dict[str, tuple[list[str], Path, int]]:
    """Utterance id -> (words after [silence]/aside removal, file, line), empties dropped."""
    out: dict[str, tuple[list[str], Path, int]] = {}
    for path in trans_files:
        n_lines = 0
        for lineno, line in read_lines(path):
            if not line.strip():
                continue
            n_lines += 1
            # ms98 *-trans.text: "<segment-id> <start> <end> <words...>", e.g.
            #   sw2001A-ms98-a-0001 0.000000 0.977625 [silence]
            #   sw2001A-ms98-a-0002 0.977625 11.561375 hi um yeah i'd like to talk about ...
            fields = line.split()
            m = _MS98_ID.match(fields[0])
            try:
                if m is None or len(fields) < 3:
                    raise ValueError
                start, end = float(fields[1]), float(fields[2])
            except ValueError:
                raise AsrtrainError(
                    f"{path}:{lineno}: expected '<swNNNN[AB]-ms98-a-NNNN> <start> <end> "
                    f"<words...>', got {line.strip()!r}") from None
            check_times(start, end, f"{path}:{lineno}")
            if not 0 <= start <= end:
                raise AsrtrainError(f"{path}:{lineno}: start {fields[1]} after end "
                                    f"{fields[2]} (or negative)")
            # Kaldi: sw2001A -> sw02001-A, times in 10 ms rounded: int(100*t+0.5).
            utt = (f"sw0{m.group(1)}-{m.group(2)}_{int(100 * start + 0.5):06d}-"
                   f"{int(100 * end + 0.5):06d}")
            text = " ".join([utt] + fields[3:])
            # Remove [SILENCE] (its phone is sil, the optional silence), <B_ASIDE>,
            # <E_ASIDE>; [NOISE] [VOCALIZED-NOISE] [LAUGHTER] stay for nsn, spn, lau.
            text = _SILENCE.sub(r"\1", text)
            text = _ASIDE.sub("", text)
            words = text.split()[1:]
            if not words:
                continue
            if utt in out:
                first = out[utt]
                raise AsrtrainError(f"{path}:{lineno}: utterance id {utt} repeats "
                                    f"{first[1]}:{first[2]}")
            out[utt] = (words, path, lineno)
        if n_lines == 0:
            raise AsrtrainError(f"{path}: empty transcript file")
    return out


def prepare_swbd(audio_dir: Path, transcripts_dir: Path, dev_utts: int = 4000,
                 max_dup: int = 300, max_missing_audio: int = 3,
                 expected_sph: tuple[int, ...] | None = LDC97S62_SPH) -> SwbdCorpus:
    """Prepare Switchboard-1 as Kaldi s5c does: sets train, train_dev, train_nodup; the dict dir.

    ``dev_utts``: the first utterances held out as ``train_dev`` (4000 in s5c).
    ``max_dup``: the most copies of one transcript kept in ``train_nodup`` (300 in s5c).
    ``max_missing_audio``: conversations with transcripts but no .sph that are tolerated (LDC97S62
    copies hold 2435 or 2438 of the 2438 transcribed conversations; Kaldi drops the missing).
    ``expected_sph``: the .sph counts a full copy holds (another count is logged as a warning);
    ``None`` for a corpus that is knowingly smaller (the tiny corpus, which says so itself).
    """
    audio_dir = require_dir(Path(audio_dir), "Switchboard audio", AUDIO_LAYOUT)
    transcripts_dir = require_dir(Path(transcripts_dir), "ms98 transcripts", TRANSCRIPTS_LAYOUT)
    ms98 = transcripts_dir
    if (transcripts_dir / "swb_ms98_transcriptions").is_dir():
        ms98 = transcripts_dir / "swb_ms98_transcriptions"
    dict_file = ms98 / "sw-ms98-dict.text"
    trans_files = sorted(ms98.glob("*/*/*-trans.text"))
    if not dict_file.is_file() or not trans_files:
        hint = ""
        if any(p.suffix.lower() == ".sph" for p in transcripts_dir.rglob("*")):
            hint = " (this looks like the audio, LDC97S62, given for the transcripts)"
        missing = "sw-ms98-dict.text" if not dict_file.is_file() else "*/*/*-trans.text files"
        raise AsrtrainError(f"{ms98}: no {missing}{hint}; expected {TRANSCRIPTS_LAYOUT}")
    sph = find_sphere(audio_dir, "Switchboard audio", AUDIO_LAYOUT, allow_none=True)
    if not sph:
        if list(audio_dir.glob("sw-ms98-dict.text")) + list(audio_dir.glob("*/sw-ms98-dict.text")):
            raise AsrtrainError(f"{audio_dir}: holds the ms98 transcripts, not the audio; "
                                f"expected {AUDIO_LAYOUT}")
        raise AsrtrainError(f"{audio_dir}: no .sph files found for the Switchboard audio; "
                            f"expected {AUDIO_LAYOUT}")
    if expected_sph is not None and len(sph) not in expected_sph:
        log.warning("%s: %d .sph files (LDC97S62 has %s)", audio_dir, len(sph),
                    " or ".join(map(str, expected_sph)))

    dict_dir, acronyms = _prepare_dict(dict_file)
    transcripts = _read_transcripts(trans_files)

    train = DataDir()
    wav, r2fc = side_tables(sph)
    missing: dict[str, tuple[Path, int]] = {}
    for utt, (words, path, lineno) in sorted(transcripts.items()):
        reco = utt[:9]   # sw02001-A: the conversation side is the speaker (s5c)
        if reco not in wav:
            missing.setdefault(reco[:7], (path, lineno))
            continue
        start, end = int(utt[10:16]) / 100, int(utt[17:23]) / 100
        if end <= start:
            # Kaldi's extract-segments skips these; drop them here so the data dir validates.
            log.warning("%s:%d: utterance %s has no duration; dropped", path, lineno, utt)
            continue
        mapped = _map_acronyms([map_word(w) for w in words], acronyms)
        train.text[utt] = " ".join(mapped)
        train.utt2spk[utt] = reco
        train.segments[utt] = Segment(reco, start, end)
    if not missing and not train.utt2spk:
        raise AsrtrainError(f"{ms98}: no utterances with words and a duration in the transcripts")
    if len(missing) > max_missing_audio or not train.utt2spk:
        conv, (path, lineno) = next(iter(sorted(missing.items())))
        raise AsrtrainError(
            f"{path}:{lineno}: conversation {conv} has transcripts but no audio {conv}.sph under "
            f"{audio_dir} ({len(missing)} conversations without audio; at most "
            f"{max_missing_audio} tolerated); expected {AUDIO_LAYOUT}")
    for conv, (path, _) in sorted(missing.items()):
        log.warning("%s: no audio %s.sph under %s; its utterances are dropped", path, conv,
                    audio_dir)
    train.wav, train.reco2file_and_channel = keep_recordings_in_use(
        wav, r2fc, {s.recording for s in train.segments.values()})
    train.validate("train")

    utts = train.utts
    if dev_utts >= len(utts):
        raise AsrtrainError(f"{ms98}: {len(utts)} utterances, too few to hold out "
                            f"dev_utts={dev_utts} for train_dev")
    train_dev = train.subset(utts[:dev_utts])
    train_nodev = train.subset(utts[dev_utts:])
    train_nodup = remove_dup_utts(train_nodev, max_dup)
    return SwbdCorpus(sets={"train": train, "train_dev": train_dev, "train_nodup": train_nodup},
                      dict_dir=dict_dir)
