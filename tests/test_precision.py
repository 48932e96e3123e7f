"""trainer.precision: bf16 autocast for both tasks on CPU (the same code runs on CUDA), weights,
gradients, optimizer state and loss in fp32, recorded in the checkpoints and kept on resume; a
device without bf16 LSTM kernels (a CPU without AVX-512) refused in one line before training.

The refusal runs for real here: ``ONEDNN_MAX_CPU_ISA=AVX2`` caps oneDNN below AVX-512, where
torch's own bf16 LSTM fails as it does on the project's AMD EPYC CPUs (checked first, with torch
alone, by :func:`onednn_cap_breaks_bf16_lstm`)."""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import torch
from omegaconf import OmegaConf
from test_curves import _alignments
from test_train_single import build_exp, make_cfg

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import SingleProcessBackend
from asrtrain.models import build_model
from asrtrain.models.precision import precision_refusal
from asrtrain.train import checkpoint
from asrtrain.train.config import TrainerConfig
from asrtrain.train.curves import read_scalars
from asrtrain.train.tasks import build_task
from asrtrain.train.trainer import autocast, build_optimizer, train

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
#: Why this machine's CPU cannot train in bf16 (the trainer's probe), or None.
BF16_REFUSAL = precision_refusal("bf16", CPU)
needs_cpu_bf16 = pytest.mark.skipif(BF16_REFUSAL is not None, reason=f"{BF16_REFUSAL}")
#: oneDNN capped below AVX-512, as on the project's AMD EPYC CPUs.
NO_AVX512 = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
#: One line the CLI prints when it refuses bf16 on such a CPU.
NO_AVX512_REFUSAL = re.compile(
    r"asrtrain: error: trainer\.precision=bf16: this CPU \(.+, ONEDNN_MAX_CPU_ISA=AVX2\) has "
    r"no bf16 LSTM kernel \(oneDNN: .*primitive.*\): use trainer\.precision=fp32")


@functools.cache
def onednn_cap_breaks_bf16_lstm() -> bool:
    """Whether torch's own bidirectional LSTM fails in bf16 autocast under :data:`NO_AVX512`
    (x86 CPUs with oneDNN; elsewhere the cap means nothing and there is nothing to refuse)."""
    code = ("import torch\n"
            "m = torch.nn.LSTM(4, 4, batch_first=True, bidirectional=True)\n"
            "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
            "    y = m(torch.randn(2, 3, 4))[0]\n"
            "y.float().sum().backward()\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **NO_AVX512},
                          capture_output=True, text=True, timeout=120)
    return proc.returncode != 0 and "primitive descriptor" in proc.stderr


def run_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return forked_cli.run(*args, timeout=300, env={**os.environ, **(env or {})})


def assert_one_line_refusal(proc: subprocess.CompletedProcess, pattern: re.Pattern) -> None:
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert pattern.fullmatch(proc.stderr.strip().splitlines()[-1]), proc.stderr[-3000:]


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
    proc = forked_cli.run("run", "recipes/tiny",
                          f"exp_dir={tmp_path / 'exp'}", "trainer.precision=fp16",
                          "--dry-run", timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "asrtrain: error: trainer.precision='fp16': expected one of fp32, bf16")


@needs_cpu_bf16
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


@needs_cpu_bf16
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


def learner_config(exp: Path, tmp_path: Path) -> Path:
    """The resolved config a train stage hands its learners: one bf16 hybrid epoch."""
    cfg = ce_cfg(exp, tmp_path, **{"trainer.epochs": 1, "trainer.precision": "bf16"})
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(cfg))
    return path


def test_bf16_here_trains_or_is_refused_before_training(exp: Path, tmp_path: Path) -> None:
    """This machine as it is: a learner (``asrtrain train``) asked for bf16 trains in it where
    the probe found the kernels, else refuses in one line before writing any checkpoint; never
    a crash mid-epoch. A dry run of the recipe agrees."""
    config = learner_config(exp, tmp_path)
    proc = run_cli(["train", str(config)])
    model = tmp_path / "model"
    dry = run_cli(["run", "recipes/tiny", f"exp_dir={tmp_path / 'exp'}",
                   "trainer.precision=bf16", "--dry-run"])
    if BF16_REFUSAL is None:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert checkpoint.load(model / "final.pt")["precision"] == "bf16"
        assert dry.returncode == 0, dry.stderr[-3000:]
    else:
        refusal = re.compile(re.escape(f"asrtrain: error: trainer.precision=bf16: {BF16_REFUSAL}"
                                       ": use trainer.precision=fp32"))
        assert_one_line_refusal(proc, refusal)
        assert not list(model.glob("*.pt"))
        assert_one_line_refusal(dry, refusal)


def test_bf16_without_avx512_is_refused_in_one_line(exp: Path, tmp_path: Path) -> None:
    """oneDNN capped at AVX2 (what an AMD EPYC without AVX-512 has): the learner refuses bf16
    before training, naming the CPU and oneDNN's missing kernel, without a traceback; so does a
    run of the recipe, before its first stage writes anything; fp32 still trains."""
    if not onednn_cap_breaks_bf16_lstm():
        pytest.skip("torch's bf16 LSTM runs under ONEDNN_MAX_CPU_ISA=AVX2 here: nothing to refuse")
    config = learner_config(exp, tmp_path)
    assert_one_line_refusal(run_cli(["train", str(config)], NO_AVX512), NO_AVX512_REFUSAL)
    assert not list((tmp_path / "model").glob("*.pt"))
    assert_one_line_refusal(run_cli(["run", "recipes/tiny", f"exp_dir={tmp_path / 'exp'}",
                                     "trainer.precision=bf16"], NO_AVX512), NO_AVX512_REFUSAL)
    assert not (tmp_path / "exp").exists()
    config.write_text(config.read_text().replace("precision: bf16", "precision: fp32"))
    proc = run_cli(["train", str(config)], NO_AVX512)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert checkpoint.load(tmp_path / "model" / "final.pt")["precision"] == "fp32"


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
def test_precision_is_in_the_train_stages_digest(stage: str) -> None:
    """trainer.precision is a setting of the model like any other: fp32 (the default) and bf16
    give different train stage settings, so a dry run names the change."""
    import importlib

    from asrtrain.recipe import compose_recipe

    settings = importlib.import_module(f"asrtrain.stages.{stage}").STAGE.config

    def values(*overrides: str) -> dict:
        return settings(compose_recipe(REPO / "recipes" / "tiny", list(overrides)))

    assert values()["trainer"]["precision"] == "fp32"
    assert values() == values("trainer.precision=fp32")
    assert values("trainer.precision=bf16")["trainer"] == {**values()["trainer"],
                                                           "precision": "bf16"}
