"""A new model is one registered builder: this file defines one (a feed-forward net over spliced
frames), registers it, and trains and decodes it through the CLI with both heads, CTC (``train``,
two learner processes, ``decode``) and hybrid (``train_hybrid``, ``decode_hybrid``), without a
change anywhere in the package. The learners and decoders are other processes: they register it
by importing this module, which ``model.module`` names (``tests/`` on their ``PYTHONPATH``).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import forked_cli
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from asrtrain import AsrtrainError
from asrtrain.models import ModelCheckpoint, build_model, load_model, model_names, register_model
from asrtrain.models.blstm import BLSTM
from asrtrain.models.config import BlstmConfig, ModelConfig
from asrtrain.models.registry import BUILTIN_CONFIGS, check_model_config, model_settings
from asrtrain.recipe import compose_recipe
from asrtrain.settings import defaults, integer, opt

REPO = Path(__file__).resolve().parents[1]
ARCH = "test_spliced_mlp"


def _leave_a_thread_inside_torch() -> None:
    """A daemon thread inside torch operations when the interpreter's exit begins, as a user's
    module may leave one (a prefetcher): Python ends such a thread by ``pthread_exit`` when an
    operation gives the GIL back, which C++ frames cannot unwind (SIGABRT, "terminate called
    without an active exception"). Registered with atexit in each learner this module is
    imported by (``model.module``, under torchrun), so it runs only if a learner that finished
    still ends through the interpreter's finalization: asrtrain's learners end with ``os._exit``
    once their work is on disk, and the CTC training below must succeed (it failed, the
    learners aborted, without that)."""
    a = torch.randn(300, 300)

    def spin() -> None:
        while True:
            a @ a

    threading.Thread(target=spin, daemon=True).start()
    time.sleep(0.2)


if os.environ.get("TORCHELASTIC_RUN_ID"):
    atexit.register(_leave_a_thread_inside_torch)


class SplicedMLP(nn.Module):
    """Frames stacked ``stack_frames`` at a time (the output rate), each output frame seeing
    ``context`` stacked frames either side (zeros past the ends), one hidden ReLU layer."""

    def __init__(self, input_dim: int, output_dim: int, hidden: int, context: int,
                 stack_frames: int) -> None:
        super().__init__()
        self.stack_frames, self.context = stack_frames, context
        width = input_dim * stack_frames * (2 * context + 1)
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, output_dim))

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor):
        b, t, d = feats.shape
        s = self.stack_frames
        feats = feats[:, : t // s * s].reshape(b, t // s, d * s)
        lengths = torch.div(lengths, s, rounding_mode="floor").clamp(min=1)
        valid = (torch.arange(feats.shape[1]) < lengths[:, None]).unsqueeze(-1).to(feats.device)
        x = nn.functional.pad(feats * valid, (0, 0, self.context, self.context))
        spliced = x.unfold(1, 2 * self.context + 1, 1).flatten(2)  # [b, t', d*s*(2c+1)]
        return self.net(spliced).float(), lengths


@register_model(ARCH)
def build_spliced_mlp(cfg, input_dim: int, output_dim: int, head: str) -> SplicedMLP:
    # CTC reads a wider window than frame CE's chunk-local decisions need
    context = int(cfg.get("context", 2 if head == "ctc" else 1))
    return SplicedMLP(input_dim, output_dim, int(cfg["hidden"]), context,
                      int(cfg.get("stack_frames", 1)))


def model_cfg(**extra) -> dict:
    return {"name": "mlp", "arch": ARCH, "module": __name__, "hidden": 16, "head": "ctc",
            **extra}


def test_the_registry_builds_and_rebuilds_the_new_model(tmp_path: Path) -> None:
    assert {"blstm", ARCH} <= set(model_names())
    model = build_model(OmegaConf.create(model_cfg(stack_frames=2)), 5, 7)
    assert isinstance(model, SplicedMLP) and model.context == 2 and model.stack_frames == 2
    logits, lengths = model(torch.randn(3, 9, 5), torch.tensor([9, 5, 1]))
    assert logits.shape == (3, 4, 7) and logits.dtype == torch.float32
    assert lengths.tolist() == [4, 2, 1]
    assert build_model(model_cfg(head="ce"), 5, 7).context == 1   # the head reaches the builder
    # a checkpoint records the arch and the module, and loading rebuilds through the registry
    ckpt = ModelCheckpoint(model.state_dict(), model_cfg(stack_frames=2), 5, 7,
                           {"delta_order": 0, "norm_vars": False})
    ckpt.save(tmp_path / "mlp.pt")
    saved = torch.load(tmp_path / "mlp.pt", weights_only=False)
    assert (saved["model_config"]["arch"], saved["model_config"]["module"]) == (ARCH, __name__)
    loaded, back = load_model(tmp_path / "mlp.pt", head="ctc")
    assert isinstance(loaded, SplicedMLP) and back.arch == ARCH and not loaded.training
    feats = torch.randn(2, 8, 5)
    torch.testing.assert_close(loaded(feats, torch.tensor([8, 6]))[0],
                               model.eval()(feats, torch.tensor([8, 6]))[0])
    # the built-in default, recorded even when the config names no arch
    blstm = ModelCheckpoint({}, {"layers": 1, "cells": 4}, 5, 7, {})
    assert blstm.arch == "blstm" and blstm.to_dict()["model_config"]["arch"] == "blstm"


def test_unknown_archs_and_modules_are_one_line_naming_the_registered(tmp_path: Path) -> None:
    with pytest.raises(AsrtrainError) as e:
        check_model_config(OmegaConf.create({"name": "x", "arch": "conformer"}), "hybrid.model")
    assert str(e.value).startswith("hybrid.model.arch='conformer': not a registered model; "
                                   "registered: ")
    assert "blstm" in str(e.value) and "hybrid.model.module names the module" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(AsrtrainError, match=r"^model.module='no_such_models': cannot import it "
                                            r"\(ModuleNotFoundError"):
        check_model_config({"arch": "gru", "module": "no_such_models"})
    with pytest.raises(AsrtrainError, match=r"^model.module=3: expected a module name"):
        check_model_config({"module": 3})
    with pytest.raises(AsrtrainError, match=r"^model.head='rnnt': expected one of ctc, ce$"):
        check_model_config({"head": "rnnt"})
    with pytest.raises(AsrtrainError, match=f"model arch {ARCH!r} is registered twice"):
        register_model(ARCH, lambda cfg, i, o, h: None)
    with pytest.raises(AsrtrainError, match="the model's stack_frames is 1, but "
                                            "model.stack_frames=3"):
        register_model("test_forgets_stacking",
                       lambda cfg, i, o, h: SplicedMLP(i, o, 4, 0, 1))
        build_model({"arch": "test_forgets_stacking", "stack_frames": 3}, 5, 7)
    # a checkpoint of an arch that is not registered here: one line naming the file
    model = build_model(model_cfg(), 5, 7)
    ckpt = ModelCheckpoint(model.state_dict(), {**model_cfg(), "arch": "gone", "module": None},
                           5, 7, {})
    ckpt.save(tmp_path / "gone.pt")
    with pytest.raises(AsrtrainError) as e:
        load_model(tmp_path / "gone.pt")
    assert str(e.value).startswith(f"{tmp_path / 'gone.pt'}: model.arch='gone': not a "
                                   "registered model; registered: ")
    assert ARCH in str(e.value) and "\n" not in str(e.value)


def asrtrain(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                       os.environ.get("PYTHONPATH")]))}
    return forked_cli.run(*args, timeout=900, env=env)


# The models small, trained one epoch, the CTC model on two learner processes, the hybrid on one,
# on a copy of conftest's tiny_tri1 (the data stages and the small mono and tri1 passes of
# recipes/tiny/small.yaml's tri1 set, nj=2: found done, not run again): the hybrid model's
# targets are tri1's alignments, its input the 40 log-mel features; no i-vectors, no scoring.
# (read in the test: the learners import this module without bench/ or conftest on their path)
SMALL = ["nj=2",
         "trainer.epochs=1", "trainer.batch_frames=4000", "trainer.spec_augment=null",
         "trainer.learners=2",
         "hybrid.trainer.epochs=1", "hybrid.trainer.batch_chunks=64", "+hybrid.trainer.learners=1",
         "+hybrid.decode.decoder=faster", "+hybrid.decode.max_active=300",
         "+hybrid.decode.beam=8", "+hybrid.decode.lmwt=10"]
MINE = [f"model.arch={ARCH}", f"+model.module={__name__}", "model.name=mlp_ctc",
        "+model.hidden=32", "model.stack_frames=2",
        f"hybrid.model.arch={ARCH}", f"+hybrid.model.module={__name__}",
        "hybrid.model.name=mlp_hybrid", "+hybrid.model.hidden=32"]


@pytest.mark.timeout(900)
def test_a_model_defined_here_trains_and_decodes_through_the_cli(tiny_tri1: Path,
                                                                  tmp_path: Path) -> None:
    import small  # bench/small.py (conftest puts bench/ on the path)
    from conftest import copy_exp

    exp = copy_exp(tiny_tri1, tmp_path / "exp")
    stages = [s for s in compose_recipe(REPO / "recipes" / "tiny", []).stages
              if s not in ("ivectors", "score")]
    proc = asrtrain("run", "recipes/tiny", f"exp_dir={exp}", *small.overrides("tri1"), *SMALL,
                    *MINE,
                    f"stages=[{','.join(stages)}]")
    assert proc.returncode == 0, proc.stderr[-4000:]
    ran = re.findall(r"stage (\w+) +starts:", proc.stderr)
    assert {"train", "decode", "train_hybrid", "decode_hybrid"} <= set(ran), ran
    assert not set(ran) & {"prepare", "features", "mfcc", "align"}, ran  # tiny_tri1's, done
    # two learner processes trained the CTC model: each imported this module to build it
    assert "backend ssgd: 2 learners" in (exp / "log" / "train.log").read_text()
    for name, head, context in (("mlp_ctc", "ctc", 2), ("mlp_hybrid", "ce", 1)):
        ckpt = ModelCheckpoint.load(exp / "train" / name / "final.pt", head=head)
        assert ckpt.arch == ARCH and ckpt.model_config["module"] == __name__
        assert set(ckpt.model) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
        model = ckpt.build()
        assert isinstance(model, SplicedMLP) and model.context == context
    ctc_out = exp / "decode" / "mlp_ctc" / "eval2000"
    ctc = json.loads((ctc_out / "decode.json").read_text())
    assert (ctc_out / "text").is_file() and (ctc_out / "ctm").is_file()
    # the hybrid model's posteriors through HCLG, scored (a model trained for seconds: the
    # words it finds are not the point)
    hybrid = json.loads((exp / "decode" / "mlp_hybrid" / "eval2000" / "decode.json").read_text())
    assert hybrid["utterances"] == ctc["utterances"] > 0 and hybrid["failed_utterances"] == 0
    assert hybrid["wer"]["all"]["ref_words"] > 0 and hybrid["frames"] > 0


@pytest.mark.parametrize("stage, key", [("train", "model"), ("train_hybrid", "hybrid.model")])
def test_the_training_stages_refuse_an_arch_nothing_registers(stage: str, key: str) -> None:
    """Checked before any stage runs (the stages' checks), in one line naming the registered."""
    import importlib

    check = importlib.import_module(f"asrtrain.stages.{stage}").STAGE.check
    check(compose_recipe(REPO / "recipes" / "tiny", MINE))
    with pytest.raises(AsrtrainError) as e:
        check(compose_recipe(REPO / "recipes" / "tiny", [*MINE, f"{key}.arch=conformer"]))
    assert str(e.value).startswith(f"{key}.arch='conformer': not a registered model; "
                                   "registered: ")
    assert ARCH in str(e.value) and "blstm" in str(e.value)


# ------------------------------------------------------------------ an arch's options' dataclass
@dataclass(frozen=True)
class TypedMLPConfig:
    hidden: int = opt(16, integer(1))
    context: int = opt(1, integer(0))
    stack_frames: int = opt(1, integer(1))   # a common key the builder uses too


@register_model("test_typed_mlp", config=TypedMLPConfig)
def build_typed_mlp(cfg: TypedMLPConfig, input_dim: int, output_dim: int,
                    head: str) -> SplicedMLP:
    assert isinstance(cfg, TypedMLPConfig)   # the dataclass, not the mapping
    return SplicedMLP(input_dim, output_dim, cfg.hidden, cfg.context, cfg.stack_frames)


def test_an_arch_with_a_dataclass_gets_it_and_typos_are_one_line() -> None:
    model = build_model({"name": "m", "arch": "test_typed_mlp", "hidden": 8, "stack_frames": 2},
                        5, 7)
    assert (model.net[0].out_features, model.context, model.stack_frames) == (8, 1, 2)
    read = model_settings({"arch": "test_typed_mlp", "head": "ce"}, "hybrid.model")
    assert read.options == TypedMLPConfig() and read.common.head == "ce"
    with pytest.raises(AsrtrainError) as e:
        build_model({"arch": "test_typed_mlp", "hiden": 8}, 5, 7)
    assert str(e.value) == ("model.hiden: unknown setting; known: alignments, arch, context, "
                            "head, hidden, module, name, stack_frames")
    with pytest.raises(AsrtrainError, match=r"^hybrid.model.hidden='8': expected an integer"):
        check_model_config({"arch": "test_typed_mlp", "hidden": "8"}, "hybrid.model")
    # without a dataclass (the arch above), the builder's keys are its own business, as before
    assert model_settings(model_cfg(hiden=3)).options == model_cfg(hiden=3)


def test_the_blstm_reads_its_section_with_its_dataclass() -> None:
    assert BUILTIN_CONFIGS["blstm"] is BlstmConfig   # what a plan reads without torch
    model = build_model({"name": "b", "layers": 2, "cells": 6, "bottleneck": 0,
                         "stack_frames": 3}, 5, 7)
    assert isinstance(model, BLSTM) and len(model.layers) == 2 and model.stack_frames == 3
    for section, message in [
            ({"cels": 5}, "model.cels: unknown setting; known: alignments, arch, bottleneck, "
                          "cells, dropout, head, layers, module, name, stack_frames$"),
            ({"layers": 0}, "model.layers=0: expected an integer >= 1$"),
            ({"dropout": "0.1"}, "model.dropout='0.1': expected a number >= 0 and <= 1$"),
            ({"stack_frames": 1.5}, "model.stack_frames=1.5: expected an integer >= 1$")]:
        with pytest.raises(AsrtrainError, match="^" + message):
            check_model_config(section)


def _conf(path: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(REPO / "conf" / path), resolve=False)


def test_the_model_yaml_defaults_are_the_dataclass_defaults() -> None:
    """conf/model/blstm_ibm.yaml lists every key of ModelConfig and BlstmConfig at its default
    but ``name`` (the model's own, no default), ``module`` (a model outside asrtrain) and
    ``alignments`` (train_hybrid gives the hybrid model the align stage's); the tiny model and
    the hybrid ones differ in size only: every key they give is known and typed."""
    ibm = _conf("model/blstm_ibm.yaml")
    common = {f.name for f in dataclasses.fields(ModelConfig)}
    own = {f.name for f in dataclasses.fields(BlstmConfig)}
    assert set(ibm) == (common | own) - {"module", "alignments"}
    assert {k: v for k, v in ibm.items() if k in own} == defaults(BlstmConfig)
    assert {k: v for k, v in ibm.items() if k in common and k != "name"} == \
        {k: v for k, v in defaults(ModelConfig).items() if k in ibm and k != "name"}
    assert model_settings(ibm, build=False).options == BlstmConfig()
    tiny = model_settings(_conf("model/blstm_tiny.yaml"), build=False)
    assert (tiny.options.layers, tiny.options.cells, tiny.common.stack_frames) == (3, 192, 3)
    for path in sorted((REPO / "conf" / "hybrid").glob("*.yaml")):
        hybrid = model_settings(_conf(f"hybrid/{path.name}")["model"], "hybrid.model",
                                build=False)
        assert hybrid.common.head == "ce" and hybrid.common.arch == "blstm"


def test_a_model_typo_through_the_cli_is_one_line(tmp_path: Path) -> None:
    """Before anything runs (the train stage's check, in a plan): exit 1 and one line naming
    the key and the valid ones; the hybrid model's section in-process (the same check)."""
    proc = asrtrain("run", "recipes/tiny", f"exp_dir={tmp_path / 'exp'}", "+model.cels=5",
                    "--dry-run")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "asrtrain: error: model.cels: unknown setting; known: alignments, arch, bottleneck, "
        "cells, dropout, head, layers, module, name, stack_frames"]
    assert not (tmp_path / "exp").exists()
    import importlib

    check = importlib.import_module("asrtrain.stages.train_hybrid").STAGE.check
    with pytest.raises(AsrtrainError, match=r"^hybrid.model.cels: unknown setting; known: "):
        check(compose_recipe(REPO / "recipes" / "tiny", ["+hybrid.model.cels=5"]))
