"""The one feature reader and the model checkpoint schema, on real kaldiio arks and models."""

from __future__ import annotations

import shutil
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from conftest import write_datadir
from omegaconf import OmegaConf

from asrtrain import AsrtrainError
from asrtrain.align.model import load_data
from asrtrain.data.datadir import DataDir
from asrtrain.decode.hybrid import feature_reader
from asrtrain.features import FeatureOptions, add_deltas, apply_cmvn, compute_features
from asrtrain.features.reader import FeatureReader, chunk_starts, length_batches
from asrtrain.models import BLSTM, ModelCheckpoint, build_model, load_model
from asrtrain.train.chunks import ChunkSet
from asrtrain.train.data import UtteranceSet
from asrtrain.train.tasks import Task

SMALL = {"layers": 2, "cells": 6, "bottleneck": 4}


@pytest.fixture(scope="module")
def mfcc(tmp_path_factory) -> Path:
    """A data dir of 6 utterances (2 speakers) with 13-dim MFCCs, cmvn.scp, utt2num_frames."""
    root = tmp_path_factory.mktemp("mfcc")
    data = write_datadir(root)
    compute_features(data, root / "feats", FeatureOptions(kind="mfcc", num_mel_bins=23), nj=1)
    return data


def expected(data_dir: Path, delta_order: int, norm_vars: bool) -> dict[str, np.ndarray]:
    """What Kaldi's ``apply-cmvn [--norm-vars] scp:cmvn.scp scp:feats.scp | add-deltas`` gives,
    step by step from the arks (the computation each module used to write for itself)."""
    feats = kaldiio.load_scp(str(data_dir / "feats.scp"))
    cmvn = kaldiio.load_scp(str(data_dir / "cmvn.scp"))
    d = DataDir.read(data_dir)
    return {u: add_deltas(apply_cmvn(feats[u], cmvn[d.utt2spk[u]], norm_vars), delta_order)
            for u in d.utts}


@pytest.mark.parametrize("delta_order, norm_vars", [(0, False), (2, False), (2, True)])
def test_every_path_reads_the_same_arrays(mfcc: Path, tmp_path: Path, delta_order: int,
                                          norm_vars: bool) -> None:
    want = expected(mfcc, delta_order, norm_vars)
    dim = 13 * (delta_order + 1)
    reader = FeatureReader(mfcc, delta_order, norm_vars)
    assert reader.dim == dim and reader.utts == sorted(want)
    got = {"reader": dict(reader)}
    us = UtteranceSet(mfcc, lambda text: [1], delta_order=delta_order, norm_vars=norm_vars)
    got["UtteranceSet"] = {u: us.load(u) for u in want}
    ali = tmp_path / "ali"
    ali.mkdir()
    d = DataDir.read(mfcc)
    with kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as w:
        for u in d.utts:
            w(u, np.zeros(d.utt2num_frames[u], dtype=np.int32))
    (ali / "num_pdfs").write_text("3\n")
    cs = ChunkSet(mfcc, ali, delta_order=delta_order, norm_vars=norm_vars)
    assert cs.dim == dim
    got["ChunkSet"] = {u: cs.load(u)[0] for u in want}
    ckpt = ModelCheckpoint({}, SMALL, dim, 3, {"delta_order": delta_order,
                                               "norm_vars": norm_vars})
    got["decode_hybrid"] = dict(feature_reader(mfcc, ckpt))
    if not norm_vars:  # the GMM aligner normalises means only

        class Lexicon:
            lexicon = {"<unk>": [("spn",)]}

        utts, skipped = load_data(mfcc, Lexicon, delta_order)
        assert not skipped
        got["load_data"] = {u.utt: u.feats for u in utts}
    for path, arrays in got.items():
        assert set(arrays) == set(want), path
        for u, a in arrays.items():
            assert a.dtype == np.float32 and a.flags.writeable, (path, u)
            np.testing.assert_array_equal(a, want[u], err_msg=f"{path} {u}")


def test_batches_are_padded_in_length_order(mfcc: Path) -> None:
    reader = FeatureReader(mfcc, 2, need_num_frames=True)
    lengths = [reader.num_frames[u] for u in reader.utts]
    batches = length_batches(lengths, 2 * max(lengths))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)
    utts = [reader.utts[i] for i in batches[0]]
    feats, lens = reader.batch(utts)
    assert feats.shape == (len(utts), max(lens), 39)
    for k, u in enumerate(utts):
        np.testing.assert_array_equal(feats[k, : lens[k]].numpy(), reader[u])
        assert (feats[k, lens[k]:] == 0).all()
    assert chunk_starts(50, 21) == [0, 21, 29]


