"""The trainer loop, checkpoints, resume and CTC decoding with one learner on real arks."""

import logging
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from conftest import write_datadir
from omegaconf import OmegaConf

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, write_table
from asrtrain.decode.ctc import decode_data_dir
from asrtrain.distributed.backend import SingleProcessBackend
from asrtrain.features import FeatureOptions, compute_features
from asrtrain.lang.bpe import train_units
from asrtrain.recipe import compose_recipe
from asrtrain.train import checkpoint
from asrtrain.train.curves import read_scalars
from asrtrain.train.trainer import train

RECIPE = """
defaults:
  - lang: char
  - features: fbank40
  - model: blstm_tiny
  - trainer: default
  - decode: ctc_greedy
  - score: hub5
  - _self_
exp_dir: EXP
stages: [train]
sets: {train: train, dev: train, test: [train]}
model: {layers: 1, cells: 16, bottleneck: 8, stack_frames: 2}
trainer: {epochs: 3, batch_frames: 400, lr: 0.01, warmup_epochs: 0, log_every: 2}
"""


@pytest.fixture(scope="module")
def exp(tmp_path_factory) -> Path:
    return build_exp(tmp_path_factory.mktemp("exp"))


def build_exp(root: Path) -> Path:
    """A training set of 8 synthetic utterances with fbank features and character units."""
    data = write_datadir(root / "src", n_speakers=2, utts_per_speaker=4)
    (root / "data").mkdir()
    data.rename(root / "data" / "train")
    compute_features(root / "data" / "train", root / "feats", FeatureOptions(), nj=1)
    d = DataDir.read(root / "data" / "train")
    train_units([d.text[u] for u in d.utts], root / "lang" / "units.model")
    return root


def make_cfg(exp: Path, tmp_path: Path, **overrides):
    recipe = tmp_path / "recipe"
    recipe.mkdir(exist_ok=True)
    (recipe / "recipe.yaml").write_text(RECIPE.replace("EXP", str(exp)))
    cfg = compose_recipe(recipe, [f"+train_dir={tmp_path / 'model'}",
                                  *[f"{k}={v}" for k, v in overrides.items()]])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


@pytest.mark.parametrize("spec_augment", [None, "{freq_masks: 2, freq_width: 4, time_masks: 1, "
                                                 "time_width: 5}"])
def test_train_checkpoints_and_exact_resume(exp: Path, tmp_path: Path,
                                            spec_augment: str | None) -> None:
    torch.set_num_threads(1)
    cfg = make_cfg(exp, tmp_path, **({"trainer.spec_augment": spec_augment} if spec_augment
                                     else {}))
    assert bool(cfg.trainer.spec_augment) == bool(spec_augment)
    final = train(cfg, SingleProcessBackend())
    out = tmp_path / "model"
    assert final == out / "final.pt"
    train_loss = [v for _, v in read_scalars(out)["loss/train_epoch"]]
    assert len(train_loss) == 3 and train_loss[2] < train_loss[0]
    # trainer.keep_checkpoints=2: epoch 1 went, unless it is the best by dev loss
    assert checkpoint.epochs(out)[-2:] == [2, 3]
    first = checkpoint.load(final)["model"]
    # Lose the last epoch as a crash would, then resume: the same model comes out, bit for bit.
    (out / "epoch-3.pt").unlink()
    (out / "final.pt").unlink()
    assert checkpoint.latest_epoch(out) == 2
    train(cfg, SingleProcessBackend())
    again = checkpoint.load(out / "final.pt")["model"]
    for k in first:
        torch.testing.assert_close(first[k], again[k], rtol=0, atol=0)


def test_decode_writes_ctm_in_recording_time(exp: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = make_cfg(exp, tmp_path, **{"trainer.epochs": 1})
    final = train(cfg, SingleProcessBackend())
    figures = decode_data_dir(final, exp / "lang" / "units.model", exp / "data" / "train",
                              tmp_path / "decode")
    hyps = (tmp_path / "decode" / "text").read_text().splitlines()
    assert len(hyps) == 8 and figures["utterances"] == 8
    for line in (tmp_path / "decode" / "ctm").read_text().splitlines():
        file, channel, start, dur, word = line.split()
        assert file.startswith("spk") and channel == "1"
        assert float(start) >= 0 and float(dur) > 0
        assert word.strip() and "\u2581" not in word and "\u2047" not in word


def test_nan_features_stop_with_rank_and_utterances(exp: Path, tmp_path: Path) -> None:
    # A copy of the training set whose features hold NaNs for every utterance.
    bad = tmp_path / "bad"
    d = DataDir.read(exp / "data" / "train")
    feats = {}
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/nan.ark,{tmp_path}/nan.scp") as w:
        for u in d.utts:
            m = kaldiio.load_mat(d.feats[u]).copy()
            m[3, :] = np.nan
            w(u, m)
    for line in (tmp_path / "nan.scp").read_text().splitlines():
        k, v = line.split(maxsplit=1)
        feats[k] = v
    d.feats = feats
    d.cmvn = {}
    d.write(bad)
    for name in ("cmvn.scp",):
        (bad / name).unlink(missing_ok=True)
    write_table(bad / "feats.scp", feats)
    (exp / "data" / "bad").symlink_to(bad)
    try:
        cfg = make_cfg(exp, tmp_path, **{"sets.train": "bad", "sets.dev": "bad"})
        with pytest.raises(AsrtrainError, match=r"rank 0: non-finite loss .* \(utterances spk"):
            train(cfg, SingleProcessBackend())
    finally:
        (exp / "data" / "bad").unlink()


def test_a_single_learner_logs_no_consensus_distance(exp: Path, tmp_path: Path, caplog) -> None:
    """One learner (as lockstep learners) is one model: its step lines state no consensus
    distance (they printed 'consensus distance 0.00e+00' on every line)."""
    torch.set_num_threads(1)
    caplog.set_level(logging.INFO, logger="asrtrain")
    train(make_cfg(exp, tmp_path, **{"trainer.epochs": 1}), SingleProcessBackend())
    steps = [r.getMessage() for r in caplog.records if " step " in r.getMessage()]
    assert steps and all("frames/s per learner" in m for m in steps), steps
    assert not any("consensus" in m for m in steps), steps
