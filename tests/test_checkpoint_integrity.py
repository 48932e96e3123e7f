"""Checkpoint hygiene on real files: sha256 sidecars verified on load (a file cut short, a
flipped byte, a NaN written in), resume from the last good epoch, trainer.keep_checkpoints, and
a rerun of the recipe that notices a damaged final.pt and resumes instead of doing nothing."""

from __future__ import annotations

import logging
import shutil
import subprocess
import zipfile
from pathlib import Path

import forked_cli
import pytest
import torch
from conftest import copy_exp
from test_e2e import SMALL, asrtrain
from test_train_single import build_exp, make_cfg

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import SingleProcessBackend
from asrtrain.models import checksum
from asrtrain.models.checkpoint import ModelCheckpoint, load_model
from asrtrain.train import checkpoint
from asrtrain.train.trainer import train


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))


def write_a_nan(path: Path) -> None:
    """What a script that edits a checkpoint does: load it, change a weight, save it back."""
    d = torch.load(path, weights_only=False)
    d["model"][next(iter(d["model"]))].view(-1)[0] = float("nan")
    torch.save(d, path)


DAMAGE = {"truncate": truncate, "flip_a_byte": flip_a_byte, "write_a_nan": write_a_nan}


def small_checkpoint(epoch: int | None = None, dev_loss: float = 1.0) -> ModelCheckpoint:
    from asrtrain.models import build_model

    model_cfg = {"name": "m", "layers": 1, "cells": 4, "bottleneck": 0, "dropout": 0.0,
                 "stack_frames": 1, "head": "ctc"}
    model = build_model(model_cfg, 3, 5)
    return ModelCheckpoint(model.state_dict(), model_cfg, 3, 5, {"delta_order": 0},
                           epoch=epoch, global_samples=10, metrics={"dev_loss": dev_loss})


def test_save_records_a_sha256_that_sha256sum_accepts(tmp_path: Path) -> None:
    path = tmp_path / "final.pt"
    small_checkpoint().save(path)
    side = checksum.sidecar(path)
    assert side.name == "final.pt.sha256"
    assert side.read_text() == f"{checksum.sha256_file(path)}  final.pt\n"
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--check", "--quiet", side.name], cwd=tmp_path, check=True,
                       timeout=60)
    model, ckpt = load_model(path)
    assert ckpt.output_dim == 5 and not model.training
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_one_error_naming_the_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "epoch-3.pt"
    small_checkpoint(3).save(path)
    DAMAGE[damage](path)
    with pytest.raises(AsrtrainError) as e:
        load_model(path)
    message = str(e.value)
    assert message.startswith(f"{path}: cut short or altered after it was written")
    assert "epoch-3.pt.sha256" in message and "\n" not in message
    assert checksum.damage(path).startswith("cut short or altered")


def test_without_a_sidecar_a_nan_or_a_cut_is_still_caught(tmp_path: Path) -> None:
    # Checkpoints written before checksums were kept have no sidecar: they load unverified,
    # but a NaN weight or a torn file is still an error naming the file.
    path = tmp_path / "final.pt"
    small_checkpoint().save(path)
    checksum.sidecar(path).unlink()
    assert checksum.damage(path) is None
    write_a_nan(path)
    with pytest.raises(AsrtrainError, match=r"final\.pt: weight '.*' holds 1 NaN or infinite"):
        load_model(path)
    truncate(path)
    assert checksum.damage(path).startswith("cut short: not a whole zip archive")
    with pytest.raises(AsrtrainError, match=r"final\.pt: cut short: not a whole zip archive"):
        load_model(path)
    with zipfile.ZipFile(path, "w") as z:  # a whole archive, but no torch checkpoint
        z.writestr("notes.txt", "hello")
    with pytest.raises(AsrtrainError, match=r"final\.pt: cannot read the checkpoint \("):
        load_model(path)


