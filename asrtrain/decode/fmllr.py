"""Speaker-adapted decoding as Kaldi's ``steps/decode_fmllr.sh``, and the fMLLR feature dirs.

``decode_fmllr`` decodes a SAT pass in two passes, each speaker adapted in between:

1. the speaker-independent model (``final.alimdl``) decodes the unadapted (LDA+MLLT) features;
2. per speaker, an fMLLR transform is estimated with ``final.mdl`` from the first pass's best
   path at the adaptation scale (``acoustic_scales[0]``, Kaldi's first-pass ``acwt`` 1/12, or the
   one chosen on the dev set), silence weighted by the pass's ``silence_weight``;
3. ``final.mdl`` decodes the adapted features; a second transform is estimated from that best
   path on the adapted features and composed with the first (decode_fmllr.sh's
   ``trans.JOB`` = ``pre_trans`` then the re-estimate);
4. ``final.mdl`` decodes the features under the composed transforms: the words scored and kept.

Kaldi rescores the second pass's lattice in step 4; kaldi-decoder's FasterDecoder gives no
lattice, so the last step is a full decode (a few seconds on the tiny corpus). The decode dir gets
``trans.{ark,scp}`` (the composed transforms) and ``decode.json`` the first pass's WER next to the
final one (``first_pass``), so the gain of adaptation is visible.

The fMLLR feature dirs (``paths.fmllr_set``, the hybrid model's ``fmllr`` input) hold the
features a SAT model reads: CMN'd MFCCs spliced through the LDA+MLLT matrix, then the speaker's
transform: ``write_fmllr_set`` for our own passes, ``import_kaldi_fmllr`` with a Kaldi
experiment's ``final.mat`` and ``trans.*`` (``align.kaldi_fmllr``; the MFCCs must be Kaldi's:
``conf/mfcc/kaldi13.yaml`` is s5c's ``mfcc.conf``).
"""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import kaldiio
import numpy as np

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.align.config import GmmConfig
from asrtrain.align.frames import compose_transforms, estimate_transforms, silence_pdfs
from asrtrain.align.model import (
    AcousticModel,
    Utterance,
    adapt_features,
    adapt_utterances,
    lda_features,
    load_data,
    model_features,
    read_transforms,
    write_transforms,
)
from asrtrain.decode import AUDIO_PER_JOB_S, GmmDecodeConfig, score_candidates
from asrtrain.decode.graph import (
    Graph,
    ModelRef,
    Search,
    make_graph,
    open_decoding,
    search_utts,
    time_candidates,
    write_decode,
)
from asrtrain.features.reader import FeatureReader
from asrtrain.fileio import atomic_ark, atomic_dir, write_text
from asrtrain.jobs import JobConfig
from asrtrain.lang.lexicon import Lang
from asrtrain.progress import Bar
from asrtrain.score import counts_json

log = logging.getLogger(__name__)

#: The estimation options a SAT pass passes on to its test-time transforms (Kaldi's names; the
#: defaults are the GMM passes', as train_sat.sh and decode_fmllr.sh share them).
FMLLR_KEYS = ("silence_weight", "fmllr_min_count", "fmllr_num_iters", "device", "max_batch_mb")
FMLLR_DEFAULTS = {k: getattr(GmmConfig(), k) for k in FMLLR_KEYS}


