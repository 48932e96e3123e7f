"""The jobs of a GMM pass, as Kaldi's ``JOB=1:$nj`` pipelines, one job a **block**: the data
dir's blocks of whole speakers (:func:`asrtrain.data.datadir.split_data_dir`, Kaldi's
``data/<set>/split<N>/<k>``, cut by a rule that does not involve ``nj``), each job reading its
block's own data dir from disk, with the model, matrix and transforms the parent wrote into the
pass's work dir, and returning statistics only (``gmm-acc-stats-ali``, ``acc-tree-stats``,
``acc-lda``, ``gmm-acc-mllt``, ``gmm-acc-stats-twofeats``, the global moments of
``gmm-init-mono`` and the variance floor), its speakers' fMLLR transforms (``gmm-est-fmllr``: a
block holds whole speakers) and, when it aligns, its alignment part on disk (``ali.K``, as
Kaldi's ``ali.JOB.gz``).  ``nj`` is only how many processes serve the blocks; the parent adds
the statistics in block order (``gmm-sum-accs``, :meth:`asrtrain.align.passes.PassJobs.run`)
and merges the parts in utterance order, so the results are the same bytes whatever ``nj``; it
never holds the corpus's features.

Jobs are module-level functions of one picklable argument run by :func:`asrtrain.jobs.run_jobs`:
the same code in a forked pool or a fresh interpreter on a cluster.  A job streams its block:
it reads, adapts, aligns and accumulates one batch of whole speakers at a time
(:meth:`Part.batches`, about ``part_batch_frames`` frames; Kaldi's piped jobs read one utterance
at a time, fMLLR needs a speaker's every utterance), so its memory is its block's tables, the
model, the statistics and one batch, whatever the corpus.  Statistics run through each batch in
the block's order into one accumulator, so they are the same bits whatever the batch size.  The
training graphs a job compiles at its first alignment of a pass stay on disk per batch for the
next (``graphs.K.B.pt``, Kaldi's ``fsts.JOB.gz``; the blocks and their batches are fixed, so
block ``k``'s batch ``b`` always aligns the same utterances).

Within a pass, what a job reads that does not change (the lang dir, its block's tables) is kept
by the process that ran it, keyed by the pass's work dir (:func:`cached`, one of each kind: the
block it works on), so the pool that :class:`asrtrain.jobs.JobPool` keeps for the pass reads the
lang once per worker, not once per block and iteration.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from asrtrain import AsrtrainError
from asrtrain.adapt.lda import LdaStats
from asrtrain.adapt.mllt import MlltStats
from asrtrain.adapt.posteriors import component_posteriors
from asrtrain.adapt.splice import splice_frames
from asrtrain.align.frames import (
    Moments,
    alimdl_stats,
    batch_frames,
    compose_transforms,
    estimate_transforms,
    frame_batches,
    frame_weights,
    silence_pdfs,
    silence_phone_mask,
)
from asrtrain.align.gmm import GmmStats
from asrtrain.align.graph import equal_alignment
from asrtrain.align.model import (
    STATE_BITS,
    AcousticModel,
    GraphCache,
    Utterance,
    _align_shard,
    _int_vector,
    _scp_specs,
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
from asrtrain.progress import Bar

#: Frames of speech (whole speakers) a job holds at once: ~0.55 h, about 100-200 MB of
#: features, adapted copies and training graphs (GmmConfig.part_batch_frames).
PART_BATCH_FRAMES = 200_000

_CACHE: dict[tuple[str, str, str], object] = {}


def cached(work: str, kind: str, path: str, make: Callable[[str], object]) -> object:
    """``make(path)``, kept by this process for the pass whose work dir is ``work`` (the lang
    dir, the data dir's tables: they do not change within a pass); :func:`forget` drops them."""
    key = (str(work), kind, str(path))
    if key not in _CACHE:
        # one of each kind: a worker that serves many blocks holds the tables of the block
        # it works on, not of every block it served
        for k in [k for k in _CACHE if k[:2] == key[:2]]:
            del _CACHE[k]
        _CACHE[key] = make(path)
    return _CACHE[key]


def forget(work: str | Path) -> None:
    """Drop what :func:`cached` and :func:`read_model` keep for the pass of ``work`` (at its
    end)."""
    for key in [k for k in _CACHE if k[0] == str(work)]:
        del _CACHE[key]
    for key in [k for k in _MODELS if k[0].startswith(str(work) + "/")]:
        del _MODELS[key]


_MODELS: dict[tuple[str, int, int, int], AcousticModel] = {}


def read_model(path: str | Path) -> AcousticModel:
    """``AcousticModel.read(path)``, kept by this process while the file is the same one (its
    inode, size and modification time: the parent replaces ``cur.mdl`` each iteration), so a
    worker that serves several blocks of an iteration reads the model once (a read is ~35 ms of
    unpickling even for the tiny recipe's model); the last 4 models are kept.  The jobs only
    read a model, never change it."""
    st = os.stat(path)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    model = _MODELS.get(key)
    if model is None:
        model = AcousticModel.read(path)
        for k in [k for k in _MODELS if k[0] == key[0]]:
            del _MODELS[k]
        while len(_MODELS) >= 4:
            del _MODELS[next(iter(_MODELS))]
        _MODELS[key] = model
    return model


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

    def lang(self) -> Lang:
        """The lang dir, read once per process and pass."""
        return cached(self.work, "lang", self.lang_dir, Lang.read)

    def read(self, lang: Lang) -> list[Utterance]:
        """The part's utterances: words, speaker and CMN'd MFCCs, read from the data dir."""
        return [u for batch in self.batches(lang, 0) for u in batch]

    def batches(self, lang: Lang, max_frames: int) -> Iterator[list[Utterance]]:
        """The part's utterances (words, speaker, CMN'd MFCCs) in batches of whole speakers of
        at least ``max_frames`` frames each (the last may be less; 0: one batch), read from
        the data dir as each batch is asked for.  Speakers in the order of their first
        utterance in ``utts``, a speaker's utterances in ``utts`` order: for a block of
        :func:`asrtrain.data.datadir.split_data_dir` (speakers contiguous) that is ``utts``'s order,
        so the batches join up to the part whatever ``max_frames``."""
        reader = cached(self.work, "mfcc", self.data_dir, mfcc_reader)
        utt2spk = reader.data.utt2spk
        by_spk: dict[str, list[str]] = {}
        for u in self.utts:
            by_spk.setdefault(utt2spk[u], []).append(u)
        batch: list[Utterance] = []
        frames = 0
        for spk, utts in by_spk.items():
            if batch and max_frames and frames >= max_frames:
                yield batch
                batch, frames = [], 0
            words, skipped = transcripts(reader.data, lang, utts)
            if skipped:
                utt, why = next(iter(skipped.items()))
                raise AsrtrainError(f"{self.data_dir}: utterance {utt}: {why}")
            for u in utts:
                batch.append(Utterance(u, words[u], reader[u], spk))
                frames += len(batch[-1].feats)
        if batch:
            yield batch


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
        self.applier()(utts)

    def applier(self) -> Callable[[list[Utterance]], None]:
        """:meth:`apply` with the model, matrix and transforms read once (for every batch)."""
        if self.model is not None:
            pipeline = read_model(self.model)
            make = lambda x: model_features(pipeline, x)   # noqa: E731
        elif self.matrix is not None:
            mat = np.load(self.matrix)
            make = lambda x: lda_features(x, self.splice, mat)   # noqa: E731
        else:
            make = lambda x: model_features(self.delta_order, x)   # noqa: E731
        trans = read_transforms(self.trans) if self.trans else None

        def apply(utts: list[Utterance]) -> None:
            for u in utts:
                u.feats = make(u.feats)
                if trans is not None:
                    u.feats = adapt_features(u.feats, _transform(trans, u, self.trans))
        return apply


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
    return _checked_alignment(scp, read_int_vectors(scp, [u.utt for u in utts]), utts)


def _checked_alignment(scp: str | Path, table: Mapping[str, np.ndarray],
                       utts: list[Utterance]) -> dict[str, np.ndarray]:
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


class AlignmentTable:
    """A job's view of an alignment table (``ali.scp``, a job's ``ali_phone_state.JOB.scp``):
    the entries of its part's utterances, found once (the scp of a whole corpus is read one
    time per job, not per batch), read a batch at a time (:meth:`of`)."""

    def __init__(self, scp: str | Path, utts: Iterable[str]) -> None:
        specs = _scp_specs(scp)
        self.scp = scp
        self.specs = {u: specs[u] for u in utts if u in specs}

    def of(self, utts: list[Utterance]) -> dict[str, np.ndarray]:
        """:func:`read_alignment` of ``utts`` (int64, lengths checked)."""
        keys = sorted((u.utt for u in utts if u.utt in self.specs), key=self.specs.__getitem__)
        table = {k: _int_vector(self.scp, k, self.specs[k]) for k in keys}
        return _checked_alignment(self.scp, table, utts)


class _PartWriter:
    """``work/name.JOB.{ark,scp}`` written a batch at a time (each batch's utterances in
    sorted order; the merge sorts them all), renamed into place at the end."""

    def __init__(self, part: Part, name: str, stack: contextlib.ExitStack) -> None:
        ark = part.file(f"{name}.JOB.ark").resolve()
        self.w = stack.enter_context(atomic_ark(ark, part.file(f"{name}.JOB.scp")))

    def write(self, table: Mapping[str, np.ndarray]) -> None:
        for utt in sorted(table):
            self.w(utt, np.asarray(table[utt], dtype=np.int32))


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


def _batch_frames(c: Mapping) -> int:
    return int(c.get("part_batch_frames") or PART_BATCH_FRAMES)


class _Reiterable:
    """An iterable made afresh by each ``iter()`` (for :meth:`TreeStats.accumulate`, which
    goes over its items twice): the first time from ``first()``, then from ``again()``."""

    def __init__(self, first: Callable[[], Iterator], again: Callable[[], Iterator]) -> None:
        self.first, self.again, self.used = first, again, False

    def __iter__(self) -> Iterator:
        make = self.again if self.used else self.first
        self.used = True
        return make()


def setup_job(a: SetupJob) -> SetupResult:

    lang = a.part.lang()
    size = _batch_frames(a.cfg)
    out = SetupResult()
    device = torch.device(a.cfg.get("device", "cpu"))
    need_features = a.moments or a.tree or a.fmllr_model is not None
    apply = a.features.applier() if need_features else None
    prev = AlignmentTable(a.ali, a.part.utts) if (a.tree or a.lda) else None
    pdf_ali = (AlignmentTable(a.pdf_ali, a.part.utts)
               if (a.lda is not None or a.fmllr_model is not None) else None)
    silence = silence_phone_mask(lang) if a.lda is not None else None
    model = read_model(a.fmllr_model) if a.fmllr_model is not None else None
    sil_pdfs = silence_pdfs(model.tree, lang) if model is not None else None
    if a.moments:
        out.moments = Moments()
    if model is not None:
        out.transforms = {}
    reports: list[dict] = []

    def lda(batch: list[Utterance]) -> None:   # acc-lda on spliced CMN'd MFCCs
        num_classes, left, right = a.lda
        pdfs, ali = pdf_ali.of(batch), prev.of(batch)
        for u in batch:
            if out.lda is None:
                out.lda = LdaStats.zeros(num_classes, u.feats.shape[1] * (left + 1 + right),
                                         device)
            if u.utt not in pdfs or u.utt not in ali:
                continue
            w = frame_weights(ali[u.utt], silence, a.cfg["silence_weight"])
            keep = w > 0
            x = splice_frames(torch.from_numpy(u.feats).to(device), left, right)[
                torch.from_numpy(keep).to(device)]
            out.lda.accumulate(x, torch.from_numpy(pdfs[u.utt][keep]).to(device),
                               torch.from_numpy(w[keep]).to(device))

    def features(batch: list[Utterance], first: bool) -> None:
        apply(batch)
        if model is None:
            return
        if first:   # train_sat.sh without trans.*: gmm-est-fmllr from ali
            rep: dict = {}
            out.transforms.update(estimate_transforms(model, batch, pdf_ali.of(batch),
                                                      sil_pdfs, a.cfg, report=rep))
            reports.append(rep)
        for u in batch:
            u.feats = adapt_features(u.feats, out.transforms[u.speaker])

    def first_batch(batch: list[Utterance]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if a.lda is not None:
            lda(batch)
        if not need_features:
            return
        features(batch, True)
        if a.moments:
            for u in batch:
                out.moments.accumulate(u.feats)
        if a.tree:
            yield from contexts(batch)

    def contexts(batch: list[Utterance]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        ali = prev.of(batch)
        for u in batch:
            if u.utt in ali:
                yield frame_contexts(ali[u.utt]), u.feats

    def again_batch(batch: list[Utterance]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        features(batch, False)
        yield from contexts(batch)

    def first() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for batch in a.part.batches(lang, size):
            yield from first_batch(batch)
            batch = None   # not held while the next batch is read

    def again() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for batch in a.part.batches(lang, size):
            yield from again_batch(batch)
            batch = None

    if a.tree:   # acc-tree-stats: the items twice, the second time made again from disk
        out.tree = TreeStats.accumulate(_Reiterable(first, again))
    else:
        for _ in first():
            pass
    if reports:
        out.fmllr = reports[0] if len(reports) == 1 else merge_fmllr_reports(reports)
    return out


# ------------------------------------------------------------------ an iteration


@dataclass
class IterJob:
    """One job of an iteration, over its part, a batch of whole speakers at a time
    (:meth:`Part.batches`): features of ``model`` (a model file) adapted by ``trans``; the
    alignment (``align``): ``viterbi`` (realign, written to ``ali_phone_state.JOB``),
    ``equal`` (mono's start, written too) or ``read`` from ``ali``; then what ``what`` asks,
    in this order: ``fmllr`` (the speakers' transforms re-estimated, composed with ``trans``,
    the features re-adapted), ``mllt`` (statistics), ``gmm`` (statistics and transition
    counts), ``moments``, ``alimdl`` (the unadapted features' statistics under the adapted
    ones' posteriors), ``final`` (the pdf alignment written too, ``ali.JOB``).  At most one of
    ``mllt``, ``gmm``, ``alimdl``: each takes the part's frames as one stream."""

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

    c = a.cfg
    streams = [w for w in ("mllt", "gmm", "alimdl") if w in a.what]
    if len(streams) > 1:
        raise AsrtrainError(f"iter_job: {streams} in one job (at most one statistics stream)")
    device = torch.device(c.get("device", "cpu"))
    model = read_model(a.model)
    lang = a.part.lang()
    trans = read_transforms(a.trans) if a.trans else None
    prev = AlignmentTable(a.ali, a.part.utts) if a.align == "read" else None
    num_states = ({p: lang.phones.topology(p).num_states for p in lang.phones.real_phone_ids}
                  if a.align == "equal" else None)
    sil_pdfs = silence_pdfs(model.tree, lang) if "fmllr" in a.what else None
    out = IterResult()
    if "moments" in a.what:
        out.moments = Moments()
    if "fmllr" in a.what:
        out.transforms = {}
    reports: list[dict] = []

    def stream(writers: dict[str, _PartWriter], bar: Bar
               ) -> Iterator[tuple[Utterance, np.ndarray, np.ndarray]]:
        """The part's aligned utterances, batch by batch: ``(utterance with the pass's
        features, phone-state alignment, unadapted features)``."""
        for b, utts in enumerate(a.part.batches(lang, _batch_frames(c))):
            base = {}
            for u in utts:
                u.feats = model_features(model, u.feats)
                base[u.utt] = u.feats
            if trans is not None:
                for u in utts:
                    u.feats = adapt_features(base[u.utt], _transform(trans, u, a.trans))
            if a.align == "viterbi":
                t0 = time.time()
                cache = _graphs(a.part, b, model, c)
                res = _align_shard(model, lang, utts, c, cache, bar)
                if res.compiled and cache.graphs:
                    with atomic_open(a.part.file(f"graphs.JOB.{b}.pt"), "wb") as f:
                        torch.save(cache.graphs, f)
                del cache
                out.compiled += res.compiled
                phone_state = {k: v.astype(np.int64) for k, v in res.phone_state.items()}
                out.acoustic.update(res.acoustic)
                out.failed.update(res.failed)
                out.frames += sum(len(v) for v in phone_state.values())
                out.align_seconds += time.time() - t0
                writers["ali_phone_state"].write(phone_state)
                if "final" in a.what:
                    writers["ali"].write(res.pdf)
            elif a.align == "equal":
                phone_state = {}
                for u in utts:
                    eq = equal_alignment(lang, u.words, len(u.feats), num_states.__getitem__)
                    if eq is None:
                        out.failed[u.utt] = f"equal alignment impossible ({len(u.feats)} frames)"
                        continue
                    phone_state[u.utt] = np.array([ph * STATE_BITS + s for ph, s in eq],
                                                  dtype=np.int64)
                writers["ali_phone_state"].write(phone_state)
            else:
                phone_state = prev.of(utts)
            aligned = [u for u in utts if u.utt in phone_state]
            if "fmllr" in a.what:
                pdfs = {u.utt: pdfs_of(model.tree, frame_contexts(phone_state[u.utt]))
                        for u in aligned}
                rep: dict = {}
                new = estimate_transforms(model, utts, pdfs, sil_pdfs, c, report=rep)
                reports.append(rep)
                new = compose_transforms(new, trans)
                out.transforms.update(new)
                for u in utts:
                    u.feats = adapt_features(base[u.utt], new[u.speaker])
            if out.moments is not None:
                for u in utts:
                    out.moments.accumulate(u.feats)
            for u in aligned:
                yield u, phone_state[u.utt], base[u.utt]
            # not held while the next batch is read: one batch in memory, not two
            utts = base = phone_state = aligned = u = res = None

    with contextlib.ExitStack() as stack:
        writers = {}
        if a.align in ("viterbi", "equal"):
            writers["ali_phone_state"] = _PartWriter(a.part, "ali_phone_state", stack)
        if a.align == "viterbi" and "final" in a.what:
            writers["ali"] = _PartWriter(a.part, "ali", stack)
        bar = stack.enter_context(Bar(
            total=len(a.part.utts), desc=a.progress, unit="utt", file=sys.stderr,
            disable=None if a.progress and a.align == "viterbi" else True, leave=False))
        items = stream(writers, bar)
        if "mllt" in a.what:
            out.mllt = _mllt_stats(model, items, lang, c, device)
        elif "gmm" in a.what:
            _, out.stats, out.counts = accumulate_stats(
                model, ((u.feats, ps) for u, ps, _ in items), device)
        elif "alimdl" in a.what:

            # alimdl_stats looks an utterance's alignment and unadapted features up as it
            # takes the utterance: the stream puts them there one utterance at a time
            one_ps: dict[str, np.ndarray] = {}
            one_base: dict[str, np.ndarray] = {}

            def utterances() -> Iterator[Utterance]:
                for u, ps, base in items:
                    one_ps.clear()
                    one_base.clear()
                    one_ps[u.utt], one_base[u.utt] = ps, base
                    yield u

            out.alimdl, out.alimdl_moments = alimdl_stats(model, utterances(), one_base,
                                                          one_ps, device)
        else:
            for _ in items:
                pass
    if reports:
        out.fmllr = reports[0] if len(reports) == 1 else merge_fmllr_reports(reports)
    return out


def _graphs(part: Part, batch: int, model: AcousticModel, c: Mapping) -> GraphCache:
    """A batch's training graphs: those its earlier alignments of the pass compiled, from
    ``graphs.JOB.B.pt`` (the pass's tree is fixed, and so are the job's batches)."""
    cache = GraphCache(c.get("graph_cache_mb", 4096.0)).for_tree(model.tree)
    path = part.file(f"graphs.JOB.{batch}.pt")
    if path.is_file():
        for utt, g in torch.load(path, weights_only=False).items():
            cache.keep(utt, g)
    return cache


def _mllt_stats(model: AcousticModel,
                items: Iterable[tuple[Utterance, np.ndarray, np.ndarray]], lang: Lang,
                c: Mapping, device: torch.device) -> MlltStats:
    """``gmm-acc-mllt`` of the aligned utterances ``(utterance, phone-state alignment, _)``
    (silence weighted), in batches of frames."""
    gmm = model.gmm.to(device)
    silence = silence_phone_mask(lang)
    stats = MlltStats.zeros(gmm.dim, device)

    def frames():
        for u, ps, _ in items:
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
    """``align_fmllr.sh`` for one part, a batch of whole speakers at a time: the alignment
    model on unadapted features, the speakers' transforms from that alignment (posteriors of
    the alignment model), the final model on the adapted features; both alignments written
    (``ali.JOB``, ``ali_phone_state.JOB``: the second)."""

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

    c = a.cfg
    model, alimdl = read_model(a.model), read_model(a.alimdl)
    lang = a.part.lang()
    sil_pdfs = silence_pdfs(model.tree, lang)
    first, second, transforms, reports = IterResult(), IterResult(), {}, []
    with contextlib.ExitStack() as stack:
        ali_ps = _PartWriter(a.part, "ali_phone_state", stack)
        ali = _PartWriter(a.part, "ali", stack)
        for utts in a.part.batches(lang, _batch_frames(c)):
            for u in utts:
                u.feats = model_features(model, u.feats)
            cache = GraphCache(c.get("graph_cache_mb", 4096.0))
            t0 = time.time()
            one = _align_shard(alimdl, lang, utts, c, cache.for_tree(alimdl.tree))
            _add_alignment(first, one, time.time() - t0)
            rep: dict = {}
            new = estimate_transforms(model, utts, one.pdf, sil_pdfs, c, posterior_model=alimdl,
                                      report=rep)
            transforms.update(new)
            reports.append(rep)
            for u in utts:
                u.feats = adapt_features(u.feats, new[u.speaker])
            t0 = time.time()
            two = _align_shard(model, lang, utts, c, cache.for_tree(model.tree))
            _add_alignment(second, two, time.time() - t0)
            ali_ps.write(two.phone_state)
            ali.write(two.pdf)
            utts = one = two = cache = None   # not held while the next batch is read
    rep = reports[0] if len(reports) == 1 else merge_fmllr_reports(reports)
    return AlignFmllrResult(first, second, transforms, rep)


def _add_alignment(out: IterResult, res, seconds: float) -> None:
    out.acoustic.update(res.acoustic)
    out.failed.update(res.failed)
    out.frames += sum(len(v) for v in res.pdf.values())
    out.align_seconds += seconds


def sum_gmm(parts: Iterable[IterResult]) -> tuple[GmmStats, dict[int, np.ndarray]]:
    """``gmm-sum-accs``: the jobs' GMM statistics and transition counts, in block order (a
    result whose statistics :meth:`asrtrain.align.passes.PassJobs.run` already added into the
    first's has none)."""
    stats, counts = None, {}
    for p in parts:
        if p.stats is None:
            continue
        if stats is None:
            stats = p.stats
        else:
            stats.add(p.stats)
        add_transition_counts(counts, p.counts)
    return stats, counts


def merge_fmllr_reports(reports: Iterable[dict]) -> dict:
    """The jobs' :func:`~asrtrain.align.frames.estimate_transforms` reports as one: speakers,
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
