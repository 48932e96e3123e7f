"""The corpus preparers on LDC-format fixtures, line by line against Kaldi's scripts.

The expected lines below are what Kaldi's own scripts print for tests/fixtures/corpora/ (run once
with LC_ALL=C: egs/swbd/s5c local/swbd1_prepare_dict.sh + swbd1_data_prep.sh with
swbd1_map_words.pl, format_acronyms_dict.py, map_acronyms_transcripts.py; utils/data/
remove_dup_utts.sh; local/eval2000_data_prep.sh with extend_segments.pl; egs/fisher_swbd/s5
local/fisher_data_prep.sh). Kaldi's awk prints segment times with %g ("0.2"); here they are shown
with the two decimals DataDir writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from asrtrain.data.corpora.eval2000 import extend_segments, prepare_eval2000
from asrtrain.data.corpora.fisher import prepare_fisher
from asrtrain.data.corpora.swbd import map_word, prepare_swbd, remove_dup_utts
from asrtrain.data.datadir import DataDir

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "corpora"
SWBD = FIXTURES / "swbd"
EVAL2000 = FIXTURES / "eval2000"
FISHER = FIXTURES / "fisher"


def _lines(table: dict[str, str]) -> list[str]:
    return [f"{k} {v}" for k, v in sorted(table.items())]


def _segments(d: DataDir) -> list[str]:
    return [f"{u} {s.recording} {s.start:.2f} {s.end:.2f}" for u, s in sorted(d.segments.items())]


# ------------------------------------------------------------------------------ Switchboard
SWBD_TEXT = """\
sw02001-A_000005-000020 hi um [noise] ab- -y story
sw02001-A_000020-000030 them yuppiedom
sw02001-A_000035-000040 [silence]
sw02001-A_000040-000053 it'n [vocalized-noise] i._b._m. i._b._m.'s b._b._c.s a. i [laughter]
sw02001-A_000053-000060 ex ammn-t- sto-
sw02001-A_000060-000070 the i. b. m. thing [noise] yes them's
sw02001-B_000000-000010 uh-huh
sw02001-B_000010-000020 uh-huh
sw02001-B_000020-000030 uh-huh
sw02001-B_000030-000040 uh-huh
sw02001-B_000040-000050 yeah
sw02005-A_000000-000016 uh-huh
sw02005-A_000016-000040 yeah [vocalized-noise] yuppiedom
sw02005-B_000020-000045 uh-huh
sw02005-B_000045-000070 um yeah -y
""".splitlines()

SWBD_SEGMENTS = """\
sw02001-A_000005-000020 sw02001-A 0.05 0.20
sw02001-A_000020-000030 sw02001-A 0.20 0.30
sw02001-A_000035-000040 sw02001-A 0.35 0.40
sw02001-A_000040-000053 sw02001-A 0.40 0.53
sw02001-A_000053-000060 sw02001-A 0.53 0.60
sw02001-A_000060-000070 sw02001-A 0.60 0.70
sw02001-B_000000-000010 sw02001-B 0.00 0.10
sw02001-B_000010-000020 sw02001-B 0.10 0.20
sw02001-B_000020-000030 sw02001-B 0.20 0.30
sw02001-B_000030-000040 sw02001-B 0.30 0.40
sw02001-B_000040-000050 sw02001-B 0.40 0.50
sw02005-A_000000-000016 sw02005-A 0.00 0.16
sw02005-A_000016-000040 sw02005-A 0.16 0.40
sw02005-B_000020-000045 sw02005-B 0.20 0.45
sw02005-B_000045-000070 sw02005-B 0.45 0.70
""".splitlines()

SWBD_LEXICON = """\
!sil sil
-y iy
<unk> spn
[laughter] lau
[noise] nsn
[vocalized-noise] spn
a ax
a. ey
ab- ae b
ammn-t- ae m y uw ih t
b. b iy
b._b._c.s b iy b iy s iy z
c. s iy
d. d iy
e. iy
ex eh k s
f. eh f
g. jh iy
h. ey ch
hi hh ay
i ay
i. ay
i._b._m. ay b iy eh m
i._b._m.'s ay b iy eh m z
it'n ih t n
j. jh ey
k. k ey
l. eh l
m. eh m
n. eh n
o. ow
p. p iy
q. k y uw
r. aa r
s. eh s
sto- s t ao
story s t ao r iy
t. t iy
the dh ax
them dh ax m
them dh eh m
thing th ih ng
u. y uw
uh-huh ah hh ah
um ah m
v. v iy
w. d ah b ax l y uw
x. eh k s
y. w ay
yeah y ae
yes y eh s
yuppiedom y ah p iy d ax m
z. z iy
""".splitlines()

SWBD_ACRONYMS_TAIL = """\
a\ta.\ta
bbcs\tb._b._c.s\tb b c's
i\ti.\ti
ibm\ti._b._m.\ti b m
ibm's\ti._b._m.'s\ti b m's
""".splitlines()


@pytest.fixture(scope="module")
def swbd():
    return prepare_swbd(SWBD / "LDC97S62", SWBD, dev_utts=2, max_dup=3, max_missing_audio=0)


def test_swbd_text_as_kaldi_s5c(swbd):
    # Covers: [silence] removed (but a second adjacent one survives Kaldi's non-overlapping
    # regex), asides removed, empty utterances dropped, ab[solute]- -> ab-, -[an]y -> -y,
    # [laughter-story] -> story, [laughter-sto]- -> sto-, [it'n/isn't] -> it'n, {x} -> x,
    # them_1 -> them, ex[specially]-/especially] -> ex, ammu[n]it- -> ammn-t- (Kaldi's $3 quirk),
    # acronyms ibm -> i._b._m., "a" -> "a." (ms98 has "a ey"), I B M -> i. b. m., lowercase.
    train = swbd.sets["train"]
    assert _lines(train.text) == SWBD_TEXT
    assert _segments(train) == SWBD_SEGMENTS
    assert _lines(train.utt2spk) == [f"{line.split()[0]} {line.split()[0][:9]}"
                                     for line in SWBD_TEXT]
    assert sorted(train.wav) == ["sw02001-A", "sw02001-B", "sw02005-A", "sw02005-B"]
    assert train.wav["sw02005-B"].endswith(
        f"LDC97S62/swb1_d2/data/sw02005.sph - | {shutil.which('sox')} -t wav - -t wav - remix 2 |")
    assert train.reco2file_and_channel == {"sw02001-A": ("sw02001", "A"),
                                           "sw02001-B": ("sw02001", "B"),
                                           "sw02005-A": ("sw02005", "A"),
                                           "sw02005-B": ("sw02005", "B")}
    train.validate("train")


def test_swbd_dict_dir_as_kaldi_s5c(swbd):
    files = swbd.dict_dir.files()
    assert files["lexicon.txt"].splitlines() == SWBD_LEXICON
    assert files["silence_phones.txt"] == "sil\nspn\nnsn\nlau\n"
    assert files["optional_silence.txt"] == "sil\n"
    assert files["extra_questions.txt"] == ""
    assert files["nonsilence_phones.txt"].split() == (
        "ae ah ao ax ay b d dh eh ey hh ih iy k m n ng p r s t th uw y z".split())
    acronyms = files["acronyms.map"].splitlines()
    assert acronyms[:3] == ["A\ta.\ta", "B\tb.\tb", "C\tc.\tc"]
    assert len(acronyms) == 26 + 5 and acronyms[26:] == SWBD_ACRONYMS_TAIL


def test_swbd_subsets_as_kaldi(swbd):
    assert swbd.sets["train_dev"].utts == [line.split()[0] for line in SWBD_TEXT[:2]]
    # remove_dup_utts.sh 3 on the rest: "uh-huh" appears 5 times there; Kaldi's generator keeps
    # these (checked by running its perl on the same text).
    assert swbd.sets["train_nodup"].utts == [
        "sw02001-A_000035-000040", "sw02001-A_000040-000053", "sw02001-A_000053-000060",
        "sw02001-A_000060-000070", "sw02001-B_000000-000010", "sw02001-B_000020-000030",
        "sw02001-B_000040-000050", "sw02005-A_000000-000016", "sw02005-A_000016-000040",
        "sw02005-B_000045-000070"]
    for name in ("train_dev", "train_nodup"):
        swbd.sets[name].validate(name)
        assert set(swbd.sets[name].wav) == {s.recording
                                            for s in swbd.sets[name].segments.values()}


def test_swbd_transcripts_dir_itself():
    # The ms98 directory may be given itself instead of the directory holding it.
    corpus = prepare_swbd(SWBD / "LDC97S62", SWBD / "swb_ms98_transcriptions", dev_utts=2,
                          max_dup=3, max_missing_audio=0)
    assert _lines(corpus.sets["train"].text) == SWBD_TEXT


@pytest.mark.parametrize("raw,mapped", [
    ("[laughter-story]", "story"), ("[LAUGHTER-Story]", "Story"), ("[laughter-sto]-", "sto-"),
    ("[it'n/isn't]", "it'n"), ("[lem[guini]-/linguini]", "lem-"),
    ("-[an]y", "-y"), ("[an]y", "-y"), ("ab[solute]-", "ab-"), ("ab[solute]", "ab-"),
    ("ex[specially]-/especially]", "ex"), ("{yuppiedom}", "yuppiedom"),
    ("ammu[n]it-", "ammn-t-"), ("them_1", "them"), ("them_1's", "them's"),
    ("[noise]", "[noise]"), ("[vocalized-noise]", "[vocalized-noise]"), ("uh-huh", "uh-huh"),
])
def test_map_word_as_swbd1_map_words(raw, mapped):
    # Each pair was run through Kaldi's swbd1_map_words.pl.
    assert map_word(raw) == mapped


def test_remove_dup_utts_generator():
    d = DataDir()
    for i in range(10):
        u = f"s-{i:02d}"
        d.utt2spk[u], d.text[u], d.wav[u] = "s", "uh-huh" if i < 8 else "yes", "x.wav"
    # Kaldi: n=8 >= 3, keep when random() < 3/8, random() = (k + 103349) % 71147 / 71147.
    kept = remove_dup_utts(d, 3).utts
    k, expect = 0, []
    for i in range(8):
        k = (k + 103349) % 71147
        if k / 71147 < 3 / 8:
            expect.append(f"s-{i:02d}")
    assert kept == expect + ["s-08", "s-09"]


# ------------------------------------------------------------------------------ eval2000
EVAL2000_TEXT = """\
en_4156-A_000005-000020 OH (( I DON'T KNOW ))
en_4156-A_000028-000041 <B_ASIDE> YEAH (( )) RIGHT <E_ASIDE>
en_4156-B_000010-000030 %HESITATION WE (%HESITATION) WENT
en_4156-B_000025-000050 TO THE (STORE-)
en_4156-B_000062-000070 UH-HUH
sw_4390-A_000000-000035 I THINK THAT'S RIGHT
sw_4390-B_000040-000075 YEAH
""".splitlines()

# 0.29 * 100 truncates to 28, as awk's %d does; neighbours meet halfway; overlapping segments
# (en_4156-B 0.10-0.30 and 0.25-0.50) keep their inner times; the first start is clamped at 0.
EVAL2000_SEGMENTS = """\
en_4156-A_000005-000020 en_4156-A 0.00 0.24
en_4156-A_000028-000041 en_4156-A 0.24 0.43
en_4156-B_000010-000030 en_4156-B 0.00 0.30
en_4156-B_000025-000050 en_4156-B 0.25 0.56
en_4156-B_000062-000070 en_4156-B 0.56 0.80
sw_4390-A_000000-000035 sw_4390-A 0.00 0.45
sw_4390-B_000040-000075 sw_4390-B 0.30 0.85
""".splitlines()


@pytest.fixture(scope="module")
def eval2000():
    return prepare_eval2000(EVAL2000 / "LDC2002S09", EVAL2000 / "LDC2002T43", expected_sides=4)


def test_eval2000_as_kaldi(eval2000):
    d = eval2000.data
    assert _lines(d.text) == EVAL2000_TEXT          # IGNORE_TIME_SEGMENT_IN_SCORING left out
    assert _segments(d) == EVAL2000_SEGMENTS
    assert d.utt2spk == {u: u[:9] for u in d.text}
    # sw_4484 has audio but no segments: dropped as fix_data_dir.sh drops it.
    assert sorted(d.wav) == ["en_4156-A", "en_4156-B", "sw_4390-A", "sw_4390-B"]
    assert d.reco2file_and_channel["sw_4390-B"] == ("sw_4390", "B")
    d.validate("eval2000")


def test_eval2000_stm_and_glm_copies(eval2000):
    src = (EVAL2000 / "LDC2002T43" / "2000_hub5_eng_eval_tr" / "reference")
    stm_in = (src / "hub5e00.english.000405.stm").read_bytes().splitlines()
    stm_out = eval2000.stm.splitlines()
    assert len(stm_in) == len(stm_out)
    changed = [(a, b) for a, b in zip(stm_in, stm_out, strict=True) if a != b]
    assert changed == [
        (b"en_4156 A en_4156_A 0.05 0.20 <O,en,F,en-F>  OH (( I DON'T KNOW ))",
         b"en_4156 A en_4156_A 0.05 0.20 <O,en,F,en-F>  OH ( I DON'T KNOW ))"),
        (b"en_4156 A en_4156_A 0.29 0.41 <O,en,F,en-F>  <B_ASIDE> YEAH (( )) RIGHT <E_ASIDE>",
         b"en_4156 A en_4156_A 0.29 0.41 <O,en,F,en-F>   YEAH ( )) RIGHT "),
    ]
    assert eval2000.glm == (src / "en20000405_hub5.glm").read_bytes()


def test_extend_segments_as_kaldi_examples():
    # The examples at the end of Kaldi's extend_segments.pl.
    got = extend_segments([("a1", "A", 0, 1), ("a2", "A", 3, 4), ("b1", "B", 0, 1),
                           ("b2", "B", 2, 3)], 1.0)
    assert [(u, f"{s:.2f}", f"{e:.2f}") for u, _, s, e in got] == [
        ("a1", "0.00", "2.00"), ("a2", "2.00", "5.00"), ("b1", "0.00", "1.50"),
        ("b2", "1.50", "4.00")]
    got = extend_segments([("a1", "A", 0, 2), ("a2", "A", 1, 3)], 1.0)
    assert [(s, e) for _, _, s, e in got] == [(0, 2), (1, 4)]
    got = extend_segments([("a1", "A", 0, 2), ("a2", "A", 5, 6), ("a3", "A", 3, 4)], 1.0)
    assert [(f"{s:.2f}", f"{e:.2f}") for _, _, s, e in got] == [
        ("0.00", "2.50"), ("4.50", "7.00"), ("2.50", "4.50")]


# ------------------------------------------------------------------------------ Fisher
FISHER_TEXT = [
    "fe_03_00001-A-000025-000040 and [laughter] i think so",
    "fe_03_00001-B-000028-000033 [noise] [noise] [noise]",
    "fe_03_00001-B-000041-000055 yeah [noise] [noise] right",
    "fe_03_05851-A-000035-000050 i. b. m.'s",
    "fe_03_05851-A-000060-000070 a",
    "fe_03_05851-B-000010-000030 hello   [laughter] there",
]


def test_fisher_as_kaldi():
    # Covers: (( lines dropped, [laugh]/[cough]/[sigh]/[mn]/[breath]/[lipsmack] mapped, times
    # truncated (0.29 -> 000028), "((" alone and the two-character "ok" skipped by Kaldi's
    # regex, inner spacing kept, the new-style fisher_eng_tr_sp_d1 directory name.
    d = prepare_fisher([FISHER / "LDC2004T19", FISHER / "LDC2005T19", FISHER / "LDC2004S13",
                        FISHER / "LDC2005S13"], expected_conversations=2)
    assert _lines(d.text) == FISHER_TEXT
    assert _segments(d) == [
        "fe_03_00001-A-000025-000040 fe_03_00001-A 0.25 0.40",
        "fe_03_00001-B-000028-000033 fe_03_00001-B 0.28 0.33",
        "fe_03_00001-B-000041-000055 fe_03_00001-B 0.41 0.55",
        "fe_03_05851-A-000035-000050 fe_03_05851-A 0.35 0.50",
        "fe_03_05851-A-000060-000070 fe_03_05851-A 0.60 0.70",
        "fe_03_05851-B-000010-000030 fe_03_05851-B 0.10 0.30"]
    assert d.utt2spk == {u: u[:13] for u in d.text}
    assert sorted(d.wav) == ["fe_03_00001-A", "fe_03_00001-B", "fe_03_05851-A", "fe_03_05851-B"]
    d.validate("train_fisher")


def test_fisher_single_directory(tmp_path):
    # "We also support a single directory that has the contents of all of them."
    for part in ("LDC2004T19", "LDC2005T19", "LDC2004S13", "LDC2005S13"):
        shutil.copytree(FISHER / part, tmp_path, dirs_exist_ok=True)
    d = prepare_fisher([tmp_path], expected_conversations=2)
    assert _lines(d.text) == FISHER_TEXT
