"""The jobs of a GMM pass, as Kaldi's ``JOB=1:$nj`` pipelines: each job reads its part of the
data dir (whole speakers, :func:`asrtrain.jobs.split_by_speaker`) from disk, with the model,
matrix and transforms the parent wrote into the pass's work dir, and returns statistics only
(``gmm-acc-stats-ali``, ``acc-tree-stats``, ``acc-lda``, ``gmm-acc-mllt``,
``gmm-acc-stats-twofeats``, the global moments of ``gmm-init-mono`` and the variance floor), its
speakers' fMLLR transforms (``gmm-est-fmllr``: a job owns its speakers) and, when it aligns,
its alignment part on disk (``ali.JOB``, as Kaldi's ``ali.JOB.gz``).  The parent sums the
statistics in job order (``gmm-sum-accs``) and merges the parts in utterance order, so the
results do not depend on ``nj``; it never holds the corpus's features.

Jobs are module-level functions of one picklable argument run by :func:`asrtrain.jobs.run_jobs`:
the same code in a forked pool or a fresh interpreter on a cluster.  A job's memory is its
part's features (``1/nj`` of the corpus's) and its training graphs, which it compiles at its
first alignment of a pass and keeps on disk for the next (``graphs.JOB.pt``, Kaldi's
``fsts.JOB.gz``; the split is fixed for the pass, so job ``j`` always aligns the same
utterances).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from asrtrain import AsrtrainError
from asrtrain.adapt.lda import LdaStats
from asrtrain.adapt.mllt import MlltStats
from asrtrain.adapt.posteriors import component_posteriors
from asrtrain.adapt.splice import splice_frames
from asrtrain.align.gmm import GmmStats
from asrtrain.align.graph import equal_alignment
from asrtrain.align.model import (
    STATE_BITS,
    AcousticModel,
    GraphCache,
    Utterance,
    _align_shard,
    accumulate_stats,
    adapt_features,
    add_transition_counts,
    frame_contexts,
    lda_features,
    mfcc_reader,
    model_features,
    pdfs_of,
    read_int_vectors,
    read_transforms,
    transcripts,
)
from asrtrain.align.tree import TreeStats
from asrtrain.fileio import atomic_ark, atomic_open
from asrtrain.lang.lexicon import Lang


@dataclass
class Moments:
    """Frames, sum and sum of squares of features, float64: the global mean and variance
    (``gmm-init-mono``'s start, every pass's variance floor) summed over jobs."""

    n: float = 0.0
    s1: np.ndarray | None = None
    s2: np.ndarray | None = None

    def accumulate(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        if self.s1 is None:
            self.s1, self.s2 = np.zeros(x.shape[1]), np.zeros(x.shape[1])
        self.n += len(x)
        self.s1 += x.sum(0)
        self.s2 += (x * x).sum(0)

    def add(self, other: Moments) -> None:
        if other.s1 is None:
            return
        if self.s1 is None:
            self.s1, self.s2 = np.zeros_like(other.s1), np.zeros_like(other.s2)
        self.n += other.n
        self.s1 += other.s1
        self.s2 += other.s2

    def mean_var(self) -> tuple[np.ndarray, np.ndarray]:
        if self.s1 is None or self.n <= 0:
            raise AsrtrainError("no frames to estimate the global mean and variance from")
        mean = self.s1 / self.n
        return mean, np.maximum(self.s2 / self.n - mean * mean, 0.0)


@dataclass
class Part:
    """One job's share of a pass: its utterances (whole speakers, sorted), the data and lang
    dirs it reads them from, the pass's work dir."""

    index: int               # 1-based, as Kaldi's JOB
    data_dir: str
    lang_dir: str
    utts: list[str]
    work: str

    def file(self, name: str) -> Path:
        """``work/name`` with ``JOB`` replaced by this job's number."""
        return Path(self.work) / name.replace("JOB", str(self.index))

    def read(self, lang: Lang) -> list[Utterance]:
        """The part's utterances: words, speaker and CMN'd MFCCs, read from the data dir."""
        reader = mfcc_reader(self.data_dir)
        words, skipped = transcripts(reader.data, lang, self.utts)
        if skipped:
            utt, why = next(iter(skipped.items()))
            raise AsrtrainError(f"{self.data_dir}: utterance {utt}: {why}")
        return [Utterance(u, words[u], reader[u], reader.data.utt2spk[u]) for u in self.utts]


