"""Consistency of the committed tiny corpus in data/tiny (LDC Switchboard / Hub5'00 layouts).

These tests read the committed files only (no espeak-ng): audio format, transcript times against
the audio, lexicon coverage, train/test separation and the Hub5 pem/stm/glm conventions.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import soundfile as sf

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny"
SWBD = TINY / "LDC97S62"
MS98 = SWBD / "swb_ms98_transcriptions"
HUB5_AUDIO = TINY / "LDC2002S09" / "hub5e_00" / "english"
HUB5_REF = TINY / "LDC2002T43" / "reference"
STM = HUB5_REF / "hub5e00.english.000405.stm"
PEM = HUB5_AUDIO / "hub5e_00.pem"
GLM_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "glm" / "en20030506.glm"

# Tokens that Kaldi's swbd1_data_prep.sh / swbd1_prepare_dict.sh treat specially: [silence] and
# the aside markers are removed, the noise words get phones added by the recipe (not in ms98).
NOT_IN_LEXICON = {"[silence]", "[noise]", "[laughter]", "[vocalized-noise]", "<b_aside>",
                  "<e_aside>"}
MS98_PHONES = {"aa", "ae", "ah", "ao", "aw", "ax", "ay", "b", "ch", "d", "dh", "eh", "er", "ey",
               "f", "g", "hh", "ih", "iy", "jh", "k", "l", "m", "n", "ng", "ow", "oy", "p", "r",
               "s", "sh", "t", "th", "uh", "uw", "v", "w", "y", "z", "zh", "sil"}
SAMPLE = 1.0 / 8000


def train_sph() -> list[Path]:
    files = sorted(SWBD.glob("swb1_d*/data/sw0*.sph"))
    assert len(files) >= 10, files
    return files


def hub5_sph() -> list[Path]:
    return sorted(HUB5_AUDIO.glob("*.sph"))


@cache
def duration(path: Path) -> float:
    info = sf.info(str(path))
    return info.frames / info.samplerate


def ms98_file(conv: int, side: str) -> Path:
    return MS98 / f"{conv // 100:02d}" / f"{conv:04d}" / f"sw{conv}{side}-ms98-a-trans.text"


@cache
def ms98_lines(conv: int, side: str) -> list[tuple[str, float, float, list[str]]]:
    out = []
    for line in ms98_file(conv, side).read_text().splitlines():
        uid, start, end, *words = line.split()
        out.append((uid, float(start), float(end), words))
    return out


def conversations() -> list[tuple[int, Path]]:
    return [(int(p.stem[2:]), p) for p in train_sph()]


@cache
def stm_rows() -> list[tuple[str, str, str, float, float, str, list[str]]]:
    rows = []
    for line in STM.read_text().splitlines():
        if line.startswith(";;"):
            continue
        f = line.split()
        rows.append((f[0], f[1], f[2], float(f[3]), float(f[4]), f[5], f[6:]))
    return rows


def lexicon() -> dict[str, list[list[str]]]:
    lex: dict[str, list[list[str]]] = {}
    path = MS98 / "sw-ms98-dict.text"
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith("#") or not line.strip():
            continue
        word, *phones = line.split()
        assert phones, f"{path}:{n}: entry without phones"
        lex.setdefault(word, []).append(phones)
    return lex


def normalized_train_words(words: list[str]) -> list[str]:
    """ms98 tokens -> spoken words, as Kaldi's swbd1_map_words.pl plus removal of markup."""
    out = []
    for w in words:
        if w in NOT_IN_LEXICON or w in ("uh", "um") or re.search(r"\[\w+\]-$|^-\[", w):
            continue
        w = re.sub(r"^\[laughter-(.+)\]$", r"\1", w)
        w = re.sub(r"_\d$", "", w).strip("{}")
        out.append(w)
    return out


def normalized_stm_words(words: list[str]) -> list[str]:
    drop = {"(%HESITATION)", "<B_ASIDE>", "<E_ASIDE>"}
    return [w.lower() for w in words if w not in drop and not re.fullmatch(r"\(.*-\)", w)]


