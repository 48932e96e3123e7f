"""CTM hypotheses (time-marked words): parsing, Kaldi's pre-scoring filter and csrfilt's GLM step.

A CTM line is ``<file> <channel> <start> <duration> <word> [<confidence>]``.  After GLM filtering a
word may become several words (its duration split evenly) or an alternation, written as csrfilt.sh
writes it::

    sw_4390 A * * <ALT_BEGIN>
    sw_4390 A 5.600 0.150 HE 0.8
    sw_4390 A 5.750 0.150 IS 0.8
    sw_4390 A * * <ALT>
    ...
    sw_4390 A * * <ALT_END>
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.score.glm import Glm, check_optional_parens, csr_filter_text
from asrtrain.score.lines import data_fields, parse_file


@dataclass
class CtmLine:
    """One raw CTM line: the fields as strings (times are re-printed only when csrfilt does)."""

    file: str
    channel: str
    start: str
    dur: str
    word: str
    rest: list[str]
    line: int = 0
    source: str = ""


def parse_ctm_line(line: str, path: Path | str, lineno: int) -> CtmLine | None:
    """Parse one CTM line; ``None`` for comments and blank lines.  Malformed lines raise."""
    fields = data_fields(line)
    if fields is None:
        return None
    if len(fields) < 5 or len(fields) > 6:
        raise AsrtrainError(
            f"{path}:{lineno}: CTM line needs <file> <channel> <start> <duration> <word> "
            f"[<confidence>], got {len(fields)} fields: {line.strip()!r}"
        )
    for value, what in ((fields[2], "start"), (fields[3], "duration")):
        try:
            number = float(value)
        except ValueError:
            raise AsrtrainError(
                f"{path}:{lineno}: CTM {what} {value!r} is not a number"
            ) from None
        # SCTK reads nan, inf and negative durations and scores them somewhere; we refuse them.
        if not math.isfinite(number) or (what == "duration" and number < 0):
            raise AsrtrainError(
                f"{path}:{lineno}: CTM {what} {value!r} is not a finite "
                f"{'time' if what == 'start' else 'non-negative duration'}"
            )
    if len(fields) == 6:
        try:
            float(fields[5])
        except ValueError:
            raise AsrtrainError(
                f"{path}:{lineno}: CTM confidence {fields[5]!r} is not a number"
            ) from None
    return CtmLine(fields[0], fields[1], fields[2], fields[3], fields[4], fields[5:], lineno,
                   str(path))


def read_ctm(path: Path) -> list[CtmLine]:
    """Read a CTM file (file order); raises AsrtrainError naming file and line."""
    return parse_file(path, "CTM", parse_ctm_line)


# Kaldi egs/swbd/s5c/local/score_sclite.sh removes these lines from the CTM before hubscr.pl:
# noise/laughter tokens (note the grep alternation: "[NOISE" or "LAUGHTER" or "VOCALIZED-NOISE]"
# anywhere in the line), <unk>, hesitations when they end the line (i.e. CTMs without a
# confidence column), and partial words ending in '-'.  The hesitations and partial words are
# optionally deletable in the reference, so dropping them can only help.
_KALDI_NOISE = re.compile(r"\[NOISE|LAUGHTER|VOCALIZED-NOISE\]", re.IGNORECASE)
_KALDI_UNK = re.compile(r"<UNK>", re.IGNORECASE)
_KALDI_HES = re.compile(r" (UH|UM|EH|MM|HM|AH|HUH|HA|ER|OOF|HEE|ACH|EEE|EW)$", re.IGNORECASE)


def kaldi_keep(line: str) -> bool:
    """True if Kaldi's score_sclite.sh CTM filter keeps this raw CTM line."""
    return not (
        _KALDI_NOISE.search(line)
        or _KALDI_UNK.search(line)
        or _KALDI_HES.search(line)
        or line.endswith("-")
    )


def sort_ctm(entries: Iterable[CtmLine]) -> list[CtmLine]:
    """hubscr.pl's sortCTM: by file and channel (string order), then start time, stably."""
    return sorted(entries, key=lambda e: (e.file, e.channel, float(e.start)))


_CONF_LIKE = re.compile(r"^[0-9.-]*$")


