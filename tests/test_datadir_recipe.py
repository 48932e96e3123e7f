"""recipes/datadir as a first-class recipe: your own Kaldi data dirs, cut here from the tiny
corpus's audio, with a pronunciation lexicon that turns on the GMM and hybrid systems; the
dev set split off or asked for before anything is copied; the OOV words, the utterances the
CTC trainer drops, and nj from the cores."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import forked_cli
import pytest
from omegaconf import OmegaConf
from test_e2e import ALIGN_SMALL, HYBRID_SMALL, REPO, SMALL

from asrtrain import AsrtrainError
from asrtrain.data.corpora.datadir import (
    UserCorpus,
    prepare_user_corpus,
    split_dev,
    user_dict_files,
    write_dict_dir,
)
from asrtrain.data.datadir import DataDir
from asrtrain.lang.lexicon import Lang, cmudict_lexicon, make_dict_dir, prepare_lang, read_lexicon
from asrtrain.recipe import MAX_AUTO_NJ, STAGE_ORDER, SYSTEM_STAGES, compose_recipe
from asrtrain.stages import STAGES

RECIPE = REPO / "recipes" / "datadir"
# nj is left to the recipe (nj: auto) in these runs.
SMALL_AUTO_NJ = [o for o in SMALL if not o.startswith("nj=")]
SHORT_UTT = "sw02006-A_000000-000012"          # 0.12 s: fewer frames than characters
REMOVED = ("camping", "golf")                    # words of the training text left out of lex.txt
# Every stage the systems run by default: ivectors only when the hybrid input appends i-vectors.
ALL_STAGES = [s for s in STAGE_ORDER if s != "ivectors"]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return forked_cli.run("run", str(RECIPE), *args, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def one_error_line(proc: subprocess.CompletedProcess, alone: bool = True) -> str:
    """The run failed with the CLI's one line ``asrtrain: error: ...``, the only line on stderr
    (``alone``: no stage started) or the last one, without a traceback."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("asrtrain: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and (len(lines) == 1 or not alone), proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def corpus(user_corpus: Path) -> Path:
    """conftest's user_corpus (read-only), under this module's name for it."""
    return user_corpus


def sets(corpus: Path, *names: str) -> str:
    return "corpus.sets={" + ", ".join(f"{n}: {corpus / n}" for n in names) + "}"


# The datadir recipe's hybrid reads `features` (it has no hybrid.features to choose)
DATADIR_ALIGN = [o for o in ALIGN_SMALL if not o.startswith("features@hybrid.features=")]


