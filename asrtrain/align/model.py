"""The GMM-HMM acoustic model (tree + transition probabilities + GMMs) and its alignment passes.

A model is saved as ``final.mdl`` (a torch file) with ``tree.txt`` and ``num_pdfs`` beside it.
Alignments are written as two Kaldi int32-vector tables (readable by ``copy-int-vector``):
``ali.ark``/``ali.scp`` with the pdf id of every frame (what the hybrid trainer needs) and
``ali_phone_state.ark``/``.scp`` with ``8 * phone_id + hmm_state`` per frame, which is
independent of the tree and lets the next pass accumulate context statistics (the role of Kaldi's
transition-id alignments).

A model's features are CMN'd MFCCs mapped by :func:`model_features`: Δ/ΔΔ (``delta_order``), or,
for LDA+MLLT models, spliced frames times ``lda_mllt`` (Kaldi's ``final.mat``).  A SAT model
(``sat``) was trained on those features with each speaker's fMLLR transform applied
(``trans.{ark,scp}``, :func:`write_transforms`, :func:`read_transforms`); its speaker-independent
twin for the first decoding pass is ``final.alimdl`` (``AcousticModel.load(dir,
alignment_model=True)``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import kaldiio
import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.adapt.lda import apply_transform
from asrtrain.adapt.splice import splice_frames
from asrtrain.align.gmm import DiagGmmSet, GmmStats
from asrtrain.align.graph import (
    HmmGraph,
    hmm_graph,
    phone_graph,
    scale_transitions,
    transition_table,
)
from asrtrain.align.tree import Tree
from asrtrain.align.viterbi import Alignment, viterbi_states
from asrtrain.data.datadir import DataDir
from asrtrain.features.ark import load_matrix
from asrtrain.features.reader import FeatureReader
from asrtrain.features.transform import add_deltas
from asrtrain.fileio import atomic_ark, atomic_open, write_text
from asrtrain.lang.lexicon import Lang
from asrtrain.progress import Bar

log = logging.getLogger(__name__)

STATE_BITS = 8   # ali_phone_state value = phone * 8 + hmm_state


@dataclass
class Utterance:
    utt: str
    words: list[str]
    feats: np.ndarray    # [T, D] the model's features (see :func:`model_features`)
    speaker: str = ""


def read_utterances(data_dir: Path, lang: Lang) -> tuple[list[Utterance], dict[str, str]]:
    """Text, speaker and CMN'd MFCCs (Kaldi apply-cmvn: per-speaker means, no variance
    normalization) of every utterance, before deltas or splicing.  Returns the utterances and the
    ones left out with why (transcript words outside the lexicon when it has no <unk>); an
    utterance without features is an error (see :class:`FeatureReader`)."""
    reader = mfcc_reader(data_dir)
    data = reader.data
    words, skipped = transcripts(data, lang)
    out = [Utterance(utt, words[utt], reader[utt], data.utt2spk[utt])
           for utt in Bar(words, desc=f"reading {Path(data_dir).name}", unit="utt",
                           file=sys.stderr, disable=None, leave=False)]
    return out, skipped


def mfcc_reader(data_dir: Path | str) -> FeatureReader:
    """CMN'd MFCCs of a data dir (Kaldi apply-cmvn: per-speaker means, no variances)."""
    return FeatureReader(data_dir, 0, norm_vars=False, require_cmvn=True,
                         hint="run the mfcc features stage first")