def test_a_sidecar_that_is_not_a_checksum_is_named(tmp_path: Path) -> None:
    path = tmp_path / "final.pt"
    small_checkpoint().save(path)
    checksum.sidecar(path).write_text("hello\n")
    with pytest.raises(AsrtrainError, match=r"final\.pt: its checksum file final\.pt\.sha256 "
                                            r"is not a sha256 line"):
        checkpoint.load(path)


def test_prune_keeps_the_last_epochs_the_best_model_and_later_files(tmp_path: Path) -> None:
    for epoch in range(1, 7):
        small_checkpoint(epoch).save(checkpoint.model_path(tmp_path, epoch))
        for rank in (0, 1):
            checkpoint.save({"optimizer": {}}, checkpoint.optimizer_path(tmp_path, epoch, rank))
    assert checkpoint.prune(tmp_path, keep=0, newest=5, best=2) == []
    removed = checkpoint.prune(tmp_path, keep=2, newest=5, best=2)
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".sha256"))
    # epochs 4 and 5 whole, epoch 2's model; epoch 6 (after the newest) is not touched
    assert left == sorted(["epoch-2.pt", *[f"epoch-{e}{r}.pt" for e in (4, 5, 6)
                                            for r in ("", ".optim.rank0", ".optim.rank1")]])
    assert len(removed) == 3 * 3 - 1
    for p in removed:
        assert not checksum.sidecar(p).exists()
    for name in left:
        assert checksum.damage(tmp_path / name) is None and checksum.sidecar(tmp_path / name)


@pytest.fixture(scope="module")
def exp(tmp_path_factory) -> Path:
    return build_exp(tmp_path_factory.mktemp("exp"))


def test_keep_checkpoints_prunes_and_the_run_still_resumes(exp: Path, tmp_path: Path,
                                                           caplog) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "model"
    train(make_cfg(exp, tmp_path, **{"trainer.epochs": 4, "trainer.keep_checkpoints": 1,
                                     "trainer.keep_best": 1}),
          SingleProcessBackend())
    losses = {e: checkpoint.load(checkpoint.model_path(out, e))["metrics"]["dev_loss"]
              for e in checkpoint.epochs(out)}
    assert 4 in losses and len(losses) <= 2  # the last one, and the best if it is another
    best = min(losses, key=losses.get)
    assert sorted(p.name for p in out.glob("*.optim.*.pt")) == ["epoch-4.optim.rank0.pt"]
    assert (out / "final.pt").is_file()
    # trainer.epochs=6 continues from epoch 4, with its optimizer state
    caplog.set_level(logging.INFO)
    train(make_cfg(exp, tmp_path, **{"trainer.epochs": 6, "trainer.keep_checkpoints": 1,
                                     "trainer.keep_best": 1}),
          SingleProcessBackend())
    assert "resuming after epoch 4" in caplog.text
    assert checkpoint.epochs(out)[-1] == 6
    assert sorted(p.name for p in out.glob("*.optim.*.pt")) == ["epoch-6.optim.rank0.pt"]
    assert set(checkpoint.epochs(out)) <= {best, 5, 6}
    for p in out.glob("*.pt"):
        assert checksum.damage(p) is None and checksum.sidecar(p).is_file()


