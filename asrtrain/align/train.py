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
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import kaldiio
import numpy as np
import torch

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.adapt.lda import estimate_lda
from asrtrain.adapt.mllt import compose, estimate_mllt, transform_means
from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.model import (
    STATE_BITS,
    AcousticModel,
    AlignResult,
    Utterance,
    check_failures,
    estimate_log_trans,
    frame_contexts,
    initial_log_trans,
    merge_alignments,
    mfcc_reader,
    transcripts,
    write_alignments,
    write_transforms,
)
from asrtrain.align.passjobs import (
    Features,
    IterJob,
    IterResult,
    Moments,
    Part,
    SetupJob,
    SetupResult,
    forget,
    iter_job,
    setup_job,
    sum_gmm,
)
from asrtrain.align.tree import build_tree, cluster_phones, mono_tree
from asrtrain.data.datadir import DataDir
from asrtrain.fileio import atomic_dir, write_text
from asrtrain.jobs import JobConfig, JobPool, run_jobs, split_by_speaker
from asrtrain.lang.lexicon import Lang
from asrtrain.progress import Bar

if TYPE_CHECKING:
    from asrtrain.align.sat import _FmllrHook

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
    part_batch_frames: int = 200000      # frames (whole speakers) a job holds at once: its
    #                                      memory, not its results (passjobs.Part.batches)
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


class _PassJobs:
    """A pass's jobs (:mod:`asrtrain.align.passjobs`): its utterances split by speaker into
    ``nj`` parts once (balanced by ``utt2num_frames``), and the work dir the parent and the
    jobs share, ``.<pass>.*.work.tmp`` beside the output (removed at the end; a killed run's is
    removed by the pipeline with the other temporaries): the current model (``cur.mdl``),
    transforms (``trans.scp``), LDA matrix, the jobs' alignment parts and graphs.  The jobs read
    the current alignment from ``prev_ali`` (the previous pass's table) until the pass aligns,
    then from their own parts.  Local jobs run in one pool of processes kept for the pass
    (:class:`asrtrain.jobs.JobPool`)."""

    def __init__(self, data_dir: Path, lang_dir: Path, out_dir: Path, utts: list[str],
                 data: DataDir, jobs: JobConfig, c: GmmConfig, name: str) -> None:
        spk2utt: dict[str, list[str]] = {}
        for u in utts:
            spk2utt.setdefault(data.utt2spk[u], []).append(u)
        frames = data.utt2num_frames if all(u in data.utt2num_frames for u in utts) else None
        split = split_by_speaker(spk2utt, jobs.nj, frames)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.",
                                          suffix=".work.tmp")).resolve()
        # absolute paths: a job may run elsewhere (cmd: slurm), in another directory
        self.parts = [Part(j + 1, str(Path(data_dir).resolve()), str(Path(lang_dir).resolve()),
                           us, str(self.work)) for j, us in enumerate(split)]
        self.jobs, self.cfg, self.name = jobs, asdict(c), name
        self.in_process = torch.device(c.device).type != "cpu"   # one process on a GPU
        self.prev_ali: str | None = None
        self.trans: str | None = None
        self.num_utts = len(utts)
        self.compiled = 0
        # one pool of local processes for the pass's every run of jobs (not one per iteration)
        self.pool = JobPool(JobConfig(nj=max(1, min(jobs.nj, len(self.parts))), cmd=jobs.cmd,
                                      threads=jobs.threads))

    def __enter__(self) -> _PassJobs:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.pool.close(cancel=exc[0] is not None)
        finally:
            forget(self.work)
            shutil.rmtree(self.work, ignore_errors=True)

    def run(self, fn: Callable, make: Callable[[Part], object], desc: str) -> list:
        """``fn`` over the parts, ``make(part)`` its argument; results in job order.  Jobs run
        here one after another (one job, ``nj=1``, a GPU) draw their own progress bar over the
        utterances they align (``progress``); parallel jobs have the runner's bar over jobs."""
        args = [make(p) for p in self.parts]
        if self.jobs.cmd == "local" and (self.in_process or len(args) == 1
                                         or self.jobs.nj == 1):
            for a in args:
                if hasattr(a, "progress"):
                    a.progress = f"{self.name}: {desc}"
        return run_jobs(fn, args, self.jobs, f"{self.name}: {desc}",
                        in_process=self.in_process, pool=self.pool)

    def setup(self, features: Features, desc: str, **kw) -> list[SetupResult]:
        return self.run(setup_job, lambda p: SetupJob(p, features, ali=self.prev_ali,
                                                      cfg=self.cfg, **kw), desc)

    def write_transforms(self, transforms: Mapping[str, np.ndarray]) -> None:
        write_transforms(self.work, transforms)
        self.trans = str(self.work / "trans.scp")

    def iterate(self, model: AcousticModel, align: str, what: tuple[str, ...], desc: str
                ) -> list[IterResult]:
        """One iteration's jobs with ``model`` (see :class:`IterJob`); after an alignment the
        jobs' parts are the current alignment."""
        path = self.work / "cur.mdl"
        model.write(path)
        parts = self.run(iter_job, lambda p: IterJob(
            p, str(path), align, self.prev_ali or str(p.file("ali_phone_state.JOB.scp")),
            self.trans, what, self.cfg), desc)
        if align != "read":
            self.prev_ali = None
        self.compiled += sum(p.compiled for p in parts)
        return parts

    def alignment_parts(self) -> list[tuple[Path, int]]:
        return [(self.work, p.index) for p in self.parts]