def transcripts(data: DataDir, lang: Lang, utts: Iterable[str] | None = None
                ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The words of each utterance (of ``utts``, default all; words outside the lexicon
    mapped to ``<unk>`` when it has one), and the utterances left out with why (a word outside
    a lexicon without ``<unk>``).  Reads the text only, no features."""
    out, skipped = {}, {}
    for utt in data.utts if utts is None else utts:
        words = []
        for w in data.text.get(utt, "").split():
            if w not in lang.lexicon:
                if "<unk>" not in lang.lexicon:
                    skipped[utt] = f"word {w!r} is not in the lexicon"
                    break
                w = "<unk>"
            words.append(w)
        if utt not in skipped:
            out[utt] = words
    return out, skipped


def load_data(data_dir: Path, lang: Lang, model_or_delta_order: AcousticModel | int = 2,
              transforms: Mapping[str, np.ndarray] | None = None
              ) -> tuple[list[Utterance], dict[str, str]]:
    """The utterances of a data dir as a model sees them: :func:`read_utterances`, then
    :func:`model_features` (a model, or a delta order for Δ features), then each speaker's
    fMLLR transform when ``transforms`` (speaker -> ``[dim, dim+1]``) is given."""
    utts, skipped = read_utterances(data_dir, lang)
    for u in utts:
        u.feats = model_features(model_or_delta_order, u.feats)
    if transforms is not None:
        adapt_utterances(utts, transforms, where=str(data_dir))
    return utts, skipped


def model_features(model_or_delta_order: AcousticModel | int, cmn: np.ndarray) -> np.ndarray:
    """CMN'd MFCCs ``[T, 13]`` -> the model's features, float32: ``add-deltas`` for a Δ model
    (an int is a delta order), ``splice-feats | transform-feats final.mat`` for an LDA+MLLT
    one (the same arithmetic whatever reads the features: training, alignment, decoding)."""
    m = model_or_delta_order
    if isinstance(m, int | np.integer):
        return add_deltas(cmn, int(m))
    if m.lda_mllt is None:
        return add_deltas(cmn, m.delta_order)
    return lda_features(cmn, m.splice, m.lda_mllt)


def lda_features(cmn: np.ndarray, splice: tuple[int, int], matrix: np.ndarray) -> np.ndarray:
    """``splice-feats --left-context=L --right-context=R | transform-feats matrix``, float32."""
    x = splice_frames(torch.from_numpy(np.asarray(cmn, dtype=np.float32)), *splice)
    return apply_transform(x, torch.from_numpy(matrix)).float().numpy()


def adapt_features(feats: np.ndarray, transform: np.ndarray) -> np.ndarray:
    """``transform-feats`` with one speaker's fMLLR ``[A b]``: ``A x + b`` per frame, float32."""
    return apply_transform(torch.from_numpy(feats),
                           torch.from_numpy(np.asarray(transform, dtype=np.float64))
                           ).float().numpy()


def adapt_utterances(utts: list[Utterance], transforms: Mapping[str, np.ndarray],
                     where: str = "") -> None:
    """Replace each utterance's features by its speaker's adapted ones (in place); a speaker
    without a transform is an error naming it."""
    for u in utts:
        w = transforms.get(u.speaker)
        if w is None:
            raise AsrtrainError(f"{where}: no fMLLR transform for speaker {u.speaker!r} "
                                f"(utterance {u.utt})")
        u.feats = adapt_features(u.feats, w)


@dataclass
class AcousticModel:
    """Tree, GMMs, transitions and the feature pipeline they were trained on: Δ features of
    ``delta_order``, or, when ``lda_mllt`` is set, frames spliced ``splice = (left, right)``
    times ``lda_mllt`` (``[dim, D*(L+1+R)]``, or ``+1`` offset column: Kaldi's ``final.mat``,
    LDA then MLLT composed); ``sat``: trained on speaker-adapted (fMLLR) features."""

    tree: Tree
    gmm: DiagGmmSet
    log_trans: dict[int, np.ndarray]    # phone -> [n, n+1] log transition probabilities
    delta_order: int
    var_floor: np.ndarray
    splice: tuple[int, int] = (0, 0)
    lda_mllt: np.ndarray | None = None
    sat: bool = False

    @property
    def num_pdfs(self) -> int:
        return self.tree.num_pdfs

    @property
    def kind(self) -> str:
        """``deltas``, ``lda_mllt`` or ``sat`` (the pass types of ``align.passes``)."""
        return "sat" if self.sat else "lda_mllt" if self.lda_mllt is not None else "deltas"

    def state_dict(self) -> dict:
        d = {"tree": self.tree.state_dict(), "gmm": self.gmm.state_dict(),
             "log_trans": {p: torch.from_numpy(m) for p, m in self.log_trans.items()},
             "delta_order": self.delta_order,
             "var_floor": torch.from_numpy(self.var_floor)}
        if self.lda_mllt is not None or self.sat:   # a Δ model's file is as it always was
            d.update(splice=list(self.splice), sat=bool(self.sat),
                     lda_mllt=None if self.lda_mllt is None else torch.from_numpy(self.lda_mllt))
        return d

    def save(self, out_dir: Path, phone_names: list[str]) -> None:
        with atomic_open(out_dir / "final.mdl", "wb") as f:
            torch.save(self.state_dict(), f)
        write_text(out_dir / "tree.txt", self.tree.write_text(phone_names))
        write_text(out_dir / "num_pdfs", f"{self.num_pdfs}\n")

    def save_alignment_model(self, out_dir: Path) -> None:
        """``final.alimdl``: the speaker-independent model of a SAT pass (same tree)."""
        with atomic_open(out_dir / "final.alimdl", "wb") as f:
            torch.save(self.state_dict(), f)

    def write(self, path: Path | str) -> None:
        """The model alone, to ``path`` (read back by :meth:`read`)."""
        with atomic_open(path, "wb") as f:
            torch.save(self.state_dict(), f)

    @classmethod
    def load(cls, model_dir: Path, alignment_model: bool = False) -> AcousticModel:
        """``final.mdl``; with ``alignment_model``, ``final.alimdl`` when the dir has one (a SAT
        pass), else ``final.mdl`` (as Kaldi's align_fmllr.sh and decode_fmllr.sh choose)."""
        path = Path(model_dir) / "final.mdl"
        if alignment_model and (Path(model_dir) / "final.alimdl").is_file():
            path = Path(model_dir) / "final.alimdl"
        if not path.is_file():
            raise AsrtrainError(f"{path}: no model; train this pass first")
        return cls.read(path)

    @classmethod
    def read(cls, path: Path | str) -> AcousticModel:
        """A model file (``final.mdl``, ``final.alimdl``, or the one a pass's jobs read); one
        cut short or of another kind is an error naming it."""
        try:
            d = torch.load(path, weights_only=True)
            mat = d.get("lda_mllt")
            return cls(Tree.from_state_dict(d["tree"]), DiagGmmSet.from_state_dict(d["gmm"]),
                       {int(p): m.numpy() for p, m in d["log_trans"].items()},
                       int(d["delta_order"]), d["var_floor"].numpy(),
                       tuple(int(v) for v in d.get("splice", (0, 0))),
                       None if mat is None else mat.numpy(), bool(d.get("sat", False)))
        except (AsrtrainError, FileNotFoundError):
            raise
        except Exception as e:  # noqa: BLE001 - torch's zip reader says neither file nor why
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AsrtrainError(f"{path}: not a whole GMM model ({why}); it was cut short or "
                                "altered: rerun its pass (--force align)") from e


def initial_log_trans(lang: Lang) -> dict[int, np.ndarray]:
    out = {}
    for p in lang.phones.real_phone_ids:
        topo = lang.phones.topology(p)
        m = np.full((topo.num_states, topo.num_states + 1), -np.inf)
        for s, arcs in enumerate(topo.transitions):
            for d, prob in arcs:
                m[s, d] = math.log(prob)
        out[p] = m
    return out


def estimate_log_trans(counts: dict[int, np.ndarray], prior: dict[int, np.ndarray],
                       floor: float = 0.01, min_count: float = 5.0) -> dict[int, np.ndarray]:
    """ML transition probabilities per (phone, HMM state) from counts; states seen fewer than
    ``min_count`` times keep their previous probabilities (Kaldi's MleUpdate)."""
    out = {}
    for p, old in prior.items():
        new = old.copy()
        c = counts.get(p)
        if c is not None:
            allowed = np.isfinite(old)
            for s in range(old.shape[0]):
                tot = c[s][allowed[s]].sum()
                if tot >= min_count:
                    prob = np.where(allowed[s], np.maximum(c[s] / tot, floor), 0.0)
                    prob /= prob.sum()
                    new[s] = np.where(allowed[s], np.log(np.maximum(prob, 1e-30)), -np.inf)
        out[p] = new
    return out


def frame_contexts(phone_state: np.ndarray) -> np.ndarray:
    """``[T, 4]`` (left, phone, right, hmm_state) per frame from a phone-state alignment.  A new
    phone starts where HMM state 0 follows a non-zero state (every HMM enters at state 0 and
    never returns to it)."""
    first = np.zeros(len(phone_state), dtype=bool)
    first[:1] = True
    return _contexts(np.asarray(phone_state), first)[0]


def _contexts(phone_state: np.ndarray, utt_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`frame_contexts` of many alignments laid end to end (``utt_start`` marks each
    one's first frame: a phone never runs across it, and the context there is 0), and where
    each phone starts."""
    phones = phone_state // STATE_BITS
    states = phone_state % STATE_BITS
    starts = utt_start.copy()
    starts[1:] |= (states[1:] == 0) & ((states[:-1] != 0) | (phones[1:] != phones[:-1]))
    seg = np.cumsum(starts) - 1
    seg_phone = phones[starts]
    seg_first = utt_start[starts]                     # the segment opens an utterance
    seg_last = np.append(seg_first[1:], True)         # the segment closes one
    left = np.where(seg_first, 0, np.concatenate([[0], seg_phone[:-1]]))[seg]
    right = np.where(seg_last, 0, np.concatenate([seg_phone[1:], [0]]))[seg]
    return np.stack([left, phones, right, states], axis=1), starts


def transition_counts(phone_state: np.ndarray, counts: dict[int, np.ndarray],
                      log_trans: dict[int, np.ndarray]) -> None:
    """Add the HMM transitions taken in one alignment to ``counts[phone][state, next]`` (the last
    column counts leaving the phone)."""
    first = np.zeros(len(phone_state), dtype=bool)
    first[:1] = True
    ctx, starts = _contexts(np.asarray(phone_state), first)
    _add_transitions(ctx, starts, counts, log_trans)


def _add_transitions(ctx: np.ndarray, starts: np.ndarray, counts: dict[int, np.ndarray],
                     log_trans: Mapping[int, np.ndarray]) -> None:
    """:func:`transition_counts` of alignments laid end to end (``ctx``, ``starts`` from
    :func:`_contexts`): every frame's ``(phone, state, next)`` as one index into all phones'
    matrices flattened, counted by one ``bincount``."""
    if not len(ctx):
        return
    phones, states = ctx[:, 1], ctx[:, 3]
    leaves = np.append(starts[1:], True)     # the next frame starts a phone (or an utterance)
    nxt = np.append(states[1:], 0)
    ids = np.unique(phones)
    missing = [int(p) for p in ids if int(p) not in log_trans]
    if missing:
        raise KeyError(missing[0])
    width = np.zeros(int(ids[-1]) + 1, dtype=np.int64)        # columns: states + 1
    size = np.array([log_trans[int(p)].size for p in ids], dtype=np.int64)
    offset = np.zeros(int(ids[-1]) + 1, dtype=np.int64)
    offset[ids] = np.cumsum(size) - size
    width[ids] = [log_trans[int(p)].shape[1] for p in ids]
    w = width[phones]
    flat = offset[phones] + states * w + np.where(leaves, w - 1, nxt)
    total = np.bincount(flat, minlength=int(size.sum())).astype(np.float64)
    for p, off, n in zip(ids.tolist(), offset[ids].tolist(), size.tolist(), strict=True):
        c = counts.setdefault(p, np.zeros_like(log_trans[p]))
        c += total[off:off + n].reshape(c.shape)


def pdfs_of(tree: Tree, ctx: np.ndarray) -> np.ndarray:
    """The pdf of every frame from its ``(left, phone, right, hmm_state)`` context."""
    return tree.pdfs(ctx)


def accumulate_stats(model: AcousticModel, items: Iterable[tuple[np.ndarray, np.ndarray]],
                     device: torch.device | str = "cpu", batch_frames: int = 65536
                     ) -> tuple[DiagGmmSet, GmmStats, dict[int, np.ndarray]]:
    """``gmm-acc-stats-ali``: GMM statistics and transition counts of ``(feats, phone-state
    alignment)`` pairs; returns the model's GMM on ``device``, the statistics and the counts.
    A job's statistics add up with :meth:`GmmStats.add` and :func:`add_transition_counts`
    (``gmm-sum-accs``), so the sum over jobs does not depend on how the data was split (up to
    float rounding: the items go through in batches of about ``batch_frames`` frames, each
    one call of the tree lookup, the transition count and :meth:`DiagGmmSet.accumulate`)."""
    gmm = model.gmm.to(device)
    stats = gmm.zero_stats()
    counts: dict[int, np.ndarray] = {}
    feats: list[np.ndarray] = []
    align: list[np.ndarray] = []

    def flush() -> None:
        ps = np.concatenate(align).astype(np.int64)
        first = np.zeros(len(ps), dtype=bool)
        first[np.cumsum([0] + [len(a) for a in align[:-1]])] = True
        ctx, starts = _contexts(ps, first)
        pdf = model.tree.pdfs(ctx)
        gmm.accumulate(torch.from_numpy(np.concatenate(feats)).to(device),
                       torch.from_numpy(pdf).to(device), stats)
        _add_transitions(ctx, starts, counts, model.log_trans)
        feats.clear()
        align.clear()

    frames = 0
    for f, ps in items:
        if len(ps) != len(f):
            raise AsrtrainError(f"accumulate_stats: an alignment of {len(ps)} frames for "
                                f"features of {len(f)}")
        if not len(ps):
            continue
        feats.append(f)
        align.append(ps)
        frames += len(ps)
        if frames >= batch_frames:
            flush()
            frames = 0
    if align:
        flush()
    return gmm, stats, counts


def add_transition_counts(total: dict[int, np.ndarray], part: Mapping[int, np.ndarray]) -> None:
    """Add one job's transition counts to ``total`` (in place)."""
    for p, c in part.items():
        if p in total:
            total[p] = total[p] + c
        else:
            total[p] = c.copy()


@dataclass
class AlignResult:
    phone_state: dict[str, np.ndarray]
    pdf: dict[str, np.ndarray]
    words: dict[str, np.ndarray]          # word index in the transcript per frame (-1: silence)
    failed: dict[str, str]
    loglike_per_frame: float
    frames: int
    seconds: float


class GraphCache:
    """Training graphs compiled once per utterance and reused by every alignment of a pass (as
    Kaldi's ``fsts.*.gz``): the structure depends on the lexicon, the transcript and the tree
    only; transition log weights are applied at alignment time (:meth:`HmmGraph.reweighted`),
    so re-estimated transitions need no recompile.  A different tree empties the cache.

    Memory is bounded by ``max_mb`` (about 150 bytes per frame of speech on the tiny corpus's
    triphone graphs): past it, graphs are compiled afresh each time, which costs about 4 us per
    frame against the tens of microseconds of aligning it, so a corpus too big to keep is slower
    by a few percent, not out of memory.  A training pass's jobs keep theirs on disk for the
    pass, a file per batch of speakers (``graphs.JOB.B.pt``, :mod:`asrtrain.align.passjobs`): a
    graph is valid for one tree, i.e. one pass, and a job holds one batch's graphs at a time."""

    def __init__(self, max_mb: float = 4096.0) -> None:
        self.max_bytes = max_mb * 2 ** 20
        self.tree: Tree | None = None
        self.graphs: dict[str, HmmGraph] = {}
        self.bytes = 0
        self.compiled = 0     # graphs compiled (not found here), for the log and the tests

    def for_tree(self, tree: Tree) -> GraphCache:
        if self.tree is not tree:
            self.tree, self.graphs, self.bytes = tree, {}, 0
        return self

    def get(self, lang: Lang, u: Utterance, scaled: dict[int, np.ndarray]) -> HmmGraph:
        g = self.graphs.get(u.utt)
        if g is None:
            # the scaled matrices have the shapes of the log transitions: the structure is
            # the same whatever the probabilities
            g = hmm_graph(lang, phone_graph(lang, u.words), self.tree.pdf, scaled,
                          scaled=scaled)
            self.compiled += 1
            self.keep(u.utt, g)
        return g

    def keep(self, utt: str, g: HmmGraph) -> None:
        """Store ``g`` unless the cache is full."""
        size = sum(v.nbytes for v in vars(g).values() if isinstance(v, np.ndarray))
        if self.bytes + size <= self.max_bytes and utt not in self.graphs:
            self.graphs[utt] = g
            self.bytes += size


@dataclass
class _ShardResult:
    """What aligning a shard of utterances gives back (graphs: the ones it had to compile)."""

    phone_state: dict[str, np.ndarray]
    pdf: dict[str, np.ndarray]
    words: dict[str, np.ndarray]
    failed: dict[str, str]
    acoustic: dict[str, float]
    graphs: dict[str, HmmGraph]
    compiled: int = 0


def align_graphs(gmm: DiagGmmSet, graphs: list[HmmGraph], feats: list[torch.Tensor],
                 acoustic_scale: float, device: torch.device,
                 max_batch_mb: float = 256.0) -> list[Alignment]:
    """Viterbi-align one batch: each utterance's likelihoods for the pdfs of its own graph only
    (:meth:`DiagGmmSet.pdf_loglikes`), gathered to its states, then one batched search."""
    states = []
    for g, x in zip(graphs, feats, strict=True):
        uniq, inv = np.unique(g.pdf, return_inverse=True)
        ll = gmm.pdf_loglikes(x.to(device), torch.from_numpy(uniq).to(device), max_batch_mb)
        states.append(torch.index_select(ll, 1, torch.from_numpy(inv.reshape(-1)).to(device)))
    return viterbi_states(graphs, states, acoustic_scale, device)


def _align_shard(model: AcousticModel, lang: Lang, utts: list[Utterance], cfg: Mapping,
                 cache: GraphCache, bar: Bar | None = None) -> _ShardResult:
    """Align ``utts`` in batches of about ``batch_frames`` frames, shortest first."""
    device = torch.device(cfg.get("device", "cpu"))
    gmm = model.gmm.to(device)
    scaled = scale_transitions(model.log_trans, cfg.get("self_loop_scale", 0.1),
                               cfg.get("transition_scale", 1.0))
    table = transition_table(scaled).table
    known, compiled = set(cache.graphs), cache.compiled
    out = _ShardResult({}, {}, {}, {}, {}, {})

    def run(batch: list[Utterance]) -> None:
        hgs = [cache.get(lang, u, scaled).reweighted(table) for u in batch]
        feats = [torch.from_numpy(u.feats) for u in batch]
        found = align_graphs(gmm, hgs, feats, cfg.get("acoustic_scale", 0.1), device,
                             cfg.get("max_batch_mb", 256.0))
        for u, g, a in zip(batch, hgs, found, strict=True):
            if a.states is None:
                out.failed[u.utt] = f"no path through the graph ({len(u.feats)} frames)"
                continue
            out.phone_state[u.utt] = (g.phone[a.states] * STATE_BITS
                                      + g.hmm_state[a.states]).astype(np.int32)
            out.pdf[u.utt] = g.pdf[a.states].astype(np.int32)
            out.words[u.utt] = g.word[a.states].astype(np.int32)
            out.acoustic[u.utt] = a.acoustic
        if bar is not None:
            bar.update(len(batch))

    budget = int(cfg.get("batch_frames", 20000))
    batch: list[Utterance] = []
    for u in sorted(utts, key=lambda u: (len(u.feats), u.utt)):
        if batch and sum(len(b.feats) for b in batch) + len(u.feats) > budget:
            run(batch)
            batch = []
        batch.append(u)
    if batch:
        run(batch)
    out.graphs = {k: g for k, g in cache.graphs.items() if k not in known}
    out.compiled = cache.compiled - compiled
    return out


@dataclass
class _ShardJob:
    """One job of :func:`_align_parallel`: everything it aligns travels in it (a job inherits
    nothing: under ``cmd: slurm`` it runs in a fresh interpreter)."""

    model: AcousticModel
    lang: Lang
    utts: list[Utterance]
    cfg: dict
    cache: GraphCache


def _shard_job(a: _ShardJob) -> _ShardResult:
    return _align_shard(a.model, a.lang, a.utts, a.cfg, a.cache)


def _align_parallel(model: AcousticModel, lang: Lang, utts: list[Utterance], cfg: Mapping,
                    cache: GraphCache, nj: int, bar: Bar) -> list[_ShardResult]:
    """``nj`` jobs (:func:`asrtrain.jobs.run_jobs`) over shards of utterances held in memory
    (every nj-th by length, so the shards are alike), each sent its utterances and the graphs
    already compiled for them; they return the alignments and the graphs they compiled (kept
    for the next call).  For callers with the utterances in memory (the decoder's word
    timing); the training passes' jobs read their own data (:mod:`asrtrain.align.passjobs`)."""
    from asrtrain.jobs import JobConfig, run_jobs

    order = sorted(utts, key=lambda u: (len(u.feats), u.utt))
    num_shards = min(len(order), nj)   # one per job: batches as full as with one process
    args = []
    for i in range(num_shards):
        shard = order[i::num_shards]
        part = GraphCache(cache.max_bytes / 2 ** 20).for_tree(cache.tree)
        for u in shard:
            if u.utt in cache.graphs:
                part.keep(u.utt, cache.graphs[u.utt])
        args.append(_ShardJob(model, lang, shard, dict(cfg), part))
    parts = run_jobs(_shard_job, args, JobConfig(nj=nj), "align")
    for part in parts:
        for utt, g in part.graphs.items():
            cache.keep(utt, g)
        cache.compiled += part.compiled
        bar.update(len(part.acoustic) + len(part.failed))
    return parts


def align(model: AcousticModel, lang: Lang, utts: list[Utterance], cfg: Mapping,
          graphs: GraphCache | None = None, desc: str = "align") -> AlignResult:
    """Viterbi-align ``utts`` through their training graphs (compiled once into ``graphs``, see
    :class:`GraphCache`), batched (``batch_frames`` frames of speech per batch, utterances sorted
    by length), in ``nj`` parallel jobs on the CPU (one process on a GPU); the same alignments
    whatever ``nj``.  ``desc`` names the progress bar."""
    t0 = time.time()
    cache = (graphs if graphs is not None else GraphCache()).for_tree(model.tree)
    nj = min(int(cfg.get("nj", 1)), len(utts))
    if torch.device(cfg.get("device", "cpu")).type != "cpu":
        nj = 1
    with Bar(total=len(utts), desc=desc, unit="utt", file=sys.stderr, disable=None,
              leave=False) as bar:
        if nj > 1:
            parts = _align_parallel(model, lang, utts, cfg, cache, nj, bar)
        else:
            parts = [_align_shard(model, lang, utts, cfg, cache, bar)]
    res = AlignResult({}, {}, {}, {}, 0.0, 0, 0.0)
    acoustic: dict[str, float] = {}
    for part in parts:
        res.phone_state.update(part.phone_state)
        res.pdf.update(part.pdf)
        res.words.update(part.words)
        res.failed.update(part.failed)
        acoustic.update(part.acoustic)
    res.frames = sum(len(res.pdf[k]) for k in res.pdf)
    total = sum(acoustic[k] for k in sorted(acoustic))   # one order whatever the shards
    res.loglike_per_frame = total / max(res.frames, 1)
    res.seconds = time.time() - t0
    return res


def check_failures(res: AlignResult, num_utts: int, max_fail_fraction: float,
                   where: str) -> None:
    for utt, why in sorted(res.failed.items()):
        log.warning("%s: alignment failed for %s: %s", where, utt, why)
    if num_utts and len(res.failed) / num_utts > max_fail_fraction:
        raise AsrtrainError(f"{where}: {len(res.failed)} of {num_utts} utterances failed to "
                            f"align (more than align.max_fail_fraction={max_fail_fraction}); "
                            f"first: {sorted(res.failed.items())[:3]}")


def write_alignments(out_dir: Path, res: AlignResult) -> None:
    """ali.ark/scp (pdf ids) and ali_phone_state.ark/scp, int32 vectors, written atomically."""
    for name, table in (("ali", res.pdf), ("ali_phone_state", res.phone_state)):
        ark = (out_dir / f"{name}.ark").resolve()  # the scp is read from other directories
        with atomic_ark(ark, out_dir / f"{name}.scp") as w:
            for utt in sorted(table):
                w(utt, table[utt].astype(np.int32))


def merge_alignments(out_dir: Path, parts: Iterable[Path]) -> int:
    """``ali.{ark,scp}`` and ``ali_phone_state.{ark,scp}`` of ``out_dir`` from the jobs'
    ``ali.JOB.scp`` and ``ali_phone_state.JOB.scp`` (``parts``: ``(dir, JOB)`` pairs), in
    sorted utterance order whatever the split (so the same bytes whatever ``nj``), one
    utterance in memory at a time.  Returns the number of utterances."""
    parts = list(parts)
    count = 0
    for name in ("ali", "ali_phone_state"):
        where = {}
        for d, j in parts:
            scp = Path(d) / f"{name}.{j}.scp"
            where.update({utt: (scp, spec) for utt, spec in _scp_specs(scp).items()})
        ark = (out_dir / f"{name}.ark").resolve()  # the scp is read from other directories
        with atomic_ark(ark, out_dir / f"{name}.scp") as w:
            for utt in sorted(where):
                scp, spec = where[utt]
                w(utt, _int_vector(scp, utt, spec))
        count = len(where)
    return count


def read_int_table(scp: Path) -> dict[str, np.ndarray]:
    if not scp.is_file():
        raise AsrtrainError(f"{scp}: missing")
    return read_int_vectors(scp)


_KALDI_INT32 = np.dtype([("size", "i1"), ("value", "<i4")])


def read_int_vectors(scp: Path | str, keys: Iterable[str] | None = None
                     ) -> dict[str, np.ndarray]:
    """The int32 vectors of a Kaldi table (``ali.scp``), all or those of ``keys`` that it has,
    each read as one numpy buffer (kaldiio unpacks them a value at a time: ~18 us a frame, more
    than an accumulation iteration).  An entry in another form (text, a pipe) goes through
    kaldiio."""
    specs = _scp_specs(scp)
    if keys is not None:
        specs = {k: specs[k] for k in keys if k in specs}
    return {k: _int_vector(scp, k, spec) for k, spec in sorted(specs.items(),
                                                                  key=lambda kv: kv[1])}


def _scp_specs(scp: Path | str) -> dict[str, str]:
    with open(scp, encoding="utf-8") as f:
        return {p[0]: p[1].strip() for p in (line.split(None, 1) for line in f) if len(p) == 2}


def _int_vector(scp: Path | str, key: str, spec: str) -> np.ndarray:
    """One entry ``path:offset`` of an int32-vector table (Kaldi's binary ``\\0B``, then the
    size and each value as a 1-byte width and an int32)."""
    path, _, offset = spec.rpartition(":")
    if not (path and offset.isdigit()):
        return load_matrix(spec, f"{scp}: {key}")
    with open(path, "rb") as f:
        f.seek(int(offset))
        head = f.read(7)
        n = int.from_bytes(head[3:7], "little", signed=True) if len(head) == 7 else -1
        if head[:3] != b"\0B\x04" or n < 0:
            return load_matrix(spec, f"{scp}: {key}")
        v = np.frombuffer(f.read(5 * n), dtype=_KALDI_INT32)
    if len(v) != n or (v["size"] != 4).any():
        raise AsrtrainError(f"{scp}: {key}: not an int32 vector at {spec}")
    return v["value"].astype(np.int32)


def write_transforms(out_dir: Path, transforms: Mapping[str, np.ndarray]) -> None:
    """``trans.ark``/``trans.scp``: one float32 ``[dim, dim+1]`` fMLLR matrix per speaker, as
    Kaldi's ``trans.*`` (``copy-matrix`` reads them), written atomically."""
    ark = (Path(out_dir) / "trans.ark").resolve()   # the scp is read from other directories
    with atomic_ark(ark, Path(out_dir) / "trans.scp") as w:
        for spk in sorted(transforms):
            w(spk, np.asarray(transforms[spk], dtype=np.float32))


def read_transforms(path: Path, dim: int | None = None) -> dict[str, np.ndarray]:
    """Speaker -> ``[dim, dim+1]`` fMLLR matrix from ``trans.scp``, ``trans.ark`` (or a dir
    holding ``trans.scp``), Kaldi's or ours; every problem names the file and the speaker."""
    path = Path(path)
    if path.is_dir():
        path = path / "trans.scp"
    if not path.is_file():
        raise AsrtrainError(f"{path}: missing (no fMLLR transforms)")
    try:
        table = (dict(kaldiio.load_scp(str(path))) if path.suffix == ".scp"
                 else dict(kaldiio.load_ark(str(path))))
        out = {spk: np.asarray(table[spk], dtype=np.float64) for spk in table}
    except AsrtrainError:
        raise
    except Exception as e:
        raise AsrtrainError(f"{path}: cannot read fMLLR transforms: {e}") from e
    for spk, m in out.items():
        _check_transform(path, spk, m, dim)
    if not out:
        raise AsrtrainError(f"{path}: no fMLLR transform in it")
    return out


def _check_transform(path: Path, spk: str, m: np.ndarray, dim: int | None) -> None:
    if m.ndim != 2 or m.shape[1] != m.shape[0] + 1 or (dim is not None and m.shape[0] != dim):
        want = f"[{dim}, {dim + 1}]" if dim is not None else "[dim, dim+1]"
        raise AsrtrainError(f"{path}: speaker {spk}: fMLLR transform of shape {m.shape}, "
                            f"expected {want}")
    if not np.isfinite(m).all():
        raise AsrtrainError(f"{path}: speaker {spk}: fMLLR transform has non-finite values")
    if abs(np.linalg.det(m[:, :-1])) == 0.0:
        raise AsrtrainError(f"{path}: speaker {spk}: fMLLR transform is singular")
