"""The dev set split off your own training set (``corpus.dev_percent``): by speaker, naming the
speakers and warning of those who also speak in a test set, or by utterance
(``corpus.dev_split=utterance``) for corpora whose test speakers are the training speakers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import write_datadir

from asrtrain import AsrtrainError
from asrtrain.data.corpora.datadir import prepare_user_corpus, split_dev
from asrtrain.data.datadir import DataDir


@pytest.fixture
def train(tmp_path: Path) -> DataDir:
    return DataDir.read(write_datadir(tmp_path / "train", n_speakers=4, utts_per_speaker=5))


def test_by_speaker_names_the_speakers_and_warns_of_test_speakers(train: DataDir, caplog
                                                                  ) -> None:
    caplog.set_level(logging.INFO)
    rest, dev = split_dev(train, 25, "train", "dev")
    held = sorted(dev.spk2utt)
    assert len(held) == 1 and not set(held) & set(rest.spk2utt)
    assert sorted(rest.utts + dev.utts) == sorted(train.utts)
    assert f"dev speakers: {held[0]}" in caplog.text
    assert "also speak in" not in caplog.text
    # the same split, with a test set where the dev speaker speaks too, and one where not
    others = [s for s in train.spk2utt if s not in held]
    tests = {"eval": train.subset(train.spk2utt[held[0]][:2] + train.spk2utt[others[0]]),
             "clean": train.subset(train.spk2utt[others[1]])}
    caplog.clear()
    rest2, dev2 = split_dev(train, 25, "train", "dev", tests=tests)
    assert dev2.utts == dev.utts and rest2.utts == rest.utts
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"dev speaker(s) {held[0]} also speak in test set 'eval' "
                                  f"(2 of its 7 utterances)")
    assert "corpus.dev_split=utterance" in warnings[0]


def test_by_utterance_every_speaker_stays_in_training(train: DataDir, caplog) -> None:
    caplog.set_level(logging.INFO)
    rest, dev = split_dev(train, 20, "train", "dev", by="utterance")
    assert len(dev.utts) == 4 and len(rest.utts) == 16
    assert not set(dev.utts) & set(rest.utts)
    assert set(rest.spk2utt) == set(train.spk2utt)       # nobody left training
    assert set(dev.spk2utt) <= set(train.spk2utt)
    assert all(dev.text[u] == train.text[u] for u in dev.utts)
    assert (f"4 of 20 utterances of train (corpus.dev_percent=20, corpus.dev_split=utterance) "
            f"are the dev set, from {len(dev.spk2utt)} of its 4 speakers") in caplog.text
    again, _ = split_dev(train, 20, "train", "dev", by="utterance")
    assert again.utts == rest.utts                       # seeded: the same split each run
    # a speaker with one utterance keeps it
    one = train.subset([train.spk2utt["spk0"][0], *train.spk2utt["spk1"]])
    rest, dev = split_dev(one, 50, "train", "dev", by="utterance")
    assert "spk0" in rest.spk2utt and "spk0" not in dev.spk2utt


def test_one_speaker_can_give_a_dev_set_by_utterance(train: DataDir) -> None:
    one = train.subset(train.spk2utt["spk0"])
    with pytest.raises(AsrtrainError, match="or set corpus.dev_split=utterance"):
        split_dev(one, 10, "train", "dev")
    rest, dev = split_dev(one, 10, "train", "dev", by="utterance")
    assert len(dev.utts) == 1 and len(rest.utts) == 4


def _corpus(root: Path, **extra) -> dict:
    return {"kind": "datadir", "sample_rate": 8000, "resample": True, "dev_percent": 25,
            "oov": "unk", "lexicon": None, "dict_dir": None,
            "sets": {"train": str(root / "train" / "data"), "test": str(root / "test" / "data")},
            **extra}


def test_prepare_splits_as_corpus_dev_split_says(tmp_path: Path, caplog) -> None:
    write_datadir(tmp_path / "train", n_speakers=4, utts_per_speaker=5)
    write_datadir(tmp_path / "test", n_speakers=4, utts_per_speaker=2, seed=3)  # the same 4
    caplog.set_level(logging.INFO)
    user = prepare_user_corpus(_corpus(tmp_path), "train", "dev", ["test"])
    held = sorted(user.sets["dev"].spk2utt)
    assert len(held) == 1 and f"dev speaker(s) {held[0]} also speak in test set 'test'" in \
        caplog.text
    caplog.clear()
    user = prepare_user_corpus(_corpus(tmp_path, dev_split="utterance"), "train", "dev",
                               ["test"])
    assert set(user.sets["train"].spk2utt) == {f"spk{s}" for s in range(4)}
    assert len(user.sets["dev"].utts) == 5 and "also speak in" not in caplog.text
    with pytest.raises(AsrtrainError, match=r"corpus.dev_split='speakers': expected speaker "
                                            r"\(held-out speakers"):
        prepare_user_corpus(_corpus(tmp_path, dev_split="speakers"), "train", "dev", ["test"])


def test_the_split_is_in_the_prepare_digest(tmp_path: Path) -> None:
    """``corpus.dev_split`` is in the prepare stage's digest, whichever it is (an experiment
    prepared before the setting existed reruns, as every older experiment dir does)."""
    from asrtrain.pipeline import Pipeline
    from asrtrain.recipe import compose_recipe
    from asrtrain.stages import STAGES

    sets = f"corpus.sets={{train: {tmp_path}/t, test: {tmp_path}/e}}"
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "datadir"
    values = {}
    for split in ("speaker", "utterance"):
        cfg = compose_recipe(recipe, [sets, f"corpus.dev_split={split}",
                                      f"exp_dir={tmp_path}/exp"])
        values[split] = Pipeline(cfg, STAGES).values["prepare"]
        assert values[split]["corpus"]["dev_split"] == split
    assert values["speaker"]["corpus"]["dev_percent"] == 10