def _align_result(parts: list[IterResult]) -> AlignResult:
    """The figures of the jobs' alignments (the tables are on disk): failures, frames, the
    log-likelihood per frame summed in utterance order (one sum whatever the split), and the
    longest job's seconds."""
    acoustic: dict[str, float] = {}
    res = AlignResult({}, {}, {}, {}, 0.0, 0, 0.0)
    for p in parts:
        acoustic.update(p.acoustic)
        res.failed.update(p.failed)
        res.frames += p.frames
        res.seconds = max(res.seconds, p.align_seconds)
    res.loglike_per_frame = sum(acoustic[k] for k in sorted(acoustic)) / max(res.frames, 1)
    return res


def _train_iters(model: AcousticModel, pj: _PassJobs, cfg: GmmConfig, target_gauss: int,
                 plog: _PassLog, mllt: _MlltUpdate | None = None,
                 fmllr: _FmllrHook | None = None) -> tuple[AlignResult, list[IterResult]]:
    """The shared loop, each iteration one run of jobs (two at an MLLT iteration): realign
    (when scheduled), the feature-space updates of LDA+MLLT (``mllt``: statistics, then the
    parent's estimate, then the accumulation with the new features) and SAT passes (``fmllr``:
    each job re-estimates its speakers' transforms before it accumulates), accumulate; the
    parent sums, updates, mixes up.  A final alignment with the last model (with the
    ``final.alimdl`` statistics of a SAT pass) ends it; returns its figures and the jobs'
    results.  A progress bar counts the iterations (the log has a line for each)."""
    device = torch.device(cfg.device)
    num_gauss = model.gmm.num_gauss()
    inc = max(0, (target_gauss - num_gauss) // max(cfg.max_iter_inc, 1))
    bar = Bar(total=cfg.num_iters + 1, desc=plog.name, unit="iter", file=sys.stderr,
               disable=None, leave=False)
    for it in range(1, cfg.num_iters + 1):
        t0 = time.time()
        align = "viterbi" if it in cfg.realign_iters else "read"
        desc = f"iter {it}" + (": align" if align == "viterbi" else "")
        extra = None
        if mllt is not None and it in cfg.mllt_iters:
            parts = pj.iterate(model, align, ("mllt",), desc)
            res = _checked(parts, align, pj, cfg, plog, it)
            extra = mllt(it, model, parts)
            parts = pj.iterate(model, "read", ("gmm", "moments"), f"iter {it}")
            moments = Moments()
            for p in parts:
                moments.add(p.moments)
            model.var_floor = cfg.var_floor_factor * moments.mean_var()[1]
        elif fmllr is not None and it in cfg.fmllr_iters:
            parts = pj.iterate(model, align, ("fmllr", "gmm"), desc + ", fMLLR")
            res = _checked(parts, align, pj, cfg, plog, it)
            extra = fmllr(it, pj, parts, time.time() - t0)
        else:
            parts = pj.iterate(model, align, ("gmm",), desc)
            res = _checked(parts, align, pj, cfg, plog, it)
        stats, counts = sum_gmm(parts)
        gmm = model.gmm.to(device)
        gmm.update(stats,
                   torch.from_numpy(model.var_floor).to(device), cfg.min_gaussian_occupancy)
        model.log_trans = estimate_log_trans(counts, model.log_trans)
        if it <= cfg.max_iter_inc and num_gauss < target_gauss:
            num_gauss = min(target_gauss, num_gauss + inc)
            # a pdf's occupancy is its frame count (each frame's posteriors sum to one):
            # rounded, it is the same bits whatever the jobs' grouping of the sums, so pdfs
            # of equal counts tie exactly in the allocation, not by the last bits
            gmm.mixup(num_gauss, stats.occ.sum(-1).round())
        model.gmm = gmm.to("cpu")
        plog.record(it, res, stats.loglike / max(stats.frames, 1), stats.frames,
                    time.time() - t0, model.gmm.num_gauss(), extra)
        bar.set_postfix(loglike=f"{plog.passes[-1]['loglike_per_frame']:.2f}",
                        gauss=model.gmm.num_gauss(), refresh=False)
        bar.update()
    what = ("final", "alimdl") if fmllr is not None else ("final",)
    parts = pj.iterate(model, "viterbi", what, "final alignment")
    res = _align_result(parts)
    bar.update()
    bar.close()
    check_failures(res, pj.num_utts, cfg.max_fail_fraction, f"{plog.name} final alignment")
    plog(f"training graphs: {pj.compiled} compiled for {pj.num_utts} utterances in "
         f"{len(pj.parts)} jobs (kept on disk per job for the pass)")
    plog.record(cfg.num_iters + 1, res, res.loglike_per_frame, res.frames, res.seconds,
                model.gmm.num_gauss())
    return res, parts


def _checked(parts: list[IterResult], align: str, pj: _PassJobs, cfg: GmmConfig,
             plog: _PassLog, it: int) -> AlignResult | None:
    """An iteration's alignment figures (None when it did not align), failures checked."""
    if align != "viterbi":
        return None
    res = _align_result(parts)
    check_failures(res, pj.num_utts, cfg.max_fail_fraction, f"{plog.name} iter {it}")
    return res


def _pass_utterances(data_dir: Path, lang: Lang) -> tuple[list[str], dict[str, str], DataDir]:
    """The data dir's utterances a pass trains on (its transcript in the lexicon), those
    left out with why, and the data dir (read and checked: features, CMVN; no features read)."""
    data = mfcc_reader(data_dir).data
    words, skipped = transcripts(data, lang)
    return list(words), skipped, data


def train_mono(data_dir: Path, lang_dir: Path, out_dir: Path,
               cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """Flat-start monophone training (see the module docstring); returns the summary.
    ``jobs``: how its jobs run (default ``nj`` of ``cfg`` on this machine)."""
    c = GmmConfig.from_config(cfg)
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    utts, skipped, data = _pass_utterances(data_dir, lang)
    if not utts:
        raise AsrtrainError(f"{data_dir}: no utterance to train on")
    if c.num_utts:
        missing = [u for u in utts if u not in data.utt2num_frames]
        if missing:
            raise AsrtrainError(f"{Path(data_dir) / 'utt2num_frames'}: no length for {missing[0]}"
                                " (num_utts picks the shortest); run the mfcc stage again")
        utts = sorted(utts, key=lambda u: (data.utt2num_frames[u], u))[:c.num_utts]
    out_dir = Path(out_dir)
    plog = _PassLog(out_dir, "mono")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    with _PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, "mono") as pj:
        moments = Moments()
        for r in pj.setup(Features(delta_order=c.delta_order), "global mean and variance",
                          moments=True):
            moments.add(r.moments)
        mean, var = moments.mean_var()
        var_floor = c.var_floor_factor * var
        tree = mono_tree(lang.phones.root_of(), _num_states(lang))
        p = tree.num_pdfs
        gmm = DiagGmmSet(torch.from_numpy(np.tile(mean, (p, 1, 1))),
                         torch.from_numpy(np.tile(var, (p, 1, 1))), torch.zeros(p, 1))
        model = AcousticModel(tree, gmm, initial_log_trans(lang), c.delta_order, var_floor)

        # iteration 0: equal alignment (Kaldi align-equal-compiled, then gmm-est)
        t0 = time.time()
        parts = pj.iterate(model, "equal", ("gmm",), "equal alignment")
        impossible = {k: v for part in parts for k, v in part.failed.items()}
        for utt in sorted(impossible):
            plog(f"{impossible[utt]} for {utt}")
        if len(impossible) > c.max_fail_fraction * len(utts):
            raise AsrtrainError(f"{data_dir}: {len(impossible)} of {len(utts)} utterances are "
                                "too short for an equal alignment")
        device = torch.device(c.device)
        stats, counts = sum_gmm(parts)
        g = model.gmm.to(device)
        g.update(stats, torch.from_numpy(var_floor).to(device), min_gaussian_occupancy=3.0)
        model.gmm = g.to("cpu")
        model.log_trans = estimate_log_trans(counts, model.log_trans)
        plog.record(0, None, stats.loglike / max(stats.frames, 1), stats.frames,
                    time.time() - t0, model.gmm.num_gauss())

        res, _ = _train_iters(model, pj, c, c.totgauss, plog)
        summary = {"kind": "mono", "num_pdfs": model.num_pdfs,
                   "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
                   "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame}
        _write(out_dir, model, lang, pj, plog, summary)
    return summary


def train_tri(data_dir: Path, lang_dir: Path, ali_dir: Path, out_dir: Path,
              cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """Triphone training on the alignment of a previous pass in ``ali_dir``."""
    c = GmmConfig.from_config(cfg, **TRI_DEFAULTS)
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    utts, skipped, data = _pass_utterances(data_dir, lang)
    ali_dir, out_dir = Path(ali_dir), Path(out_dir)
    plog = _PassLog(out_dir, out_dir.name)
    utts = _aligned_utterances(utts, skipped, ali_dir, plog, c)
    with _PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        pj.prev_ali = str(ali_dir.resolve() / "ali_phone_state.scp")
        model, tsum, _ = _tree_model(pj, Features(delta_order=c.delta_order), lang, ali_dir, c,
                                     plog)
        res, _ = _train_iters(model, pj, c, c.num_gauss, plog)
        summary = {"kind": "tri", "num_pdfs": model.num_pdfs,
                   "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
                   "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame, "tree": tsum}
        _write(out_dir, model, lang, pj, plog, summary)
    return summary


TRI_DEFAULTS = dict(num_iters=35, realign_iters=[10, 20, 30], max_iter_inc=25)


def _aligned_utterances(utts: list[str], skipped: dict[str, str], ali_dir: Path,
                        plog: _PassLog, c: GmmConfig) -> list[str]:
    """The utterances that have an alignment in ``ali_dir`` (logged: those skipped or without
    one; the table's keys only are read here, the jobs check the lengths); too few is an
    error."""
    prev = kaldiio.load_scp(str(_existing(ali_dir / "ali_phone_state.scp")))
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    utts_with_ali = []
    for u in utts:
        if u not in prev:
            plog(f"no alignment for {u} in {ali_dir}")
        else:
            utts_with_ali.append(u)
    if len(utts_with_ali) < (1 - c.max_fail_fraction) * len(utts):
        raise AsrtrainError(f"{ali_dir}: only {len(utts_with_ali)} of {len(utts)} utterances "
                            "have an alignment")
    return utts_with_ali


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise AsrtrainError(f"{path}: missing")
    return path


def _tree_model(pj: _PassJobs, features: Features, lang: Lang, ali_dir: Path, c: GmmConfig,
                plog: _PassLog, fmllr_model: str | None = None
                ) -> tuple[AcousticModel, dict, list[SetupResult]]:
    """``acc-tree-stats`` (jobs, on ``features``, contexts from the previous alignment, summed
    in job order), ``cluster-phones``, ``build-tree`` and ``gmm-init-model``: a model of one
    Gaussian per leaf, the transitions of the previous pass's model; returns it and the tree's
    summary (and, with ``fmllr_model``, the jobs' results: their speakers' first transforms,
    estimated with that model before the statistics of the adapted features)."""
    t0 = time.time()
    parts = pj.setup(features, "tree statistics", tree=True, moments=True,
                     fmllr_model=fmllr_model,
                     pdf_ali=str(ali_dir.resolve() / "ali.scp") if fmllr_model else None)
    stats, moments = parts[0].tree, Moments()
    for i, r in enumerate(parts):
        if i:
            stats.add(r.tree)
        moments.add(r.moments)
    mean, var = moments.mean_var()
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
    return model, tsum, parts


def train_lda_mllt(data_dir: Path, lang_dir: Path, ali_dir: Path, out_dir: Path,
                   cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """LDA+MLLT triphones (tri3, Kaldi's ``steps/train_lda_mllt.sh``): LDA of CMN'd MFCCs
    spliced ±``left/right_context`` to ``dim`` on the previous pass's pdf alignment (silence
    weighted ``silence_weight``), a tree on the LDA features, then the shared loop with MLLT
    at ``mllt_iters``; the model's ``lda_mllt`` is Kaldi's ``final.mat``."""
    c = GmmConfig.from_config(cfg, **TRI_DEFAULTS, type="lda_mllt")
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    utts, skipped, data = _pass_utterances(data_dir, lang)
    ali_dir, out_dir = Path(ali_dir), Path(out_dir)
    plog = _PassLog(out_dir, out_dir.name)
    utts = _aligned_utterances(utts, skipped, ali_dir, plog, c)
    splice = (c.left_context, c.right_context)
    with _PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        pj.prev_ali = str(ali_dir.resolve() / "ali_phone_state.scp")
        lda, lda_info = _estimate_lda(pj, ali_dir, splice, c, plog)
        np.save(pj.work / "lda.npy", lda)
        model, tsum, _ = _tree_model(pj, Features(splice=splice,
                                                  matrix=str(pj.work / "lda.npy")),
                                     lang, ali_dir, c, plog)
        model.splice, model.lda_mllt = splice, lda
        mllt = _MlltUpdate(c, plog)
        res, _ = _train_iters(model, pj, c, c.num_gauss, plog, mllt=mllt)
        summary = {"kind": "lda_mllt", "num_pdfs": model.num_pdfs,
                   "num_gauss": model.gmm.num_gauss(), "utterances": len(utts),
                   "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame, "tree": tsum,
                   "lda": lda_info, "mllt_objf_improvement": mllt.improvements}
        _write(out_dir, model, lang, pj, plog, summary)
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


def _estimate_lda(pj: _PassJobs, ali_dir: Path, splice: tuple[int, int], c: GmmConfig,
                  plog: _PassLog) -> tuple[np.ndarray, dict]:
    """``acc-lda`` in jobs (classes: the previous pass's pdf ids, silence weighted; summed in
    job order as ``sum-lda-accs``) and ``est-lda --dim``: the ``[dim, D*(L+1+R)]`` matrix (no
    offset column, as Kaldi's ``0.mat``) and its figures for the summary."""
    t0 = time.time()
    num_classes = int((ali_dir / "num_pdfs").read_text().split()[0])
    parts = pj.setup(Features(), "LDA statistics", lda=(num_classes, *splice),
                     pdf_ali=str(_existing(ali_dir / "ali.scp").resolve()))
    stats = parts[0].lda
    for r in parts[1:]:
        stats.add(r.lda)
    res = estimate_lda(stats, c.dim)
    spliced_dim = stats.dim
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
    """The LDA+MLLT pass's update at ``mllt_iters`` (``est-mllt``, ``gmm-transform-means``,
    ``compose-transforms``) from the jobs' ``gmm-acc-mllt`` statistics (summed in job order):
    the transform composed into the model's ``lda_mllt`` and applied to its means; the jobs
    then accumulate on the new features and give their moments for the variance floor."""

    def __init__(self, c: GmmConfig, plog: _PassLog) -> None:
        self.c, self.plog = c, plog
        self.improvements: list[float] = []

    def __call__(self, it: int, model: AcousticModel, parts: list[IterResult]) -> dict:
        t0 = time.time()
        stats = parts[0].mllt
        for p in parts[1:]:
            stats.add(p.mllt)
        est = estimate_mllt(stats)
        m = est.matrix.cpu()
        g = model.gmm
        model.gmm = DiagGmmSet(transform_means(g.means, m), g.vars, g.log_weights)
        model.lda_mllt = compose(m, torch.from_numpy(model.lda_mllt)).numpy()
        self.improvements.append(est.improvement)
        logdet = float(torch.linalg.slogdet(m)[1])
        self.plog(f"iter {it}: MLLT objective +{est.improvement:.4f} per frame over "
                  f"{stats.beta:.0f} frames (log|det| {logdet:.3f}) in {time.time() - t0:.1f} s")
        return {"mllt_objf_improvement": est.improvement, "mllt_logdet": logdet,
                "mllt_seconds": round(time.time() - t0, 3)}


def _write(out_dir: Path, model: AcousticModel, lang: Lang, pj: _PassJobs, plog: _PassLog,
           summary: dict, transforms: Mapping[str, np.ndarray] | None = None,
           alignment_model: AcousticModel | None = None) -> None:
    """The pass's directory, atomically: model (and ``final.alimdl``), alignments (the jobs'
    parts merged in utterance order), speaker transforms (``trans.{ark,scp}``) when given,
    ``log.txt``, ``passes.json``."""
    with atomic_dir(out_dir) as tmp:
        model.save(tmp, lang.phones.phones.id2sym)
        if alignment_model is not None:
            alignment_model.save_alignment_model(tmp)
        merge_alignments(tmp, pj.alignment_parts())
        if transforms is not None:
            write_transforms(tmp, transforms)
        plog.write(tmp, summary)
    # ark offsets in the scp files point into tmp: fix the directory name after the swap
    for name in ("ali.scp", "ali_phone_state.scp", "trans.scp"):
        p = out_dir / name
        if p.is_file():
            write_text(p, p.read_text().replace(str(tmp.resolve()), str(out_dir.resolve())))


def align_data(data_dir: Path, lang_dir: Path, model_dir: Path, out_dir: Path,
               cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """Align a data dir with a trained model (Kaldi's ``steps/align_si.sh``): ``out_dir`` gets
    the model (copied), ``ali.{ark,scp}``, ``ali_phone_state.{ark,scp}``, ``log.txt``,
    ``passes.json``; the next ``train_tri`` can start from it.  A SAT model is aligned with
    fMLLR (:func:`asrtrain.align.sat.align_fmllr`, Kaldi's ``steps/align_fmllr.sh``)."""
    c = GmmConfig.from_config(cfg)
    jobs = jobs or JobConfig(nj=c.nj)
    lang = Lang.read(lang_dir)
    model = AcousticModel.load(model_dir)
    if model.sat:
        from asrtrain.align.sat import align_fmllr  # sat builds on this module

        return align_fmllr(data_dir, lang_dir, model_dir, out_dir, cfg, jobs)
    utts, skipped, data = _pass_utterances(data_dir, lang)
    out_dir = Path(out_dir)
    plog = _PassLog(out_dir, f"align {Path(model_dir).name}")
    for utt, why in sorted(skipped.items()):
        plog(f"skipped {utt}: {why}")
    with _PassJobs(data_dir, lang_dir, out_dir, utts, data, jobs, c, plog.name) as pj:
        model_file = str(Path(model_dir).resolve() / "final.mdl")
        parts = pj.run(iter_job, lambda p: IterJob(p, model_file, "viterbi", what=("final",),
                                                   cfg=pj.cfg), f"align {Path(data_dir).name}")
        res = _align_result(parts)
        check_failures(res, len(utts), c.max_fail_fraction, f"aligning {data_dir}")
        for utt, why in sorted(res.failed.items()):
            plog(f"failed {utt}: {why}")
        plog.record(0, res, res.loglike_per_frame, res.frames, res.seconds,
                    model.gmm.num_gauss())
        summary = {"kind": "align", "model": str(model_dir), "num_pdfs": model.num_pdfs,
                   "utterances": len(utts), "skipped": len(skipped), "failed": len(res.failed),
                   "final_loglike_per_frame": res.loglike_per_frame}
        _write(out_dir, model, lang, pj, plog, summary)
    return summary


def train_pass(data_dir: Path, lang_dir: Path, ali_dir: Path | None, out_dir: Path,
               cfg: Mapping | None = None, jobs: JobConfig | None = None) -> dict:
    """One pass of ``align.passes``: mono when it starts from nothing (``ali_dir`` None),
    else by its ``type``: ``deltas`` (train_deltas.sh), ``lda_mllt`` (train_lda_mllt.sh),
    ``sat`` (train_sat.sh).  ``jobs``: how its jobs run (default: ``nj`` of ``cfg``, here).
    Returns the pass's summary."""
    if ali_dir is None:
        return train_mono(data_dir, lang_dir, out_dir, cfg, jobs)
    kind = GmmConfig.from_config(cfg).type
    if kind == "lda_mllt":
        return train_lda_mllt(data_dir, lang_dir, ali_dir, out_dir, cfg, jobs)
    if kind == "sat":
        from asrtrain.align.sat import train_sat  # sat builds on this module

        return train_sat(data_dir, lang_dir, ali_dir, out_dir, cfg, jobs)
    return train_tri(data_dir, lang_dir, ali_dir, out_dir, cfg, jobs)


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
