"""The hybrid model's composed input (issue 13): fbank + Δ + ΔΔ | fMLLR | online i-vector.

Unit tests on real kaldiio arks in the shared layout (``Paths.fmllr_set``, ``Paths.ivector_set``),
and the tiny recipe through the real CLI with fMLLR and i-vector dirs written by the test (a fixed
random affine of the sets' MFCCs, random i-vectors: what the align and ivectors stages write has
that layout)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from conftest import copy_exp
from test_e2e import ALIGN_SMALL, HYBRID_SMALL, REPO, SMALL, asrtrain
from test_resident import make_set, write_streams

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir
from asrtrain.features.reader import FeatureReader, appended_streams, stream_dirs
from asrtrain.features.transform import add_deltas, apply_cmvn
from asrtrain.recipe import Paths, compose_recipe
from asrtrain.train.chunks import IGNORE, ChunkSet
from asrtrain.train.resident import ResidentChunks, bytes_per_frame

LENGTHS = [5, 21, 47, 63, 12, 100, 42, 50, 30, 77, 8, 64, 90, 23]


@pytest.fixture(scope="module")
def ibm(tmp_path_factory) -> tuple[Path, Path, dict[str, Path]]:
    """A set with IBM's sizes: 40 fbank dims, 40 fMLLR, 100-dim i-vectors every 10 frames."""
    root = tmp_path_factory.mktemp("ibm")
    data, ali = make_set(root, LENGTHS, dim=40)
    return data, ali, write_streams(root, data, fmllr_dim=40, ivector_dim=100, period=10)