@dataclass
class Features:
    """How a job makes a pass's features from CMN'd MFCCs: ``model``'s pipeline (a model file:
    Δ or splice + LDA+MLLT), else Δ of ``delta_order`` or, with ``matrix`` (an ``.npy``),
    ``splice`` + that matrix; then each speaker's fMLLR from ``trans`` (a ``trans.scp``)."""

    model: str | None = None
    delta_order: int = 2
    splice: tuple[int, int] = (0, 0)
    matrix: str | None = None
    trans: str | None = None

    def apply(self, utts: list[Utterance]) -> None:
        """Replace each utterance's CMN'd MFCCs by the features (in place)."""
        if self.model is not None:
            pipeline = AcousticModel.read(self.model)
            make = lambda x: model_features(pipeline, x)   # noqa: E731
        elif self.matrix is not None:
            mat = np.load(self.matrix)
            make = lambda x: lda_features(x, self.splice, mat)   # noqa: E731
        else:
            make = lambda x: model_features(self.delta_order, x)   # noqa: E731
        trans = read_transforms(self.trans) if self.trans else None
        for u in utts:
            u.feats = make(u.feats)
            if trans is not None:
                u.feats = adapt_features(u.feats, _transform(trans, u, self.trans))


def _transform(trans: Mapping[str, np.ndarray], u: Utterance, where: str | None) -> np.ndarray:
    w = trans.get(u.speaker)
    if w is None:
        raise AsrtrainError(f"{where}: no fMLLR transform for speaker {u.speaker!r} "
                            f"(utterance {u.utt})")
    return w


def read_alignment(scp: str | Path, utts: Iterable[Utterance]) -> dict[str, np.ndarray]:
    """The phone-state (or pdf) alignment of ``utts`` from a table, int64; an utterance whose
    length differs from its features is an error, one without an alignment is left out."""
    utts = list(utts)
    table = read_int_vectors(scp, [u.utt for u in utts])
    out = {}
    for u in utts:
        if u.utt not in table:
            continue
        a = table[u.utt].astype(np.int64)
        if len(a) != len(u.feats):
            raise AsrtrainError(f"{scp}: utterance {u.utt} has {len(a)} frames, its features "
                                f"{len(u.feats)}")
        out[u.utt] = a
    return out


def _write_part(part: Part, name: str, table: Mapping[str, np.ndarray]) -> None:
    """``work/name.JOB.{ark,scp}``: this job's part of an int32 alignment table."""
    ark = part.file(f"{name}.JOB.ark").resolve()
    with atomic_ark(ark, part.file(f"{name}.JOB.scp")) as w:
        for utt in sorted(table):
            w(utt, np.asarray(table[utt], dtype=np.int32))


# ------------------------------------------------------------------ before the pass's model


@dataclass
class SetupJob:
    """What a pass needs before its first model: ``moments`` of the features, tree statistics
    (``tree``: contexts from the phone-state alignment ``ali``), LDA statistics (``lda``:
    spliced CMN'd MFCCs, classes the pdfs of ``pdf_ali``), and first fMLLR transforms
    (``fmllr_model``: estimated with that model from ``pdf_ali``, before the tree statistics of
    the adapted features)."""

    part: Part
    features: Features
    moments: bool = False
    tree: bool = False
    ali: str | None = None
    lda: tuple[int, int, int] | None = None          # (num_classes, left, right)
    pdf_ali: str | None = None
    fmllr_model: str | None = None
    cfg: dict = field(default_factory=dict)


@dataclass
class SetupResult:
    moments: Moments | None = None
    tree: TreeStats | None = None
    lda: LdaStats | None = None
    transforms: dict[str, np.ndarray] | None = None
    fmllr: dict | None = None


