"""Hybrid decoding through HCLG on the tiny corpus: posteriors from a forced alignment decode the
aligned utterances almost perfectly; a BLSTM trained a few steps with FrameCETask gives a scored
CTM; mismatched models, missing graphs and features are clear errors.

The module fixture prepares the tiny corpus's eval2000 (espeak-ng speech, stm + glm), computes
MFCC (for the GMM) and fbank (for the BLSTM) features, trains a monophone GMM on eval2000 itself
(its text in the lexicon's case, out-of-vocabulary words as <unk>) and builds HCLG from it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir, read_table
from asrtrain.decode import HybridDecodeConfig
from asrtrain.decode.hybrid import decode_hybrid, decode_loglikes, pseudo_loglikes
from asrtrain.models import build_model
from asrtrain.score import counts_json, score_decode
from asrtrain.train import checkpoint
from asrtrain.train.tasks import FrameCETask

REPO = Path(__file__).resolve().parents[1]
MONO = {"num_iters": 6, "totgauss": 200, "realign_iters": [1, 2, 3, 4, 6], "max_iter_inc": 4,
        "min_gaussian_occupancy": 3}
FAST = {"beam": 11.0, "lattice_beam": 5.0, "min_lmwt": 8, "max_lmwt": 12, "wips": [0.0, 1.0]}
SMALL_BLSTM = {"layers": 1, "cells": 32, "bottleneck": 16}
FEATURES = {"delta_order": 0, "norm_vars": False, "frame_shift": 10.0}
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def setup(hybrid_setup: dict[str, Path]) -> dict[str, Path]:
    """conftest's session hybrid_setup (shared with test_decode_scale): eval2000's GMM, HCLG."""
    return hybrid_setup


def oracle_loglikes(ali_dir: Path):
    """Scaled log-likelihoods that prefer the aligned pdf of every frame by 1 (10 unscaled)."""
    num_pdfs = int((ali_dir / "num_pdfs").read_text())
    for utt, ali in sorted(kaldiio.load_scp(str(ali_dir / "ali.scp")).items()):
        ali = np.asarray(ali)
        ll = np.full((len(ali), num_pdfs), -1.0, dtype=np.float32)
        ll[np.arange(len(ali)), ali] = 0.0
        yield utt, ll, 0.0


def test_alignment_posteriors_decode_the_aligned_utterances(setup, tmp_path) -> None:
    """Posteriors from the forced alignment through HCLG, timed words, sweep and choice."""
    out = tmp_path / "oracle"
    summary = decode_loglikes(oracle_loglikes(setup["ali"]), setup["graph"], setup["gmm_data"],
                              out, FAST)
    assert summary["wer"]["all"]["ref_words"] > 500
    assert summary["wer"]["all"]["wer"] < 2.0
    assert summary["failed_utterances"] == summary["untimed_paths"] == 0
    sweep = json.loads((out / "decode.json").read_text())
    assert [(r["lmwt"], r["wip"]) for r in sweep["sweep"]] == [
        (m, w) for m in range(8, 13) for w in (0.0, 1.0)]
    best = min(r["wer"]["all"]["wer"] for r in sweep["sweep"])
    assert sweep["wer"]["all"]["wer"] == best
    assert "chosen on" in sweep["selection"]
    # the one decode-dir layout; no stm here: plain WER of text, reports of the chosen setting
    assert sweep["settings"] == {**HybridDecodeConfig().as_dict(), **FAST}
    rescored = score_decode(setup["gmm_data"], out)["all"]
    assert summary["counts"]["all"].as_dict() == rescored.as_dict()
    assert sweep["wer"]["all"] == counts_json(summary["counts"])["all"]
    assert (out / "score" / "text.sys").is_file() and not (out / "score" / "ctm.filt.sys").exists()
    # every word inside its utterance, in order, with the hypothesis text
    data = DataDir.read(setup["gmm_data"])
    hyp = read_table(out / "text", allow_empty_value=True)
    ctm = [ln.split() for ln in (out / "ctm").read_text().splitlines()]
    assert len(ctm) == sum(len(t.split()) for t in hyp.values())
    for utt, seg in data.segments.items():
        file, channel = data.reco2file_and_channel[seg.recording]
        words = [w for w in ctm if w[0] == file and w[1] == channel
                 and seg.start - 0.005 <= float(w[2]) < seg.end]
        assert [w[4] for w in words] == hyp[utt].split()
        assert all(float(w[2]) + float(w[3]) <= seg.end + 0.005 for w in words)


def test_fixed_setting_scores_the_stm_subsets(setup, tmp_path) -> None:
    """lmwt/wip fixed: one setting, Hub5 scoring of all, swbd and callhm from the stm."""
    out = tmp_path / "fixed"
    summary = decode_loglikes(oracle_loglikes(setup["ali"]), setup["graph"], setup["test"], out,
                              {**FAST, "lmwt": 10, "wip": 0.5})
    assert (summary["lmwt"], summary["wip"]) == (10, 0.5) and len(summary["sweep"]) == 1
    assert set(summary["wer"]) == {"all", "swbd", "callhm"}
    assert summary["wer"]["all"]["ref_words"] == (summary["wer"]["swbd"]["ref_words"]
                                                  + summary["wer"]["callhm"]["ref_words"])
    # a loose bound: the oracle posteriors decode nearly, not exactly, the reference
    assert summary["wer"]["all"]["wer"] < 10.0
    assert (out / "score" / "ctm.filt.sys").is_file()
    assert {k: c.as_dict() for k, c in summary["counts"].items()} == {
        k: c.as_dict() for k, c in score_decode(setup["test"], out).items()}
    assert json.loads((out / "decode.json").read_text())["wer"] == counts_json(summary["counts"])


def test_faster_decoder_sweeps_lm_weights_only(setup, tmp_path) -> None:
    """decoder=faster: one FasterDecoder pass per LM weight (max_active), no penalty."""
    out = tmp_path / "faster"
    summary = decode_loglikes(oracle_loglikes(setup["ali"]), setup["graph"], setup["gmm_data"],
                              out, {**FAST, "decoder": "faster", "max_active": 2000})
    assert [(r["lmwt"], r["wip"]) for r in summary["sweep"]] == [(m, 0.0) for m in range(8, 13)]
    assert summary["wer"]["all"]["wer"] < 2.0
    with pytest.raises(AsrtrainError, match="insertion penalty"):
        decode_loglikes(oracle_loglikes(setup["ali"]), setup["graph"], setup["gmm_data"], out,
                        {"decoder": "faster", "wip": 0.5})
    with pytest.raises(AsrtrainError, match=r"decode.beams: unknown setting"):
        decode_loglikes(oracle_loglikes(setup["ali"]), setup["graph"], setup["gmm_data"], out,
                        {"beams": 3})


def train_blstm(setup: dict, path: Path, steps: int) -> dict:
    """A small BLSTM trained ``steps`` steps with FrameCETask, saved like the trainer does."""
    ali = setup["ali"]
    cfg = OmegaConf.create({
        "exp_dir": str(setup["root"] / "exp"), "features": FEATURES,
        "trainer": {"chunk": 21, "batch_chunks": 32, "seed": 0},
        "model": {"head": "ce", "alignments": {"train": str(ali), "dev": str(ali)},
                  **SMALL_BLSTM},
        "sets": {"train": "eval2000", "dev": "eval2000"}})
    task = FrameCETask(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model, task.input_dim, task.output_dim)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    done = 0
    while done < steps:
        for batch in task.epoch(done, 0, 1):
            opt.zero_grad()
            task.loss(model, batch).backward()
            opt.step()
            done += 1
            if done == steps:
                break
    ckpt = {"model": model.state_dict(), "model_config": OmegaConf.to_container(cfg.model),
            "input_dim": task.input_dim, "output_dim": task.output_dim, "features": FEATURES,
            **task.checkpoint_extra()}
    checkpoint.save(ckpt, path)
    return ckpt


def test_blstm_decodes_to_a_scored_ctm(setup, tmp_path) -> None:
    train_blstm(setup, tmp_path / "final.pt", steps=30)
    out = tmp_path / "decode"
    # an undertrained model has flat posteriors: a narrow beam keeps the lattice search short
    summary = decode_hybrid(tmp_path / "final.pt", setup["graph"], setup["test"], out,
                            {**FAST, "beam": 7.0, "lattice_beam": 3.0, "threads": 1,
                             "batch_chunks": 64})
    assert set(summary["wer"]) == {"all", "swbd", "callhm"}
    assert summary["wer"]["all"]["ref_words"] > 500
    assert summary["utterances"] == len(DataDir.read(setup["test"]).utts)
    assert summary["real_time_factor"] > 0 and summary["nn_seconds"] > 0
    assert (out / "ctm").read_text().strip()
    for subset in ("ctm.filt.sys", "ctm.swbd.filt.sys", "ctm.callhm.filt.sys"):
        assert (out / "score" / subset).is_file()
    assert len(json.loads((out / "decode.json").read_text())["sweep"]) == 10


def test_each_frame_from_one_chunk(setup) -> None:
    """50 frames in chunks starting at 0, 21, 29: frames 21..41 come from the second chunk,
    42..49 from the last; log-softmax minus scaled priors, times the acoustic scale."""
    torch.manual_seed(1)
    model = build_model(SMALL_BLSTM, 5, 7).eval()
    feats = np.random.default_rng(0).standard_normal((50, 5)).astype(np.float32)
    priors = torch.log_softmax(torch.randn(7), -1)
    (utt, ll, _), = pseudo_loglikes(model, iter([("u", feats)]), priors, 21, 0.5, 0.1, 2)
    with torch.no_grad():
        def run(s: int) -> torch.Tensor:
            x = torch.from_numpy(feats[s: s + 21])[None]
            return torch.log_softmax(model(x, torch.tensor([len(x[0])]))[0][0], -1)
        want = torch.cat([run(0), run(21), run(29)[13:]])
    assert utt == "u" and ll.shape == (50, 7)
    np.testing.assert_allclose(ll, ((want - 0.5 * priors) * 0.1).numpy(), atol=1e-5)


def test_errors_name_the_file(setup, tmp_path) -> None:
    ckpt = train_blstm(setup, tmp_path / "final.pt", steps=1)
    bad = {**ckpt, "output_dim": ckpt["output_dim"] + 1}
    checkpoint.save(bad, tmp_path / "bad.pt")
    with pytest.raises(AsrtrainError, match=r"bad\.pt: the model has \d+ outputs.*HCLG\.fst"):
        decode_hybrid(tmp_path / "bad.pt", setup["graph"], setup["test"], tmp_path / "o", {})
    graph = tmp_path / "graph"
    shutil.copytree(setup["graph"], graph)
    (graph / "HCLG.fst").unlink()
    with pytest.raises(AsrtrainError, match=f"{graph / 'HCLG.fst'}: missing"):
        decode_hybrid(tmp_path / "final.pt", graph, setup["test"], tmp_path / "o", {})
    data = tmp_path / "nofeats"
    shutil.copytree(setup["test"], data)
    (data / "feats.scp").unlink()
    with pytest.raises(AsrtrainError, match=f"{data / 'feats.scp'}: missing"):
        decode_hybrid(tmp_path / "final.pt", setup["graph"], data, tmp_path / "o", {})


def test_config_defaults_in_one_place_and_checked() -> None:
    """HybridDecodeConfig holds the defaults; the recipes' hybrid.decode sections load through
    it and repeat none of them; unknown keys, wrong types and bad values are errors."""
    default = HybridDecodeConfig()
    assert default.settings() == [(m, w) for m in range(7, 18) for w in (0.0, 0.5, 1.0)]
    for path in sorted((REPO / "conf" / "hybrid").glob("*.yaml")):
        section = OmegaConf.to_container(OmegaConf.load(path)).get("decode") or {}
        cfg = HybridDecodeConfig.from_config(section)
        repeated = {k for k, v in section.items() if getattr(default, k) == getattr(cfg, k)}
        assert not repeated, f"{path}: decode repeats the defaults of {sorted(repeated)}"
    c = HybridDecodeConfig.from_config({"beam": 11, "wips": [0, 1], "lmwt": 9})
    assert (c.beam, c.wips, c.settings()) == (11.0, (0.0, 1.0), [(9, 0.0), (9, 1.0)])
    assert HybridDecodeConfig.from_config({"decoder": "faster", "max_lmwt": 8}).settings() == [
        (7, 0.0), (8, 0.0)]
    for bad, message in (({"beams": 3}, r"decode.beams: unknown setting"),
                         ({"beam": "wide"}, r"decode.beam='wide': expected a number"),
                         ({"lmwt": 9.5}, r"decode.lmwt=9.5: expected an integer"),
                         ({"wips": 0.5}, r"decode.wips=0.5: expected a list"),
                         ({"decoder": "viterbi"}, "expected lattice or faster"),
                         ({"min_lmwt": 0}, "LM weights positive"),
                         ({"wips": []}, "need at least one of each"),
                         ({"beam": -1.0}, "must be positive")):
        with pytest.raises(AsrtrainError, match=message):
            HybridDecodeConfig.from_config(bad)
