"""GMM-HMM training stages: flat-start monophones, triphones with a decision tree, Kaldi import.

``train_mono`` follows Kaldi's ``steps/train_mono.sh``: every pdf starts as the global Gaussian,
the first statistics come from an equal alignment, then ``num_iters`` passes of ML re-estimation
with Viterbi realignment at ``realign_iters`` and Gaussian splitting up to ``totgauss``.
``train_tri`` follows ``steps/train_deltas.sh``: context statistics from the previous pass's
alignment, questions from phone clustering plus the extra questions, a tree of ``num_leaves``
leaves, one Gaussian per leaf, then training with realignment and mixing up to ``num_gauss``.
A second triphone pass (tri2) is ``train_tri`` again on tri1's alignment with more leaves.
``train_lda_mllt`` follows ``steps/train_lda_mllt.sh`` (tri3): LDA of spliced frames on the
previous pass's pdf alignment, a tree on the LDA features, MLLT estimated at ``mllt_iters``.
``train_sat`` and ``align_fmllr`` (tri4, ``steps/train_sat.sh``, ``steps/align_fmllr.sh``) are in
:mod:`asrtrain.align.sat`.  All pass types share one training loop (:func:`_train_iters`, with a
hook per iteration for the MLLT and fMLLR updates).  Each stage writes ``final.mdl``,
``tree.txt``, ``num_pdfs``, ``ali.{ark,scp}``, ``ali_phone_state.{ark,scp}``, ``log.txt`` and
``passes.json`` (log-likelihood, frames/s and seconds of each iteration) into its output
directory.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.adapt.lda import LdaStats, estimate_lda
from asrtrain.adapt.mllt import MlltStats, compose, estimate_mllt, transform_means
from asrtrain.adapt.posteriors import component_posteriors
from asrtrain.adapt.splice import splice_frames
from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.graph import equal_alignment
from asrtrain.align.model import (
    STATE_BITS,
    AcousticModel,
    AlignResult,
    GraphCache,
    Utterance,
    accumulate_stats,
    align,
    check_failures,
    estimate_log_trans,
    frame_contexts,
    initial_log_trans,
    lda_features,
    load_data,
    model_features,
    pdfs_of,
    read_int_table,
    read_utterances,
    write_alignments,
    write_transforms,
)
from asrtrain.align.tree import TreeStats, build_tree, cluster_phones, mono_tree
from asrtrain.fileio import atomic_dir, write_text
from asrtrain.lang.lexicon import Lang

log = logging.getLogger(__name__)


PASS_TYPES = ("deltas", "lda_mllt", "sat")


@dataclass
class GmmConfig:
    """Options of a GMM pass; names and defaults as Kaldi's train_mono.sh / train_deltas.sh /
    train_lda_mllt.sh / train_sat.sh (``type`` picks the script; the first pass is mono)."""

    num_iters: int = 40
    totgauss: int = 1000                 # mono: target total Gaussians
    num_leaves: int = 2000               # tri: tree leaves (pdfs)
    num_gauss: int = 10000               # tri: target total Gaussians
    max_iter_inc: int = 30               # mix up during the first iterations only
    realign_iters: list[int] = field(default_factory=lambda: [
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 18, 20, 23, 26, 29, 32, 35, 38])
    delta_order: int = 2
    acoustic_scale: float = 0.1
    self_loop_scale: float = 0.1
    transition_scale: float = 1.0
    min_gaussian_occupancy: float = 10.0
    var_floor_factor: float = 0.01       # variance floor = factor * global variance
    tree_thresh: float = 0.0             # minimum likelihood gain of a split
    tree_min_count: float = 10.0         # frames on each side of a split
    max_fail_fraction: float = 0.1
    num_utts: int = 0                    # train on the shortest N utterances (0: all), as
    #                                      Kaldi's mono on subset_data_dir.sh --shortest
    batch_frames: int = 20000
    max_batch_mb: float = 256.0          # likelihood work tensors of one block of frames
    device: str = "cpu"                  # cpu | cuda[:N]: where likelihoods and Viterbi run
    nj: int = 1                          # parallel alignment jobs on the CPU (the pipeline's nj)
    graph_cache_mb: float = 4096.0       # training graphs kept for the pass's realignments
    type: str = "deltas"                 # deltas | lda_mllt (tri3) | sat (tri4)
    left_context: int = 3                # lda_mllt: splice-feats --left-context
    right_context: int = 3               # lda_mllt: splice-feats --right-context
    dim: int = 40                        # lda_mllt: est-lda --dim
    mllt_iters: list[int] = field(default_factory=lambda: [2, 4, 6, 12])
    fmllr_iters: list[int] = field(default_factory=lambda: [2, 4, 6, 12])
    silence_weight: float = 0.0          # weight-silence-post for LDA, MLLT and fMLLR stats
    fmllr_min_count: float = 500.0       # gmm-est-fmllr --fmllr-min-count: fewer -> identity
    fmllr_num_iters: int = 40            # gmm-est-fmllr --fmllr-num-iters (row sweeps)

    @classmethod
    def from_config(cls, cfg: Mapping | None, **defaults) -> GmmConfig:
        values = dict(defaults)
        for k, v in dict(cfg or {}).items():
            if k not in cls.__dataclass_fields__:
                raise AsrtrainError(f"unknown GMM option {k!r}; known: "
                                    f"{sorted(cls.__dataclass_fields__)}")
            values[k] = list(v) if k in _LIST_OPTIONS else v
        c = cls(**values)
        if c.type not in PASS_TYPES:
            raise AsrtrainError(f"GMM option type={c.type!r}: expected one of {list(PASS_TYPES)}")
        if c.left_context < 0 or c.right_context < 0 or c.dim < 1:
            raise AsrtrainError(f"GMM options left_context={c.left_context}, right_context="
                                f"{c.right_context}, dim={c.dim}: contexts >= 0, dim >= 1")
        return c


_LIST_OPTIONS = ("realign_iters", "mllt_iters", "fmllr_iters")


class _PassLog:
    """Writes log.txt lines and collects the per-pass figures for passes.json."""

    def __init__(self, out_dir: Path, name: str) -> None:
        self.out_dir, self.name = out_dir, name
        self.lines: list[str] = []
        self.passes: list[dict] = []

    def __call__(self, msg: str) -> None:
        log.info("%s: %s", self.name, msg, extra=STAGE_LOG_ONLY)
        self.lines.append(msg)

    def record(self, it: int, res: AlignResult | None, loglike: float, frames: int,
               seconds: float, num_gauss: int, extra: dict | None = None) -> None:
        entry = {"iter": it, "loglike_per_frame": loglike, "frames": frames,
                 "seconds": round(seconds, 3), "num_gauss": num_gauss,
                 "frames_per_second": round(frames / max(seconds, 1e-9))}
        if res is not None:
            entry.update(realigned=True, align_frames_per_second=round(
                res.frames / max(res.seconds, 1e-9)), align_seconds=round(res.seconds, 3),
                failed=len(res.failed))
        entry.update(extra or {})
        self.passes.append(entry)
        self(json.dumps(entry))

    def write(self, tmp: Path, summary: dict) -> None:
        write_text(tmp / "log.txt", "\n".join(self.lines) + "\n")
        write_text(tmp / "passes.json", json.dumps({"summary": summary, "passes": self.passes},
                                                   indent=1) + "\n")


def _global_stats(utts: list[Utterance]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of all frames, one utterance at a time (a float64 copy of the corpus
    was ~500 bytes a frame at the stage's peak).  Sums run frame by frame in corpus order, as
    ``x.mean(0)``/``x.var(0)`` of the concatenation do, so the figures are the same bits."""
    n = sum(len(u.feats) for u in utts)
    mean = _running_sum(u.feats.astype(np.float64) for u in utts) / n
    var = _running_sum((u.feats.astype(np.float64) - mean) ** 2 for u in utts) / n
    return mean, var