def setup_job(a: SetupJob) -> SetupResult:
    from asrtrain.align.sat import estimate_transforms, silence_pdfs
    from asrtrain.align.train import frame_weights, silence_phone_mask

    lang = Lang.read(a.part.lang_dir)
    utts = a.part.read(lang)
    out = SetupResult()
    device = torch.device(a.cfg.get("device", "cpu"))
    if a.lda is not None:   # acc-lda on spliced CMN'd MFCCs
        num_classes, left, right = a.lda
        pdfs = read_alignment(a.pdf_ali, utts)
        prev = read_alignment(a.ali, utts)
        silence = silence_phone_mask(lang)
        out.lda = LdaStats.zeros(num_classes, utts[0].feats.shape[1] * (left + 1 + right),
                                 device)
        for u in utts:
            if u.utt not in pdfs or u.utt not in prev:
                continue
            w = frame_weights(prev[u.utt], silence, a.cfg["silence_weight"])
            keep = w > 0
            x = splice_frames(torch.from_numpy(u.feats).to(device), left, right)[
                torch.from_numpy(keep).to(device)]
            out.lda.accumulate(x, torch.from_numpy(pdfs[u.utt][keep]).to(device),
                               torch.from_numpy(w[keep]).to(device))
    if not (a.moments or a.tree or a.fmllr_model):
        return out
    a.features.apply(utts)
    if a.fmllr_model is not None:   # train_sat.sh without trans.*: gmm-est-fmllr from ali
        model = AcousticModel.read(a.fmllr_model)
        rep: dict = {}
        out.transforms = estimate_transforms(model, utts, read_alignment(a.pdf_ali, utts),
                                             silence_pdfs(model.tree, lang), a.cfg, report=rep)
        out.fmllr = rep
        for u in utts:
            u.feats = adapt_features(u.feats, out.transforms[u.speaker])
    if a.moments:
        out.moments = Moments()
        for u in utts:
            out.moments.accumulate(u.feats)
    if a.tree:
        prev = read_alignment(a.ali, utts)
        out.tree = TreeStats.accumulate(
            [(frame_contexts(prev[u.utt]), u.feats) for u in utts if u.utt in prev])
    return out


# ------------------------------------------------------------------ an iteration


@dataclass
class IterJob:
    """One job of an iteration, over its part: features of ``model`` (a model file) adapted by
    ``trans``; the alignment (``align``): ``viterbi`` (realign, written to
    ``ali_phone_state.JOB``), ``equal`` (mono's start, written too) or ``read`` from
    ``ali``; then what ``what`` asks, in this order: ``fmllr`` (the speakers' transforms
    re-estimated, composed with ``trans``, the features re-adapted), ``mllt`` (statistics),
    ``gmm`` (statistics and transition counts), ``moments``, ``alimdl`` (the unadapted
    features' statistics under the adapted ones' posteriors), ``final`` (the pdf alignment
    written too, ``ali.JOB``)."""

    part: Part
    model: str
    align: str = "read"
    ali: str | None = None
    trans: str | None = None
    what: tuple[str, ...] = ("gmm",)
    cfg: dict = field(default_factory=dict)
    progress: str | None = None     # a bar over the utterances aligned, named so (set for a
    #                                 job that runs alone in the stage's process)


@dataclass
class IterResult:
    acoustic: dict[str, float] = field(default_factory=dict)   # per aligned utterance
    failed: dict[str, str] = field(default_factory=dict)
    frames: int = 0                 # frames aligned
    align_seconds: float = 0.0
    compiled: int = 0               # training graphs compiled (not found on disk)
    stats: GmmStats | None = None
    counts: dict[int, np.ndarray] | None = None
    moments: Moments | None = None
    mllt: MlltStats | None = None
    transforms: dict[str, np.ndarray] | None = None
    fmllr: dict | None = None       # estimate_transforms's report
    alimdl: GmmStats | None = None
    alimdl_moments: Moments | None = None


