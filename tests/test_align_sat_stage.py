"""The align stage's LDA+MLLT and SAT passes through the real CLI on the tiny corpus: mono -> tri1
-> tri3 (lda_mllt from tri1) -> tri4 (sat from tri3) with few iterations; tri4's two-pass fMLLR
decode (decode_fmllr.sh), the fMLLR feature dirs of train/dev/eval2000, resumability, the
config checks, and the import of a Kaldi experiment's final.mat and trans.* (written here by
kaldiio, as Kaldi writes them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import forked_cli
import kaldiio
import numpy as np
import pytest
import small  # bench/small.py (conftest puts bench/ on the path)
import torch

from asrtrain.adapt.splice import splice_frames
from asrtrain.align.model import (
    AcousticModel,
    adapt_features,
    load_data,
    model_features,
    read_transforms,
)
from asrtrain.data.datadir import DataDir
from asrtrain.decode import GmmDecodeConfig
from asrtrain.decode.fmllr import undecoded_transforms
from asrtrain.decode.graph import ModelRef, open_decoding, search_utts
from asrtrain.features.reader import FeatureReader

REPO = Path(__file__).resolve().parents[1]
SETS = ("train_nodup", "train_dev", "eval2000")
# mono -> tri1 -> tri3 -> tri4, small, each pass decoded: recipes/tiny/small.yaml's sat_decoded
SAT_SMALL = small.overrides("sat_decoded")

def asrtrain(*args: str, ok: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    return forked_cli.run(*args, timeout=timeout, check=ok)


def run_align(exp: Path, *extra: str, ok: bool = True) -> subprocess.CompletedProcess:
    """The GMM passes (align), the fMLLR feature dirs (fmllr) and their decoding (decode_gmm)."""
    return asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--stage", "align", "--to",
                    "decode_gmm", *SAT_SMALL, *extra, ok=ok)


@pytest.fixture(scope="module")
def exp(tmp_path_factory: pytest.TempPathFactory, tiny_shipped: dict) -> Path:
    """A copy of the session's run of the recipe as shipped (conftest's tiny_shipped: the same
    passes, mono -> tri1 -> tri3 -> tri4, not decoded), then each pass decoded: no pass is
    trained again (their steps are keyed by their own settings), the decoding and the fMLLR
    feature dirs of the decoded test set are made."""
    exp = tmp_path_factory.mktemp("sat") / "exp"
    shutil.copytree(tiny_shipped["exp"], exp, symlinks=True)
    out = run_align(exp)
    (exp / "first_run.stderr").write_text(out.stderr)
    for name in ("mono", "tri1", "tri3", "tri4"):   # not trained again: the session's models
        model = Path("align") / name / "final.mdl"
        assert (exp / model).read_bytes() == (tiny_shipped["exp"] / model).read_bytes(), name
        assert (exp / model).stat().st_mtime_ns == \
            (tiny_shipped["exp"] / model).stat().st_mtime_ns, name
    assert "stage decode_gmm" in out.stderr, out.stderr[-3000:]
    return exp


@pytest.fixture(autouse=True)
def _one_thread_here(one_thread: None) -> None:
    """The decoding, fMLLR and feature checks these tests run in this process: one thread
    (conftest's one_thread; the undecoded-set test took 72 s with torch's default 2, 10 s with
    1, at load 4-6)."""


def fmllr_features(model_dir: Path, mfcc: Path, trans: dict[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """The SAT model's features of every utterance, computed here from its parts."""
    model = AcousticModel.load(model_dir)
    reader = FeatureReader(mfcc, 0, require_cmvn=True)
    return {u: adapt_features(model_features(model, reader[u]), trans[reader.data.utt2spk[u]])
            for u in reader.utts}