# ---------------------------------------------------------------------------- two-pass decode
def decode_fmllr(model_dir: Path, graph_dir: Path, data_dir: Path, out_dir: Path,
                 cfg: Mapping | GmmDecodeConfig | None = None, nj: int | JobConfig = 1,
                 fmllr: Mapping | None = None, audio_per_job: float = AUDIO_PER_JOB_S) -> dict:
    """Decode ``data_dir`` with the SAT pass in ``model_dir`` as decode_fmllr.sh (see the module
    docstring); ``cfg`` and ``nj`` as :func:`asrtrain.decode.graph.decode_gmm`, ``fmllr`` the
    pass's estimation options (``FMLLR_DEFAULTS``' keys). Returns ``decode_gmm``'s summary with
    ``first_pass`` (its scale, selection and WER) and ``counts``."""
    c = GmmDecodeConfig.from_config(cfg)
    model_dir, data_dir, out_dir = Path(model_dir), Path(data_dir), Path(out_dir)
    si_ref = ModelRef(model_dir, speaker_independent=True)
    si_model, graph, lang = open_decoding(si_ref, graph_dir)
    model = AcousticModel.load(model_dir)
    unadapted, skipped = load_data(data_dir, lang, si_model)
    scale = c.acoustic_scales[0]
    desc = f"decode {model_dir.name} {out_dir.name}"
    first = search_utts(si_ref, si_model, graph, unadapted, c, nj, audio_per_job, scale,
                        f"{desc} pass 1")
    first_pass = _score_pass(si_model, lang, unadapted, first, data_dir, c)
    trans, passes = two_pass_transforms(model_dir, model, si_model, graph, lang, unadapted,
                                        first, c, nj, fmllr, audio_per_job, where=str(data_dir),
                                        desc=f"{desc} pass 2")
    final = _adapted(unadapted, trans, data_dir)
    found = search_utts(ModelRef(model_dir), model, graph, final, c, nj, audio_per_job,
                        desc=f"{desc} pass 3")
    seconds = first.seconds + passes.seconds + found.seconds
    found = Search(found.words, {}, seconds,
                   first.cpu_seconds + passes.cpu_seconds + found.cpu_seconds, found.jobs)
    summary = write_decode(model, lang, final, skipped, found, data_dir, out_dir, c,
                           {"first_pass": first_pass, "adaptation_scale": scale,
                            "fmllr": _options(fmllr), "decoding_passes": 3})
    write_transforms(out_dir, trans)
    return summary


def two_pass_transforms(model_dir: Path, model: AcousticModel, si_model: AcousticModel,
                        graph: Graph, lang: Lang, unadapted: list[Utterance], first: Search,
                        c: GmmDecodeConfig, nj: int | JobConfig, fmllr: Mapping | None,
                        audio_per_job: float = AUDIO_PER_JOB_S, where: str = "",
                        desc: str = "search") -> tuple[dict[str, np.ndarray], Search]:
    """Transforms from the first pass's paths, then the second pass (``final.mdl``, adapted
    features, the adaptation scale only; its jobs named ``desc``) and a re-estimate from its
    paths composed with them; returns the composed transforms and the second pass."""
    opts = _options(fmllr)
    pre = path_transforms(model, lang, unadapted, first.paths, opts, "first pass",
                          posterior_model=si_model)
    adapted = _adapted(unadapted, pre, where)
    one = replace(c, acoustic_scales=c.acoustic_scales[:1])
    second = search_utts(ModelRef(model_dir), model, graph, adapted, one, nj, audio_per_job,
                         one.acoustic_scales[0], desc)
    delta = path_transforms(model, lang, adapted, second.paths, opts, "second pass")
    return compose_transforms(delta, pre), second


def undecoded_transforms(model_dir: Path, graph_dir: Path, data_dir: Path, lang_dir: Path,
                        lm_dir: Path, fmllr: Mapping | None = None, nj: int | JobConfig = 1,
                        cfg: Mapping | GmmDecodeConfig | None = None) -> dict[str, np.ndarray]:
    """A test set's transforms when it is not decoded (``align.decode=false``): the first pass
    with the speaker-independent model and the estimation only, nothing scored (the graph is
    built first when the pass has none)."""
    model_dir, graph_dir = Path(model_dir), Path(graph_dir)
    if not (graph_dir / "HCLG.fst").is_file():
        make_graph(lang_dir, lm_dir, model_dir, graph_dir)
    c = GmmDecodeConfig.from_config(cfg)
    c = replace(c, acoustic_scales=c.acoustic_scales[:1])
    si_ref = ModelRef(model_dir, speaker_independent=True)
    si_model, graph, lang = open_decoding(si_ref, graph_dir)
    unadapted, _ = load_data(data_dir, lang, si_model)
    first = search_utts(si_ref, si_model, graph, unadapted, c, nj, path_scale=c.acoustic_scales[0],
                        desc=f"first pass {model_dir.name} {Path(data_dir).name}")
    return path_transforms(AcousticModel.load(model_dir), lang, unadapted, first.paths,
                           _options(fmllr), "first pass", posterior_model=si_model)


