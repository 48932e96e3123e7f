"""Which model is decoded (``decode.checkpoint: best | last | average``), what the trainer keeps
for it (``trainer.keep_best``, ``epochs.json``), and early stopping on the dev loss."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from conftest import write_datadir
from omegaconf import OmegaConf
from test_e2e import SMALL, asrtrain
from test_train_single import build_exp

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import SingleProcessBackend
from asrtrain.features import FeatureOptions, compute_features
from asrtrain.models.average import CheckpointChoice, average_checkpoints, choose_model, read_record
from asrtrain.models.checkpoint import ModelCheckpoint, load
from asrtrain.recipe import compose_recipe
from asrtrain.train import checkpoint
from asrtrain.train.trainer import train

MODEL_CONFIG = {"name": "m", "layers": 1, "cells": 4, "bottleneck": 0, "dropout": 0.0,
                "stack_frames": 1, "head": "ctc"}


def small_checkpoint(epoch: int, dev_loss: float, seed: int) -> ModelCheckpoint:
    from asrtrain.models import build_model

    torch.manual_seed(seed)
    model = build_model(MODEL_CONFIG, 3, 5)
    return ModelCheckpoint(model.state_dict(), MODEL_CONFIG, 3, 5, {"delta_order": 0},
                           epoch=epoch, metrics={"dev_loss": dev_loss})


def write_run(out: Path, losses: dict[int, float], keep: set[int] | None = None) -> None:
    """A model dir as the trainer leaves it: epoch-N.pt (those in ``keep``), final.pt (the last
    epoch) and, when ``keep`` is None, every epoch and no record (a run before the record)."""
    from asrtrain.models.average import write_record

    for epoch, loss in losses.items():
        ckpt = small_checkpoint(epoch, loss, seed=epoch)
        if keep is None or epoch in keep:
            ckpt.save(checkpoint.model_path(out, epoch))
        if epoch == max(losses):
            ckpt.save(out / "final.pt")
    if keep is not None:
        write_record(out, {e: {"dev_loss": v} for e, v in losses.items()})


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load(path)["model"]


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_average_is_the_elementwise_mean(tmp_path: Path) -> None:
    paths = []
    for e in (1, 2, 3):
        small_checkpoint(e, 1.0, seed=e).save(tmp_path / f"epoch-{e}.pt")
        paths.append(tmp_path / f"epoch-{e}.pt")
    avg = average_checkpoints(paths)
    states = [weights(p) for p in paths]
    for k, v in avg.model.items():
        want = (states[0][k].double() + states[1][k].double() + states[2][k].double()) / 3
        torch.testing.assert_close(v, want.float(), rtol=0, atol=1e-7)
    assert avg.epoch is None and avg.input_dim == 3
    other = ModelCheckpoint({**states[0], "extra.weight": torch.zeros(2)}, MODEL_CONFIG, 3, 5,
                            {"delta_order": 0})
    other.save(tmp_path / "other.pt")
    with pytest.raises(AsrtrainError, match="not epochs of one run"):
        average_checkpoints([tmp_path / "other.pt", paths[0]])


def test_best_last_and_average_by_the_record(tmp_path: Path, caplog) -> None:
    losses = {1: 5.0, 2: 3.0, 3: 2.0, 4: 2.5, 5: 2.2, 6: 4.0}  # the dev loss turns up
    write_run(tmp_path, losses, keep={2, 3, 4, 5, 6})
    path, info = choose_model(tmp_path, CheckpointChoice("last"), tmp_path / "dec")
    assert path == tmp_path / "final.pt" and info["epochs"] == [6]
    assert info["description"] == "last epoch, 6 (dev loss 4)"
    path, info = choose_model(tmp_path, CheckpointChoice("best"), tmp_path / "dec")
    assert path == tmp_path / "epoch-3.pt" and info["epochs"] == [3]
    assert info["description"] == "best epoch 3 (dev loss 2, the lowest)"
    path, info = choose_model(tmp_path, CheckpointChoice("average", 3), tmp_path / "dec")
    assert path == tmp_path / "dec" / "model.pt" and info["epochs"] == [3, 4, 5]
    assert info["description"] == ("average of epochs 3, 4, 5 (dev loss 2, 2.5, 2.2; the 3 "
                                   "lowest)")
    assert_same(weights(path), average_checkpoints(
        [tmp_path / f"epoch-{e}.pt" for e in (3, 4, 5)]).model)
    # epoch 1 is among the 6 best but its model is gone: said, and left out
    caplog.set_level(logging.WARNING)
    _, info = choose_model(tmp_path, CheckpointChoice("average", 6), tmp_path / "dec")
    assert info["epochs"] == [2, 3, 4, 5, 6] and "epochs 1 (among the 6 best" in caplog.text


def test_without_a_record_the_kept_checkpoints_say_their_dev_loss(tmp_path: Path) -> None:
    write_run(tmp_path, {1: 3.0, 2: 1.0, 3: 2.0})
    assert not (tmp_path / "epochs.json").exists()
    path, info = choose_model(tmp_path, CheckpointChoice("best"), tmp_path / "dec")
    assert path == tmp_path / "epoch-2.pt" and info["dev_losses"] == [1.0]


@pytest.mark.parametrize("bad, message", [
    ({"checkpoint": "newest"}, r"decode.checkpoint='newest': expected one of best, last, "
                               "average"),
    ({"average_n": 0}, r"decode.average_n=0: expected a whole number"),
    ({"average_n": "3"}, r"decode.average_n='3'"),
])
def test_bad_choices_are_named(bad: dict, message: str) -> None:
    with pytest.raises(AsrtrainError, match=message):
        CheckpointChoice.from_config(bad)
    with pytest.raises(AsrtrainError, match=message.replace("decode.", "hybrid.decode.")):
        CheckpointChoice.from_config(bad, "hybrid.decode")


def test_average_n_beyond_what_the_trainer_keeps_is_refused() -> None:
    choice = CheckpointChoice("average", 6)
    with pytest.raises(AsrtrainError, match=r"decode.average_n=6: the trainer keeps the models "
                                            r"of only 5 best epochs \(trainer.keep_best\)"):
        choice.check_kept({"keep_best": 5}, "decode", "trainer")
    choice.check_kept({"keep_best": 5, "keep_checkpoints": 0}, "decode", "trainer")  # all kept
    CheckpointChoice("best", 6).check_kept({"keep_best": 1}, "decode", "trainer")


def test_transcribe_reads_the_model_the_decode_stage_decoded(tmp_path: Path) -> None:
    from asrtrain.recipe import Paths
    from asrtrain.transcribe import System

    paths = Paths(tmp_path)
    write_run(paths.model_dir("m"), {1: 2.0, 2: 1.0, 3: 1.5}, keep={1, 2, 3})
    system = System("ctc", "m", paths, {})
    assert system.model == paths.model_dir("m") / "final.pt"      # not decoded yet
    path, info = choose_model(paths.model_dir("m"), CheckpointChoice("average", 2),
                              tmp_path / "decode" / "m")
    dec = paths.decode_dir("m", "eval")
    dec.mkdir(parents=True)
    (dec / "decode.json").write_text(json.dumps({"model": str(path), "checkpoint": info}))
    assert system.model == path == tmp_path / "decode" / "m" / "model.pt"


# ---------------------------------------------------------------------------- the trainer
RECIPE = """
defaults:
  - lang: char
  - features: fbank40
  - model: blstm_tiny
  - trainer: default
  - decode: ctc_greedy
  - _self_