def _running_sum(blocks) -> np.ndarray:
    """Rows summed in order across blocks (one sequential sum, as numpy's axis-0 reduction)."""
    acc = None
    for b in blocks:
        acc = b.sum(0) if acc is None else np.add.reduce(np.concatenate([acc[None], b]), 0)
    return acc


class _ContextItems:
    """``(frame contexts, feats)`` per utterance for :meth:`TreeStats.accumulate`, made on the
    fly from the previous alignment (all of them at once were 32 bytes a frame)."""

    def __init__(self, utts: list[Utterance], prev: Mapping[str, np.ndarray]) -> None:
        self.utts, self.prev = utts, prev

    def __iter__(self):
        for u in self.utts:
            yield frame_contexts(self.prev[u.utt].astype(np.int64)), u.feats


def _num_states(lang: Lang) -> dict[int, int]:
    return {p: lang.phones.topology(p).num_states for p in lang.phones.real_phone_ids}


def _accumulate(model: AcousticModel, utts: list[Utterance], phone_state: dict[str, np.ndarray],
                device: torch.device) -> tuple:
    """GMM statistics and transition counts from a phone-state alignment."""
    return accumulate_stats(model, ((u.feats, phone_state[u.utt]) for u in utts
                                    if u.utt in phone_state), device)