# ---------------------------------------------------------------------------------------------
def test_sphere_audio_is_two_channel_8khz_mulaw() -> None:
    files = train_sph() + hub5_sph()
    assert len(hub5_sph()) >= 6
    for path in files:
        assert path.read_bytes()[:8] == b"NIST_1A\n", path
        info = sf.info(str(path))
        assert (info.samplerate, info.channels, info.subtype) == (8000, 2, "ULAW"), path
        x, sr = sf.read(str(path), dtype="int16", frames=8000)
        assert x.shape == (8000, 2) and sr == 8000


def test_ms98_transcripts_tile_each_side_within_its_audio() -> None:
    for conv, sph in conversations():
        dur = duration(sph)
        for side in "AB":
            lines = ms98_lines(conv, side)
            assert lines, ms98_file(conv, side)
            t = 0.0
            for i, (uid, start, end, words) in enumerate(lines, start=1):
                where = f"{ms98_file(conv, side)}:{i}"
                assert uid == f"sw{conv}{side}-ms98-a-{i:04d}", where
                assert abs(start - t) < 1e-6, f"{where}: segments must tile the side"
                assert 0.0 <= start < end <= dur + SAMPLE, f"{where}: {start}-{end} vs {dur}"
                assert words, where
                t = end
            assert abs(t - dur) < 2 * SAMPLE, f"{ms98_file(conv, side)}: ends at {t}, audio {dur}"


def test_ms98_speech_segments_have_speech_and_silence_segments_do_not() -> None:
    for conv, sph in conversations():
        audio, sr = sf.read(str(sph), dtype="float32")
        for ch, side in enumerate("AB"):
            for uid, start, end, words in ms98_lines(conv, side):
                seg = audio[int(start * sr): int(end * sr), ch]
                level = 20 * np.log10(np.sqrt(np.mean(seg**2)) + 1e-9)
                if words == ["[silence]"]:
                    assert level < -50, f"{uid}: [silence] segment at {level:.1f} dBFS"
                else:
                    assert level > -40, f"{uid}: speech segment at {level:.1f} dBFS"


def test_ms98_transcripts_use_the_switchboard_markup() -> None:
    tokens = {w for conv, _ in conversations() for side in "AB"
              for *_, words in ms98_lines(conv, side) for w in words}
    for marker in NOT_IN_LEXICON | {"uh", "um"}:
        assert marker in tokens, marker
    assert any(re.fullmatch(r"[a-z]+\[[a-z]+\]-", w) for w in tokens)  # ab[solutely]-
    assert any(re.fullmatch(r"\[laughter-[a-z]+\]", w) for w in tokens)
    assert any(re.fullmatch(r"\{[a-z]+\}", w) for w in tokens)
    assert any(re.fullmatch(r"[a-z]+_1", w) for w in tokens)
    assert all(w == w.lower() for w in tokens)


def test_lexicon_covers_train_and_test_vocabulary() -> None:
    lex = lexicon()
    for word, prons in lex.items():
        for phones in prons:
            assert set(phones) <= MS98_PHONES, (word, phones)
    assert lex["[silence]"] == [["sil"]]
    # Like the real ms98 lexicon: the recipe adds these itself (with spn/nsn/lau phones).
    assert not {"[noise]", "[laughter]", "[vocalized-noise]"} & set(lex)
    for conv, _ in conversations():
        for side in "AB":
            for uid, _s, _e, words in ms98_lines(conv, side):
                missing = [w for w in words if w not in NOT_IN_LEXICON and w not in lex]
                assert not missing, f"{uid}: not in sw-ms98-dict.text: {missing}"
    for f, _ch, _spk, start, _end, _label, words in stm_rows():
        if words == ["IGNORE_TIME_SEGMENT_IN_SCORING"]:
            continue
        missing = [w for w in normalized_stm_words(words) if w not in lex]
        assert not missing, f"{STM}: {f} {start}: not in sw-ms98-dict.text: {missing}"


