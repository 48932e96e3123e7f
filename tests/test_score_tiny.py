"""Parity with hubscr.pl on the tiny corpus' Hub5'00-style reference, scored against perturbed CTMs.

The STM (data/tiny/LDC2002T43/reference/hub5e00.english.000405.stm, with Kaldi's eval2000 fixes)
is turned into time-mediated CTMs: each segment's words get plausible times inside the segment,
then words are substituted, deleted, inserted, lower-cased, optional words realised or dropped,
fragments completed, noise tokens added.  Both scorers must give identical counts per speaker for
all, swbd and callhm, with and without Kaldi's CTM filter.  A perfect hypothesis scores 0.00%,
whether its words are the reference's (contractions expanded, as the Hub5 stm spells them) or the
words as spoken (contractions, hesitations and partial words, as the CallHome-style transcripts
and a recognizer trained on the ms98 transcripts give them).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from asrtrain.score import score_hub5
from asrtrain.score.ctm import kaldi_keep
from asrtrain.score.hub5 import SUBSETS, in_subset, score_hub5_python
from asrtrain.score.sclite import run_hubscr, sctk_bin
from asrtrain.score.stm import fix_eval2000_stm_line, parse_stm_line

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "tiny" / "LDC2002T43" / "reference"
STM = REFERENCE / "hub5e00.english.000405.stm"
GLM = REFERENCE / "en20000405_hub5.glm"

FILLERS = ["uh", "um", "[noise]", "[laughter]", "<unk>", "yeah", "the", "uh-huh", "mm-hmm"]


def _perturbed_ctm(lines: list[str], seed: int) -> str:
    rng = random.Random(seed)
    vocab = sorted({w for line in lines for w in line.split()[6:] if w.isalpha()})
    out = []
    for n, line in enumerate(lines):
        seg = parse_stm_line(line, STM, n)
        if seg is None:
            continue
        words = []
        for w in seg.text.split():
            r = rng.random()
            if w.startswith("("):
                inner = w.strip("()")
                if r < 0.5:
                    continue
                words.append(inner.rstrip("-") + rng.choice(["-", "", "ING"])
                             if inner.endswith("-") else rng.choice(["uh", "um", inner]))
            elif r < 0.08:
                continue
            elif r < 0.16:
                words.append(rng.choice(vocab))
            else:
                words.append(w.lower() if rng.random() < 0.5 else w)
            if rng.random() < 0.06:
                words.append(rng.choice(FILLERS))
        if not words:
            continue
        step = (seg.end - seg.start) / len(words)
        for i, w in enumerate(words):
            start = seg.start + i * step + rng.uniform(0, 0.1 * step)
            dur = step * rng.uniform(0.6, 0.9)
            out.append(f"{seg.file} {seg.channel} {start:.2f} {dur:.2f} {w}")
    rng.shuffle(out)
    return "".join(x + "\n" for x in out)


@pytest.mark.timeout(300)
def test_tiny_reference_parity(tmp_path: Path) -> None:
    sctk_bin()
    assert STM.is_file(), f"tiny corpus reference missing: {STM}"
    lines = [fix_eval2000_stm_line(x) for x in STM.read_text(encoding="latin-1").splitlines()]
    stm = tmp_path / "stm"
    stm.write_text("".join(x + "\n" for x in lines))
    sides = 0
    for seed in range(3):
        ctm = tmp_path / f"eval2000.{seed}.ctm"
        ctm.write_text(_perturbed_ctm(lines, seed))
        for kaldi_filter in (False, True):
            ours = score_hub5_python(stm, ctm, GLM, kaldi_filter=kaldi_filter)
            for subset in SUBSETS:
                sub_stm = tmp_path / f"stm.{subset}"
                sub_stm.write_text("".join(x + "\n" for x in lines if in_subset(x, subset)))
                sub_ctm = tmp_path / f"{ctm.name}.{subset}"
                sub_ctm.write_text("".join(
                    x + "\n" for x in ctm.read_text().splitlines()
                    if in_subset(x, subset) and (not kaldi_filter or kaldi_keep(x))))
                speakers, total = run_hubscr(sub_stm, sub_ctm, GLM, tmp_path / "out",
                                             sub_ctm.name)
                mine = ours[subset]
                assert {k: v.as_dict() for k, v in mine.speakers.items()} == {
                    k: v.as_dict() for k, v in speakers.items()}, (seed, kaldi_filter, subset)
                assert mine.total.as_dict() == total.as_dict()
                assert total.ref_words > 0
                sides += len(speakers)
    assert sides >= 12 * 2 * 3


def _timed(file: str, channel: str, start: float, end: float, words: list[str]) -> list[str]:
    step = (end - start) / max(len(words), 1)
    return [f"{file} {channel} {start + i * step:.2f} {0.9 * step:.2f} {w}"
            for i, w in enumerate(words)]


def _ctm_from_stm(lines: list[str]) -> str:
    """The reference's own words (optional ones left out), lower case, in their segments."""
    out = []
    for n, line in enumerate(lines):
        seg = parse_stm_line(line, STM, n)
        if seg is None or seg.text == "IGNORE_TIME_SEGMENT_IN_SCORING":
            continue
        words = [w.lower() for w in seg.text.split() if not w.startswith("(")]
        out += _timed(seg.file, seg.channel, seg.start, seg.end, words)
    return "".join(x + "\n" for x in out)


def _ctm_as_spoken() -> str:
    """The words as spoken, from the CallHome-style transcripts: contractions (i'd, don't),
    hesitations (um) and partial words (prob-) as a recognizer writes them."""
    out = []
    for txt in sorted((REFERENCE / "english").glob("*.txt")):
        for line in txt.read_text().splitlines():
            m = re.fullmatch(r"(\d+\.\d+) (\d+\.\d+) ([AB]): (.*)", line)
            if not m or m.group(4) == "(( ))":
                continue
            text = re.sub(r'<contraction e_form="[^"]*">', "", m.group(4))
            out += _timed(txt.stem, m.group(3), float(m.group(1)), float(m.group(2)),
                          [w.lstrip("%") for w in text.split()])
    return "".join(x + "\n" for x in out)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("source", ["stm", "spoken"])
@pytest.mark.parametrize("backend", ["python", "sclite"])
def test_perfect_hypothesis_scores_zero(tmp_path: Path, source: str, backend: str) -> None:
    """The tiny stm and GLM agree: the GLM expands a hypothesis' contractions (its ctm-only
    rules) into the words the stm spells out, so a perfect CTM has no error in any subset."""
    lines = [fix_eval2000_stm_line(x) for x in STM.read_text(encoding="latin-1").splitlines()]
    stm = tmp_path / "stm"
    stm.write_text("".join(x + "\n" for x in lines))
    ctm = tmp_path / "ctm"
    ctm.write_text(_ctm_from_stm(lines) if source == "stm" else _ctm_as_spoken())
    if source == "spoken":
        assert {"i'd", "don't", "that's", "um", "prob-"} <= set(ctm.read_text().split())
    for kaldi_filter in (True, False):
        counts = score_hub5(stm, ctm, tmp_path / "out", GLM, kaldi_filter, backend)
        for subset in SUBSETS:
            c = counts[subset]
            assert (c.err, c.corr) == (0, c.ref_words), (subset, kaldi_filter, c.as_dict())
        assert counts["all"].ref_words == 593 == (counts["swbd"].ref_words
                                                  + counts["callhm"].ref_words)
