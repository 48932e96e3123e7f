"""Per-pass training data (``align.passes.NAME.data``): the subset rules equal Kaldi's
utils/subset_data_dir.sh (--shortest, --first, --last, --speakers, no option) and
utils/data/remove_dup_utts.sh on a hand-made data dir (the expected lists are what Kaldi's own
scripts printed for it); a pass with a subset trains on exactly the subset's utterances of the
tiny corpus; changing the subset reruns that pass and those after it only."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import forked_cli
import pytest

from asrtrain import AsrtrainError
from asrtrain.align.model import read_int_table
from asrtrain.data.datadir import DataDir, check_subset_rules, subset_data_dir, subset_slug

REPO = Path(__file__).resolve().parents[1]
WORDS = ["uh-huh", "yeah", "right", "i know", "that's true", "oh really", "we went there",
         "it was a long time ago", "i think so too"]


def hand_made() -> DataDir:
    """6 speakers, 7 utterances each; transcripts repeat ("uh-huh" 14 times); frame counts
    with ties, so that the C-order tie break of ``sort -n -k2`` matters."""
    d = DataDir()
    for s in range(6):
        spk = f"sw0{2001 + s * 7}-{'AB'[s % 2]}"
        for u in range(7):
            utt = f"{spk}_{u * 100 + s:06d}-{u * 100 + s + 50:06d}"
            d.utt2spk[utt] = spk
            d.wav[utt] = f"/audio/{utt}.wav"
            d.text[utt] = WORDS[(s * 7 + u) % 3 if (s + u) % 2 else (s * 7 + u) % len(WORDS)]
            d.utt2num_frames[utt] = 50 + ((s * 7 + u) * 37) % 11 * 10
    return d


# What Kaldi's scripts keep of hand_made(), run from kaldi-asr/kaldi egs/wsj/s5/utils (LC_ALL=C):
#   utils/subset_data_dir.sh --shortest D 9 A; utils/subset_data_dir.sh --first D 5 B;
#   utils/subset_data_dir.sh --last D 4 C;     utils/subset_data_dir.sh D 7 E   (no option);
#   utils/subset_data_dir.sh --speakers D 10 F;
#   utils/data/remove_dup_utts.sh 3 D G;  utils/subset_data_dir.sh --shortest G 12 G2; then
#   utils/subset_data_dir.sh G2 5 H (fisher_swbd's mono subset, in small)
KALDI: dict[str, list[str]] = {
    "shortest": ["sw02001-A_000000-000050", "sw02001-A_000300-000350",
        "sw02001-A_000600-000650", "sw02008-B_000401-000451", "sw02015-A_000002-000052",
        "sw02022-B_000103-000153", "sw02022-B_000403-000453", "sw02029-A_000504-000554",
        "sw02036-B_000105-000155"],
    "first": ["sw02001-A_000000-000050", "sw02001-A_000100-000150", "sw02001-A_000200-000250",
        "sw02001-A_000300-000350", "sw02001-A_000400-000450"],
    "last": ["sw02036-B_000305-000355", "sw02036-B_000405-000455", "sw02036-B_000505-000555",
        "sw02036-B_000605-000655"],
    "evenly": ["sw02008-B_000201-000251", "sw02015-A_000002-000052",
        "sw02015-A_000602-000652", "sw02022-B_000403-000453", "sw02029-A_000204-000254",
        "sw02036-B_000005-000055", "sw02036-B_000605-000655"],
    "speakers": ["sw02001-A_000000-000050", "sw02001-A_000100-000150",
        "sw02001-A_000200-000250", "sw02001-A_000300-000350", "sw02001-A_000400-000450",
        "sw02001-A_000500-000550", "sw02001-A_000600-000650", "sw02015-A_000002-000052",
        "sw02015-A_000102-000152", "sw02015-A_000202-000252", "sw02015-A_000302-000352",
        "sw02015-A_000402-000452", "sw02015-A_000502-000552", "sw02015-A_000602-000652"],
    "max_dup": ["sw02001-A_000400-000450", "sw02001-A_000600-000650",
        "sw02008-B_000001-000051", "sw02008-B_000101-000151", "sw02008-B_000301-000351",
        "sw02008-B_000501-000551", "sw02015-A_000002-000052", "sw02015-A_000202-000252",
        "sw02015-A_000602-000652", "sw02022-B_000103-000153", "sw02022-B_000303-000353",
        "sw02022-B_000403-000453", "sw02022-B_000503-000553", "sw02029-A_000204-000254",
        "sw02029-A_000404-000454", "sw02029-A_000604-000654", "sw02036-B_000105-000155",
        "sw02036-B_000305-000355", "sw02036-B_000505-000555"],
    "chain": ["sw02008-B_000001-000051", "sw02015-A_000602-000652", "sw02022-B_000503-000553",
        "sw02029-A_000604-000654", "sw02036-B_000505-000555"],
}


def kaldi_case(name: str, rules: list[dict]) -> list[str]:
    return subset_data_dir(hand_made(), check_subset_rules(rules, "test")).utts


@pytest.mark.parametrize("name,rules", [
    ("shortest", [{"shortest": 9}]),
    ("first", [{"first": 5}]),
    ("last", [{"last": 4}]),
    ("evenly", [{"evenly": 7}]),
    ("speakers", [{"speakers": 10}]),
    ("max_dup", [{"max_dup": 3}]),
    ("chain", [{"max_dup": 3}, {"shortest": 12}, {"evenly": 5}]),
])
def test_subset_rules_equal_kaldi(name: str, rules: list[dict]) -> None:
    assert kaldi_case(name, rules) == KALDI[name]


def test_subset_keeps_the_tables_of_its_utterances() -> None:
    d = subset_data_dir(hand_made(), [("speaker_prefix", "sw02008"), ("first", 3)])
    assert d.utts == hand_made().utts[7:10]
    assert set(d.utt2num_frames) == set(d.text) == set(d.wav) == set(d.utts)
    assert list(d.spk2utt) == ["sw02008-B"]


def test_subset_rules_are_checked() -> None:
    assert check_subset_rules({"first": 5}, "x") == [("first", 5)]
    assert subset_slug([("first", 100000), ("max_dup", 200)]) == "first100000_maxdup200"
    for bad, says in [([{"longest": 5}], "unknown subset rule"), ([{"first": 0}], "positive"),
                      ([{"max_dup": 1}], "at least 2"), ([{"first": 1, "last": 2}], "one rule"),
                      ("first", "expected a list"), ([{"speaker_prefix": 3}], "non-empty")]:
        with pytest.raises(AsrtrainError, match=says):
            check_subset_rules(bad, "align.passes.tri1.data")
    with pytest.raises(AsrtrainError, match="more utterances than the 42 left"):
        subset_data_dir(hand_made(), [("first", 43)])
    no_frames = hand_made()
    no_frames.utt2num_frames = {}
    with pytest.raises(AsrtrainError, match="utt2num_frames"):
        subset_data_dir(no_frames, [("shortest", 3)])


# ------------------------------------------------------------------ the stage, on tiny data
SMALL = ["nj=2", "align.decode=false", "~align.passes.tri2", "~align.passes.tri3",
         "~align.passes.tri4",
         "++align.passes.mono.num_iters=3", "++align.passes.mono.totgauss=200",
         "++align.passes.mono.realign_iters=[1,2]",
         "++align.passes.tri1.num_leaves=40", "++align.passes.tri1.num_gauss=200",
         "++align.passes.tri1.num_iters=3", "++align.passes.tri1.realign_iters=[2]",
         "++align.passes.tri1b={from:tri1,num_leaves:40,num_gauss:200,num_iters:2,"
         "realign_iters:[1]}"]


def asrtrain(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return forked_cli.run(*args, timeout=timeout, check=True)


def run_align(exp: Path, *extra: str) -> subprocess.CompletedProcess:
    return asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--stage", "align", "--to", "align",
                    *SMALL, *extra)


def mtimes(exp: Path) -> dict[str, float]:
    return {p: (exp / "align" / p / ".done").stat().st_mtime_ns for p in ("mono", "tri1", "tri1b")}


def test_passes_train_on_their_subsets_and_a_change_reruns_from_that_pass(
        tmp_path: Path, tiny_tri1: Path) -> None:
    """On a copy of the session's data stages (conftest's tiny_tri1: prepare, lang, features,
    lm and mfcc of the recipe's own settings, as this test ran them itself), without its align
    stage (record, outputs and log): every pass here is trained by this test."""
    exp = tmp_path / "exp"
    shutil.copytree(tiny_tri1, exp, symlinks=True,
                    ignore=shutil.ignore_patterns("align", "align.log"))
    assert not (exp / ".done" / "align").exists() and not (exp / "align").exists()
    assert (exp / ".done" / "mfcc").is_file()
    full = DataDir.read(exp / "data" / "train_nodup_mfcc")
    mono_rules = [("shortest", len(full.utts) * 3 // 4), ("evenly", len(full.utts) // 2)]
    tri1_rules = [("first", len(full.utts) * 2 // 3), ("max_dup", 2)]

    def listed(rules: list) -> str:
        return "[" + ",".join(f"{{{rule}:{value}}}" for rule, value in rules) + "]"

    def overrides(tri1: list) -> list[str]:
        return [f"++align.passes.mono.data={listed(mono_rules)}",
                f"++align.passes.tri1.data={listed(tri1)}"]

    run_align(exp, *overrides(tri1_rules))
    for name, rules in (("mono", mono_rules), ("tri1", tri1_rules)):
        sub = exp / "data" / f"train_nodup_{subset_slug(rules)}_mfcc"
        expected = subset_data_dir(full, rules).utts
        assert DataDir.read(sub).utts == expected
        assert 0 < len(expected) < len(full.utts)
        # trained on exactly the subset: its alignments are of the subset's utterances
        assert sorted(read_int_table(exp / "align" / name / "ali.scp")) == expected
    # tri1 started from mono's alignment of tri1's data (align_si.sh), not of mono's
    mono_ali = exp / "align" / f"mono_ali_train_nodup_{subset_slug(tri1_rules)}"
    assert sorted(read_int_table(mono_ali / "ali.scp")) == subset_data_dir(full, tri1_rules).utts
    # tri1b, on all of train_nodup, from tri1's alignment of it
    assert sorted(read_int_table(exp / "align" / "tri1b" / "ali.scp")) == full.utts
    assert (exp / "align" / "tri1_ali_train_nodup" / ".done").is_file()

    before = mtimes(exp)
    run_align(exp, *overrides(tri1_rules))           # nothing changed: nothing retrains
    assert mtimes(exp) == before
    tri1_rules = [("first", len(full.utts) * 2 // 3), ("max_dup", 3)]
    run_align(exp, *overrides(tri1_rules))           # tri1's subset changed
    after = mtimes(exp)
    assert after["mono"] == before["mono"]
    assert after["tri1"] > before["tri1"] and after["tri1b"] > before["tri1b"]
    assert sorted(read_int_table(exp / "align" / "tri1" / "ali.scp")) == \
        subset_data_dir(full, tri1_rules).utts


def test_the_last_pass_trains_on_all_of_the_training_set(tmp_path: Path) -> None:
    proc = forked_cli.run("run", "recipes/tiny",
                          f"exp_dir={tmp_path / 'exp'}", "--dry-run", *SMALL,
                          "++align.passes.tri1b.data=[{first:10}]", timeout=300)
    assert proc.returncode != 0
    assert "align.passes.tri1b.data: the last pass trains on all of sets.train" in proc.stderr


def test_the_number_of_blocks_does_not_involve_nj() -> None:
    """``num_split_blocks``: ~2.8 h of speech a block, 8 at least, 128 at most, one a speaker
    at most (the tiny recipe's training set: 79k frames of 20 speakers; SWB-300's train_nodup
    ~103M frames; SWB-2000 ~720M)."""
    from asrtrain.data.datadir import num_split_blocks

    assert num_split_blocks(79_263, 20) == 8
    assert num_split_blocks(79_263, 5) == 5
    assert num_split_blocks(102_960_000, 520) == 103
    assert num_split_blocks(720_000_000, 20_000) == 128
    assert num_split_blocks(10 ** 10, 10 ** 5) == 128
    assert num_split_blocks(0, 0) == 1


def test_split_data_dir_is_whole_speakers_written_once(tmp_path: Path) -> None:
    """Kaldi's split_data.sh: a data dir of each block, whole speakers, every utterance in one
    block; reused as it is while the data dir is unchanged, cut again when it changed."""
    from asrtrain.data.datadir import split_data_dir

    src = tmp_path / "data"
    hand_made().write(src)
    blocks = split_data_dir(src)
    assert [b.name for b in blocks] == [str(k) for k in range(1, len(blocks) + 1)]
    assert len(blocks) == 6 and all(b.parent == src / "split6" for b in blocks)
    seen: dict[str, str] = {}
    for b in blocks:
        d = DataDir.read(b)
        for spk in d.spk2utt:
            assert spk not in seen.values(), f"speaker {spk} in two blocks"
        seen.update(d.utt2spk)
        assert d.text == {u: hand_made().text[u] for u in d.utt2spk}
    assert seen == hand_made().utt2spk
    key = (src / "split6" / "key").stat()
    assert split_data_dir(src) == blocks
    assert (src / "split6" / "key").stat().st_mtime_ns == key.st_mtime_ns   # not rewritten
    changed = hand_made()
    changed.text = {u: "right" for u in changed.text}
    changed.write(src)
    blocks = split_data_dir(src)
    assert all(set(DataDir.read(b).text.values()) == {"right"} for b in blocks)
    assert not list(src.glob("*.tmp")) and not list(src.glob(".split*"))
