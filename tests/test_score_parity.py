"""Parity of the Python Hub5 scorer with NIST SCTK's hubscr.pl on many random STM/CTM pairs.

The pairs are generated with fixed seeds and exercise what Hub5 scoring is made of: substitutions,
deletions, insertions, hesitations and backchannels (GLM-mapped), contractions (alternations in
the hypothesis), hyphenated words, optional ``(words)``, fragments ``th-``, ignore regions, words
outside or across segment boundaries, sides without any hypothesis, both sw_ and en_ files, mixed
case, CTMs with and without confidences, and Kaldi's noise/<unk> tokens.  Every pair is scored for
all/swbd/callhm by both scorers; the per-speaker and total counts must be identical.

SCTK is required: the test fails (it does not skip) when hubscr.pl is missing.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from asrtrain.score import score_hub5
from asrtrain.score.hub5 import SUBSETS, score_hub5_python
from asrtrain.score.sclite import run_hubscr, sctk_bin

GLM = Path(__file__).resolve().parent / "fixtures" / "glm" / "en20030506.glm"   # see its README

WORDS = ["the", "and", "i", "you", "that", "it", "to", "a", "of", "know", "yeah", "so", "we",
         "they", "have", "like", "but", "well", "there", "their", "right", "really", "think",
         "go", "going", "to", "do", "not", "is", "has", "he", "she", "can", "cannot", "kind",
         "school", "thing", "things", "people", "time", "uh-oh", "x-ray", "well-known",
         "cancelled", "adviser", "good", "by", "bye", "mister", "mr", "okay", "oh", "O.K.",
         "t.", "shirt", "down", "syndrome"]
HESITATIONS = ["uh", "um", "eh", "mm", "hm", "ah", "huh", "er", "%hesitation", "UH", "Um"]
BACKCHANNELS = ["uh-huh", "mm-hmm", "mhm", "huh-uh", "um-hmm", "uh-uh", "%bcack"]
CONTRACTIONS = ["he's", "can't", "don't", "it's", "i'm", "we're", "that's", "won't", "gonna",
                "wanna", "'cause", "you're", "they've", "she'd", "isn't", "let's", "y'all",
                "what's", "kinda", "there's"]
NOISE = ["[noise]", "[laughter]", "[vocalized-noise]", "<unk>", "[NOISE]", "<UNK>"]


def _case(rng: random.Random, w: str) -> str:
    r = rng.random()
    if r < 0.15:
        return w.upper()
    if r < 0.2:
        return w.capitalize()
    return w


def _ref_word(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.08:
        return rng.choice(HESITATIONS)
    if r < 0.13:
        return rng.choice(BACKCHANNELS)
    if r < 0.22:
        return rng.choice(CONTRACTIONS)
    if r < 0.28:
        inner = rng.choice(WORDS + HESITATIONS)
        return f"({inner})"
    if r < 0.33:
        w = rng.choice(WORDS)
        k = rng.randint(1, max(1, len(w) - 1))
        return f"{w[:k]}-" if rng.random() < 0.8 else f"-{w[k:]}"
    if r < 0.35:
        w = rng.choice(WORDS)
        return f"({w[:2]}-)"
    return _case(rng, rng.choice(WORDS))


def _hyp_for(rng: random.Random, ref_words: list[str]) -> list[str]:
    out: list[str] = []
    for w in ref_words:
        base = w.strip("()")
        r = rng.random()
        if r < 0.1:
            continue  # deletion
        if r < 0.2:
            out.append(_case(rng, rng.choice(WORDS + HESITATIONS)))  # substitution
        elif r < 0.25 and len(base) > 1 and base.endswith("-"):
            out.append(base[:-1] + rng.choice(["", "e", "ing", "s"]))  # completed fragment
        elif r < 0.3:
            out.append(rng.choice(CONTRACTIONS + BACKCHANNELS + HESITATIONS))
        elif base and not base.startswith("-") and not base.endswith("-"):
            out.append(_case(rng, base))
        if rng.random() < 0.08:
            out.append(_case(rng, rng.choice(WORDS + HESITATIONS + NOISE)))  # insertion
    return out


def make_pair(seed: int, directory: Path, n_files: int = 5) -> tuple[Path, Path]:
    """Write a random STM and a perturbed, time-marked CTM for it; returns their paths."""
    rng = random.Random(seed)
    stm_lines = [';; LABEL "O" "Overall" "Overall"', ';; LABEL "F" "Female" "Female Caller"']
    ctm_lines: list[str] = []
    with_conf = rng.random() < 0.4
    for k in range(n_files):
        prefix = rng.choice(["sw_", "en_"])
        file_id = f"{prefix}{4000 + seed * 10 + k}"
        for chan in rng.sample(["A", "B"], rng.randint(1, 2)):
            spk = f"{file_id}_{chan}"
            t = round(rng.uniform(0, 5), 2)
            no_hyp_side = rng.random() < 0.05
            for j in range(rng.randint(1, 7)):
                dur = round(rng.uniform(0.5, 6.0), 2)
                start, end = t, round(t + dur, 2)
                t = round(end + rng.choice([0.0, 0.0, rng.uniform(0.1, 2.0)]), 2)
                # (sclite crashes when a whole file has only ignored segments)
                if j > 0 and rng.random() < 0.08:
                    text = "IGNORE_TIME_SEGMENT_IN_SCORING"
                    words = [rng.choice(WORDS) for _ in range(rng.randint(0, 4))]
                else:
                    n = rng.choice([0, 1, 2, 3, 5, 8, 12]) if rng.random() < 0.9 else 20
                    words = [_ref_word(rng) for _ in range(n)]
                    text = " ".join(words)
                label = rng.choice(["<O,F>", "<O>", "<o,f>", ""])
                stm_lines.append(f"{file_id} {chan} {spk} {start:.2f} {end:.2f} {label} {text}")
                if no_hyp_side:
                    continue
                hyp = _hyp_for(rng, words)
                if not hyp:
                    continue
                # plausible times inside the segment, some spilling over its edges
                lo = start - (0.3 if rng.random() < 0.2 else 0.0)
                hi = end + (0.5 if rng.random() < 0.2 else 0.0)
                step = (hi - lo) / len(hyp)
                for i, w in enumerate(hyp):
                    ws = max(0.0, round(lo + i * step + rng.uniform(0, step * 0.2), 2))
                    wd = round(max(0.01, step * rng.uniform(0.5, 0.95)), 2)
                    conf = f" {rng.uniform(0.3, 1.0):.3f}" if with_conf else ""
                    ctm_lines.append(f"{file_id} {chan} {ws:.2f} {wd:.2f} {w}{conf}")
    rng.shuffle(ctm_lines)  # hubscr.pl sorts; so must we
    stm = directory / f"ref{seed}.stm"
    ctm = directory / f"hyp{seed}.ctm"
    stm.write_text("\n".join(stm_lines) + "\n")
    ctm.write_text("\n".join(ctm_lines) + "\n")
    return stm, ctm


def _subset_file(path: Path, subset: str, out: Path, kaldi: bool) -> Path:
    from asrtrain.score.ctm import kaldi_keep
    from asrtrain.score.hub5 import in_subset

    lines = path.read_text().splitlines()
    keep = [x for x in lines if in_subset(x, subset) and (not kaldi or kaldi_keep(x))]
    out.write_text("".join(x + "\n" for x in keep))
    return out


def compare_pair(stm: Path, ctm: Path, work: Path, kaldi_filter: bool) -> int:
    """Score one pair with both scorers for every subset; returns the conversation sides compared.

    Per-speaker (= conversation side) counts and the totals must be identical in every subset.
    """
    ours = score_hub5_python(stm, ctm, GLM, kaldi_filter=kaldi_filter)
    sides = 0
    for subset in SUBSETS:
        sub_stm = _subset_file(stm, subset, work / f"{stm.stem}.{subset}.stm", False)
        sub_ctm = _subset_file(ctm, subset, work / f"{ctm.stem}.{subset}.ctm", kaldi_filter)
        mine = ours[subset]
        if not any(not x.startswith(";;") for x in sub_stm.read_text().splitlines()):
            assert mine.total.segments == 0
            continue
        speakers, total = run_hubscr(sub_stm, sub_ctm, GLM, work / "out", sub_ctm.name)
        got = {k: c.as_dict() for k, c in mine.speakers.items()}
        want = {k: c.as_dict() for k, c in speakers.items()}
        assert got == want, f"{stm} {ctm} subset {subset}: per-speaker counts differ"
        assert mine.total.as_dict() == total.as_dict(), f"{stm} {subset}: totals differ"
        if subset == "all":
            sides = len(want)
    return sides


def merge_pairs(seeds: list[int], directory: Path, n_files: int) -> tuple[Path, Path]:
    """The pairs of ``seeds`` (their files' ids differ: seed * 10 + k) as one STM and one CTM:
    hubscr.pl's ~30 processes start once for all of them. The seeds of one merge all have
    confidences in their CTM or none have."""
    stms, ctms = zip(*(make_pair(seed, directory / f"pair{seed}", n_files) for seed in seeds),
                     strict=True)
    labels = [x for x in stms[0].read_text().splitlines() if x.startswith(";;")]
    stm = directory / f"ref{seeds[0]}x{len(seeds)}.stm"
    ctm = directory / f"hyp{seeds[0]}x{len(seeds)}.ctm"
    stm.write_text("".join(x + "\n" for x in labels + [x for f in stms for x in
                                                       f.read_text().splitlines()
                                                       if not x.startswith(";;")]))
    ctm.write_text("".join(f.read_text() for f in ctms))
    return stm, ctm


@pytest.mark.timeout(400)
def test_parity_random_pairs(tmp_path: Path) -> None:
    """28 random pairs (seeds 0-27; Kaldi's CTM filter on every third), scored in 4 merges: by
    the filter, and by whether the CTM has confidences (make_pair's first draw)."""
    sctk_bin()  # fails loudly (AsrtrainError) without SCTK: CI installs it
    groups: dict[tuple[bool, bool], list[int]] = {}
    for seed in range(28):
        groups.setdefault((seed % 3 == 0, random.Random(seed).random() < 0.4), []).append(seed)
    assert len(groups) == 4
    sides = 0
    for (kaldi_filter, _), seeds in sorted(groups.items()):
        for seed in seeds:
            (tmp_path / f"pair{seed}").mkdir()
        stm, ctm = merge_pairs(seeds, tmp_path, n_files=6)
        sides += compare_pair(stm, ctm, tmp_path, kaldi_filter=kaldi_filter)
    # each side is compared in "all" and again in its swbd or callhm subset
    assert sides >= 200


@pytest.mark.timeout(120)
def test_sclite_backend_equals_python(tmp_path: Path) -> None:
    stm, ctm = make_pair(1000, tmp_path, n_files=6)
    py = score_hub5(stm, ctm, tmp_path / "py", glm=GLM, backend="python")
    sc = score_hub5(stm, ctm, tmp_path / "sc", glm=GLM, backend="sclite")
    assert {k: v.as_dict() for k, v in py.items()} == {k: v.as_dict() for k, v in sc.items()}
    for name in ("hyp1000.ctm.filt.sys", "hyp1000.ctm.swbd.filt.raw",
                 "hyp1000.ctm.callhm.filt.dtl"):
        assert (tmp_path / "py" / name).is_file()
        assert (tmp_path / "sc" / name).is_file()