def iter_job(a: IterJob) -> IterResult:
    from asrtrain.align.sat import compose_transforms, estimate_transforms, silence_pdfs

    c = a.cfg
    device = torch.device(c.get("device", "cpu"))
    model = AcousticModel.read(a.model)
    lang = Lang.read(a.part.lang_dir)
    utts = a.part.read(lang)
    base = {}
    for u in utts:
        u.feats = model_features(model, u.feats)
        base[u.utt] = u.feats
    trans = read_transforms(a.trans) if a.trans else None
    if trans is not None:
        for u in utts:
            u.feats = adapt_features(base[u.utt], _transform(trans, u, a.trans))
    out = IterResult()
    if a.align == "viterbi":
        t0 = time.time()
        cache = _graphs(a.part, model, c)
        with tqdm(total=len(utts), desc=a.progress, unit="utt", file=sys.stderr,
                  disable=None if a.progress else True, leave=False) as bar:
            res = _align_shard(model, lang, utts, c, cache, bar)
        if res.compiled and cache.graphs:
            with atomic_open(a.part.file("graphs.JOB.pt"), "wb") as f:
                torch.save(cache.graphs, f)
        out.compiled = res.compiled
        phone_state = {k: v.astype(np.int64) for k, v in res.phone_state.items()}
        out.acoustic, out.failed = res.acoustic, res.failed
        out.frames = sum(len(v) for v in phone_state.values())
        out.align_seconds = time.time() - t0
        _write_part(a.part, "ali_phone_state", phone_state)
        if "final" in a.what:
            _write_part(a.part, "ali", res.pdf)
    elif a.align == "equal":
        num_states = {p: lang.phones.topology(p).num_states for p in lang.phones.real_phone_ids}
        phone_state = {}
        for u in utts:
            eq = equal_alignment(lang, u.words, len(u.feats), num_states.__getitem__)
            if eq is None:
                out.failed[u.utt] = f"equal alignment impossible ({len(u.feats)} frames)"
                continue
            phone_state[u.utt] = np.array([ph * STATE_BITS + s for ph, s in eq], dtype=np.int64)
        _write_part(a.part, "ali_phone_state", phone_state)
    else:
        phone_state = read_alignment(a.ali, utts)
    aligned = [u for u in utts if u.utt in phone_state]
    if "fmllr" in a.what:
        pdfs = {u.utt: pdfs_of(model.tree, frame_contexts(phone_state[u.utt])) for u in aligned}
        rep: dict = {}
        new = estimate_transforms(model, utts, pdfs, silence_pdfs(model.tree, lang), c,
                                  report=rep)
        out.transforms = compose_transforms(new, trans)
        out.fmllr = rep
        for u in utts:
            u.feats = adapt_features(base[u.utt], out.transforms[u.speaker])
    if "mllt" in a.what:
        out.mllt = _mllt_stats(model, aligned, phone_state, lang, c, device)
    if "gmm" in a.what:
        _, out.stats, out.counts = accumulate_stats(
            model, ((u.feats, phone_state[u.utt]) for u in aligned), device)
    if "moments" in a.what:
        out.moments = Moments()
        for u in utts:
            out.moments.accumulate(u.feats)
    if "alimdl" in a.what:
        from asrtrain.align.sat import alimdl_stats

        out.alimdl, out.alimdl_moments = alimdl_stats(model, aligned, base, phone_state, device)
    return out


def _graphs(part: Part, model: AcousticModel, c: Mapping) -> GraphCache:
    """The job's training graphs: those its earlier alignments of the pass compiled, from
    ``graphs.JOB.pt`` (the pass's tree is fixed, and so are the job's utterances)."""
    cache = GraphCache(c.get("graph_cache_mb", 4096.0)).for_tree(model.tree)
    path = part.file("graphs.JOB.pt")
    if path.is_file():
        for utt, g in torch.load(path, weights_only=False).items():
            cache.keep(utt, g)
    return cache


