"""prepare_corpus end to end: every kind writes valid Kaldi data dirs, the dict dir, stm and glm."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
from omegaconf import OmegaConf

from asrtrain import REPO_ROOT, AsrtrainError
from asrtrain.data.audio import iter_utterances, read_recording
from asrtrain.data.corpora import prepare_corpus
from asrtrain.data.datadir import DataDir

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "corpora"
SWBD = FIXTURES / "swbd"
EVAL2000 = FIXTURES / "eval2000"
FISHER = FIXTURES / "fisher"
DICT_FILES = {"lexicon.txt", "silence_phones.txt", "nonsilence_phones.txt",
              "optional_silence.txt", "extra_questions.txt", "acronyms.map"}


def _swb300_cfg(**kw) -> dict:
    cfg = {"kind": "swb300", "swbd_audio": str(SWBD / "LDC97S62"), "swbd_transcripts": str(SWBD),
           "eval2000_audio": str(EVAL2000 / "LDC2002S09"),
           "eval2000_transcripts": str(EVAL2000 / "LDC2002T43"),
           "dev_utts": 2, "max_dup": 3, "max_missing_audio": 0, "expected_test_sides": 4}
    cfg.update(kw)
    return cfg


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.timeout(120)
def test_swb300_writes_sets_dict_stm_glm_and_audio_reads(tmp_path):
    data_root = tmp_path / "data"
    sets = prepare_corpus(_swb300_cfg(), data_root)
    assert sets == ["train", "train_dev", "train_nodup", "eval2000"]
    for name in sets:
        d = DataDir.read(data_root / name)   # validates
        assert set(d.wav) == {s.recording for s in d.segments.values()}
        assert (data_root / name / "spk2utt").is_file()
        assert (data_root / name / "reco2file_and_channel").is_file()
    assert len(DataDir.read(data_root / "train").utts) == 15
    assert len(DataDir.read(data_root / "train_dev").utts) == 2
    assert len(DataDir.read(data_root / "train_nodup").utts) == 10
    assert {p.name for p in (data_root / "local" / "dict").iterdir()} == DICT_FILES
    ref = EVAL2000 / "LDC2002T43/2000_hub5_eng_eval_tr/reference"
    assert (data_root / "eval2000/glm").read_bytes() == (ref / "en20000405_hub5.glm").read_bytes()
    stm = (data_root / "eval2000/stm").read_bytes()
    assert stm.count(b"((") == 0 and stm.count(b"))") == 2 and b"ASIDE" not in stm  # Kaldi's sed
    assert not (data_root / "train/stm").exists()
    assert not list(data_root.rglob("*.tmp")) and not list(data_root.glob(".*"))

    # The written wav.scp reads back through the pipes: each utterance is its segment of the side.
    test = DataDir.read(data_root / "eval2000")
    sides = {}
    for conv in ("en_4156", "sw_4390"):
        x, rate = read_recording(str(EVAL2000 / f"LDC2002S09/hub5e_00/english/{conv}.sph"))
        assert rate == 8000 and x.shape[0] == 2
        sides[f"{conv}-A"], sides[f"{conv}-B"] = x[0], x[1]
    got = dict(iter_utterances(test, 8000))
    assert sorted(got) == test.utts
    for utt, samples in got.items():
        seg = test.segments[utt]
        side = sides[seg.recording]
        first, last = round(seg.start * 8000), min(round(seg.end * 8000), len(side))
        np.testing.assert_array_equal(samples, side[first:last])


def test_failed_run_leaves_earlier_outputs(tmp_path):
    data_root = tmp_path / "data"
    prepare_corpus(_swb300_cfg(), data_root)
    before = _snapshot(data_root)
    broken = tmp_path / "eval2000"
    shutil.copytree(EVAL2000, broken)
    (broken / "LDC2002S09/hub5e_00/english/hub5e_00.pem").write_text("en_4156 A x 0.3\n")
    with pytest.raises(AsrtrainError, match=r"hub5e_00.pem:1: expected"):
        prepare_corpus(_swb300_cfg(eval2000_audio=str(broken / "LDC2002S09"), dev_utts=3),
                       data_root)
    assert _snapshot(data_root) == before


def test_swb2000_adds_fisher_to_training(tmp_path):
    cfg = _swb300_cfg(kind="swb2000", fisher_conversations=2,
                      fisher_dirs=[str(FISHER / p) for p in ("LDC2004T19", "LDC2005T19",
                                                             "LDC2004S13", "LDC2005S13")])
    sets = prepare_corpus(cfg, tmp_path)
    assert sets == ["train", "train_dev", "train_nodup", "eval2000"]
    train = DataDir.read(tmp_path / "train")
    assert len(train.utts) == 15 + 6
    assert {r[:5] for r in train.wav} == {"sw020", "fe_03"}
    dev = DataDir.read(tmp_path / "train_dev")
    assert all(u.startswith("sw") for u in dev.utts)
    nodup = DataDir.read(tmp_path / "train_nodup")
    assert sum(u.startswith("fe_03") for u in nodup.utts) == 6
    assert not set(nodup.utts) & set(dev.utts)


def test_datadir_kind_copies_and_validates(tmp_path):
    src = tmp_path / "mine"
    src.mkdir()
    soundfile.write(src / "r1.wav", np.zeros(8000, dtype=np.int16), 16000)
    (src / "wav.scp").write_text(f"spk1-r1 {src / 'r1.wav'}\n")
    (src / "text").write_text("spk1-r1 hello world\n")
    (src / "utt2spk").write_text("spk1-r1 spk1\n")
    (src / "feats.scp").write_text("spk1-r1 /old/feats.ark:12\n")
    (src / "stm").write_text("spk1-r1 1 spk1 0.0 0.5 hello world\n")
    dict_dir = tmp_path / "dict"
    prepare_corpus(_swb300_cfg(), tmp_path / "swbdata")
    shutil.copytree(tmp_path / "swbdata/local/dict", dict_dir)
    cfg = OmegaConf.create({"features": {"sample_rate": 8000},
                            "corpus": {"kind": "datadir", "sets": {"test": str(src)},
                                       "dict_dir": str(dict_dir), "resample": True,
                                       "sample_rate": "${features.sample_rate}"}})
    out = tmp_path / "data"
    assert prepare_corpus(cfg.corpus, out) == ["test"]
    d = DataDir.read(out / "test")
    assert d.text == {"spk1-r1": "hello world"} and not d.feats
    assert (out / "test/stm").read_text() == (src / "stm").read_text()
    assert not (out / "test/glm").exists()
    assert (out / "local/dict/lexicon.txt").read_bytes() == (dict_dir / "lexicon.txt").read_bytes()


def test_config_errors(tmp_path):
    cfg = OmegaConf.create({"repo_root": str(REPO_ROOT),
                            "corpus": OmegaConf.load(REPO_ROOT / "conf/corpus/swb300.yaml")})
    with pytest.raises(AsrtrainError, match="corpus.swbd_audio is not set: give the LDC97S62"):
        prepare_corpus(cfg.corpus, tmp_path)
    with pytest.raises(AsrtrainError, match="corpus.kind is 'wsj'; expected one of tiny, swb300"):
        prepare_corpus({"kind": "wsj"}, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(300)
def test_tiny_corpus(tmp_path):
    tiny = REPO_ROOT / "data" / "tiny"
    assert (tiny / "LDC97S62").is_dir(), "data/tiny missing: python data/tiny/make_tiny.py"
    cfg = OmegaConf.create({"repo_root": str(REPO_ROOT),
                            "corpus": OmegaConf.load(REPO_ROOT / "conf/corpus/tiny.yaml")})
    sets = prepare_corpus(cfg.corpus, tmp_path)
    assert sets == ["train", "train_dev", "train_nodup", "eval2000"]
    n_conv = len(list((tiny / "LDC97S62").glob("swb1_d*/data/*.sph")))
    train = DataDir.read(tmp_path / "train")
    assert len(train.wav) == 2 * n_conv and len(train.spk2utt) == 2 * n_conv
    dev = DataDir.read(tmp_path / "train_dev")
    assert dev.utts == train.utts[:cfg.corpus.dev_utts]
    nodup = DataDir.read(tmp_path / "train_nodup")
    assert set(nodup.utts) <= set(train.utts) - set(dev.utts)
    counts: dict[str, int] = {}
    for utt in nodup.utts:
        counts[nodup.text[utt]] = counts.get(nodup.text[utt], 0) + 1
    assert max(counts.values()) <= 2 * cfg.corpus.max_dup
    test = DataDir.read(tmp_path / "eval2000")
    assert len(test.wav) == cfg.corpus.expected_test_sides
    convs = {f for f, _ in test.reco2file_and_channel.values()}
    assert {c[:3] for c in convs} == {"sw_", "en_"}
    assert (tmp_path / "eval2000/stm").is_file() and (tmp_path / "eval2000/glm").is_file()
    lexicon = (tmp_path / "local/dict/lexicon.txt").read_text().splitlines()
    for entry in ("!sil sil", "[vocalized-noise] spn", "[noise] nsn", "[laughter] lau",
                  "<unk> spn"):
        assert entry in lexicon
    # No markup Kaldi removes or rewrites is left in the training text.
    words = {w for t in train.text.values() for w in t.split()}
    assert not {w for w in words if "[silence]" == w or "_" in w or "{" in w or "<" in w}
    assert not {w for w in words if "[" in w and w not in ("[noise]", "[laughter]",
                                                           "[vocalized-noise]")}
    # Every eval2000 utterance reads from its side, about as long as its segment.
    for utt, samples in iter_utterances(test, 8000):
        seg = test.segments[utt]
        assert abs(len(samples) - (seg.end - seg.start) * 8000) <= 1, utt