def test_test_sentences_do_not_occur_in_training() -> None:
    train_texts = [" " + " ".join(normalized_train_words(words)) + " "
                   for conv, _ in conversations() for side in "AB"
                   for *_, words in ms98_lines(conv, side)]
    train_vocab = {w for t in train_texts for w in t.split()}
    scored = [r for r in stm_rows() if r[6] != ["IGNORE_TIME_SEGMENT_IN_SCORING"]]
    test_vocab = set()
    for f, _ch, _spk, start, _end, _label, words in scored:
        norm = normalized_stm_words(words)
        test_vocab.update(norm)
        if len(norm) >= 4:
            text = " " + " ".join(norm) + " "
            assert not any(text in t for t in train_texts), f"{f} {start}: {text} is in training"
    # Test words come from training apart from a handful of test-only words.
    test_only = test_vocab - train_vocab
    assert 0 < len(test_only) <= 8, test_only


def test_stm_has_hub5_headers_labels_and_ignore_regions() -> None:
    text = STM.read_text()
    headers = [line for line in text.splitlines() if line.startswith(";;")]
    assert ';; CATEGORY "0" "" ""' in headers
    for label in ("O", "EN", "SW", "F", "M", "EN-F", "EN-M", "SW-F", "SW-M"):
        assert any(h.startswith(f';; LABEL "{label}" ') for h in headers), label
    rows = stm_rows()
    assert any(r[6] == ["IGNORE_TIME_SEGMENT_IN_SCORING"] for r in rows)
    assert rows == sorted(rows, key=lambda r: (r[0], r[1], r[3]))
    audio = {p.stem: p for p in hub5_sph()}
    for f, ch, spk, start, end, label, words in rows:
        assert f in audio and ch in "AB" and spk == f"{f}_{ch}", (f, ch, spk)
        corpus = f[:2]
        assert re.fullmatch(rf"<O,{corpus},[MF],{corpus}-[MF]>", label), label
        assert 0 <= start < end <= duration(audio[f]), (f, start, end)
        assert words
    assert {f[:3] for f, *_ in rows} == {"sw_", "en_"}
    tokens = {w for r in rows for w in r[6]}
    assert "(%HESITATION)" in tokens and "<B_ASIDE>" in tokens
    assert any(re.fullmatch(r"\([A-Z']+-\)", w) for w in tokens)


def test_pem_segments_match_stm_segments() -> None:
    pem = []
    for line in PEM.read_text().splitlines():
        if line.startswith(";;"):
            continue
        f, ch, spk, start, end = line.split()
        assert spk == "unknown_speaker"
        pem.append((f, ch, start, end))
    stm = []
    for line in STM.read_text().splitlines():
        if not line.startswith(";;"):
            f = line.split()
            stm.append((f[0], f[1], f[3], f[4]))
    assert pem == stm
    assert {(f, ch) for f, ch, *_ in pem} == {(p.stem, s) for p in hub5_sph() for s in "AB"}


def test_callhome_style_references_match_stm() -> None:
    for sph in hub5_sph():
        txt = HUB5_REF / "english" / f"{sph.stem}.txt"
        spans = set()
        for line in txt.read_text().splitlines():
            if line and not line.startswith("#"):
                start, end, side, *_ = line.split()
                spans.add((f"{float(start):.2f}", f"{float(end):.2f}", side.rstrip(":")))
        stm = {(f"{r[3]:.2f}", f"{r[4]:.2f}", r[1]) for r in stm_rows() if r[0] == sph.stem}
        assert spans == stm, txt


def test_glm_is_nists_public_file() -> None:
    assert GLM_FIXTURE.is_file(), GLM_FIXTURE
    assert (HUB5_REF / "en20000405_hub5.glm").read_bytes() == GLM_FIXTURE.read_bytes()


def test_corpus_size_and_amount_of_speech() -> None:
    def speech(lines: list[tuple[float, float]]) -> float:
        return sum(e - s for s, e in lines)

    train = speech([(s, e) for conv, _ in conversations() for side in "AB"
                    for _u, s, e, w in ms98_lines(conv, side) if w != ["[silence]"]])
    test = speech([(r[3], r[4]) for r in stm_rows()
                   if r[6] != ["IGNORE_TIME_SEGMENT_IN_SCORING"]])
    assert train >= 15 * 60, train
    assert test >= 3 * 60, test
    size = sum(p.stat().st_size for p in TINY.rglob("*") if p.is_file())
    assert size < 20e6, size
