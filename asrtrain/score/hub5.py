"""Hub5 scoring of a CTM against an STM, equal to SCTK's ``hubscr.pl -V -l english -h hub5``.

What hubscr.pl does, and so what this module does, per conversation side (file and channel):
sort both files, filter them through the GLM (csrfilt.sh), hand every hypothesis word to the
reference segment its time midpoint falls before the end of (sclite's segment_hyp_for_utt: words
before a segment go to it, the last segment of a side takes all the rest), drop segments marked
IGNORE_TIME_SEGMENT_IN_SCORING with their words, and align each segment with sclite's DP (-F
fragments, -D optional words).  Counts are kept per speaker (the STM speaker field).

Subsets follow Kaldi's egs/swbd/s5c/local/score_sclite.sh: ``swbd`` keeps the lines not starting
``en_`` and ``callhm`` those not starting ``sw_`` (both STM and CTM), ``all`` keeps everything.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.score.align import AlignedPair, Counts, Network, align_networks, make_word, parse_text
from asrtrain.score.ctm import (
    HypItem,
    HypWord,
    filter_ctm,
    kaldi_keep,
    parse_ctm_line,
    parse_filtered_ctm,
    sort_ctm,
)
from asrtrain.score.glm import Glm, ascii_lower
from asrtrain.score.lines import read_lines
from asrtrain.score.stm import StmSegment, filter_stm, parse_stm_line, sort_stm

SUBSETS = ("all", "swbd", "callhm")
_LABEL = re.compile(r';;\s*LABEL\s+"([^"]*)"', re.IGNORECASE)
_IGNORE_MARKERS = ("IGNORE_TIME_SEGMENT_IN_SCORING", "IGNORETIMESEGMENTINSCORING")


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def in_subset(line: str, subset: str) -> bool:
    """Kaldi's ``grep -v '^en_'`` (swbd) / ``grep -v '^sw_'`` (callhm) on a raw STM/CTM line."""
    if subset == "all":
        return True
    if subset == "swbd":
        return not line.startswith("en_")
    if subset == "callhm":
        return not line.startswith("sw_")
    raise AsrtrainError(f"unknown Hub5 subset {subset!r}; expected one of {', '.join(SUBSETS)}")


@dataclass
class ScoredSegment:
    """One scored reference segment with its alignment (for .pra/.dtl style reports)."""

    speaker: str
    file: str
    channel: str
    labels: str
    start: float
    end: float
    path: list[AlignedPair]


@dataclass
class SystemResult:
    """Everything sclite reports for one hypothesis file: counts per speaker and alignments."""

    title: str
    speakers: dict[str, Counts] = field(default_factory=dict)
    segments: list[ScoredSegment] = field(default_factory=list)

    @property
    def total(self) -> Counts:
        total = Counts()
        for c in self.speakers.values():
            total += c
        return total


def _hyp_network(items: Iterable[HypItem]) -> Network:
    net = Network()
    for item in items:
        if isinstance(item, HypWord):
            net.append_word(make_word(item.text))
        else:
            net.append_alternation([[make_word(w.text) for w in alt] for alt in item.alternatives])
    return net


def _ref_network(text: str) -> Network:
    net = Network()
    for tok in parse_text(text):
        if isinstance(tok, str):
            net.append_word(make_word(tok))
        else:
            net.append_alternation([[make_word(w) for w in alt] for alt in tok])
    return net


