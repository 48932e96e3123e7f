"""LDA+MLLT (tri3), SAT with fMLLR (tri4) and fMLLR alignment on real (espeak-ng) speech.

The corpus, lang, mono, tri1, tri3 (TRI3) and tri4 (TRI4) passes are session fixtures of
tests/conftest.py: 4 voices as 4 speakers of 12 training utterances each.  The passes run with
few iterations; what is checked is what Kaldi's scripts promise: the model's feature pipeline is
saved and reused (alignment with the saved model repeats the training's final one), MLLT and
fMLLR raise their objectives, adapted features fit a SAT model better than unadapted ones,
transforms are Kaldi matrices on disk, and the forked jobs give the alignments of one process.
"""

from __future__ import annotations

import filecmp
import json
import math
import multiprocessing as mp
from dataclasses import asdict
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from test_align import check_alignment

from asrtrain import AsrtrainError
from asrtrain.align import GmmConfig, align_data, train_pass
from asrtrain.align.frames import estimate_transforms, silence_pdfs
from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.model import (
    STATE_BITS,
    AcousticModel,
    align,
    load_data,
    model_features,
    read_transforms,
    read_utterances,
    write_transforms,
)
from asrtrain.align.passjobs import IterJob, Part, iter_job
from asrtrain.align.sat import alignment_model
from asrtrain.data.datadir import DataDir
from asrtrain.features.reader import FeatureReader
from asrtrain.jobs import _Job
from asrtrain.lang.lexicon import Lang

pytestmark = pytest.mark.timeout(900)

TRI3 = {"type": "lda_mllt", "num_iters": 6, "num_leaves": 120, "num_gauss": 400,
        "realign_iters": [3, 6], "mllt_iters": [1, 2, 4], "max_iter_inc": 4,
        "min_gaussian_occupancy": 3, "nj": 2}
TRI4 = {"type": "sat", "num_iters": 6, "num_leaves": 120, "num_gauss": 400,
        "realign_iters": [3, 6], "fmllr_iters": [1, 2, 4], "max_iter_inc": 4,
        "min_gaussian_occupancy": 3, "fmllr_min_count": 200, "nj": 2}


def _table(scp: Path) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in kaldiio.load_scp(str(scp)).items()}


def _passes(d: Path) -> dict:
    return json.loads((d / "passes.json").read_text())


def test_tri3_saves_its_transform_and_realigns_as_it_trained(corpus, tri3, tmp_path) -> None:
    lang = Lang.read(corpus["lang"])
    data = DataDir.read(corpus["train"])
    check_alignment(lang, data.text, tri3, data.utt2num_frames)
    model = AcousticModel.load(tri3)
    assert model.kind == "lda_mllt" and not model.sat and model.splice == (3, 3)
    assert model.lda_mllt.shape == (40, 13 * 7) and model.gmm.dim == 40
    summary = _passes(tri3)["summary"]
    assert summary["kind"] == "lda_mllt" and summary["lda"]["spliced_dim"] == 91
    assert 0 < summary["num_pdfs"] <= TRI3["num_leaves"]
    # the saved final.mat gives the features the final alignment was made on
    align_data(corpus["train"], corpus["lang"], tri3, tmp_path / "ali", {"nj": 1})
    for name in ("ali.scp", "ali_phone_state.scp"):
        a, b = _table(tri3 / name), _table(tmp_path / "ali" / name)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # features: splice ±3 of the CMN'd MFCCs times final.mat
    utts, _ = load_data(corpus["train"], lang, model)
    cmn = FeatureReader(corpus["train"], 0, require_cmvn=True)[utts[0].utt].astype(np.float64)
    t = len(cmn)
    spliced = np.concatenate([cmn[np.clip(np.arange(t) + k, 0, t - 1)] for k in range(-3, 4)], 1)
    np.testing.assert_allclose(utts[0].feats, spliced @ model.lda_mllt.T, rtol=1e-4, atol=1e-4)