def test_sat_chain_decodes_in_two_passes(exp: Path) -> None:
    for name in ("mono", "tri1", "tri3", "tri4"):
        assert (exp / "align" / name / "final.mdl").is_file()
    assert AcousticModel.load(exp / "align" / "tri3").kind == "lda_mllt"
    assert AcousticModel.load(exp / "align" / "tri4").kind == "sat"
    assert (exp / "align" / "tri4" / "final.alimdl").is_file()
    dec = exp / "decode" / "tri4" / "eval2000"
    summary = json.loads((dec / "decode.json").read_text())
    first, final = summary["first_pass"]["wer"]["all"], summary["wer"]["all"]
    assert first["ref_words"] == final["ref_words"] > 0
    assert 0 <= first["wer"] < 100 and 0 <= final["wer"] < 100
    assert summary["decoding_passes"] == 3
    # align.decode_options (recipes/tiny/small.yaml's sat_decoded) reached the search
    assert (summary["settings"]["beam"], summary["settings"]["max_active"]) == (10, 1000)
    speakers = set(DataDir.read(exp / "data" / "eval2000_mfcc").utt2spk.values())
    trans = read_transforms(dec, 40)
    assert set(trans) == speakers
    # adaptation did something: not every transform is the identity
    eye = np.hstack([np.eye(40), np.zeros((40, 1))])
    assert any(np.abs(w - eye).max() > 1e-3 for w in trans.values())
    # tri3 decodes through its own transform: a plain decode dir, no transforms
    assert (exp / "decode" / "tri3" / "eval2000" / "decode.json").is_file()
    assert not (exp / "decode" / "tri3" / "eval2000" / "trans.scp").exists()
    log = (exp / "log" / "decode_gmm.log").read_text()
    assert "speaker-independent model (first pass)" in log
    # the dev set is aligned with fMLLR (align_fmllr.sh): it has its speakers' transforms
    dev = exp / "align" / "tri4_ali_train_dev"
    assert set(read_transforms(dev, 40)) == set(
        DataDir.read(exp / "data" / "train_dev_mfcc").utt2spk.values())


@pytest.mark.parametrize("set_name", SETS)
def test_fmllr_dirs_hold_the_sat_features(exp: Path, set_name: str) -> None:
    mfcc, out = exp / "data" / f"{set_name}_mfcc", exp / "data" / f"{set_name}_fmllr"
    assert not (out / "cmvn.scp").exists()
    data, ref = DataDir.read(out), DataDir.read(mfcc)
    assert data.utt2spk == ref.utt2spk and data.text == ref.text
    assert data.utt2num_frames == ref.utt2num_frames
    source = {"train_nodup": exp / "align" / "tri4",
              "train_dev": exp / "align" / "tri4_ali_train_dev",
              "eval2000": exp / "decode" / "tri4" / "eval2000"}[set_name]
    want = fmllr_features(exp / "align" / "tri4", mfcc, read_transforms(source, 40))
    got = {u: np.asarray(m) for u, m in kaldiio.load_scp(str(out / "feats.scp")).items()}
    assert set(got) == set(ref.utts)
    for u, m in got.items():
        assert m.shape == (ref.utt2num_frames[u], 40) and m.dtype == np.float32
        np.testing.assert_allclose(m, want[u], rtol=1e-5, atol=1e-4)


def test_rerun_skips_everything(exp: Path) -> None:
    again = run_align(exp)
    assert "nothing to do" in again.stderr and "starts" not in again.stderr


def test_check_refuses_bad_pass_types(exp: Path) -> None:
    proc = run_align(exp, "--dry-run", "++align.passes.tri3.type=deltas", ok=False)
    assert proc.returncode == 1
    assert "asrtrain: error: align.passes.tri4.type=sat: its from pass 'tri3' is of type " \
           "'deltas'" in proc.stderr
    proc = run_align(exp, "--dry-run", "++align.passes.tri3.type=mllt", ok=False)
    assert proc.returncode == 1
    assert "asrtrain: error: align.passes.tri3.type='mllt': expected one of deltas, " \
           "lda_mllt, sat" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_undecoded_set_gets_first_pass_transforms(exp: Path) -> None:
    """align.decode=false: a test set's transforms from the first pass and the estimation only
    (the function the stage calls then; through the CLI it would retrain every pass, as any
    change of align.decode does)."""
    tri4 = exp / "align" / "tri4"
    data = exp / "data" / "eval2000_mfcc"
    trans = undecoded_transforms(tri4, tri4 / "graph", data, exp / "lang", exp / "lm", {}, nj=1)
    assert set(trans) == set(DataDir.read(data).utt2spk.values())
    eye = np.hstack([np.eye(40), np.zeros((40, 1))])
    for w in trans.values():
        assert w.shape == (40, 41) and np.isfinite(w).all()
    assert any(np.abs(w - eye).max() > 1e-3 for w in trans.values())