def _options(fmllr: Mapping | None) -> dict:
    unknown = sorted(set(fmllr or {}) - set(FMLLR_DEFAULTS))
    if unknown:
        raise AsrtrainError(f"fMLLR decoding options: unknown keys {unknown}; known: "
                            f"{sorted(FMLLR_DEFAULTS)}")
    return {**FMLLR_DEFAULTS, **(fmllr or {})}


def _adapted(utts: list[Utterance], trans: Mapping[str, np.ndarray], where: str
             ) -> list[Utterance]:
    """Copies of ``utts`` with their speakers' transforms applied."""
    out = [Utterance(u.utt, u.words, u.feats, u.speaker) for u in utts]
    adapt_utterances(out, trans, where)
    return out


def _score_pass(model: AcousticModel, lang: Lang, utts: list[Utterance], found: Search,
                data_dir: Path, c: GmmDecodeConfig) -> dict:
    """A pass's WER as the final words are scored (each scale's, the best kept), for
    ``decode.json``; empty when the set has nothing to score against."""
    from asrtrain.data.datadir import DataDir

    timed = time_candidates(model, lang, utts, found.words,
                            {"self_loop_scale": c.self_loop_scale,
                             "transition_scale": c.transition_scale, "device": c.device})
    scored = score_candidates({s: (found.words[s], timed[s]) for s in found.words},
                              DataDir.read(data_dir), data_dir)
    if not scored:
        return {}
    best = min(scored, key=lambda s: scored[s]["all"].wer)
    return {"acoustic_scale": best, "model": "final.alimdl (speaker-independent)",
            "per_scale": {f"{s:.4f}": counts_json(v) for s, v in scored.items()},
            "wer": counts_json(scored[best])}


# ---------------------------------------------------------------------------- estimation
def path_transforms(model: AcousticModel, lang: Lang, utts: list[Utterance],
                    paths: Mapping[str, np.ndarray], opts: Mapping, what: str,
                    posterior_model: AcousticModel | None = None) -> dict[str, np.ndarray]:
    """Per speaker, :func:`asrtrain.align.sat.estimate_transforms` (``gmm-est-fmllr`` with
    ``model``, Gaussian posteriors from ``posterior_model``) from each utterance's best path
    (``[T, 3]``: phone, HMM state, pdf), silence pdfs weighted ``silence_weight``; a speaker
    with too few frames keeps the identity."""
    report: dict = {}
    pdfs = {u: np.ascontiguousarray(p[:, 2]) for u, p in paths.items()}
    out = estimate_transforms(model, utts, pdfs, silence_pdfs(model.tree, lang), opts,
                              posterior_model=posterior_model, report=report)
    log.info("fMLLR from the %s's best paths (%d of %d utterances): %s", what, len(pdfs),
             len(utts), report, extra=STAGE_LOG_ONLY)
    return out


# ---------------------------------------------------------------------------- feature dirs
def write_fmllr_set(model_dir: Path, mfcc_dir: Path, out_dir: Path,
                    trans: Mapping[str, np.ndarray]) -> int:
    """``out_dir``: a copy of the MFCC data dir whose ``feats.scp`` holds the SAT model's
    features (its LDA+MLLT features, then each speaker's ``trans``); returns the frames."""
    model = AcousticModel.load(model_dir)
    if model.lda_mllt is None:
        raise AsrtrainError(f"{Path(model_dir) / 'final.mdl'}: not an LDA+MLLT or SAT model; "
                            "fMLLR features need one")
    return _write_adapted(mfcc_dir, out_dir, lambda cmn: model_features(model, cmn), trans,
                          f"the transforms of {model_dir.name}")