def test_reader_errors_name_the_file_and_utterance(mfcc: Path, tmp_path: Path) -> None:
    data = tmp_path / "d"
    shutil.copytree(mfcc, data)
    (data / "cmvn.scp").unlink()
    with pytest.raises(AsrtrainError, match=f"{data / 'cmvn.scp'}: missing; run the mfcc"):
        FeatureReader(data, require_cmvn=True, hint="run the mfcc features stage")
    assert FeatureReader(data).transform.cmvn == {}  # CMVN is optional unless required
    shutil.copy(mfcc / "cmvn.scp", data / "cmvn.scp")
    with pytest.raises(AsrtrainError, match=f"{data / 'feats.scp'}: utterance spk0-utt0 has "
                                            r"39-dim input \(feats.scp 13 \+ Δ/ΔΔ = 39\), the "
                                            "model takes 40"):
        next(iter(FeatureReader(data, 2, input_dim=40)))
    # statistics of another feature type (14 dims) for speaker spk1
    stats = kaldiio.load_mat(DataDir.read(data).cmvn["spk1"])
    kaldiio.save_ark(str(tmp_path / "bad.ark"), {"spk1": np.zeros((2, 15))},
                     scp=str(tmp_path / "bad.scp"))
    lines = [ln for ln in (data / "cmvn.scp").read_text().splitlines()
             if not ln.startswith("spk1 ")] + (tmp_path / "bad.scp").read_text().splitlines()
    (data / "cmvn.scp").write_text("\n".join(sorted(lines)) + "\n")
    reader = FeatureReader(data)
    assert reader["spk0-utt0"].shape[1] == 13 and stats.shape == (2, 14)
    with pytest.raises(AsrtrainError, match=r"cmvn\.scp: speaker spk1 has 14-dim statistics, "
                                            r"but utterance spk1-utt0 has 13-dim features"):
        reader["spk1-utt0"]
    shutil.copy(mfcc / "cmvn.scp", data / "cmvn.scp")
    # a feats.scp entry pointing past its ark's end
    lines = (data / "feats.scp").read_text().splitlines()
    utt, spec = lines[2].split(maxsplit=1)
    lines[2] = f"{utt} {spec.rsplit(':', 1)[0]}:999999999"
    (data / "feats.scp").write_text("\n".join(lines) + "\n")
    with pytest.raises(AsrtrainError, match=f"{data / 'feats.scp'}: utterance {utt}: cannot read"):
        FeatureReader(data)[utt]
    (data / "feats.scp").write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    with pytest.raises(AsrtrainError, match=f"feats.scp: 1 utterances missing, e.g. {utt}"):
        FeatureReader(data)
    (data / "feats.scp").unlink()
    with pytest.raises(AsrtrainError, match=f"{data / 'feats.scp'}: missing; run the features"):
        FeatureReader(data)


def test_a_truncated_ark_says_where_it_ends(mfcc: Path, tmp_path: Path) -> None:
    """Issue 26: kaldiio's error on a cut ark is an empty AssertionError (or 'buffer size must
    be a multiple of element size'); the reader gives the sizes."""
    data = tmp_path / "d"
    shutil.copytree(mfcc, data)
    feats = DataDir.read(data).feats
    arks = sorted({spec.rsplit(":", 1)[0] for spec in feats.values()})
    assert len(arks) == 1
    ark = tmp_path / "cut.ark"
    shutil.copy(arks[0], ark)
    (data / "feats.scp").write_text("".join(f"{u} {spec.replace(arks[0], str(ark))}\n"
                                            for u, spec in sorted(feats.items())))
    utt, spec = sorted(feats.items(), key=lambda x: int(x[1].rsplit(":", 1)[1]))[2]
    offset = int(spec.rsplit(":", 1)[1])
    rows = kaldiio.load_mat(spec).shape[0]
    with open(ark, "r+b") as f:
        f.truncate(offset + 100)                   # in the middle of the third matrix
    reader = FeatureReader(data)
    with pytest.raises(AsrtrainError) as e:
        reader[utt]
    assert str(e.value) == (
        f"{data / 'feats.scp'}: utterance {utt}: cannot read {ark}:{offset}: {ark} ends at byte "
        f"{offset + 100:,}, the {rows} x 13 float matrix at byte {offset:,} needs "
        f"{offset + 15 + rows * 13 * 4:,} (truncated)")
    later = max(feats, key=lambda u: int(feats[u].rsplit(":", 1)[1]))
    with pytest.raises(AsrtrainError, match=f"{ark} ends at byte {offset + 100:,}, before the "
                                            "matrix's offset"):
        reader[later]
    ark.unlink()
    with pytest.raises(AsrtrainError, match=f"cannot read {ark}:{offset}: no such file {ark}$"):
        reader[utt]


