"""STM reference transcripts (NIST segment time marks) and their GLM filtering.

An STM line is ``<file> <channel> <speaker> <start> <end> [<labels>] <words...>``; lines starting
with ``;;`` are comments (``;; LABEL ...`` headers).  Words in parentheses are optionally deletable,
words with a leading or trailing ``-`` are fragments, and a segment whose text contains
``IGNORE_TIME_SEGMENT_IN_SCORING`` is not scored (hypothesis words falling into it are dropped).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.score.glm import Glm, check_optional_parens, csr_filter_text
from asrtrain.score.lines import data_fields, parse_file


@dataclass
class StmSegment:
    """One reference segment; ``text`` holds the words separated by single spaces."""

    file: str
    channel: str
    speaker: str
    start: float
    end: float
    labels: str
    text: str
    line: int = 0
    source: str = ""


def _number(field: str, path: Path | str, lineno: int, what: str) -> float:
    try:
        value = float(field)
    except ValueError:
        raise AsrtrainError(f"{path}:{lineno}: STM {what} time {field!r} is not a number") from None
    if not math.isfinite(value):
        # SCTK accepts nan and inf, and a segment then matches every word or none.
        raise AsrtrainError(f"{path}:{lineno}: STM {what} time {field!r} is not finite")
    return value


def parse_stm_line(line: str, path: Path | str, lineno: int) -> StmSegment | None:
    """Parse one STM line; ``None`` for comment and blank lines.  Malformed lines raise."""
    fields = data_fields(line)
    if fields is None:
        return None
    if len(fields) < 5:
        raise AsrtrainError(
            f"{path}:{lineno}: STM line needs <file> <channel> <speaker> <start> <end> [<labels>] "
            f"text, got {len(fields)} fields: {line.strip()!r}"
        )
    start = _number(fields[3], path, lineno, "start")
    end = _number(fields[4], path, lineno, "end")
    if end < start:
        raise AsrtrainError(f"{path}:{lineno}: STM segment ends at {fields[4]}, before it starts "
                            f"at {fields[3]}")
    labels = ""
    words = fields[5:]
    if words and re.fullmatch(r"<\S+>", words[0]):
        labels, words = words[0], words[1:]
    return StmSegment(fields[0], fields[1], fields[2], start, end, labels, " ".join(words),
                      lineno, str(path))


def read_stm(path: Path) -> list[StmSegment]:
    """Read an STM file into segments (file order); raises AsrtrainError naming file and line."""
    return parse_file(path, "STM", parse_stm_line)


def sort_stm(segments: Iterable[StmSegment]) -> list[StmSegment]:
    """hubscr.pl's sortSTM: by file and channel (string order), then start time, stably."""
    return sorted(segments, key=lambda s: (s.file, s.channel, s.start))


def filter_stm(segments: Iterable[StmSegment], glm: Glm) -> list[StmSegment]:
    """Apply csrfilt.sh's reference filtering (GLM, upper case, hyphen split) to each segment."""
    out = []
    for seg in segments:
        if not check_optional_parens(seg.text):
            raise AsrtrainError(
                f"{seg.source}:{seg.line}: badly formed optional-deletion parentheses in "
                f"{seg.text!r}"
            )
        text = csr_filter_text(" " + seg.text + " ", glm)
        out.append(StmSegment(seg.file, seg.channel, seg.speaker, seg.start, seg.end, seg.labels,
                              text, seg.line, seg.source))
    return out


def fix_eval2000_stm_line(line: str) -> str:
    """Kaldi's eval2000_data_prep.sh fixes to LDC2002T43's STM before hubscr.pl sees it.

    ``sed -e 's:((:(:' -e 's:<B_ASIDE>::g' -e 's:<E_ASIDE>::g'``: a doubled opening parenthesis
    (first one per line) upsets csrfilt.sh's optional-deletion check, and the aside markers would
    otherwise be scored as words.
    """
    return line.replace("((", "(", 1).replace("<B_ASIDE>", "").replace("<E_ASIDE>", "")
