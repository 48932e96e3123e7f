"""Plain WER for data sets without an STM: each utterance's hypothesis against its ``text`` line.

Words are aligned with sclite's DP (``align_words``: case-insensitive, ``(word)`` optionally
deletable, fragments match), one scored segment per utterance, counts kept per speaker, so the
reports are the same sclite-style ``.sys``/``.raw``/``.dtl``/``.pra`` the Hub5 scorer writes.
No word is filtered out: the text is scored as it stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.datadir import read_table
from asrtrain.score.align import Counts, align_words
from asrtrain.score.hub5 import ScoredSegment, SystemResult


def score_utterances(refs: Mapping[str, list[str]], hyps: Mapping[str, list[str]],
                     utt2spk: Mapping[str, str] | None = None, title: str = "text",
                     hyp_name: str = "hypothesis") -> SystemResult:
    """Align every reference utterance with its hypothesis (a missing one counts as empty).

    Speakers come from ``utt2spk`` (the utterance itself where it has none); hypothesis
    utterances without a reference raise AsrtrainError, naming ``hyp_name``."""
    extra = sorted(set(hyps) - set(refs))
    if extra:
        raise AsrtrainError(
            f"{hyp_name}: {len(extra)} utterance(s) have no reference, e.g. {extra[0]!r}")
    result = SystemResult(title)
    speakers = utt2spk or {}
    for utt in sorted(refs):
        path = align_words(refs[utt], hyps.get(utt, []))
        speaker = speakers.get(utt, utt)
        result.speakers.setdefault(speaker, Counts()).add_path(path)
        result.segments.append(ScoredSegment(speaker, utt, "1", "", 0.0, 0.0, path))
    return result


def wer_counts(refs: Mapping[str, list[str]], hyps: Mapping[str, list[str]]) -> Counts:
    """Per-utterance WER counts summed over the set (see ``score_utterances``)."""
    return score_utterances(refs, hyps).total


def score_text(ref_text: Path, hyp_text: Path, out_dir: Path,
               utt2spk: Mapping[str, str] | None = None) -> Counts:
    """Score the table ``hyp_text`` against ``ref_text`` (both ``<utt> <words...>``) and write
    ``out_dir/text.{sys,raw,dtl,pra}``; returns the total counts."""
    from asrtrain.score.report import write_reports

    refs = read_table(ref_text, allow_empty_value=True)
    hyps = read_table(hyp_text, allow_empty_value=True)
    result = score_utterances({u: t.split() for u, t in refs.items()},
                              {u: t.split() for u, t in hyps.items()}, utt2spk,
                              title=Path(hyp_text).name, hyp_name=str(hyp_text))
    write_reports(result, out_dir, "text")
    return result.total