def test_int32_vectors_read_in_one_piece_equal_kaldiio_and_a_cut_one_says_so(
        tmp_path: Path) -> None:
    """Alignments (``ali-to-pdf``'s int32 vectors) are read in one piece, not element by element
    as kaldiio does: the same values and dtype, an empty one too; one cut short names the file and
    the bytes it needs, and a matrix still goes through kaldiio."""
    from asrtrain.features.ark import load_matrix

    rng = np.random.default_rng(0)
    vectors = {"u0": rng.integers(-5, 40000, 300, dtype=np.int32),
               "u1": np.zeros(0, dtype=np.int32), "u2": np.array([7], dtype=np.int32)}
    ark, scp = tmp_path / "ali.ark", tmp_path / "ali.scp"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as w:
        for key, v in vectors.items():
            w(key, v)
        w("m", np.arange(6, dtype=np.float32).reshape(2, 3))
    table = dict(line.split(maxsplit=1) for line in scp.read_text().splitlines())
    for key, v in vectors.items():
        got = load_matrix(table[key], key)
        assert got.dtype == np.int32 and np.array_equal(got, v)
        assert np.array_equal(got, kaldiio.load_mat(table[key]))
    assert np.array_equal(load_matrix(table["m"], "m"), kaldiio.load_mat(table["m"]))
    offset = int(table["u0"].rsplit(":", 1)[1])
    with open(ark, "r+b") as f:
        f.truncate(offset + 100)
    with pytest.raises(AsrtrainError) as e:
        load_matrix(table["u0"], "ali.scp: utterance u0")
    assert str(e.value) == (
        f"ali.scp: utterance u0: cannot read {ark}:{offset}: {ark} ends at byte "
        f"{offset + 100:,}, the 300-element int32 vector at byte {offset:,} needs "
        f"{offset + 7 + 5 * 300:,} (truncated)")


def _checkpoint(head: str = "ce") -> tuple[BLSTM, ModelCheckpoint]:
    torch.manual_seed(0)
    model = build_model(SMALL, 5, 7)
    cfg = OmegaConf.create({"model": {**SMALL, "head": head},
                            "features": {"delta_order": 0, "norm_vars": False}})
    task = Task()
    task.input_dim, task.output_dim = 5, 7
    ckpt = task.model_checkpoint(cfg, model.state_dict(), epoch=2, global_samples=40,
                                 metrics={"dev_loss": 1.0})
    if head == "ce":
        ckpt.log_priors, ckpt.chunk = torch.log_softmax(torch.randn(7), -1), 21
    return model, ckpt


def test_load_model_gives_the_saved_model(tmp_path: Path) -> None:
    model, ckpt = _checkpoint()
    ckpt.save(tmp_path / "final.pt")
    saved = torch.load(tmp_path / "final.pt", weights_only=False)
    # the keys the trainer has always written, so older readers keep working
    assert set(saved) == {"model", "model_config", "input_dim", "output_dim", "features",
                          "epoch", "global_samples", "metrics", "log_priors", "chunk"}
    loaded, back = load_model(tmp_path / "final.pt", head="ce")
    assert not loaded.training and back.head == "ce" and back.chunk == 21
    assert back.frame_shift == 0.01 and back.delta_order == 0 and not back.norm_vars
    feats, lengths = torch.randn(2, 9, 5), torch.tensor([9, 4])
    torch.testing.assert_close(loaded(feats, lengths)[0], model.eval()(feats, lengths)[0])


def test_load_model_errors_name_the_file(tmp_path: Path) -> None:
    _, ckpt = _checkpoint()
    for key in ("model_config", "features", "input_dim"):
        d = ckpt.to_dict()
        del d[key]
        torch.save(d, tmp_path / f"no-{key}.pt")
        with pytest.raises(AsrtrainError, match=rf"no-{key}\.pt: not a model checkpoint: no "
                                                f"'{key}'"):
            load_model(tmp_path / f"no-{key}.pt")
    d = ckpt.to_dict()
    del d["log_priors"]
    torch.save(d, tmp_path / "nopriors.pt")
    with pytest.raises(AsrtrainError, match=r"nopriors\.pt: no 'log_priors'"):
        load_model(tmp_path / "nopriors.pt")
    ckpt.save(tmp_path / "ce.pt")
    with pytest.raises(AsrtrainError, match=r"ce\.pt: a model.head=ce model, expected "
                                            "model.head=ctc"):
        load_model(tmp_path / "ce.pt", head="ctc")
    torch.save({**ckpt.to_dict(), "log_priors": torch.zeros(6)}, tmp_path / "priors.pt")
    with pytest.raises(AsrtrainError, match=r"priors\.pt: log_priors has shape \(6,\)"):
        load_model(tmp_path / "priors.pt")
    torch.save({**ckpt.to_dict(), "output_dim": 8, "log_priors": torch.zeros(8)},
               tmp_path / "sizes.pt")
    with pytest.raises(AsrtrainError, match=r"sizes\.pt: the model state does not fit"):
        load_model(tmp_path / "sizes.pt")
    with pytest.raises(AsrtrainError, match=r"none\.pt: no such checkpoint"):
        load_model(tmp_path / "none.pt")