def test_fewer_epochs_than_trained_give_a_model_of_that_many(exp: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "model"
    train(make_cfg(exp, tmp_path, **{"trainer.epochs": 4, "trainer.keep_checkpoints": 1,
                                     "trainer.keep_best": 1}),
          SingleProcessBackend())
    assert checkpoint.load(out / "final.pt")["epoch"] == 4
    # epoch 2 is gone (unless it was the best): training goes on from what is kept up to it
    train(make_cfg(exp, tmp_path, **{"trainer.epochs": 2, "trainer.keep_checkpoints": 1,
                                     "trainer.keep_best": 1}),
          SingleProcessBackend())
    assert checkpoint.load(out / "final.pt")["epoch"] == 2
    assert 4 in checkpoint.epochs(out)  # the later epoch stays for a run that goes on


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_resume_skips_a_damaged_epoch_and_gives_the_same_model(exp: Path, tmp_path: Path,
                                                                damage: str, caplog) -> None:
    torch.set_num_threads(1)
    cfg = make_cfg(exp, tmp_path)  # 3 epochs, keep_checkpoints 2
    out = tmp_path / "model"
    first = checkpoint.load(train(cfg, SingleProcessBackend()))["model"]
    DAMAGE[damage](out / "epoch-3.pt")
    (out / "final.pt").unlink()
    caplog.set_level(logging.INFO)
    train(cfg, SingleProcessBackend())
    assert f"{out / 'epoch-3.pt'}: cut short or altered" in caplog.text
    assert "resuming after epoch 2" in caplog.text
    again = checkpoint.load(out / "final.pt")["model"]
    for k in first:
        torch.testing.assert_close(first[k], again[k], rtol=0, atol=0)


# -- the recipe, through the real CLI ----------------------------------------------------------

@pytest.fixture(scope="module")
def recipe(tiny_tri1: Path, tmp_path_factory) -> list[str]:
    """The tiny recipe's settings (2 epochs) on an exp dir trained up to the CTC model: a copy
    of conftest's tiny_tri1 (its data stages; its GMM passes unused here)."""
    exp = copy_exp(tiny_tri1, tmp_path_factory.mktemp("integrity") / "exp")
    args = ["recipes/tiny", f"exp_dir={exp}", *SMALL, "trainer.epochs=2"]
    asrtrain("run", *args, "--to", "train")
    return args


@pytest.fixture
def trained(recipe: list[str]) -> list[str]:
    """Its settings for runs up to the train stage."""
    return [*recipe, "--to", "train"]


def _model_dir(args: list[str]) -> Path:
    exp = Path(next(a for a in args if a.startswith("exp_dir="))[len("exp_dir="):])
    return exp / "train" / "blstm_tiny"


@pytest.mark.parametrize("damage", ["truncate", "remove"])  # flip_a_byte: the test below
def test_a_rerun_notices_a_damaged_final_model_and_resumes(trained: list[str],
                                                           damage: str) -> None:
    final = _model_dir(trained) / "final.pt"
    if damage == "remove":
        final.unlink()
    else:
        DAMAGE[damage](final)
    plan = asrtrain("run", *trained, "--dry-run").stdout
    why = " is missing" if damage == "remove" else ": cut short or altered after it was written"
    assert f"train          runs: {final}{why}" in plan
    out = asrtrain("run", *trained)
    assert "resuming after epoch 2" in out.stderr and "epoch 1/" not in out.stderr
    assert checksum.damage(final) is None
    assert "nothing to do" in asrtrain("run", *trained).stderr


def test_a_rerun_retrains_from_the_last_good_epoch(trained: list[str]) -> None:
    model_dir = _model_dir(trained)
    flip_a_byte(model_dir / "epoch-2.pt")
    flip_a_byte(model_dir / "final.pt")
    out = asrtrain("run", *trained)
    assert f"{model_dir / 'epoch-2.pt'}: cut short or altered" in out.stderr
    assert "resuming after epoch 1" in out.stderr
    for name in ("epoch-2.pt", "final.pt"):
        assert checksum.damage(model_dir / name) is None
    assert "nothing to do" in asrtrain("run", *trained).stderr


def test_a_stage_reading_a_damaged_model_outside_the_range_names_it(recipe: list[str]) -> None:
    final = _model_dir(recipe) / "final.pt"
    data = final.read_bytes()
    truncate(final)
    try:
        proc = forked_cli.run("run", *recipe, "--stage",
                              "decode", "--to", "decode", timeout=300)
    finally:
        final.write_bytes(data)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"stage decode reads train, which is not up to date ({final}: cut short" in proc.stderr


def test_keep_checkpoints_is_a_launch_setting(trained: list[str]) -> None:
    out = asrtrain("run", *trained, "trainer.keep_checkpoints=5", "--dry-run").stdout
    assert "train          done" in out