def _mllt_stats(model: AcousticModel, utts: list[Utterance], phone_state: Mapping,
                lang: Lang, c: Mapping, device: torch.device) -> MlltStats:
    """``gmm-acc-mllt`` of the aligned utterances (silence weighted), in batches of frames."""
    from asrtrain.align.train import (
        batch_frames,
        frame_batches,
        frame_weights,
        silence_phone_mask,
    )

    gmm = model.gmm.to(device)
    silence = silence_phone_mask(lang)
    stats = MlltStats.zeros(gmm.dim, device)

    def frames():
        for u in utts:
            ps = phone_state[u.utt]
            w = frame_weights(ps, silence, c["silence_weight"])
            keep = w > 0
            yield u.feats[keep], pdfs_of(model.tree, frame_contexts(ps))[keep], w[keep]

    for feats, pdf, w in frame_batches(frames(), batch_frames(gmm, c["max_batch_mb"])):
        x = torch.from_numpy(feats).to(device)
        post = component_posteriors(gmm, x, torch.from_numpy(pdf).to(device),
                                    torch.from_numpy(w).to(device))
        stats.accumulate(x, post, c["max_batch_mb"])
    return stats


# ------------------------------------------------------------------ aligning a data dir


@dataclass
class AlignFmllrJob:
    """``align_fmllr.sh`` for one part: the alignment model on unadapted features, the
    speakers' transforms from that alignment (posteriors of the alignment model), the
    final model on the adapted features; both alignments written (``ali.JOB``,
    ``ali_phone_state.JOB``: the second)."""

    part: Part
    model: str
    alimdl: str
    cfg: dict = field(default_factory=dict)


@dataclass
class AlignFmllrResult:
    first: IterResult
    second: IterResult
    transforms: dict[str, np.ndarray]
    fmllr: dict


def align_fmllr_job(a: AlignFmllrJob) -> AlignFmllrResult:
    from asrtrain.align.sat import estimate_transforms, silence_pdfs

    c = a.cfg
    model, alimdl = AcousticModel.read(a.model), AcousticModel.read(a.alimdl)
    lang = Lang.read(a.part.lang_dir)
    utts = a.part.read(lang)
    for u in utts:
        u.feats = model_features(model, u.feats)
    cache = GraphCache(c.get("graph_cache_mb", 4096.0))
    results = []
    t0 = time.time()
    first = _align_shard(alimdl, lang, utts, c, cache.for_tree(alimdl.tree))
    results.append(IterResult(first.acoustic, first.failed,
                              sum(len(v) for v in first.pdf.values()), time.time() - t0))
    rep: dict = {}
    transforms = estimate_transforms(model, utts, first.pdf, silence_pdfs(model.tree, lang), c,
                                     posterior_model=alimdl, report=rep)
    for u in utts:
        u.feats = adapt_features(u.feats, transforms[u.speaker])
    t0 = time.time()
    second = _align_shard(model, lang, utts, c, cache.for_tree(model.tree))
    results.append(IterResult(second.acoustic, second.failed,
                              sum(len(v) for v in second.pdf.values()), time.time() - t0))
    _write_part(a.part, "ali_phone_state", second.phone_state)
    _write_part(a.part, "ali", second.pdf)
    return AlignFmllrResult(results[0], results[1], transforms, rep)


def sum_gmm(parts: Iterable[IterResult]) -> tuple[GmmStats, dict[int, np.ndarray]]:
    """``gmm-sum-accs``: the jobs' GMM statistics and transition counts, in job order."""
    stats, counts = None, {}
    for p in parts:
        if stats is None:
            stats = p.stats
        else:
            stats.add(p.stats)
        add_transition_counts(counts, p.counts)
    return stats, counts


def merge_fmllr_reports(reports: Iterable[dict]) -> dict:
    """The jobs' :func:`~asrtrain.align.sat.estimate_transforms` reports as one: speakers,
    identity and frames summed, the objective improvement per frame over all frames."""
    out = {"speakers": 0, "identity": 0, "frames": 0.0}
    gain = 0.0
    for r in reports:
        for k in out:
            out[k] += r[k]
        gain += r["objf_improvement_per_frame"] * r["frames"]
    out["frames"] = round(out["frames"], 1)
    out["objf_improvement_per_frame"] = gain / max(out["frames"], 1e-10)
    return out