def test_first_pass_paths_are_the_same_in_jobs(exp: Path) -> None:
    """The speaker-independent first pass in 2 spawned jobs (each loads final.alimdl) gives the
    words and the best paths (the fMLLR statistics' input) of one process."""
    tri4 = exp / "align" / "tri4"
    ref = ModelRef(tri4, speaker_independent=True)
    model, graph, lang = open_decoding(ref, tri4 / "graph")
    utts, _ = load_data(exp / "data" / "eval2000_mfcc", lang, model)
    c = GmmDecodeConfig(acoustic_scales=(1 / 12,))
    one = search_utts(ref, model, graph, utts, c, nj=1, path_scale=1 / 12)
    two = search_utts(ref, model, graph, utts, c, nj=2, audio_per_job=1.0, path_scale=1 / 12)
    assert two.jobs == 2 and one.jobs == 1
    assert two.words == one.words
    assert set(two.paths) == set(one.paths) and len(one.paths) >= len(utts) - 2
    for u, path in one.paths.items():
        assert path.shape == (len(next(x for x in utts if x.utt == u).feats), 3)
        np.testing.assert_array_equal(two.paths[u], path)


# ---------------------------------------------------------------------------- Kaldi import
def kaldi_experiment(exp: Path, root: Path, seed: int = 0) -> dict:
    """``final.mat`` (40 x 91, LDA+MLLT-like), ``splice_opts`` and per set ``trans.1``,
    ``trans.2`` (speaker-keyed [40, 41] arks), as Kaldi's tri4 and its alignment and decode
    dirs hold them."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    mat = (rng.standard_normal((40, 91)) * 0.1).astype(np.float32)
    kaldiio.save_mat(str(root / "final.mat"), mat)
    (root / "splice_opts").write_text("--left-context=3 --right-context=3\n")
    trans = {}
    for s in SETS:
        d = root / s
        d.mkdir(exist_ok=True)
        spks = sorted(set(DataDir.read(exp / "data" / f"{s}_mfcc").utt2spk.values()))
        trans[s] = {k: np.hstack([np.eye(40) + 0.05 * rng.standard_normal((40, 40)),
                                  rng.standard_normal((40, 1))]).astype(np.float32)
                    for k in spks}
        half = len(spks) // 2
        for job, part in ((1, spks[:half]), (2, spks[half:])):
            with kaldiio.WriteHelper(f"ark:{d / f'trans.{job}'}") as w:
                for k in part:
                    w(k, trans[s][k])
    return {"root": root, "mat": mat, "trans": trans}


def kaldi_override(root: Path, sets: tuple[str, ...] = SETS) -> str:
    listed = ",".join(f"{s}:'{root / s}'" for s in sets)
    return (f"++align.kaldi_fmllr={{final_mat:'{root / 'final.mat'}',"
            f"splice_opts:'{root / 'splice_opts'}',trans:{{{listed}}}}}")


def test_kaldi_fmllr_import(exp: Path, tmp_path: Path) -> None:
    k = kaldi_experiment(exp, tmp_path / "kaldi")
    kept = {n: (exp / "align" / n / "final.mdl").stat().st_mtime_ns
            for n in ("mono", "tri1", "tri3", "tri4")}
    out = run_align(exp, kaldi_override(k["root"]))
    assert "starts" in out.stderr
    for name, mtime in kept.items():  # Kaldi's transforms retrain no pass
        assert (exp / "align" / name / "final.mdl").stat().st_mtime_ns == mtime, name
    for s in SETS:
        mfcc = exp / "data" / f"{s}_mfcc"
        reader = FeatureReader(mfcc, 0, require_cmvn=True)
        got = dict(kaldiio.load_scp(str(exp / "data" / f"{s}_fmllr" / "feats.scp")))
        assert set(got) == set(reader.utts)
        for u in reader.utts[:5]:
            x = splice_frames(torch.from_numpy(reader[u]), 3, 3).double().numpy()
            w = k["trans"][s][reader.data.utt2spk[u]].astype(np.float64)
            want = (x @ k["mat"].astype(np.float64).T) @ w[:, :40].T + w[:, 40]
            assert got[u].shape == (reader.data.utt2num_frames[u], 40)
            np.testing.assert_allclose(got[u], want, rtol=1e-4, atol=1e-3)


def test_kaldi_fmllr_errors_name_file_and_speaker(exp: Path, tmp_path: Path) -> None:
    k = kaldi_experiment(exp, tmp_path / "kaldi", seed=1)
    dev = k["root"] / "train_dev"
    spks = sorted(k["trans"]["train_dev"])
    with kaldiio.WriteHelper(f"ark:{dev / 'trans.2'}") as w:   # one speaker fewer
        for s in spks[len(spks) // 2:-1]:
            w(s, k["trans"]["train_dev"][s])
    proc = run_align(exp, kaldi_override(k["root"]), ok=False)
    assert proc.returncode == 1
    assert "asrtrain: error:" in proc.stderr and f"speaker {spks[-1]}" in proc.stderr
    assert "Traceback" not in proc.stderr
    with kaldiio.WriteHelper(f"ark:{dev / 'trans.2'}") as w:   # wrong dims
        for s in spks[len(spks) // 2:]:
            w(s, np.zeros((39, 40), dtype=np.float32))
    proc = run_align(exp, kaldi_override(k["root"]), ok=False)
    assert proc.returncode == 1
    assert f"{dev / 'trans.2'}: speaker {spks[len(spks) // 2]}: fMLLR transform of shape " \
           "(39, 40), expected [40, 41]" in proc.stderr
    proc = run_align(exp, "--dry-run", kaldi_override(k["root"], SETS[:2]), ok=False)
    assert "align.kaldi_fmllr.trans.eval2000: missing" in proc.stderr


def test_changing_tri4_retrains_only_tri4(exp: Path) -> None:
    """Last: it changes tri4 for good (and brings back our own fMLLR dirs after the import).
    The change is of tri4's settings only; it also makes the retraining short (2 iterations,
    the fMLLR estimation in the first, no realignment before the final alignment): which stages
    and passes rerun, and the fMLLR features of the new model, do not depend on how long it
    trains."""
    kept = {n: (exp / "align" / n / "final.mdl").stat().st_mtime_ns
            for n in ("mono", "tri1", "tri3", "tri4")}
    out = run_align(exp, "++align.passes.tri4.num_gauss=350", "++align.passes.tri4.num_iters=2",
                    "++align.passes.tri4.realign_iters=[]", "++align.passes.tri4.fmllr_iters=[1]")
    assert "stage align" in out.stderr
    log = (exp / "log" / "align.log").read_text()
    decoded = (exp / "log" / "decode_gmm.log").read_text()
    for name in ("mono", "tri1", "tri3"):
        assert f"align {name}: done already" in log
        assert f"decode_gmm {name} decoding: done already" in decoded
        assert (exp / "align" / name / "final.mdl").stat().st_mtime_ns == kept[name]
    assert (exp / "align" / "tri4" / "final.mdl").stat().st_mtime_ns != kept["tri4"]
    summary = json.loads((exp / "align" / "tri4" / "passes.json").read_text())["summary"]
    assert summary["num_gauss"] <= 350
    assert len(summary["fmllr_objf_improvement"]) == 1   # trained with the new settings
    dec = exp / "decode" / "tri4" / "eval2000"
    want = fmllr_features(exp / "align" / "tri4", exp / "data" / "eval2000_mfcc",
                          read_transforms(dec, 40))
    got = dict(kaldiio.load_scp(str(exp / "data" / "eval2000_fmllr" / "feats.scp")))
    for u, m in got.items():
        np.testing.assert_allclose(m, want[u], rtol=1e-5, atol=1e-4)