def test_mllt_raises_its_objective_and_the_likelihood(tri3) -> None:
    """Every MLLT update gains (est-mllt's auxiliary function), less each time as it converges;
    the training likelihood in the LDA space (each iteration's per-frame log-likelihood plus the
    log-determinant of the MLLT so far: the Jacobian) rises from the first iteration to the last."""
    passes = _passes(tri3)["passes"]
    gains = [p["mllt_objf_improvement"] for p in passes if "mllt_objf_improvement" in p]
    assert len(gains) == len(TRI3["mllt_iters"])
    assert all(g > 0 for g in gains) and gains[0] > gains[-1]
    logdet, lda_space = 0.0, []
    for p in passes[:-1]:
        logdet += p.get("mllt_logdet", 0.0)
        lda_space.append(p["loglike_per_frame"] + logdet)
    assert lda_space[-1] > lda_space[0] + 1.0, lda_space
    assert all(p["frames_per_second"] > 0 for p in passes)


def test_tri4_writes_kaldi_transforms_and_a_speaker_independent_model(corpus, tri3,
                                                                       tri4) -> None:
    lang = Lang.read(corpus["lang"])
    data = DataDir.read(corpus["train"])
    check_alignment(lang, data.text, tri4, data.utt2num_frames)
    model = AcousticModel.load(tri4)
    alimdl = AcousticModel.load(tri4, alignment_model=True)
    assert model.sat and model.kind == "sat" and not alimdl.sat
    np.testing.assert_array_equal(model.lda_mllt, AcousticModel.load(tri3).lda_mllt)
    assert alimdl.tree.nodes == model.tree.nodes and alimdl.gmm.means.shape == model.gmm.means.shape
    assert not torch.equal(alimdl.gmm.means, model.gmm.means)
    # trans.ark through kaldiio: a float32 [40, 41] matrix per training speaker
    speakers = set(data.utt2spk.values())
    for table in (kaldiio.load_scp(str(tri4 / "trans.scp")),
                  dict(kaldiio.load_ark(str(tri4 / "trans.ark")))):
        got = {k: np.asarray(v) for k, v in table.items()}
        assert set(got) == speakers
        assert all(m.shape == (40, 41) and m.dtype == np.float32 for m in got.values())
    trans = read_transforms(tri4, dim=40)
    assert all(not np.allclose(m[:, :40], np.eye(40)) for m in trans.values())
    gains = _passes(tri4)["summary"]["fmllr_objf_improvement"]
    assert len(gains) == len(TRI4["fmllr_iters"]) and all(g > 0 for g in gains)
    assert gains[0] > gains[-1]


def test_alignment_model_ignores_dead_component_slots(corpus, tri4) -> None:
    """final.alimdl from a model whose GMMs carry unused slots (mixing up pads every pdf) is
    the one from the same model without them."""
    lang = Lang.read(corpus["lang"])
    model = AcousticModel.load(tri4)
    base, _ = read_utterances(corpus["train"], lang)
    base = {u.utt: u.feats for u in base}
    utts, _ = load_data(corpus["train"], lang, model, read_transforms(tri4))
    ps = _table(tri4 / "ali_phone_state.scp")
    cfg = GmmConfig.from_config({"type": "sat"})
    plain = alignment_model(model, utts, base, ps, cfg)
    g = model.gmm
    p, m, d = g.means.shape
    model.gmm = DiagGmmSet(torch.cat([g.means, torch.zeros(p, 3, d, dtype=g.means.dtype)], 1),
                           torch.cat([g.vars, torch.ones(p, 3, d, dtype=g.vars.dtype)], 1),
                           torch.cat([g.log_weights, torch.full((p, 3), -math.inf)], 1))
    padded = alignment_model(model, utts, base, ps, cfg)
    assert torch.equal(padded.gmm.means[:, :m], plain.gmm.means)
    assert torch.equal(padded.gmm.vars[:, :m], plain.gmm.vars)
    # weights are normalised over the slots, so the dead ones may move the last bit
    torch.testing.assert_close(padded.gmm.log_weights[:, :m], plain.gmm.log_weights,
                               rtol=0, atol=1e-12)


def test_adapted_alignment_beats_the_same_model_without_transforms(corpus, tri4) -> None:
    """The SAT model on its speakers' fMLLR features against the same model on the unadapted
    ones: a higher log-likelihood per frame, also counting each speaker's log|det A| (the
    Jacobian that makes the two comparable)."""
    lang = Lang.read(corpus["lang"])
    model = AcousticModel.load(tri4)
    trans = read_transforms(tri4)
    cfg = {"nj": 1}
    si, _ = load_data(corpus["train"], lang, model)
    adapted, _ = load_data(corpus["train"], lang, model, trans)
    a, b = align(model, lang, adapted, cfg), align(model, lang, si, cfg)
    frames = {u.speaker: 0 for u in adapted}
    for u in adapted:
        frames[u.speaker] += len(u.feats)
    jacobian = sum(n * np.linalg.slogdet(trans[s][:, :40].astype(np.float64))[1]
                   for s, n in frames.items()) / sum(frames.values())
    assert a.loglike_per_frame + jacobian > b.loglike_per_frame + 1.0
    assert a.loglike_per_frame > b.loglike_per_frame