IterationHook = Callable[[int, AcousticModel, dict[str, np.ndarray]], dict | None]


def _train_iters(model: AcousticModel, lang: Lang, utts: list[Utterance],
                 phone_state: dict[str, np.ndarray], cfg: GmmConfig, target_gauss: int,
                 plog: _PassLog, graphs: GraphCache,
                 hook: IterationHook | None = None) -> AlignResult:
    """The shared loop: realign (when scheduled), ``hook`` (the feature-space updates of
    LDA+MLLT and SAT passes: it may change the model and the utterances' features, and returns
    figures for the iteration's record), accumulate, update, mix up; a final alignment with the
    last model is returned. A progress bar counts the iterations (the log has a line for each)."""
    device = torch.device(cfg.device)
    num_gauss = model.gmm.num_gauss()
    inc = max(0, (target_gauss - num_gauss) // max(cfg.max_iter_inc, 1))
    acfg = asdict(cfg)
    bar = tqdm(total=cfg.num_iters + 1, desc=plog.name, unit="iter", file=sys.stderr,
               disable=None, leave=False)
    for it in range(1, cfg.num_iters + 1):
        t0 = time.time()
        res = None
        if it in cfg.realign_iters:
            res = align(model, lang, utts, acfg, graphs, desc=f"{plog.name} iter {it}: align")
            check_failures(res, len(utts), cfg.max_fail_fraction, f"{plog.name} iter {it}")
            phone_state = res.phone_state
        extra = hook(it, model, phone_state) if hook is not None else None
        gmm, stats, counts = _accumulate(model, utts, phone_state, device)
        gmm.update(stats, torch.from_numpy(model.var_floor).to(device),
                   cfg.min_gaussian_occupancy)
        model.log_trans = estimate_log_trans(counts, model.log_trans)
        if it <= cfg.max_iter_inc and num_gauss < target_gauss:
            num_gauss = min(target_gauss, num_gauss + inc)
            gmm.mixup(num_gauss, stats.occ.sum(-1))
        model.gmm = gmm.to("cpu")
        plog.record(it, res, stats.loglike / max(stats.frames, 1), stats.frames,
                    time.time() - t0, model.gmm.num_gauss(), extra)
        bar.set_postfix(loglike=f"{plog.passes[-1]['loglike_per_frame']:.2f}",
                        gauss=model.gmm.num_gauss(), refresh=False)
        bar.update()
    res = align(model, lang, utts, acfg, graphs, desc=f"{plog.name}: final alignment")
    bar.update()
    bar.close()
    check_failures(res, len(utts), cfg.max_fail_fraction, f"{plog.name} final alignment")
    plog(f"training graphs: {graphs.compiled} compiled for {len(utts)} utterances, "
         f"{len(graphs.graphs)} kept ({graphs.bytes / 2 ** 20:.1f} MB)")
    plog.record(cfg.num_iters + 1, res, res.loglike_per_frame, res.frames, res.seconds,
                model.gmm.num_gauss())
    return res


def train_mono(data_dir: Path, lang_dir: Path, out_dir: Path,
               cfg: Mapping | None = None) -> dict:
    """Flat-start monophone training (see the module docstring); returns the summary."""
    c = GmmConfig.from_config(cfg)
    lang = Lang.read(lang_dir)
    utts, skipped = load_data(data_dir, lang, c.delta_order)
    if not utts:
        raise AsrtrainError(f"{data_dir}: no utterance to train on")
    if c.num_utts:
        utts = sorted(utts, key=lambda u: (len(u.feats), u.utt))[:c.num_utts]
    out_dir = Path(out_dir)
    plog = _PassLog(out_dir, "mono")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    mean, var = _global_stats(utts)
    var_floor = c.var_floor_factor * var
    num_states = _num_states(lang)
    tree = mono_tree(lang.phones.root_of(), num_states)
    p = tree.num_pdfs
    gmm = DiagGmmSet(torch.from_numpy(np.tile(mean, (p, 1, 1))),
                     torch.from_numpy(np.tile(var, (p, 1, 1))), torch.zeros(p, 1))
    model = AcousticModel(tree, gmm, initial_log_trans(lang), c.delta_order, var_floor)

    # iteration 0: equal alignment (Kaldi align-equal-compiled, then gmm-est)
    t0 = time.time()
    phone_state = {}
    for u in utts:
        eq = equal_alignment(lang, u.words, len(u.feats), num_states.__getitem__)
        if eq is None:
            plog(f"equal alignment impossible for {u.utt} ({len(u.feats)} frames)")
            continue
        phone_state[u.utt] = np.array([ph * STATE_BITS + s for ph, s in eq], dtype=np.int64)
    if len(utts) - len(phone_state) > c.max_fail_fraction * len(utts):
        raise AsrtrainError(f"{data_dir}: {len(utts) - len(phone_state)} of {len(utts)} "
                            "utterances are too short for an equal alignment")
    device = torch.device(c.device)
    g, stats, counts = _accumulate(model, utts, phone_state, device)
    g.update(stats, torch.from_numpy(var_floor).to(device), min_gaussian_occupancy=3.0)
    model.gmm = g.to("cpu")
    model.log_trans = estimate_log_trans(counts, model.log_trans)
    plog.record(0, None, stats.loglike / max(stats.frames, 1), stats.frames, time.time() - t0,
                model.gmm.num_gauss())

    res = _train_iters(model, lang, utts, phone_state, c, c.totgauss, plog,
                       GraphCache(c.graph_cache_mb))
    summary = {"kind": "mono", "num_pdfs": model.num_pdfs, "num_gauss": model.gmm.num_gauss(),
               "utterances": len(utts), "skipped": len(skipped), "failed": len(res.failed),
               "final_loglike_per_frame": res.loglike_per_frame}
    _write(out_dir, model, lang, res, plog, summary)
    return summary


def train_tri(data_dir: Path, lang_dir: Path, ali_dir: Path, out_dir: Path,
              cfg: Mapping | None = None) -> dict:
    """Triphone training on the alignment of a previous pass in ``ali_dir``."""
    c = GmmConfig.from_config(cfg, **TRI_DEFAULTS)
    lang = Lang.read(lang_dir)
    utts, skipped = load_data(data_dir, lang, c.delta_order)
    ali_dir, out_dir = Path(ali_dir), Path(out_dir)
    plog = _PassLog(out_dir, out_dir.name)
    utts, prev = _aligned_utterances(utts, skipped, ali_dir, plog, c)
    model, tsum = _tree_model(utts, prev, lang, ali_dir, c, plog)
    res = _train_iters(model, lang, utts, {u.utt: prev[u.utt].astype(np.int64) for u in utts},
                       c, c.num_gauss, plog,
                       GraphCache(c.graph_cache_mb))
    summary = {"kind": "tri", "num_pdfs": model.num_pdfs, "num_gauss": model.gmm.num_gauss(),
               "utterances": len(utts), "skipped": len(skipped), "failed": len(res.failed),
               "final_loglike_per_frame": res.loglike_per_frame, "tree": tsum}
    _write(out_dir, model, lang, res, plog, summary)
    return summary


TRI_DEFAULTS = dict(num_iters=35, realign_iters=[10, 20, 30], max_iter_inc=25)


def _aligned_utterances(utts: list[Utterance], skipped: dict[str, str], ali_dir: Path,
                        plog: _PassLog, c: GmmConfig
                        ) -> tuple[list[Utterance], dict[str, np.ndarray]]:
    """The utterances that have an alignment in ``ali_dir`` (logged: those skipped or without
    one), and the phone-state alignments; too few is an error."""
    prev = read_int_table(ali_dir / "ali_phone_state.scp")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    utts_with_ali = []
    for u in utts:
        a = prev.get(u.utt)
        if a is None:
            plog(f"no alignment for {u.utt} in {ali_dir}")
        elif len(a) != len(u.feats):
            raise AsrtrainError(f"{ali_dir / 'ali_phone_state.scp'}: utterance {u.utt} has "
                                f"{len(a)} frames, its features {len(u.feats)}")
        else:
            utts_with_ali.append(u)
    if len(utts_with_ali) < (1 - c.max_fail_fraction) * len(utts):
        raise AsrtrainError(f"{ali_dir}: only {len(utts_with_ali)} of {len(utts)} utterances "
                            "have an alignment")
    return utts_with_ali, prev


def _tree_model(utts: list[Utterance], prev: Mapping[str, np.ndarray], lang: Lang,
                ali_dir: Path, c: GmmConfig, plog: _PassLog) -> tuple[AcousticModel, dict]:
    """``acc-tree-stats``, ``cluster-phones``, ``build-tree`` and ``gmm-init-model`` on the
    utterances' features as they are (Δ, LDA or adapted): a model of one Gaussian per leaf,
    the transitions of the previous pass's model; returns it and the tree's summary."""
    t0 = time.time()
    stats = TreeStats.accumulate(_ContextItems(utts, prev))
    mean, var = _global_stats(utts)
    var_floor = c.var_floor_factor * var
    ps = lang.phones
    sets = [[ps.phones[v] for v in ps.variants(b)] for b in ps.bases]
    questions = cluster_phones(stats, sets, var_floor) + ps.questions()
    tree, tsum = build_tree(stats, ps.root_of(), questions, _num_states(lang), c.num_leaves,
                            var_floor, c.tree_thresh, c.tree_min_count)
    plog(f"tree: {tsum['leaves']} leaves, {len(questions)} phone questions, objective "
         f"{tsum['objective_before'] / tsum['frames']:.3f} -> "
         f"{tsum['objective_after'] / tsum['frames']:.3f} per frame")
    # one Gaussian per leaf from the pooled context statistics (gmm-init-model)
    leaf = np.array([tree.pdf(int(a), int(b), int(cc), int(d)) for a, b, cc, d in stats.keys])
    d = (stats.stats.shape[1] - 1) // 2
    pooled = np.zeros((tree.num_pdfs, stats.stats.shape[1]))
    np.add.at(pooled, leaf, stats.stats)
    empty = pooled[:, 0] <= 0
    pooled[empty] = np.concatenate([[1.0], mean, var + mean * mean])   # unseen: global
    gmm = DiagGmmSet.from_single_gaussians(torch.from_numpy(pooled[:, 0]),
                                           torch.from_numpy(pooled[:, 1:1 + d]),
                                           torch.from_numpy(pooled[:, 1 + d:]),
                                           torch.from_numpy(var_floor))
    prev_model_path = ali_dir / "final.mdl"
    log_trans = (AcousticModel.load(ali_dir).log_trans if prev_model_path.is_file()
                 else initial_log_trans(lang))
    model = AcousticModel(tree, gmm, log_trans, c.delta_order, var_floor)
    plog(f"tree built and model initialized in {time.time() - t0:.1f} s")
    return model, tsum


def train_lda_mllt(data_dir: Path, lang_dir: Path, ali_dir: Path, out_dir: Path,
                   cfg: Mapping | None = None) -> dict:
    """LDA+MLLT triphones (tri3, Kaldi's ``steps/train_lda_mllt.sh``): LDA of CMN'd MFCCs
    spliced ±``left/right_context`` to ``dim`` on the previous pass's pdf alignment (silence
    weighted ``silence_weight``), a tree on the LDA features, then the shared loop with MLLT
    at ``mllt_iters``; the model's ``lda_mllt`` is Kaldi's ``final.mat``."""
    c = GmmConfig.from_config(cfg, **TRI_DEFAULTS, type="lda_mllt")
    lang = Lang.read(lang_dir)
    utts, skipped = read_utterances(data_dir, lang)
    ali_dir, out_dir = Path(ali_dir), Path(out_dir)
    plog = _PassLog(out_dir, out_dir.name)
    utts, prev = _aligned_utterances(utts, skipped, ali_dir, plog, c)
    base = {u.utt: u.feats for u in utts}           # CMN'd MFCCs: 52 bytes a frame
    splice = (c.left_context, c.right_context)
    lda, lda_info = _estimate_lda(utts, prev, ali_dir, lang, splice, c, plog)
    for u in utts:
        u.feats = lda_features(base[u.utt], splice, lda)
    model, tsum = _tree_model(utts, prev, lang, ali_dir, c, plog)
    model.splice, model.lda_mllt = splice, lda
    mllt = _MlltUpdate(utts, base, lang, c, plog)
    res = _train_iters(model, lang, utts, {u.utt: prev[u.utt].astype(np.int64) for u in utts},
                       c, c.num_gauss, plog, GraphCache(c.graph_cache_mb), mllt)
    summary = {"kind": "lda_mllt", "num_pdfs": model.num_pdfs,
               "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
               "skipped": len(skipped), "failed": len(res.failed),
               "final_loglike_per_frame": res.loglike_per_frame, "tree": tsum, "lda": lda_info,
               "mllt_objf_improvement": mllt.improvements}
    _write(out_dir, model, lang, res, plog, summary)
    return summary


def silence_phone_mask(lang: Lang) -> np.ndarray:
    """``[num phone ids]`` True for the silence phones (Kaldi's ``silence.csl``)."""
    mask = np.zeros(len(lang.phones.phones), dtype=bool)
    for p in lang.phones.real_phone_ids:
        mask[p] = lang.phones.is_silence(p)
    return mask


def frame_weights(phone_state: np.ndarray, silence: np.ndarray,
                  silence_weight: float) -> np.ndarray:
    """Per frame 1, or ``silence_weight`` on a silence phone (``weight-silence-post``);
    ``silence`` is :func:`silence_phone_mask`."""
    phones = np.asarray(phone_state, dtype=np.int64) // STATE_BITS
    return np.where(silence[phones], silence_weight, 1.0)


def _estimate_lda(utts: list[Utterance], prev: Mapping[str, np.ndarray], ali_dir: Path,
                  lang: Lang, splice: tuple[int, int], c: GmmConfig, plog: _PassLog
                  ) -> tuple[np.ndarray, dict]:
    """``acc-lda`` (classes: the previous pass's pdf ids, silence weighted) and
    ``est-lda --dim``: the ``[dim, D*(L+1+R)]`` matrix (no offset column, as Kaldi's
    ``0.mat``) and its figures for the summary."""
    t0 = time.time()
    pdfs = read_int_table(ali_dir / "ali.scp")
    num_classes = int((ali_dir / "num_pdfs").read_text().split()[0])
    spliced_dim = utts[0].feats.shape[1] * (splice[0] + 1 + splice[1])
    device = torch.device(c.device)
    stats = LdaStats.zeros(num_classes, spliced_dim, device)
    silence = silence_phone_mask(lang)
    for u in utts:
        pdf = pdfs.get(u.utt)
        if pdf is None or len(pdf) != len(u.feats):
            continue
        w = frame_weights(prev[u.utt], silence, c.silence_weight)
        keep = w > 0
        x = splice_frames(torch.from_numpy(u.feats).to(device), *splice)[
            torch.from_numpy(keep).to(device)]
        stats.accumulate(x, torch.from_numpy(pdf[keep].astype(np.int64)).to(device),
                         torch.from_numpy(w[keep]).to(device))
    res = estimate_lda(stats, c.dim)
    info = {"dim": c.dim, "spliced_dim": spliced_dim, "classes": int((stats.count > 0).sum()),
            "frames": float(stats.count.sum()), "seconds": round(time.time() - t0, 3),
            "top_eigenvalues": [round(float(v), 4) for v in res.eigenvalues[:5].tolist()]}
    plog(f"LDA: {spliced_dim} -> {c.dim} dims on {info['classes']} classes, "
         f"{info['frames']:.0f} frames (silence weight {c.silence_weight}) in "
         f"{info['seconds']} s")
    return res.matrix.cpu().numpy(), info


def batch_frames(gmm: DiagGmmSet, max_batch_mb: float) -> int:
    """Frames per batch of Gaussian-posterior statistics (MLLT, fMLLR, ``[frames, components,
    dim]`` float64 work tensors, about four of them) within ``max_batch_mb``."""
    live = torch.isfinite(gmm.log_weights).sum(-1)
    per_frame = 4 * 8 * max(int(live.max()) if live.numel() else 1, 1) * gmm.dim
    return max(1, int(max_batch_mb * 2 ** 20 // per_frame))


def frame_batches(items: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], frames: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(feats, pdfs, weights)`` of utterances joined into batches of about ``frames`` frames
    (one call per batch, not per utterance: the statistics' cost per call is mostly fixed)."""
    buf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n = 0
    for item in items:
        if not len(item[0]):
            continue
        buf.append(item)
        n += len(item[0])
        if n >= frames:
            yield tuple(np.concatenate(parts) for parts in zip(*buf, strict=True))
            buf, n = [], 0
    if buf:
        yield tuple(np.concatenate(parts) for parts in zip(*buf, strict=True))


class _MlltUpdate:
    """The LDA+MLLT pass's iteration hook (``gmm-acc-mllt``, ``est-mllt``,
    ``gmm-transform-means``, ``compose-transforms``): at ``mllt_iters``, MLLT statistics from
    the current alignment (silence weighted), the transform composed into the model's
    ``lda_mllt`` and applied to its means, the features recomputed from the CMN'd MFCCs and the
    variance floor from their new global variance."""

    def __init__(self, utts: list[Utterance], base: Mapping[str, np.ndarray], lang: Lang,
                 c: GmmConfig, plog: _PassLog) -> None:
        self.utts, self.base, self.c, self.plog = utts, base, c, plog
        self.silence = silence_phone_mask(lang)
        self.improvements: list[float] = []

    def __call__(self, it: int, model: AcousticModel, phone_state: dict[str, np.ndarray]
                 ) -> dict | None:
        if it not in self.c.mllt_iters:
            return None
        t0 = time.time()
        device = torch.device(self.c.device)
        gmm = model.gmm.to(device)
        stats = MlltStats.zeros(gmm.dim, device)
        batches = frame_batches(self._frames(model, phone_state),
                                batch_frames(gmm, self.c.max_batch_mb))
        for feats, pdf, w in tqdm(batches, desc=f"{self.plog.name} iter {it}: MLLT",
                                  unit="batch", file=sys.stderr, disable=None, leave=False):
            x = torch.from_numpy(feats).to(device)
            post = component_posteriors(gmm, x, torch.from_numpy(pdf).to(device),
                                        torch.from_numpy(w).to(device))
            stats.accumulate(x, post, self.c.max_batch_mb)
        est = estimate_mllt(stats)
        m = est.matrix.cpu()
        g = model.gmm
        model.gmm = DiagGmmSet(transform_means(g.means, m), g.vars, g.log_weights)
        model.lda_mllt = compose(m, torch.from_numpy(model.lda_mllt)).numpy()
        for u in self.utts:
            u.feats = model_features(model, self.base[u.utt])
        model.var_floor = self.c.var_floor_factor * _global_stats(self.utts)[1]
        self.improvements.append(est.improvement)
        logdet = float(torch.linalg.slogdet(m)[1])
        self.plog(f"iter {it}: MLLT objective +{est.improvement:.4f} per frame over "
                  f"{stats.beta:.0f} frames (log|det| {logdet:.3f}) in {time.time() - t0:.1f} s")
        return {"mllt_objf_improvement": est.improvement, "mllt_logdet": logdet,
                "mllt_seconds": round(time.time() - t0, 3)}

    def _frames(self, model: AcousticModel, phone_state: Mapping[str, np.ndarray]):
        """Per aligned utterance: its non-silence (weight > 0) frames, their pdfs, weights."""
        for u in self.utts:
            ps = phone_state.get(u.utt)
            if ps is None:
                continue
            w = frame_weights(ps, self.silence, self.c.silence_weight)
            keep = w > 0
            yield u.feats[keep], pdfs_of(model.tree, frame_contexts(ps))[keep], w[keep]


def _write(out_dir: Path, model: AcousticModel, lang: Lang, res: AlignResult, plog: _PassLog,
           summary: dict, transforms: Mapping[str, np.ndarray] | None = None,
           alignment_model: AcousticModel | None = None) -> None:
    """The pass's directory, atomically: model (and ``final.alimdl``), alignments, speaker
    transforms (``trans.{ark,scp}``) when given, ``log.txt``, ``passes.json``."""
    with atomic_dir(out_dir) as tmp:
        model.save(tmp, lang.phones.phones.id2sym)
        if alignment_model is not None:
            alignment_model.save_alignment_model(tmp)
        write_alignments(tmp, res)
        if transforms is not None:
            write_transforms(tmp, transforms)
        plog.write(tmp, summary)
    # ark offsets in the scp files point into tmp: fix the directory name after the swap
    for name in ("ali.scp", "ali_phone_state.scp", "trans.scp"):
        p = out_dir / name
        if p.is_file():
            write_text(p, p.read_text().replace(str(tmp.resolve()), str(out_dir.resolve())))


def align_data(data_dir: Path, lang_dir: Path, model_dir: Path, out_dir: Path,
               cfg: Mapping | None = None) -> dict:
    """Align a data dir with a trained model (Kaldi's ``steps/align_si.sh``): ``out_dir`` gets
    the model (copied), ``ali.{ark,scp}``, ``ali_phone_state.{ark,scp}``, ``log.txt``,
    ``passes.json``; the next ``train_tri`` can start from it.  A SAT model is aligned with
    fMLLR (:func:`asrtrain.align.sat.align_fmllr`, Kaldi's ``steps/align_fmllr.sh``)."""
    c = GmmConfig.from_config(cfg)
    lang = Lang.read(lang_dir)
    model = AcousticModel.load(model_dir)
    if model.sat:
        from asrtrain.align.sat import align_fmllr  # sat builds on this module

        return align_fmllr(data_dir, lang_dir, model_dir, out_dir, cfg)
    utts, skipped = load_data(data_dir, lang, model)
    out_dir = Path(out_dir)
    plog = _PassLog(out_dir, f"align {Path(model_dir).name}")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    res = align(model, lang, utts, asdict(c), desc=f"align {Path(data_dir).name}")
    check_failures(res, len(utts), c.max_fail_fraction, f"aligning {data_dir}")
    for utt, why in sorted(res.failed.items()):
        plog(f"failed {utt}: {why}")
    plog.record(0, res, res.loglike_per_frame, res.frames, res.seconds, model.gmm.num_gauss())
    summary = {"kind": "align", "model": str(model_dir), "num_pdfs": model.num_pdfs,
               "utterances": len(utts), "skipped": len(skipped), "failed": len(res.failed),
               "final_loglike_per_frame": res.loglike_per_frame}
    _write(out_dir, model, lang, res, plog, summary)
    return summary


def train_pass(data_dir: Path, lang_dir: Path, ali_dir: Path | None, out_dir: Path,
               cfg: Mapping | None = None) -> dict:
    """One pass of ``align.passes``: mono when it starts from nothing (``ali_dir`` None),
    else by its ``type``: ``deltas`` (train_deltas.sh), ``lda_mllt`` (train_lda_mllt.sh),
    ``sat`` (train_sat.sh).  Returns the pass's summary."""
    if ali_dir is None:
        return train_mono(data_dir, lang_dir, out_dir, cfg)
    kind = GmmConfig.from_config(cfg).type
    if kind == "lda_mllt":
        return train_lda_mllt(data_dir, lang_dir, ali_dir, out_dir, cfg)
    if kind == "sat":
        from asrtrain.align.sat import train_sat  # sat builds on this module

        return train_sat(data_dir, lang_dir, ali_dir, out_dir, cfg)
    return train_tri(data_dir, lang_dir, ali_dir, out_dir, cfg)


def import_kaldi_alignment(kaldi_dir: Path, out_dir: Path, num_pdfs: int | None = None) -> int:
    """``align.source=kaldi``: copy pdf-id alignments (``ali-to-pdf`` output: ``pdf.*.ark``,
    ``ali.*.ark`` or ``*.scp`` int32-vector tables) into ``out_dir/ali.{ark,scp}``; ``num_pdfs``
    comes from the argument or ``kaldi_dir/num_pdfs``.  Returns the number of utterances."""
    import kaldiio

    kaldi_dir, out_dir = Path(kaldi_dir), Path(out_dir)
    if num_pdfs is None:
        f = kaldi_dir / "num_pdfs"
        if not f.is_file():
            raise AsrtrainError(f"{f}: missing; give num_pdfs (e.g. from `tree-info` or "
                                "`am-info`) in the config")
        num_pdfs = int(f.read_text().split()[0])
    files = sorted(kaldi_dir.glob("*.scp")) or sorted(kaldi_dir.glob("*.ark"))
    if not files:
        raise AsrtrainError(f"{kaldi_dir}: no .scp or .ark pdf alignments")
    table: dict[str, np.ndarray] = {}
    for f in files:
        reader = kaldiio.load_scp(str(f)) if f.suffix == ".scp" else kaldiio.load_ark(str(f))
        items = reader.items() if f.suffix == ".scp" else reader
        for utt, vec in items:
            vec = np.asarray(vec)
            if vec.ndim != 1 or not np.issubdtype(vec.dtype, np.integer):
                raise AsrtrainError(f"{f}: {utt} is not an int32 vector (run ali-to-pdf)")
            if len(vec) and (vec.min() < 0 or vec.max() >= num_pdfs):
                raise AsrtrainError(f"{f}: {utt} has pdf ids outside 0..{num_pdfs - 1}")
            table[utt] = vec.astype(np.int32)
    res = AlignResult({}, table, {}, {}, 0.0, sum(map(len, table.values())), 0.0)
    with atomic_dir(out_dir) as tmp:
        write_alignments(tmp, res)
        (tmp / "ali_phone_state.ark").unlink()
        (tmp / "ali_phone_state.scp").unlink()
        write_text(tmp / "num_pdfs", f"{num_pdfs}\n")
    p = out_dir / "ali.scp"
    write_text(p, p.read_text().replace(str(tmp.resolve()), str(out_dir.resolve())))
    return len(table)