def score_filtered(segments: list[StmSegment], hyp_lines: list[str], title: str = "hyp",
                   ctm_name: str = "CTM") -> SystemResult:
    """sclite ``-F -D`` on a filtered, sorted STM and CTM (align_ctm_to_stm_dp)."""
    result = SystemResult(title)
    hyp_channels = parse_filtered_ctm(hyp_lines)
    ref_channels: dict[tuple[str, str], list[StmSegment]] = {}
    for seg in segments:
        ref_channels.setdefault((seg.file, seg.channel), []).append(seg)
    ref_keys = {(ascii_lower(f), ascii_lower(c)) for f, c in ref_channels}
    for f, c in hyp_channels:
        if (ascii_lower(f), ascii_lower(c)) not in ref_keys:
            raise AsrtrainError(
                f"{ctm_name}: hypothesis words for file {f!r} channel {c!r}, which the STM "
                f"reference does not have (sclite fails on this)"
            )
    hyp_by_key = {(ascii_lower(f), ascii_lower(c)): items for (f, c), items in hyp_channels.items()}
    for (f, c), segs in ref_channels.items():
        items = hyp_by_key.get((ascii_lower(f), ascii_lower(c)), [])
        pos = 0
        for k, seg in enumerate(segs):
            if k == len(segs) - 1:
                end = len(items)
            else:
                # sclite reads STM times as C floats: compare with the single-precision end time.
                seg_end = _float32(seg.end)
                end = pos
                while end < len(items) and items[end].mid < seg_end:
                    end += 1
            chunk = items[pos:end]
            pos = end
            if any(m in seg.text for m in _IGNORE_MARKERS):
                continue
            path = align_networks(_ref_network(seg.text), _hyp_network(chunk))
            speaker = ascii_lower(seg.speaker)
            result.speakers.setdefault(speaker, Counts()).add_path(path)
            result.segments.append(ScoredSegment(speaker, ascii_lower(f), ascii_lower(c),
                                                 ascii_lower(seg.labels), seg.start, seg.end,
                                                 path))
    return result


def score_subset(stm_lines: list[tuple[int, str]], ctm_lines: list[tuple[int, str]],
                 stm_path: Path, ctm_path: Path, subset: str, glm_ref: Glm, glm_hyp: Glm,
                 title: str) -> SystemResult:
    """hubscr.pl on the subset's lines: sort, csrfilt both files, then sclite."""
    segments = []
    label_ids: set[str] = set()
    for lineno, line in stm_lines:
        if not in_subset(line, subset):
            continue
        m = _LABEL.match(line.strip())
        if m:
            label_ids.add(ascii_lower(m.group(1)))
        seg = parse_stm_line(line, stm_path, lineno)
        if seg is not None:
            segments.append(seg)
    # sclite refuses segment labels that no ';; LABEL "<id>" ...' header defines.
    for seg in segments:
        for label in filter(None, ascii_lower(seg.labels[1:-1]).split(",")):
            if label not in label_ids:
                raise AsrtrainError(
                    f"{stm_path}:{seg.line}: label {label!r} is not defined by a "
                    f'\';; LABEL "{label.upper()}" "..." "..."\' header line (sclite needs one)'
                )
    entries = []
    for lineno, line in ctm_lines:
        if not in_subset(line, subset):
            continue
        entry = parse_ctm_line(line, ctm_path, lineno)
        if entry is not None:
            entries.append(entry)
    ref = filter_stm(sort_stm(segments), glm_ref)
    hyp = filter_ctm(sort_ctm(entries), glm_hyp)
    return score_filtered(ref, hyp, title, str(ctm_path))


def read_checked(stm: Path, ctm: Path, kaldi_filter: bool,
                 ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The numbered lines of both files, every line validated up front (so an error names its
    line even when a subset would drop it); with ``kaldi_filter`` the CTM lines that Kaldi's
    score_sclite.sh removes are left out."""
    stm_lines = read_lines(stm, "STM")
    ctm_lines = read_lines(ctm, "CTM")
    for lineno, line in stm_lines:
        parse_stm_line(line, stm, lineno)
    for lineno, line in ctm_lines:
        parse_ctm_line(line, ctm, lineno)
    if kaldi_filter:
        ctm_lines = [(n, line) for n, line in ctm_lines if kaldi_keep(line)]
    return stm_lines, ctm_lines


def score_hub5_python(stm: Path, ctm: Path, glm: Path | None = None, kaldi_filter: bool = True,
                      subsets: Iterable[str] = SUBSETS) -> dict[str, SystemResult]:
    """Score all subsets with the pure-Python scorer; returns the sclite results per subset."""
    stm, ctm = Path(stm), Path(ctm)
    glm_ref = Glm.load(glm, "stm", "ref") if glm is not None else Glm.empty()
    glm_hyp = Glm.load(glm, "ctm", "hyp") if glm is not None else Glm.empty()
    stm_lines, ctm_lines = read_checked(stm, ctm, kaldi_filter)
    return {
        subset: score_subset(stm_lines, ctm_lines, stm, ctm, subset, glm_ref, glm_hyp,
                             ctm.name if subset == "all" else f"{ctm.name}.{subset}")
        for subset in subsets
    }