def by_hand(data: Path, streams: dict[str, Path], utt: str) -> np.ndarray:
    """The composed input of ``utt`` from the arks themselves: CMVN (variances too) and
    Kaldi's Δ/ΔΔ of the fbank features, the fMLLR matrix, the i-vector row t // period."""
    d = DataDir.read(data)
    raw = kaldiio.load_mat(d.feats[utt])
    stats = kaldiio.load_mat(d.cmvn[d.utt2spk[utt]])
    fbank = add_deltas(apply_cmvn(raw, stats, norm_vars=True), 2)
    fmllr = kaldiio.load_mat(f"{streams['fmllr']}/feats.ark:"
                             + _offset(streams["fmllr"] / "feats.scp", utt))
    rows = kaldiio.load_mat(f"{streams['ivector']}/ivector_online.ark:"
                            + _offset(streams["ivector"] / "ivector_online.scp", utt))
    period = int((streams["ivector"] / "ivector_period").read_text())
    return np.concatenate([fbank, fmllr, rows[[t // period for t in range(len(raw))]]], axis=1)


def _offset(scp: Path, utt: str) -> str:
    line = next(ln for ln in scp.read_text().splitlines() if ln.split()[0] == utt)
    return line.split()[1].rsplit(":", 1)[1]


def test_composed_input_is_the_concatenation_by_hand(ibm) -> None:
    data, ali, streams = ibm
    reader = FeatureReader(data, 2, True, streams=streams)
    assert reader.dim == 40 * 3 + 40 + 100 == 260
    for utt in reader.utts:
        got = reader[utt]
        assert got.shape == (DataDir.read(data).utt2num_frames[utt], 260)
        np.testing.assert_allclose(got, by_hand(data, streams, utt), rtol=1e-6, atol=1e-5)
    assert ChunkSet(data, ali, 21, 2, True, streams=streams).dim == 260
    assert "fmllr 40" in reader.describe() and "ivector 100" in reader.describe()


def test_resident_store_keeps_ivector_rows_not_frames(ibm) -> None:
    """The 260-dim input stored as fbank | fMLLR per frame (80 fp16) and the i-vectors as rows:
    the bytes per frame of the 120- and 260-dim inputs (docs: the figures of the report)."""
    data, ali, streams = ibm
    rc = ResidentChunks(ChunkSet(data, ali, 21, 2, True, streams=streams), "cpu")
    frames = sum(LENGTHS)
    assert rc.feats.shape == (frames + 1, 80)
    assert rc.ivector_rows.shape == (sum(math.ceil(n / 10) for n in LENGTHS), 100)
    assert rc.bytes_per_frame == bytes_per_frame(80, torch.float16, 21, 100, 10)
    plain = bytes_per_frame(40, torch.float16, 21)
    composed = bytes_per_frame(80, torch.float16, 21, 100, 10)
    assert plain == pytest.approx(85.52, abs=0.01)       # 40·2 + 4 + 32/21
    assert composed == pytest.approx(185.90, abs=0.01)   # 80·2 + 4 + 32/21 + 100·2/10 + 8/21
    # expanded per frame the i-vectors alone would be 200 bytes a frame
    assert composed - plain < 100 * 2 + 40 * 2


@pytest.mark.parametrize("period", [1, 3, 10, 200])
def test_ivector_rows_map_to_frames_by_period(tmp_path: Path, period: int) -> None:
    data, ali = make_set(tmp_path, LENGTHS, dim=3)
    ivec = tmp_path / "iv"
    ivec.mkdir()
    with kaldiio.WriteHelper(f"ark,scp:{ivec}/ivector_online.ark,{ivec}/ivector_online.scp") as w:
        for utt, n in DataDir.read(data).utt2num_frames.items():
            rows = math.ceil(n / period)
            w(utt, np.repeat(np.arange(rows, dtype=np.float32)[:, None], 2, axis=1))
    (ivec / "ivector_period").write_text(f"{period}\n")
    cs = ChunkSet(data, ali, 21, 0, False, streams={"ivector": ivec})
    for utt in cs.utts:
        x = cs.reader[utt]
        np.testing.assert_array_equal(x[:, 3], np.arange(len(x)) // period)
    # the resident gather: chunk k of the in-order epoch starts at frame start[k] of its utt
    _, start, length = cs.chunk_table()
    k = 0
    for batch in ResidentChunks(cs, "cpu", torch.float32).batches(None, 0, 1, 4):
        for b in range(batch.samples):
            n = int(length[k])
            want = (start[k] + np.arange(n)) // period
            np.testing.assert_array_equal(batch.feats[b, :n, 3].numpy(), want)
            assert (batch.feats[b, n:] == 0).all() and (batch.targets[b, n:] == IGNORE).all()
            k += 1
    assert k == len(cs)


def _rewrite(scp: Path, utt: str, mat: np.ndarray | None) -> None:
    """``scp`` with ``utt`` pointing at ``mat`` (in an ark of its own), or without it (None)."""
    lines = [ln for ln in scp.read_text().splitlines() if ln.split()[0] != utt]
    if mat is not None:
        with kaldiio.WriteHelper(f"ark,scp:{scp}.bad.ark,{scp}.bad.scp") as w:
            w(utt, mat)
        lines.append((Path(f"{scp}.bad.scp")).read_text().strip())
    scp.write_text("\n".join(sorted(lines)) + "\n")


UTT = "spk1-u01"  # 21 frames


@pytest.mark.parametrize("damage, message", [
    ("fmllr missing", r"fmllr/feats.scp: no fMLLR features for 1 utterances, e\.g\. spk1-u01"),
    ("fmllr frames", r"fmllr/feats.scp: utterance spk1-u01 has 20 frames of fMLLR features, "
                     r"\S+/data/feats.scp has 21"),
    ("ivector missing", r"ivectors/ivector_online.scp: no i-vectors for 1 utterances, e\.g\. "
                        "spk1-u01"),
    ("ivector rows", r"ivectors/ivector_online.scp: utterance spk1-u01 has 6 i-vector rows, "
                     r"its 21 frames need 7 \(one per 3 frames"),
    ("ivector nan", r"ivectors/ivector_online.scp: utterance spk1-u01 has NaN or infinite"),
    ("fmllr nan", r"fmllr/feats.scp: utterance spk1-u01 has NaN or infinite fMLLR"),
    ("no period", r"ivectors/ivector_period: missing .*run the ivectors stage"),
    ("no fmllr dir", r"fmllr/feats.scp: missing .*type: sat.*align.kaldi_fmllr"),
])
@pytest.mark.parametrize("loader", ["stream", "resident"])
def test_bad_streams_name_the_file(tmp_path: Path, damage: str, message: str,
                                   loader: str) -> None:
    data, ali = make_set(tmp_path, LENGTHS, dim=3)
    streams = write_streams(tmp_path, data, period=3)
    fm, iv = streams["fmllr"] / "feats.scp", streams["ivector"] / "ivector_online.scp"
    bad = {"fmllr missing": lambda: _rewrite(fm, UTT, None),
           "fmllr frames": lambda: _rewrite(fm, UTT, np.zeros((20, 4), np.float32)),
           "ivector missing": lambda: _rewrite(iv, UTT, None),
           "ivector rows": lambda: _rewrite(iv, UTT, np.zeros((6, 5), np.float32)),
           "ivector nan": lambda: _rewrite(iv, UTT, np.full((7, 5), np.nan, np.float32)),
           "fmllr nan": lambda: _rewrite(fm, UTT, np.full((21, 4), np.nan, np.float32)),
           "no period": lambda: (streams["ivector"] / "ivector_period").unlink(),
           "no fmllr dir": lambda: shutil.rmtree(streams["fmllr"])}
    bad[damage]()
    with pytest.raises(AsrtrainError, match=message):
        cs = ChunkSet(data, ali, 21, 2, True, streams=streams)
        if loader == "stream":
            for _ in cs.batches(None, 0, 1, 4):
                pass
        else:
            ResidentChunks(cs, "cpu")


def test_append_names_are_checked() -> None:
    assert appended_streams({"append": ["fmllr", "ivector"]}) == ["fmllr", "ivector"]
    assert appended_streams({}) == []
    for bad, message in ((["mfcc"], r"features.append=\['mfcc'\]: expected each of fmllr, "),
                         (["ivector", "fmllr"], "list them in the order they are appended"),
                         (["fmllr", "fmllr"], "at most once"), ("fmllr", "expected a list")):
        with pytest.raises(AsrtrainError, match=message):
            appended_streams({"append": bad})
    paths = Paths(Path("/e"))
    assert stream_dirs(paths, "dev", ["fmllr", "ivector"]) == {
        "fmllr": Path("/e/data/dev_fmllr"), "ivector": Path("/e/ivectors/dev")}


def _digest(tmp_path: Path, *overrides: str) -> tuple[str, dict]:
    from asrtrain.pipeline import Pipeline
    from asrtrain.stages import STAGES

    cfg = compose_recipe(REPO / "recipes" / "tiny", [f"exp_dir={tmp_path}", *overrides])
    plan = Pipeline(cfg, STAGES)
    return plan.digests["train_hybrid"], plan.values["train_hybrid"]


def test_the_digest_follows_the_hybrid_input(tmp_path: Path) -> None:
    none, values = _digest(tmp_path, "~features@hybrid.features")
    assert "features" not in values          # recipes without hybrid.features keep their digest
    ibm, values = _digest(tmp_path, "features@hybrid.features=ibm260")
    assert values["features"]["append"] == ["fmllr", "ivector"]
    deltas, _ = _digest(tmp_path, "features@hybrid.features=fbank40_deltas")
    fmllr, _ = _digest(tmp_path, "features@hybrid.features=ibm260",
                       "hybrid.features.append=[fmllr]")
    assert len({none, ibm, deltas, fmllr}) == 4
    # how the stored fbank features are made is the features group's
    from asrtrain.stages.train_hybrid import check_hybrid_features

    cfg = compose_recipe(REPO / "recipes" / "tiny", ["features@hybrid.features=ibm260",
                                                     "hybrid.features.num_mel_bins=80"])
    with pytest.raises(AsrtrainError, match="hybrid.features.num_mel_bins=80 but "
                                            "features.num_mel_bins=40"):
        check_hybrid_features(cfg)


# ---------------------------------------------------------------------------- the real CLI
IBM = ["features@hybrid.features=ibm260", "hybrid.model.name=hybrid_260"]
# ALIGN_SMALL without its choice of the hybrid input (each test gives its own)
ALIGN = [o for o in ALIGN_SMALL if not o.startswith("features@hybrid.features=")]
# The hybrid system alone, without the ivectors stage: the test writes the i-vectors itself.
HYBRID_STAGES = ("stages=[prepare,lang,features,lm,mfcc,align,fmllr,decode_gmm,train_hybrid,"
                 "decode_hybrid]")


def write_tiny_streams(exp: Path, period: int = 10) -> None:
    """What B's align stage and C's ivectors stage write, made from the tiny sets' MFCCs:
    ``data/<set>_fmllr`` (a copy of the MFCC dir, 40-dim features = one fixed random affine of
    the 13 MFCCs, no cmvn.scp) and ``ivectors/<set>`` (100-dim random rows, one per ``period``
    frames)."""
    rng = np.random.default_rng(13)
    paths = Paths(exp)
    a, b = rng.normal(size=(13, 40)) / 4, rng.normal(size=40)
    for name in ("train_nodup", "train_dev", "eval2000"):
        src, fm, iv = paths.mfcc_set(name), paths.fmllr_set(name), paths.ivector_set(name)
        shutil.rmtree(fm, ignore_errors=True)
        shutil.copytree(src, fm)
        (fm / "cmvn.scp").unlink(missing_ok=True)
        iv.mkdir(parents=True, exist_ok=True)
        d = DataDir.read(src)
        with kaldiio.WriteHelper(f"ark,scp:{fm}/fmllr.ark,{fm}/feats.scp") as wf, \
                kaldiio.WriteHelper(f"ark,scp:{iv}/ivector_online.ark,"
                                    f"{iv}/ivector_online.scp") as wi:
            for utt in d.utts:
                m = kaldiio.load_mat(d.feats[utt])
                wf(utt, (m @ a + b).astype(np.float32))
                wi(utt, rng.normal(size=(math.ceil(len(m) / period), 100)).astype(np.float32))
        (iv / "ivector_period").write_text(f"{period}\n")


@pytest.fixture(scope="module")
def aligned(tiny_trained: dict, tmp_path_factory) -> Path:
    """The tiny recipe up to decode_gmm with the small tri1 passes: a copy of conftest's
    tiny_trained (whose data stages, passes and decode_gmm these settings share)."""
    exp = copy_exp(tiny_trained["exp"], tmp_path_factory.mktemp("compose") / "exp")
    asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--to", "decode_gmm", HYBRID_STAGES, *SMALL,
             *ALIGN)
    return exp


def test_hybrid_trains_and_decodes_on_the_260_dim_input(aligned: Path) -> None:
    exp = aligned
    common = (f"exp_dir={exp}", HYBRID_STAGES, *SMALL, *ALIGN, *HYBRID_SMALL)
    args = ("run", "recipes/tiny", "--stage", "train_hybrid", *common, *IBM)
    # without the streams: one line naming the missing table
    with pytest.raises(AssertionError, match=r"asrtrain: error: \S+/data/train_nodup_fmllr/"
                                             r"feats.scp: missing"):
        asrtrain(*args)
    write_tiny_streams(exp)
    out = asrtrain(*args)
    final = torch.load(exp / "train" / "hybrid_260" / "final.pt", map_location="cpu",
                       weights_only=False)
    assert final["input_dim"] == 260 and final["features"]["append"] == ["fmllr", "ivector"]
    assert final["epoch"] == 1 and 0 < final["metrics"]["dev_frame_accuracy"] <= 100
    first = [v for k, v in final["model"].items() if "weight_ih_l0" in k]
    assert first and all(w.shape[1] == 260 for w in first)
    summary = json.loads((exp / "decode" / "hybrid_260" / "eval2000" / "decode.json").read_text())
    assert summary["utterances"] > 0 and summary["wer"]["all"]["ref_words"] > 0
    assert "eval2000 all: WER" in out.stdout
    log = (exp / "log" / "train_hybrid.log").read_text()
    assert "input 260 dims" in log and "ivector 100" in log
    assert "185.9 bytes per frame" in log   # the resident store: i-vectors as rows
    # the 120-dim input is another model: train_hybrid would rerun, naming the change
    dry = asrtrain("run", "recipes/tiny", "--dry-run", *common,
                   "features@hybrid.features=fbank40_deltas", "hybrid.model.name=hybrid_260")
    line = next(ln for ln in (dry.stdout + dry.stderr).splitlines() if "train_hybrid" in ln)
    assert "features" in line and "append" in line, line
    # a test set without i-vectors: decode_hybrid names the table
    (exp / "ivectors" / "eval2000" / "ivector_online.scp").unlink()
    with pytest.raises(AssertionError, match=r"asrtrain: error: \S+/ivectors/eval2000/"
                                             r"ivector_online.scp: missing"):
        asrtrain("run", "recipes/tiny", "--stage", "decode_hybrid", "--force", "decode_hybrid",
                 *common, *IBM)
    # transcribe makes fbank features of new audio only: it refuses the composed input
    wav = REPO / "data" / "tiny" / "LDC97S62" / "swb1_d1" / "data" / "sw02008.sph"
    with pytest.raises(AssertionError, match="appends fmllr, ivector .*transcribe cannot"):
        asrtrain("transcribe", "--exp", str(exp), "--system", "hybrid", "--channel", "A",
                 str(wav))


def test_hybrid_reads_the_ivectors_stage_output(aligned: Path) -> None:
    """The same input with the i-vectors of the real ivectors stage (its tiny config), run as a
    stage of the recipe that train_hybrid reads; fMLLR still written by the test."""
    exp = aligned
    write_tiny_streams(exp)
    stages = ("stages=[prepare,lang,features,lm,mfcc,align,fmllr,decode_gmm,ivectors,"
              "train_hybrid,decode_hybrid]")
    out = asrtrain("run", "recipes/tiny", "--stage", "ivectors", f"exp_dir={exp}", stages,
                   *SMALL, *ALIGN, *HYBRID_SMALL, "features@hybrid.features=ibm260",
                   "hybrid.model.name=hybrid_260_iv")
    assert "stage ivectors" in out.stderr and "stage train_hybrid" in out.stderr
    record = json.loads((exp / ".done" / "train_hybrid").read_text())
    assert "ivectors" in record["inputs"]
    period = int((exp / "ivectors" / "train_nodup" / "ivector_period").read_text())
    reader = FeatureReader(exp / "data" / "eval2000", 2, True,
                           streams=stream_dirs(Paths(exp), "eval2000", ["fmllr", "ivector"]))
    utt = reader.utts[0]
    rows = kaldiio.load_scp(str(exp / "ivectors" / "eval2000" / "ivector_online.scp"))[utt]
    x = reader[utt]
    assert x.shape[1] == 260
    np.testing.assert_allclose(x[:, 160:], rows[np.arange(len(x)) // period], rtol=1e-6)
    final = torch.load(exp / "train" / "hybrid_260_iv" / "final.pt", map_location="cpu",
                       weights_only=False)
    assert final["input_dim"] == 260
    assert (exp / "decode" / "hybrid_260_iv" / "eval2000" / "decode.json").is_file()