def test_align_fmllr_two_passes_write_transforms(corpus, tri4, tmp_path) -> None:
    """align_data on a SAT model is align_fmllr: the first pass with final.alimdl on unadapted
    features, transforms from it, the second with final.mdl on adapted features."""
    lang = Lang.read(corpus["lang"])
    test = DataDir.read(corpus["test"])
    out = tmp_path / "tri4_ali_test"
    s = align_data(corpus["test"], corpus["lang"], tri4, out, {"nj": 2, "fmllr_min_count": 100})
    assert s["kind"] == "align_fmllr" and s["failed"] == 0
    check_alignment(lang, test.text, out, test.utt2num_frames)
    trans = read_transforms(out / "trans.scp", dim=40)
    assert set(trans) == set(test.utt2spk.values())
    assert AcousticModel.load(out).sat and (out / "final.alimdl").is_file()
    passes = _passes(out)["passes"]
    assert [p["features"] for p in passes] == ["speaker-independent", "fmllr"]
    assert passes[1]["fmllr_objf_improvement"] > 0
    assert s["final_loglike_per_frame"] > s["si_loglike_per_frame"]


@pytest.mark.parametrize("kind", ["tri2", "tri3", "tri4"])
def test_results_do_not_depend_on_nj_or_batches(corpus, tri1, tri3, tmp_path, kind) -> None:
    """Every statistics pass runs over the data dir's blocks of whole speakers, cut by a rule
    that does not involve nj (``split_data_dir``), and the stage sums the blocks' statistics in
    block order (tree, LDA, MLLT, fMLLR, GMM, final.alimdl, realignment): with 1, 2 and 3 jobs
    the alignments, models, trees, transforms and alimdl are the same bytes.

    A job streams its part a batch of whole speakers at a time (issue 22): the 2-job run has one
    speaker per batch (``part_batch_frames=1``), the 1- and 3-job runs the whole part in one
    batch, so the same bytes also show that streaming changes nothing (this was
    test_align_jobs_stream's whole-vs-streamed pair at nj=2, two more passes a kind). tri4's
    align_fmllr (align_data of a SAT model: both passes and the transforms) likewise."""
    src, cfg = {"tri2": (tri1, {**TRI3, "type": "deltas"}), "tri3": (tri1, TRI3),
                "tri4": (tri3, TRI4)}[kind]
    cfg = dict(cfg, num_iters=4, realign_iters=[2, 4], mllt_iters=[1, 3], fmllr_iters=[1, 3])
    batch = {1: 10 ** 9, 2: 1, 3: 10 ** 9}   # frames a job holds: whole part, a speaker
    for nj in (1, 2, 3):
        train_pass(corpus["train"], corpus["lang"], src, tmp_path / f"nj{nj}",
                   dict(cfg, nj=nj, part_batch_frames=batch[nj]))
        assert not list(tmp_path.glob("*.work.tmp"))   # the jobs' work dir is gone
    blocks = sorted(Path(corpus["train"]).glob("split*/[0-9]*"))
    assert len(blocks) > 2, blocks    # more blocks than jobs: a job serves several
    names = ["ali.ark", "ali_phone_state.ark", "tree.txt", "final.mdl", "ali.scp"]
    if kind == "tri4":
        names += ["trans.ark", "final.alimdl"]
    for nj in (2, 3):
        for name in names:
            a, b = tmp_path / "nj1" / name, tmp_path / f"nj{nj}" / name
            if name.endswith(".scp"):   # offsets into the same bytes
                assert a.read_text().replace("nj1", "") == b.read_text().replace(f"nj{nj}", "")
            else:
                assert filecmp.cmp(a, b, shallow=False), f"{name}, nj={nj}"
    if kind == "tri4":
        out = {}
        for name, size in (("whole", 10 ** 9), ("streamed", 1)):
            out[name] = tmp_path / f"ali_{name}"
            align_data(corpus["test"], corpus["lang"], tmp_path / "nj1", out[name],
                       {"nj": 1, "fmllr_min_count": 100, "part_batch_frames": size})
        for name in ("ali.ark", "ali_phone_state.ark", "trans.ark"):
            assert filecmp.cmp(out["whole"] / name, out["streamed"] / name, shallow=False), name


