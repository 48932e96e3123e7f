"""trainer.precision: bf16 autocast for both tasks on CPU (the same code runs on CUDA), weights,
gradients, optimizer state and loss in fp32, recorded in the checkpoints and kept on resume."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_curves import _alignments
from test_train_single import build_exp, make_cfg

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import SingleProcessBackend
from asrtrain.models import build_model
from asrtrain.train import checkpoint
from asrtrain.train.config import TrainerConfig
from asrtrain.train.curves import read_scalars
from asrtrain.train.tasks import build_task
from asrtrain.train.trainer import autocast, build_optimizer, train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exp(tmp_path_factory) -> Path:
    return build_exp(tmp_path_factory.mktemp("exp"))


def ce_cfg(exp: Path, tmp_path: Path, **overrides):
    """The frame-CE (hybrid) task on real arks and real alignment arks."""
    ali = tmp_path / "ali"
    tmp_path.mkdir(parents=True, exist_ok=True)
    if not ali.exists():
        _alignments(exp / "data" / "train", ali)
    return make_cfg(exp, tmp_path, **{"model.head": "ce", "model.stack_frames": 1,
                                      "+model.alignments": f"{{train: '{ali}', dev: '{ali}'}}",
                                      "trainer.batch_chunks": 16, "trainer.chunk": 21,
                                      **overrides})


@pytest.mark.parametrize("value", ["fp16", "BF16", 16, None])
def test_bad_precision_names_the_key(value) -> None:
    with pytest.raises(AsrtrainError) as e:
        TrainerConfig.from_config({"precision": value})
    assert str(e.value) == f"trainer.precision={value!r}: expected one of fp32, bf16"
    with pytest.raises(AsrtrainError, match=r"^hybrid\.trainer\.precision="):
        TrainerConfig.check_section({"precision": value}, "hybrid.trainer")
    assert TrainerConfig.from_config({"precision": "bf16"}).precision == "bf16"
    assert TrainerConfig().precision == "fp32"


def test_bad_precision_is_one_cli_error_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny",
                           f"exp_dir={tmp_path / 'exp'}", "trainer.precision=fp16",
                           "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "asrtrain: error: trainer.precision='fp16': expected one of fp32, bf16")


@pytest.mark.parametrize("head", ["ce", "ctc"])
def test_bf16_step_is_close_to_fp32_and_keeps_fp32_state(exp: Path, tmp_path: Path,
                                                         head: str) -> None:
    """One optimizer step of each task: the bf16 loss is finite and close to the fp32 loss of
    the same weights and batch; gradients and Adam's moments are fp32; the weights move."""
    torch.set_num_threads(1)
    cfg = ce_cfg(exp, tmp_path) if head == "ce" else make_cfg(exp, tmp_path)
    task = build_task(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model, task.input_dim, task.output_dim)
    batch = next(iter(task.epoch(1, 0, 1)))
    device = torch.device("cpu")
    with autocast(device, "fp32"):
        fp32 = task.loss(model, batch)
    with autocast(device, "bf16"):
        bf16 = task.loss(model, batch)
    assert fp32.dtype == bf16.dtype == torch.float32
    fp32_value, bf16_value = float(fp32.detach()), float(bf16.detach())
    assert torch.isfinite(bf16) and bf16_value != fp32_value
    assert bf16_value == pytest.approx(fp32_value, rel=0.02)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(TrainerConfig(lr=0.01), model.parameters())
    bf16.backward()
    optimizer.step()
    for name, p in model.named_parameters():
        assert p.dtype == p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all(), name
        assert not torch.equal(p.detach(), before[name]), name
        assert all(v.dtype == torch.float32 for k, v in optimizer.state[p].items()
                   if k != "step"), name


def test_bf16_training_is_recorded_logged_and_kept_on_resume(exp: Path, tmp_path: Path,
                                                            caplog) -> None:
    """A bf16 hybrid run: its losses are close to an fp32 run's, every checkpoint says bf16, the
    log says so, and a run resumed after a lost epoch gives the same model bit for bit (a
    resumed run that fell back to fp32 would not)."""
    torch.set_num_threads(1)
    caplog.set_level(logging.INFO, logger="asrtrain.train.trainer")
    runs = {}
    for precision in ("fp32", "bf16"):
        cfg = ce_cfg(exp, tmp_path / precision, **{"trainer.epochs": 2,
                                                   "trainer.precision": precision})
        final = train(cfg, SingleProcessBackend())
        runs[precision] = (cfg, final)
        ckpt = checkpoint.load(final)
        assert ckpt["precision"] == precision
        assert checkpoint.load(final.parent / "epoch-1.pt")["precision"] == precision
        assert all(v.dtype == torch.float32 for v in ckpt["model"].values())
    assert "precision bf16 (autocast on cpu; weights, gradients, optimizer state and loss in " \
           "fp32)" in caplog.text
    losses = {p: [v for _, v in read_scalars(f.parent)["loss/train_epoch"]]
              for p, (_, f) in runs.items()}
    assert losses["bf16"] != losses["fp32"]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)
    cfg, final = runs["bf16"]
    first = checkpoint.load(final)["model"]
    (final.parent / "epoch-2.pt").unlink()
    final.unlink()
    caplog.clear()
    train(cfg, SingleProcessBackend())
    assert "resuming after epoch 1" in caplog.text and "trained with" not in caplog.text
    again = checkpoint.load(final)
    assert again["precision"] == "bf16"
    for k in first:
        torch.testing.assert_close(again["model"][k], first[k], rtol=0, atol=0)


@pytest.mark.cuda
def test_bf16_on_cuda_is_close_to_fp32(device: torch.device) -> None:
    """The same autocast on a GPU: cuDNN's bidirectional kernel in bf16, fp32 logits and
    gradients, a loss close to fp32's."""
    torch.manual_seed(0)
    model = build_model({"layers": 2, "cells": 32, "bottleneck": 16}, 40, 50).to(device)
    feats = torch.randn(64, 21, 40, device=device)
    targets = torch.randint(0, 50, (64 * 21,), device=device)
    losses = {}
    for precision in ("fp32", "bf16"):
        with autocast(device, precision):
            logits, _ = model(feats, torch.full((64,), 21))
            losses[precision] = torch.nn.functional.cross_entropy(
                logits.reshape(-1, 50), targets)
        assert logits.dtype == losses[precision].dtype == torch.float32
    losses["bf16"].backward()
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in model.parameters())
    assert float(losses["bf16"]) == pytest.approx(float(losses["fp32"]), rel=0.02)


@pytest.mark.parametrize("stage", ["train", "train_hybrid"])
def test_fp32_keeps_the_digests_of_runs_made_before_the_setting(stage: str) -> None:
    """A recipe without trainer.precision (a run finished before it existed) and one with the
    default fp32 have the same train stage settings, so upgrading retrains nothing; bf16
    differs, and a dry run names it."""
    import importlib

    from asrtrain.recipe import compose_recipe

    settings = importlib.import_module(f"asrtrain.stages.{stage}").STAGE.config

    def values(*overrides: str) -> dict:
        return settings(compose_recipe(REPO / "recipes" / "tiny", list(overrides)))

    before = values("~trainer.precision")
    assert "precision" not in before["trainer"]
    assert values() == values("trainer.precision=fp32") == before
    assert values("trainer.precision=bf16")["trainer"] == {**before["trainer"],
                                                           "precision": "bf16"}