exp_dir: EXP
stages: [train]
sets: {train: train, dev: dev, test: [dev]}
model: {layers: 1, cells: 32, bottleneck: 16, stack_frames: 2}
trainer: {epochs: 12, batch_frames: 400, lr: 0.03, warmup_epochs: 0, log_every: 2,
          anneal_start_epoch: 100}
"""


@pytest.fixture(scope="module")
def overfit(tmp_path_factory) -> Path:
    """8 training utterances of tones with random words and 6 others as the dev set: a model
    can only learn the training utterances by heart, so its dev loss turns up."""
    root = build_exp(tmp_path_factory.mktemp("exp"))
    dev = write_datadir(root / "devsrc", n_speakers=2, utts_per_speaker=3, seed=5)
    dev.rename(root / "data" / "dev")
    compute_features(root / "data" / "dev", root / "feats_dev", FeatureOptions(), nj=1)
    return root


def make_cfg(exp: Path, tmp_path: Path, **overrides):
    recipe = tmp_path / "recipe"
    recipe.mkdir(exist_ok=True)
    (recipe / "recipe.yaml").write_text(RECIPE.replace("EXP", str(exp)))
    cfg = compose_recipe(recipe, [f"+train_dir={tmp_path / 'model'}",
                                  *[f"{k}={v}" for k, v in overrides.items()]])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def test_the_best_epochs_are_kept_and_a_dev_loss_that_turns_up_is_not_decoded(
        overfit: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "model"
    train(make_cfg(overfit, tmp_path, **{"trainer.keep_best": 3}), SingleProcessBackend())
    record = read_record(out)
    losses = {e: s["dev_loss"] for e, s in record.items()}
    assert sorted(losses) == list(range(1, 13))
    best = min(losses, key=losses.get)
    assert best < 12 and losses[12] > losses[best], losses  # the premise: it turned up
    # the last 2 epochs (trainer.keep_checkpoints) and the 3 best models are kept
    ranked = sorted(losses, key=lambda e: (losses[e], -e))
    assert set(checkpoint.epochs(out)) == {11, 12, *ranked[:3]}
    assert load(out / "final.pt")["epoch"] == 12
    # the default (conf/decode/ctc_greedy.yaml) does not decode the last epoch
    default = CheckpointChoice.from_config(make_cfg(overfit, tmp_path).decode)
    default = CheckpointChoice(default.checkpoint, min(default.average_n, 3))
    path, info = choose_model(out, default, tmp_path / "dec")
    assert 12 not in info["epochs"]
    decoded = weights(path)
    assert any(not torch.equal(decoded[k], v) for k, v in weights(out / "final.pt").items())


def test_early_stop_ends_after_patience_epochs_without_a_new_best(overfit: Path,
                                                                  tmp_path: Path,
                                                                  caplog) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "model"
    caplog.set_level(logging.INFO)
    train(make_cfg(overfit, tmp_path, **{"trainer.early_stop_patience": 2}),
          SingleProcessBackend())
    losses = {e: s["dev_loss"] for e, s in read_record(out).items()}
    last = max(losses)
    best = min(losses, key=losses.get)
    assert last == best + 2 < 12, losses
    assert all(losses[e] >= losses[best] for e in losses)
    assert load(out / "final.pt")["epoch"] == last
    assert (f"early stop after epoch {last} of 12: the dev loss was lowest at epoch {best}"
            in caplog.text)
    # a rerun with more epochs goes on from the last epoch and stops at once
    caplog.clear()
    train(make_cfg(overfit, tmp_path, **{"trainer.early_stop_patience": 2,
                                         "trainer.epochs": 14}), SingleProcessBackend())
    assert max(read_record(out)) == last and f"early stop after epoch {last} of 14" in \
        caplog.text
    # patience 0 (the default) trains every epoch: the run above went past the best
    assert make_cfg(overfit, tmp_path).trainer.early_stop_patience == 0


def test_early_stop_with_learners_that_do_not_keep_in_step(overfit: Path, tmp_path: Path
                                                           ) -> None:
    """adpsgd's learners meet only at an epoch's end: all of them stop after the same epoch
    (a learner left training would wait for the others until trainer.timeout_s)."""
    from asrtrain.train.run import train_model

    out = tmp_path / "model"
    (overfit / "log").mkdir(exist_ok=True)   # the stage's log dir, which the learners append to
    # room past the best epoch: the gossip makes each run's curve its own (one run's best was
    # epoch 10 of 12, which left no room to stop early)
    cfg = make_cfg(overfit, tmp_path, **{"trainer.early_stop_patience": 2,
                                         "trainer.learners": 2, "trainer.backend": "adpsgd",
                                         "trainer.timeout_s": 120, "trainer.epochs": 24})
    assert train_model(cfg, out, overfit, "key", True) == out / "final.pt"
    losses = {e: s["dev_loss"] for e, s in read_record(out).items()}
    best = min(losses, key=losses.get)
    assert max(losses) == best + 2 < 24, losses
    assert load(out / "final.pt")["epoch"] == best + 2


# ---------------------------------------------------------------------------- through the CLI
def test_decode_checkpoint_through_the_cli(tmp_path_factory) -> None:
    exp = tmp_path_factory.mktemp("tiny") / "exp"
    args = ["recipes/tiny", f"exp_dir={exp}", *SMALL, "trainer.epochs=4", "--to", "score"]
    out = asrtrain("run", *args, "decode.average_n=3")
    model_dir, dec = exp / "train" / "blstm_tiny", exp / "decode" / "blstm_tiny"
    losses = {e: s["dev_loss"] for e, s in read_record(model_dir).items()}
    assert sorted(losses) == [1, 2, 3, 4]
    three = sorted(sorted(losses, key=lambda e: (losses[e], -e))[:3])
    summary = json.loads((dec / "eval2000" / "decode.json").read_text())
    assert summary["checkpoint"]["epochs"] == three
    assert summary["model"] == str(dec / "model.pt")
    assert_same(weights(dec / "model.pt"), average_checkpoints(
        [model_dir / f"epoch-{e}.pt" for e in three]).model)
    described = f"average of epochs {', '.join(map(str, three))}"
    assert described in out.stderr
    results = (exp / "RESULTS.md").read_text()
    assert described in results and "model decoded" in results
    assert described in json.loads((dec / "eval2000" / "score" / "result.json").read_text())[
        "checkpoint"]
    # another choice reruns decoding and scoring only
    stages = ("prepare", "lang", "features", "train", "decode", "score")
    plan = dict(line.split(None, 1) for line in asrtrain(
        "run", *args, "decode.checkpoint=last", "--dry-run").stdout.splitlines()
        if line.split(None, 1)[0] in stages)
    assert all(plan[s].startswith("done") for s in stages[:4]), plan
    assert plan["decode"].startswith("runs: config changed") and "decode.checkpoint" in \
        plan["decode"] and plan["score"].startswith("runs"), plan
    for choice, want in (("last", model_dir / "final.pt"),
                         ("best", model_dir / f"epoch-{min(losses, key=losses.get)}.pt")):
        out = asrtrain("run", *args, f"decode.checkpoint={choice}")
        assert re.search(r"stage train +already done", out.stderr)
        summary = json.loads((dec / "eval2000" / "decode.json").read_text())
        assert summary["model"] == str(want) and summary["checkpoint"]["checkpoint"] == choice
        assert summary["checkpoint"]["description"] in (exp / "RESULTS.md").read_text()