@pytest.fixture(scope="module")
def full_run(corpus: Path, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The whole recipe with corpus.lexicon and nothing else: both systems, small settings."""
    exp = tmp_path_factory.mktemp("full") / "exp"
    proc = ok(run_cli(f"exp_dir={exp}", sets(corpus, "train", "dev", "test"),
                      f"corpus.lexicon={corpus / 'lex.txt'}", *SMALL_AUTO_NJ, *DATADIR_ALIGN,
                      *HYBRID_SMALL))
    return exp, proc


def test_a_lexicon_turns_on_the_gmm_and_hybrid_stages(full_run) -> None:
    exp, proc = full_run
    for stage in ALL_STAGES:
        assert (exp / ".done" / stage).is_file(), stage
        assert f"stage {stage:<13} done" in proc.stderr
    assert (exp / "lang" / "L.fst").is_file() and (exp / "lm" / "G.fst").is_file()
    assert (exp / "align" / "tri1" / "ali.scp").is_file()
    lexicon = (exp / "data" / "local" / "dict" / "lexicon.txt").read_text().splitlines()
    assert "<unk> spn" in lexicon and "[noise] spn" in lexicon
    wers = re.findall(r"^test all: WER [\d.]+% \[ \d+ / \d+.*\] (\S+)$", proc.stdout, re.M)
    assert sorted(wers) == ["blstm_tiny", "hybrid_tiny"]


def test_training_words_missing_from_the_lexicon_are_named_and_mapped_to_unk(full_run) -> None:
    exp, proc = full_run
    (warning,) = [x for x in proc.stderr.splitlines() if "not in the lexicon" in x]
    assert " WARNING " in warning and "2 of " in warning and "mapped to <unk>" in warning
    assert all(f"{w} x" in warning for w in REMOVED)
    # the lexicon is the lang stage's (Kaldi's prepare_dict), so prepare never reads it
    assert warning.split(" WARNING ")[1] in (exp / "log" / "lang.log").read_text()
    info = dict(line.split() for line in (exp / "lm" / "info").read_text().splitlines())
    assert int(info["oov"]) > 0


def test_utterances_too_short_for_ctc_are_named(full_run) -> None:
    exp, proc = full_run
    (line,) = [x for x in proc.stderr.splitlines() if "utterances dropped" in x]
    assert re.search(r"data/train: 1 of \d+ utterances dropped, too short for their targets "
                     rf"\(fewer frames after 3-frame stacking than units\): {SHORT_UTT}$", line)
    assert line.split(" WARNING ")[1] in (exp / "log" / "train.log").read_text()


def test_nj_comes_from_the_cores(full_run) -> None:
    cores = len(os.sched_getaffinity(0))
    cfg = compose_recipe(RECIPE)
    assert cfg.nj == max(1, min(cores, MAX_AUTO_NJ))
    assert compose_recipe(RECIPE, ["nj=3"]).nj == 3
    config = (full_run[0] / "train" / "blstm_tiny" / "config.yaml").read_text()
    assert f"\nnj: {cfg.nj}\n" in config


def test_systems_choose_the_stages(corpus: Path) -> None:
    assert list(STAGE_ORDER) == list(STAGES)
    assert all(set(s) <= set(STAGES) for s in SYSTEM_STAGES.values())
    plain = compose_recipe(RECIPE)
    assert list(plain.systems) == ["ctc"]
    assert list(plain.stages) == ["prepare", "lang", "features", "train", "decode", "score"]
    for lexicon in (f"corpus.lexicon={corpus / 'lex.txt'}", "corpus.lexicon=cmudict",
                    f"corpus.dict_dir={corpus / 'tiny' / 'local' / 'dict'}"):
        cfg = compose_recipe(RECIPE, [lexicon])
        assert list(cfg.systems) == ["ctc", "gmm", "hybrid"] and list(cfg.stages) == ALL_STAGES
        assert cfg.align.decode is True
    gmm = compose_recipe(RECIPE, ["corpus.lexicon=cmudict", "systems=[gmm]"])
    assert list(gmm.stages) == ["prepare", "lang", "lm", "mfcc", "align", "decode_gmm"]
    hybrid = compose_recipe(RECIPE, ["corpus.lexicon=cmudict", "systems=[ctc,hybrid]"])
    assert list(hybrid.stages) == ALL_STAGES and hybrid.align.decode is False
    appends = compose_recipe(RECIPE, ["corpus.lexicon=cmudict", "++features.append=[ivector]"])
    assert list(appends.stages) == [*ALL_STAGES[:-2], "ivectors", *ALL_STAGES[-2:]]
    ctc = compose_recipe(RECIPE, ["corpus.lexicon=cmudict", "++features.append=[ivector]",
                                  "systems=[ctc,gmm]"])
    assert "ivectors" not in ctc.stages
    listed = compose_recipe(RECIPE, ["corpus.lexicon=cmudict", "stages=[prepare,lang]"])
    assert list(listed.stages) == ["prepare", "lang"]
    with pytest.raises(AsrtrainError, match=r"systems=\['ctc', 'hmm'\]: expected auto or"):
        compose_recipe(RECIPE, ["systems=[ctc,hmm]"])


@pytest.mark.parametrize("override", ["systems=[ctc,gmm,hybrid]", "systems=[hybrid]",
                                      "stages=[prepare,lang,lm]"])
def test_gmm_or_hybrid_without_a_lexicon_is_one_line(corpus: Path, tmp_path: Path,
                                                     override: str) -> None:
    exp = tmp_path / "exp"
    line = one_error_line(run_cli(f"exp_dir={exp}", sets(corpus, "train", "dev", "test"),
                                  override))
    assert "asrtrain: error: stages lm" in line and "need a pronunciation lexicon" in line
    assert "corpus.lexicon=FILE" in line and "corpus.dict_dir=DIR" in line
    assert not exp.exists()


def test_a_missing_dev_set_stops_the_run_before_prepare(corpus: Path, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    line = one_error_line(run_cli(f"exp_dir={exp}", sets(corpus, "train", "test"),
                                  "corpus.dev_percent=0"))
    assert "corpus.sets has no dev set 'dev' (sets.dev); corpus.sets has train, test" in line
    assert "corpus.dev_percent=10" in line
    assert not exp.exists()
    line = one_error_line(run_cli(f"exp_dir={exp}", sets(corpus, "train", "dev")))
    assert "corpus.sets has no test set 'test' (sets.test)" in line
    assert not exp.exists()


def test_without_a_dev_set_one_is_split_off_by_speaker(corpus: Path, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    ok(run_cli(f"exp_dir={exp}", sets(corpus, "train", "test"), "--to", "prepare"))
    given = DataDir.read(corpus / "train")
    train, dev = DataDir.read(exp / "data" / "train"), DataDir.read(exp / "data" / "dev")
    assert len(dev.spk2utt) == 1 and not set(dev.spk2utt) & set(train.spk2utt)
    assert sorted(train.utts + dev.utts) == given.utts
    assert all(dev.text[u] == given.text[u] for u in dev.utts)
    log = (exp / "log" / "prepare.log").read_text()
    assert (f"1 of 10 speakers of train (corpus.dev_percent=10, by speaker as Kaldi's "
            f"subset_data_dir_tr_cv.sh) are the dev set, {len(dev.utts)} utterances") in log


def test_oov_error_refuses_before_anything_is_written(corpus: Path, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    line = one_error_line(run_cli(f"exp_dir={exp}", sets(corpus, "train", "dev", "test"),
                                  f"corpus.lexicon={corpus / 'lex.txt'}", "corpus.oov=error"),
                          alone=False)
    assert f"{corpus / 'train' / 'text'}: 2 of " in line and "corpus.oov=error" in line
    assert all(f"{w} x" in line for w in REMOVED)
    assert not (exp / "data").exists() and not (exp / ".done" / "prepare").exists()


def test_cmudict_gives_the_training_words_stressless_pronunciations(corpus: Path,
                                                                    tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    proc = ok(run_cli(f"exp_dir={exp}", sets(corpus, "train", "dev", "test"),
                      "corpus.lexicon=cmudict", "--to", "lang"))
    lexicon = (exp / "data" / "local" / "dict" / "lexicon.txt").read_text().splitlines()
    assert "camping K AE M P IH NG" in lexicon and "<unk> spn" in lexicon
    # the partial words of the transcripts (Switchboard's "rea-") are no words of cmudict
    (warning,) = [x for x in proc.stderr.splitlines() if "not in the lexicon cmudict" in x]
    assert "rea- x2" in warning and "mapped to <unk>" in warning
    lang = Lang.read(exp / "lang")
    assert "camping" in lang.words and "AA_B" in lang.phones.phones
    assert (exp / "lang" / "L.fst").is_file()


# ------------------------------------------------------------------ the parts, in-process
def test_plain_lexicon_to_dict_dir_builds_a_lang(tmp_path: Path) -> None:
    entries = [("cat", ("K", "AE1", "T")), ("at", ("AE0", "T")), ("[laugh]", ("lau",))]
    files = make_dict_dir(entries, nonspeech=["[noise]", "[laugh]"])
    assert files["lexicon.txt"].splitlines()[:2] == ["<unk> spn", "[noise] spn"]
    assert "[laugh] lau" in files["lexicon.txt"]
    assert files["nonsilence_phones.txt"].split() == ["AE0", "AE1", "K", "T", "lau"]
    assert files["extra_questions.txt"].splitlines() == ["sil spn", "AE0", "AE1", "K T lau"]
    d = tmp_path / "dict"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    prepare_lang(d, tmp_path / "lang")
    assert {"cat", "<unk>", "[noise]"} <= set(Lang.read(tmp_path / "lang").words.id2sym)


@pytest.mark.parametrize("line, message", [
    ("cat k_a t", r"lex.txt:2: phone 'k_a' may not contain '_'"),
    ("cat 1.0 k a t", r"lex.txt:2: '1.0' after the word looks like a probability"),
    ("cat", r"lex.txt:2: word cat has no pronunciation"),
    ("#0 k", r"lex.txt:2: #0 is a reserved symbol"),
])
def test_bad_lexicon_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "lex.txt").write_text(f"dog d o g\n{line}\n")
    with pytest.raises(AsrtrainError, match=message):
        read_lexicon(tmp_path / "lex.txt")


def test_cmudict_looks_words_up_in_lower_case() -> None:
    assert cmudict_lexicon(["HELLO", "qqxz"])[0] == ("HELLO", ("HH", "AH", "L", "OW"))
    assert all(w == "HELLO" for w, _ in cmudict_lexicon(["HELLO", "qqxz"]))


def _user_corpus(corpus: Path, **extra) -> dict:
    return {"kind": "datadir", "sample_rate": 8000, "resample": True, "dev_percent": 10,
            "oov": "unk", "lexicon": None, "dict_dir": None,
            "sets": {"train": str(corpus / "train"), "dev": str(corpus / "dev"),
                     "test": str(corpus / "test")}, **extra}


def test_a_dict_dir_without_unk_cannot_take_oovs(corpus: Path, tmp_path: Path) -> None:
    d = tmp_path / "dict"
    files = make_dict_dir(read_lexicon(corpus / "lex.txt"))
    files["lexicon.txt"] = "".join(x + "\n" for x in files["lexicon.txt"].splitlines()
                                   if not x.startswith(("<unk>", "[")))
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    with pytest.raises(AsrtrainError, match=r"train/text: 5 of .* are not in the lexicon "
                                            r".*/lexicon.txt: .*; it has no <unk> to map them "
                                            r"to: add the line '<unk> spn'"):
        user_dict_files(_user_corpus(corpus, dict_dir=str(d)), DataDir.read(corpus / "train"),
                        corpus / "train" / "text")


def test_config_checks_of_your_own_sets(corpus: Path) -> None:
    for extra, message in [({"dev_percent": 60}, "corpus.dev_percent=60: expected a share"),
                           ({"oov": "skip"}, "corpus.oov='skip': expected unk"),
                           ({"lexicon": "cmudict", "dict_dir": "/d"}, "both given"),
                           ({"sets": "???"}, "corpus.sets is not set")]:
        with pytest.raises(AsrtrainError, match=message):
            prepare_user_corpus(_user_corpus(corpus, **extra), "train", "dev", ["test"])
    with pytest.raises(AsrtrainError, match="no training set 'mine'"):
        prepare_user_corpus(_user_corpus(corpus), "mine", "dev", ["test"])


def test_one_speaker_cannot_give_a_dev_set(datadir: Path) -> None:
    one = DataDir.read(datadir)
    one = one.subset(one.spk2utt["spk0"])
    with pytest.raises(AsrtrainError, match="has one speaker, so no dev set can be split"):
        split_dev(one, 10, "train", "dev")
    rest, dev = split_dev(DataDir.read(datadir), 10, "train", "dev")
    assert len(rest.spk2utt) == len(dev.spk2utt) == 1
    assert OmegaConf.select(compose_recipe(RECIPE), "corpus.dev_percent") == 10


def test_a_lexicon_no_longer_given_leaves_no_dict_dir(datadir: Path, tmp_path: Path) -> None:
    """The lang stage builds L.fst whenever data/local/dict exists: a rerun of lang without
    the lexicon removes the one an earlier run wrote; the data dirs are prepare's, untouched."""
    data = DataDir.read(datadir)
    files = {k: v.encode() for k, v in make_dict_dir([("hello", ("h", "e"))]).items()}
    assert UserCorpus({"train": data}).write(tmp_path) == ["train"]
    write_dict_dir(files, tmp_path / "local" / "dict")
    assert (tmp_path / "local" / "dict" / "lexicon.txt").read_text().endswith("hello h e\n")
    write_dict_dir(None, tmp_path / "local" / "dict")
    assert not (tmp_path / "local" / "dict").exists() and (tmp_path / "train" / "text").is_file()
