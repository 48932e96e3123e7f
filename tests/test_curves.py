"""Training curves: the TensorBoard events real training runs write, read back with
TensorBoard's own EventAccumulator, and curves.png (one learner, frame CE, and two gossiping
learners through the real CLI)."""

from __future__ import annotations

from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from test_e2e import SMALL, asrtrain
from test_train_single import build_exp, make_cfg

from asrtrain.data.datadir import DataDir
from asrtrain.distributed.backend import SingleProcessBackend
from asrtrain.train.tasks import build_task
from asrtrain.train.trainer import train


@pytest.fixture(scope="module")
def exp(tmp_path_factory) -> Path:
    return build_exp(tmp_path_factory.mktemp("exp"))


STEP_TAGS = {"loss/train", "lr", "frames_per_s/mean", "frames_per_s/learner_0"}
EPOCH_TAGS = {"loss/dev", "loss/train_epoch"}


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def steps(curve: list[tuple[int, float]]) -> list[int]:
    return [s for s, _ in curve]


def assert_png(path: Path, panels: int) -> None:
    with Image.open(path) as im:
        assert im.format == "PNG"
        # two panels a row, 12 x 3.2 inches a row of panels at 100 dpi
        assert im.size == (1200, 320 * ((panels + 1) // 2))


def test_one_learner_writes_every_curve_and_the_png(exp: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = make_cfg(exp, tmp_path, **{"trainer.log_every": 1})
    per_epoch = build_task(cfg).steps_per_epoch(1)
    train(cfg, SingleProcessBackend())
    out = tmp_path / "model"
    curves = scalars(out)
    assert set(curves) == STEP_TAGS | EPOCH_TAGS | {"dev/unit_error_rate"}
    total = 3 * per_epoch
    for tag in STEP_TAGS:
        assert steps(curves[tag]) == list(range(1, total + 1)), tag
    for tag in EPOCH_TAGS | {"dev/unit_error_rate"}:
        assert steps(curves[tag]) == [per_epoch, 2 * per_epoch, total], tag
    assert all(v > 0 for _, v in curves["frames_per_s/learner_0"])
    assert curves["frames_per_s/mean"] == curves["frames_per_s/learner_0"]
    assert all(0 <= v <= 100 for _, v in curves["dev/unit_error_rate"])
    assert [v for _, v in curves["lr"]] == pytest.approx([0.01] * total)
    assert_png(out / "curves.png", panels=4)  # loss, dev set, lr, frames/s

    # A run killed after epoch 2 and resumed: the points the killed run wrote after its last
    # checkpoint are purged, each step is drawn once, and epoch 2's points stay.
    (out / "epoch-3.pt").unlink()
    (out / "final.pt").unlink()
    (out / "curves.png").unlink()
    train(cfg, SingleProcessBackend())
    again = scalars(out)
    assert steps(again["loss/dev"]) == [per_epoch, 2 * per_epoch, total]
    assert steps(again["loss/train"]) == list(range(1, total + 1))
    assert again["loss/dev"][:2] == curves["loss/dev"][:2]
    assert_png(out / "curves.png", panels=4)


def _alignments(data: Path, out: Path, num_pdfs: int = 5) -> Path:
    """Real int32 alignment arks for the training set: pdf = frame index mod ``num_pdfs``."""
    out.mkdir()
    d = DataDir.read(data)
    with kaldiio.WriteHelper(f"ark,scp:{out}/ali.ark,{out}/ali.scp") as w:
        for utt in d.utts:
            n = kaldiio.load_mat(d.feats[utt]).shape[0]
            w(utt, (np.arange(n) % num_pdfs).astype(np.int32))
    (out / "num_pdfs").write_text(f"{num_pdfs}\n")
    return out


def test_frame_ce_writes_frame_accuracy(exp: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    ali = _alignments(exp / "data" / "train", tmp_path / "ali")
    cfg = make_cfg(exp, tmp_path, **{"model.head": "ce", "model.stack_frames": 1,
                                     "+model.alignments": f"{{train: '{ali}', dev: '{ali}'}}",
                                     "trainer.epochs": 2, "trainer.batch_chunks": 16,
                                     "trainer.chunk": 21})
    train(cfg, SingleProcessBackend())
    curves = scalars(tmp_path / "model")
    assert set(curves) == STEP_TAGS | EPOCH_TAGS | {"dev/frame_accuracy"}
    assert len(curves["dev/frame_accuracy"]) == 2
    assert all(0 <= v <= 100 for _, v in curves["dev/frame_accuracy"])
    assert_png(tmp_path / "model" / "curves.png", panels=4)


def test_gossiping_learners_add_consensus_and_gossip_curves(tmp_path: Path) -> None:
    asrtrain("run", "recipes/tiny", f"exp_dir={tmp_path / 'exp'}", "--to", "train", *SMALL,
             "trainer.epochs=2", "trainer.backend=adpsgd", "trainer.learners=2")
    run_dir = tmp_path / "exp" / "train" / "blstm_tiny"
    curves = scalars(run_dir)
    gossip = {"gossip/exchanges_per_s", "gossip/exchanges_per_step"}
    own = {"loss/train", "lr", "frames_per_s/learner_0"}  # learner 0's own: no allreduce
    assert set(curves) == own | EPOCH_TAGS | {"dev/unit_error_rate"} | gossip | {
        "consensus/distance"}
    log_steps = steps(curves["loss/train"])
    assert log_steps and all(s % 5 == 0 for s in log_steps)  # trainer.log_every=5 (SMALL)
    for tag in gossip | own:
        assert steps(curves[tag]) == log_steps, tag
    assert len(curves["loss/dev"]) == 2
    # measured where the learners meet, at the epoch's end, not on the hot path
    assert steps(curves["consensus/distance"]) == steps(curves["loss/dev"])
    assert all(v > 0 for _, v in curves["consensus/distance"])
    other = scalars(run_dir / "learner_1")  # learner 1 writes its own series
    assert {"loss/train", "lr", "frames_per_s/learner_1"} | gossip <= set(other)
    assert sum(v for _, v in curves["gossip/exchanges_per_s"]) > 0
    # loss, dev set, lr, frames/s, consensus distance, gossip exchanges/s and per step
    assert_png(run_dir / "curves.png", panels=7)