def test_delta_models_read_features_as_before(corpus, tri1) -> None:
    """A Δ model's file has none of the new keys (so files written before them are the same
    thing and load), and its features are FeatureReader's Δ+ΔΔ bit for bit."""
    d = torch.load(tri1 / "final.mdl", weights_only=True)
    assert not {"splice", "lda_mllt", "sat"} & set(d)
    model = AcousticModel.load(tri1)
    assert model.kind == "deltas" and model.lda_mllt is None and model.splice == (0, 0)
    lang = Lang.read(corpus["lang"])
    by_model, _ = load_data(corpus["train"], lang, model)
    by_order, _ = load_data(corpus["train"], lang, 2)
    reader = FeatureReader(corpus["train"], 2, require_cmvn=True)
    for a, b in zip(by_model, by_order, strict=True):
        assert a.feats.tobytes() == b.feats.tobytes() == reader[a.utt].tobytes()
        assert a.speaker == reader.data.utt2spk[a.utt]
    raw, _ = read_utterances(corpus["train"], lang)
    assert model_features(2, raw[0].feats).tobytes() == by_order[0].feats.tobytes()


def test_silence_pdfs_are_the_silence_phones_frames(corpus, tri1) -> None:
    lang = Lang.read(corpus["lang"])
    model = AcousticModel.load(tri1)
    sil = set(silence_pdfs(model.tree, lang).tolist())
    pdf, ps = _table(tri1 / "ali.scp"), _table(tri1 / "ali_phone_state.scp")
    is_sil = {p: lang.phones.is_silence(p) for p in lang.phones.real_phone_ids}
    n_sil = 0
    for utt in pdf:
        for p, ph in zip(pdf[utt].tolist(), (ps[utt] // STATE_BITS).tolist(), strict=True):
            assert (p in sil) == is_sil[ph]
            n_sil += is_sil[ph]
    assert n_sil > 0


def test_estimate_transforms_undoes_a_known_distortion(corpus, tri3) -> None:
    """One speaker's features moved by a known affine map: the transform estimated on them,
    composed with the map, is the one estimated on the original features.  The model is tri3's
    first Gaussian of every pdf, so that posteriors do not depend on the features and the
    fMLLR objective on the moved features is the original one composed with the map."""
    lang = Lang.read(corpus["lang"])
    model = AcousticModel.load(tri3)
    g = model.gmm
    model.gmm = DiagGmmSet(g.means[:, :1], g.vars[:, :1], torch.zeros(g.num_pdfs, 1))
    utts, _ = load_data(corpus["train"], lang, model)
    spk = utts[0].speaker
    utts = [u for u in utts if u.speaker == spk]
    pdfs = _table(tri3 / "ali.scp")
    sil = silence_pdfs(model.tree, lang)
    # run to convergence: the optimum is equivariant under the map, a 40-iteration estimate
    # from the identity is not (a fresh clone's tri3 left 0.039 between them)
    opts = {"fmllr_min_count": 100, "fmllr_num_iters": 400}
    clean = estimate_transforms(model, utts, pdfs, sil, opts)[spk]
    rng = np.random.default_rng(0)
    a = np.eye(40) + 0.05 * rng.standard_normal((40, 40))
    b = 0.5 * rng.standard_normal(40)
    for u in utts:
        u.feats = (u.feats.astype(np.float64) @ a.T + b).astype(np.float32)
    rep: dict = {}
    moved = estimate_transforms(model, utts, pdfs, sil, opts, report=rep)
    w = moved[spk].astype(np.float64)
    composed = np.concatenate([w[:, :40] @ a, (w[:, :40] @ b + w[:, 40])[:, None]], 1)
    np.testing.assert_allclose(composed, clean, atol=2e-3)
    assert rep["speakers"] == 1 and rep["identity"] == 0 and rep["objf_improvement_per_frame"] > 0
    # too few frames: the identity (Kaldi's --fmllr-min-count)
    few = estimate_transforms(model, utts, pdfs, sil, {"fmllr_min_count": 1e9})[spk]
    np.testing.assert_array_equal(few, np.eye(40, 41, dtype=np.float32))


def test_transform_files_round_trip_and_bad_ones_are_named(tmp_path) -> None:
    rng = np.random.default_rng(1)
    good = {f"spk{i}": np.concatenate([np.eye(4), rng.normal(size=(4, 1))], 1) for i in range(3)}
    write_transforms(tmp_path, good)
    for path in (tmp_path, tmp_path / "trans.scp", tmp_path / "trans.ark"):
        back = read_transforms(path, dim=4)
        assert set(back) == set(good)
        assert all(np.allclose(back[k], good[k], atol=1e-6) for k in good)
    bad = {"wide": np.ones((4, 6), np.float32), "nan": np.full((4, 5), math.nan, np.float32),
           "zero": np.zeros((4, 5), np.float32)}
    for spk, m in bad.items():
        d = tmp_path / spk
        d.mkdir()
        with kaldiio.WriteHelper(f"ark,scp:{d / 'trans.ark'},{d / 'trans.scp'}") as w:
            w("ok", np.eye(4, 5, dtype=np.float32))
            w(spk, m)
        with pytest.raises(AsrtrainError, match=rf"{d / 'trans.scp'}: speaker {spk}: "):
            read_transforms(d / "trans.scp")
    with pytest.raises(AsrtrainError, match=r"expected \[3, 4\]"):
        read_transforms(tmp_path, dim=3)
    with pytest.raises(AsrtrainError, match="missing"):
        read_transforms(tmp_path / "nowhere" / "trans.scp")
    (tmp_path / "junk.ark").write_bytes(b"spk1 \x00Bgarbage")
    with pytest.raises(AsrtrainError, match="junk.ark: cannot read"):
        read_transforms(tmp_path / "junk.ark")


def test_missing_speaker_transform_and_bad_options_are_errors(corpus, tri3, tmp_path) -> None:
    lang = Lang.read(corpus["lang"])
    model = AcousticModel.load(tri3)
    with pytest.raises(AsrtrainError, match=r"train: no fMLLR transform for speaker "
                       r"'train_en-029' \(utterance train_en-029-"):
        load_data(corpus["train"], lang, model, {"someone": np.eye(40, 41)})
    with pytest.raises(AsrtrainError, match="type='fmllr'"):
        GmmConfig.from_config({"type": "fmllr"})
    with pytest.raises(AsrtrainError, match="GMM pass.splice_opts: unknown setting"):
        GmmConfig.from_config({"splice_opts": "--left-context=3"})
    # a SAT pass whose alignment dir has transforms for other speakers
    write_transforms(tmp_path, {"someone": np.eye(40, 41)})
    src = tmp_path / "src"
    src.mkdir()
    for f in tri3.iterdir():
        if f.is_file() and not f.name.startswith("trans"):
            (src / f.name).write_bytes(f.read_bytes())
    for f in ("trans.ark", "trans.scp"):
        (src / f).write_bytes((tmp_path / f).read_bytes())
    with pytest.raises(AsrtrainError, match="trans.scp: no transform for speaker"):
        train_pass(corpus["train"], corpus["lang"], src, tmp_path / "tri4", TRI4)


def test_a_pass_job_runs_in_a_fresh_interpreter(corpus, tri3, tmp_path) -> None:
    """A pass's job inherits nothing (``cmd: slurm`` starts a new Python): given the same
    argument, a spawned process returns the same statistics and writes the same alignment."""
    data = DataDir.read(corpus["train"])
    spk = data.utt2spk[data.utts[0]]
    utts = [u for u in data.utts if data.utt2spk[u] == spk]
    out = []
    for name in ("here", "spawned"):
        work = tmp_path / name
        work.mkdir()
        arg = IterJob(Part(1, str(corpus["train"]), str(corpus["lang"]), utts, str(work)),
                      str(tri3 / "final.mdl"), "viterbi", what=("gmm", "final"),
                      cfg=asdict(GmmConfig()))
        if name == "here":
            out.append(_Job(iter_job, 1)(arg))
        else:
            with mp.get_context("spawn").Pool(1) as pool:
                out.append(pool.apply(_Job(iter_job, 1), (arg,)))
    here, spawned = out
    assert here.frames == spawned.frames > 0 and not here.failed
    for name in ("occ", "sx", "sxx"):
        assert torch.equal(getattr(here.stats, name), getattr(spawned.stats, name)), name
    for name in ("ali.1.ark", "ali_phone_state.1.ark"):
        assert filecmp.cmp(tmp_path / "here" / name, tmp_path / "spawned" / name, shallow=False)