def filter_ctm(entries: Iterable[CtmLine], glm: Glm) -> list[str]:
    """Apply csrfilt.sh's hypothesis filtering; returns the filtered CTM lines.

    Each word is filtered on its own (so multi-word GLM rules never fire in a CTM).  A word that
    maps to several words gets its duration split evenly; alternations get ``<ALT...>`` marker
    lines; lines with a confidence or several words are re-printed with times to 3 decimals.
    """
    out: list[str] = []
    for e in entries:
        if not check_optional_parens(e.word):
            raise AsrtrainError(
                f"{e.source}:{e.line}: badly formed optional-deletion parentheses in {e.word!r}"
            )
        text = csr_filter_text(e.word, glm)
        ext = [e.file, e.channel, e.start, e.dur, *e.rest]
        fields = ext[:4] + ([text] if text else []) + ext[4:]
        # csrfilt's ctm post-processor: braces become their own tokens.
        line = " ".join(fields)
        line = re.sub(r"([{}])", r" \1 ", line)
        tokens = line.split()
        if len(tokens) == 5:
            out.append(" ".join(tokens))
            continue
        last = len(tokens) - 1
        if _CONF_LIKE.match(tokens[last]):
            limit, conf = last - 1, tokens[last]
        else:
            limit, conf = last, ""
        data = " ".join(tokens[4 : limit + 1])
        sets = data.split("/")
        while sets and sets[-1] == "":
            sets.pop()
        file_, chan = tokens[0], tokens[1]
        if len(sets) > 1:
            out.append(f"{file_} {chan} * * <ALT_BEGIN>")
        for sn, chunk in enumerate(sets):
            words = chunk.replace("{", "").replace("}", "").lstrip().split()
            if not words:
                raise AsrtrainError(
                    f"{e.source}:{e.line}: GLM maps {e.word!r} to an empty alternative, which "
                    f"csrfilt.sh cannot write into a CTM"
                )
            dur = float(tokens[3]) / len(words)
            for i, word in enumerate(words):
                start = float(tokens[2]) + dur * i
                out.append(" ".join(f"{file_} {chan} {start:.3f} {dur:.3f} {word} {conf}".split()))
            if len(sets) > 1 and sn != len(sets) - 1:
                out.append(f"{file_} {chan} * * <ALT>")
        if len(sets) > 1:
            out.append(f"{file_} {chan} * * <ALT_END>")
    return out


@dataclass
class HypWord:
    """A hypothesis word as sclite reads it from the filtered CTM."""

    text: str
    start: float
    dur: float

    @property
    def mid(self) -> float:
        return self.start + self.dur / 2.0


@dataclass
class HypAlternation:
    """``{ a b / c }``: one of several word sequences (an empty one is sclite's null word ``@``)."""

    alternatives: list[list[HypWord]] = field(default_factory=list)

    @property
    def mid(self) -> float:
        # sclite assigns an alternation to a segment by the largest midpoint among its words.
        mid = 0.0
        for alt in self.alternatives:
            for w in alt:
                mid = max(mid, w.mid)
        return mid


HypItem = HypWord | HypAlternation


def _time(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


def parse_filtered_ctm(lines: Iterable[str]) -> dict[tuple[str, str], list[HypItem]]:
    """Group filtered CTM lines into per-(file, channel) word/alternation sequences, in order."""
    channels: dict[tuple[str, str], list[HypItem]] = {}
    current: HypAlternation | None = None
    for line in lines:
        tokens = line.split()
        if not tokens or line.startswith(";;"):
            continue
        key = (tokens[0], tokens[1])
        items = channels.setdefault(key, [])
        word = tokens[4] if len(tokens) > 4 else ""
        marker = word.upper()
        if marker == "<ALT_BEGIN>":
            current = HypAlternation([[]])
            items.append(current)
        elif marker == "<ALT>" and current is not None:
            current.alternatives.append([])
        elif marker == "<ALT_END>":
            current = None
        elif current is not None:
            current.alternatives[-1].append(HypWord(word, _time(tokens[2]), _time(tokens[3])))
        else:
            items.append(HypWord(word, _time(tokens[2]), _time(tokens[3])))
    return channels