def _write_adapted(mfcc_dir: Path, out_dir: Path,
                   features: Callable[[np.ndarray], np.ndarray],
                   trans: Mapping[str, np.ndarray], source: str) -> int:
    """The data dir of ``mfcc_dir`` (less its ``feats.scp`` and ``cmvn.scp``) with
    ``features(CMN'd MFCCs)`` adapted by each speaker's transform, one float32 matrix per
    utterance with exactly its ``utt2num_frames`` frames, written atomically."""
    mfcc_dir, out_dir = Path(mfcc_dir), Path(out_dir)
    reader = FeatureReader(mfcc_dir, 0, norm_vars=False, require_cmvn=True, need_num_frames=True,
                           hint="run the mfcc stage first")
    data = reader.data
    missing = sorted({data.utt2spk[u] for u in data.utts} - set(trans))
    if missing:
        raise AsrtrainError(f"{mfcc_dir / 'spk2utt'}: no fMLLR transform for speaker "
                            f"{missing[0]} ({len(missing)} speakers missing) in {source}")
    frames = 0
    with atomic_dir(out_dir) as tmp:
        _copy_tables(mfcc_dir, tmp)
        ark = tmp.resolve() / "feats.ark"
        with atomic_ark(ark, tmp / "feats.scp") as w:
            for utt in Bar(data.utts, desc=f"fMLLR features {out_dir.name}", unit="utt",
                            file=sys.stderr, disable=None, leave=False):
                x = adapt_features(features(reader[utt]), trans[data.utt2spk[utt]])
                if len(x) != data.utt2num_frames[utt]:
                    raise AsrtrainError(f"{mfcc_dir / 'utt2num_frames'}: utterance {utt} has "
                                        f"{data.utt2num_frames[utt]} frames, its features "
                                        f"{len(x)}")
                w(utt, np.ascontiguousarray(x, dtype=np.float32))
                frames += len(x)
        _point_at(tmp / "feats.scp", tmp, out_dir)
        write_transforms(tmp, {s: trans[s] for s in sorted(set(data.utt2spk.values()))})
        _point_at(tmp / "trans.scp", tmp, out_dir)
    log.info("fMLLR features %s: %d utterances, %d frames, %d-dim (%s)", out_dir, len(data.utts),
             frames, next(iter(trans.values())).shape[0], source)
    return frames


def _copy_tables(src: Path, dest: Path) -> None:
    """Every file of the data dir but its feature tables (``feats.scp``, ``cmvn.scp``)."""
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.startswith(".") and f.name not in ("feats.scp",
                                                                          "cmvn.scp"):
            shutil.copyfile(f, dest / f.name)


def _point_at(scp: Path, tmp: Path, out_dir: Path) -> None:
    """An scp written in ``tmp`` names its ark where it will be once ``tmp`` is ``out_dir``."""
    write_text(scp, scp.read_text().replace(str(tmp.resolve()), str(out_dir.resolve())))


# ---------------------------------------------------------------------------- Kaldi import
KALDI_KEYS = ("final_mat", "splice_opts", "trans")


def check_kaldi_fmllr(kcfg: Mapping, sets: list[str]) -> None:
    """``align.kaldi_fmllr``'s shape (no file is read): ``final_mat``, ``splice_opts`` (a path
    or null) and ``trans`` with a dir for every set the hybrid model reads."""
    unknown = sorted(set(kcfg) - set(KALDI_KEYS))
    if unknown:
        raise AsrtrainError(f"align.kaldi_fmllr: unknown keys {unknown}; known: "
                            f"{list(KALDI_KEYS)}")
    if not kcfg.get("final_mat"):
        raise AsrtrainError("align.kaldi_fmllr.final_mat: missing (Kaldi's exp/tri4/final.mat)")
    trans = kcfg.get("trans")
    if not isinstance(trans, Mapping):
        raise AsrtrainError(f"align.kaldi_fmllr.trans={trans!r}: expected a mapping of set "
                            "name to a dir of Kaldi trans.* files")
    for s in sets:
        if not trans.get(s):
            raise AsrtrainError(f"align.kaldi_fmllr.trans.{s}: missing; give the dir of the "
                                f"trans.* of set {s} (e.g. exp/tri4_ali_nodup, "
                                "exp/tri4/decode_eval2000_sw1_fsh_fg)")


def import_kaldi_fmllr(mfcc_dir: Path, out_dir: Path, kcfg: Mapping, set_name: str) -> int:
    """``out_dir`` from Kaldi's ``final.mat`` (LDA+MLLT), ``splice_opts`` and the ``trans.*`` of
    ``set_name``, applied to our CMN'd MFCCs (which must be Kaldi's, conf/mfcc/kaldi13.yaml);
    returns the frames."""
    mat_path = Path(kcfg["final_mat"])
    mat = _read_matrix(mat_path)
    left, right = read_splice_opts(kcfg.get("splice_opts"))
    trans_dir = Path(kcfg["trans"][set_name])
    trans = read_kaldi_transforms(trans_dir, mat.shape[0])
    dim = FeatureReader(mfcc_dir, 0, require_cmvn=True).dim
    spliced = dim * (left + 1 + right)
    if mat.shape[1] not in (spliced, spliced + 1):
        raise AsrtrainError(f"{mat_path}: a {mat.shape[0]}x{mat.shape[1]} matrix; our "
                            f"{dim}-dim MFCCs spliced -{left}..+{right} are {spliced}-dim "
                            "(Kaldi's MFCCs must match ours: conf/mfcc/kaldi13.yaml)")
    return _write_adapted(mfcc_dir, out_dir, lambda cmn: lda_features(cmn, (left, right), mat),
                          trans, f"Kaldi's {trans_dir}")


def _read_matrix(path: Path) -> np.ndarray:
    if not path.is_file():
        raise AsrtrainError(f"{path}: missing (align.kaldi_fmllr.final_mat)")
    try:
        m = np.asarray(kaldiio.load_mat(str(path)), dtype=np.float64)
    except Exception as e:
        raise AsrtrainError(f"{path}: cannot read a Kaldi matrix: {e}") from e
    if m.ndim != 2:
        raise AsrtrainError(f"{path}: a {m.ndim}-dim array, expected a matrix")
    return m


def read_splice_opts(path: str | Path | None) -> tuple[int, int]:
    """``(left, right)`` from Kaldi's ``splice_opts`` file (``--left-context=3
    --right-context=3``); train_lda_mllt.sh's default ±3 when there is none."""
    if path is None:
        return 3, 3
    path = Path(path)
    if not path.is_file():
        raise AsrtrainError(f"{path}: missing (align.kaldi_fmllr.splice_opts)")
    out = {"left": 4, "right": 4}   # splice-feats' own defaults
    for tok in shlex.split(path.read_text()):
        key, _, value = tok.partition("=")
        side = {"--left-context": "left", "--right-context": "right"}.get(key)
        if side is None or not value.isdigit():
            raise AsrtrainError(f"{path}: {tok!r}: expected --left-context=N and "
                                "--right-context=N")
        out[side] = int(value)
    return out["left"], out["right"]


def read_kaldi_transforms(trans_dir: Path, dim: int) -> dict[str, np.ndarray]:
    """Every speaker's ``[dim, dim+1]`` transform from a Kaldi dir's ``trans.scp``, or its
    ``trans.*`` arks (``trans.1`` .. ``trans.N``, one per job); errors name file and speaker."""
    trans_dir = Path(trans_dir)
    if (trans_dir / "trans.scp").is_file():
        return read_transforms(trans_dir / "trans.scp", dim)
    files = sorted(f for f in trans_dir.glob("trans.*") if f.suffix != ".scp")
    if not files:
        raise AsrtrainError(f"{trans_dir}: no trans.* fMLLR transforms (Kaldi writes "
                            "trans.1 .. trans.N in align_fmllr.sh and decode_fmllr.sh dirs)")
    out: dict[str, np.ndarray] = {}
    for f in files:
        out.update(read_transforms(f, dim))
    return out


__all__ = ["decode_fmllr", "import_kaldi_fmllr", "path_transforms", "read_kaldi_transforms",
           "read_transforms", "undecoded_transforms", "write_fmllr_set"]
