"""The machinery every GMM pass shares (:mod:`asrtrain.align.train`'s mono, deltas and LDA+MLLT
passes, :mod:`asrtrain.align.sat`'s SAT pass): the pass's jobs and work dir (:class:`PassJobs`),
its log (:class:`PassLog`), the training loop (:func:`train_iters`, with a hook per iteration for
the MLLT and fMLLR updates), the tree from the previous pass's alignment (:func:`tree_model`) and
the output dir (:func:`write_pass`)."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path

import kaldiio
import numpy as np
import torch

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.align.config import GmmConfig
from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.model import (
    AcousticModel,
    AlignResult,
    Utterance,
    add_transition_counts,
    check_failures,
    estimate_log_trans,
    frame_contexts,
    initial_log_trans,
    merge_alignments,
    mfcc_reader,
    transcripts,
    write_transforms,
)
from asrtrain.align.passjobs import (
    Features,
    IterJob,
    IterResult,
    Part,
    SetupJob,
    SetupResult,
    forget,
    iter_job,
    setup_job,
    sum_gmm,
)
from asrtrain.align.tree import build_tree, cluster_phones
from asrtrain.data.datadir import DataDir, read_table, split_data_dir
from asrtrain.fileio import atomic_dir, write_text
from asrtrain.jobs import JobConfig, JobPool, iter_cluster_jobs, run_jobs
from asrtrain.lang.lexicon import Lang
from asrtrain.logs import plural
from asrtrain.progress import Bar

log = logging.getLogger(__name__)

#: An LDA+MLLT pass's update at an MLLT iteration: ``(iteration, model, the jobs' results)`` ->
#: the figures logged (:class:`asrtrain.align.train.MlltUpdate`).
MlltHook = Callable[[int, AcousticModel, list[IterResult]], dict]
#: A SAT pass's update at an fMLLR iteration: ``(iteration, the pass's jobs, their results,
#: seconds so far)`` -> the figures logged (:class:`asrtrain.align.sat.FmllrHook`).
FmllrHook = Callable[[int, "PassJobs", list[IterResult], float], dict]


class PassLog:
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


def global_stats(utts: list[Utterance]) -> tuple[np.ndarray, np.ndarray]:
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


class ContextItems:
    """``(frame contexts, feats)`` per utterance for :meth:`TreeStats.accumulate`, made on the
    fly from the previous alignment (all of them at once were 32 bytes a frame)."""

    def __init__(self, utts: list[Utterance], prev: Mapping[str, np.ndarray]) -> None:
        self.utts, self.prev = utts, prev

    def __iter__(self):
        for u in self.utts:
            yield frame_contexts(self.prev[u.utt].astype(np.int64)), u.feats


def num_states(lang: Lang) -> dict[int, int]:
    return {p: lang.phones.topology(p).num_states for p in lang.phones.real_phone_ids}


class PassJobs:
    """A pass's jobs (:mod:`asrtrain.align.passjobs`): one a block of the data dir
    (:func:`asrtrain.data.datadir.split_data_dir`: whole speakers, balanced by
    ``utt2num_frames``, how many not depending on ``nj``; a job's utterances are the pass's
    utterances of its block), ``nj`` processes serving them, and the work dir the parent and the
    jobs share, ``.<pass>.*.work.tmp`` beside the output (removed at the end; a killed run's is
    removed by the pipeline with the other temporaries): the current model (``cur.mdl``),
    transforms (``trans.scp``), LDA matrix, the jobs' alignment parts and graphs.  The jobs read
    the current alignment from ``prev_ali`` (the previous pass's table) until the pass aligns,
    then from their own parts.  Local jobs run in one pool of processes kept for the pass
    (:class:`asrtrain.jobs.JobPool`)."""

    def __init__(self, data_dir: Path, lang_dir: Path, out_dir: Path, utts: list[str],
                 data: DataDir, jobs: JobConfig, c: GmmConfig, name: str) -> None:
        # the data dir's blocks (data/<set>/split<N>/<k>, whole speakers, by a rule that
        # does not involve nj), each job's utterances those of the pass in its block
        wanted = set(utts)
        blocks = [(d, [u for u in sorted(read_table(d / "utt2spk")) if u in wanted])
                  for d in split_data_dir(data_dir)]
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.",
                                          suffix=".work.tmp")).resolve()
        # absolute paths: a job may run elsewhere (cmd: slurm), in another directory
        self.parts = [Part(k + 1, str(Path(d).resolve()), str(Path(lang_dir).resolve()),
                           us, str(self.work)) for k, (d, us) in enumerate(blocks) if us]
        self.jobs, self.cfg, self.name = jobs, asdict(c), name
        self.in_process = torch.device(c.device).type != "cpu"   # one process on a GPU
        self.prev_ali: str | None = None
        self.trans: str | None = None
        self.num_utts = len(utts)
        self.compiled = 0
        # one pool of local processes for the pass's every run of jobs (not one per iteration)
        self.pool = JobPool(JobConfig(nj=max(1, min(jobs.nj, len(self.parts))), cmd=jobs.cmd,
                                      threads=jobs.threads))

    def __enter__(self) -> PassJobs:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.pool.close(cancel=exc[0] is not None)
        finally:
            forget(self.work)
            shutil.rmtree(self.work, ignore_errors=True)

    def run(self, fn: Callable, make: Callable[[Part], object], desc: str) -> list:
        """``fn`` over the blocks, ``make(part)`` its argument; results in block order, their
        statistics (:data:`SUMMED`) added into the first result's as each result comes, in
        block order (``gmm-sum-accs``; a result that comes early waits for those before it),
        and dropped from the others: the stage holds one sum and the results waiting, not
        every block's statistics.  Jobs run here one after another (one job, ``nj=1``, a GPU)
        draw their own progress bar over the utterances they align (``progress``); parallel
        jobs have the runner's bar over jobs."""
        args = [make(p) for p in self.parts]
        here = self.jobs.cmd == "local" and (self.in_process or len(args) == 1
                                             or self.jobs.nj == 1)
        if here:
            for a in args:
                if hasattr(a, "progress"):
                    a.progress = f"{self.name}: {desc}"
        out: list = []
        for r in self._results(fn, args, f"{self.name}: {desc}", here):
            if out:
                add_statistics(out[0], r)
            out.append(r)
        return out

    def _results(self, fn: Callable, args: list, desc: str, here: bool) -> Iterator:
        """The jobs' results in block order, each as soon as it and those before it are done;
        local jobs are given to the pool at most ``2 * nj`` ahead of the first not yet taken
        (the results that wait are bounded); a SLURM array's results that come early wait in
        their pickles on disk (:func:`asrtrain.jobs.iter_cluster_jobs`)."""
        if self.jobs.cmd == "slurm":
            yield from iter_cluster_jobs(fn, args, self.jobs, desc)
            return
        if self.jobs.cmd != "local":
            yield from run_jobs(fn, args, self.jobs, desc, in_process=self.in_process,
                                pool=self.pool)
            return
        if here:
            with Bar(total=len(args), desc=desc, unit="job", file=sys.stderr,
                     hidden=len(args) == 1, leave=False) as bar:
                for a in args:
                    yield fn(a)
                    bar.update()
            return
        yield from _pooled_in_order(fn, args, self.pool, desc, 2 * self.jobs.nj)

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


#: The fields of the jobs' results that are statistics, summed block by block.
SUMMED = ("stats", "counts", "moments", "mllt", "alimdl", "alimdl_moments", "tree", "lda")


def add_statistics(total: object, r: object) -> None:
    """``r``'s statistics (:data:`SUMMED`) added into ``total``'s (float64, in place) and
    taken from ``r``."""
    for name in SUMMED:
        x = getattr(r, name, None)
        if x is None:
            continue
        y = getattr(total, name)
        if y is None:
            setattr(total, name, x)
        elif name == "counts":
            add_transition_counts(y, x)
        else:
            y.add(x)
        setattr(r, name, None)


def _pooled_in_order(fn: Callable, args: list, pool: JobPool, desc: str, ahead: int
                     ) -> Iterator:
    """``fn(a)`` for each of ``args`` in ``pool``'s processes, yielded in ``args``' order;
    at most ``ahead`` calls given out beyond the first result not yet yielded.  A job that
    fails or dies ends the pool and raises, naming the job (as :func:`run_jobs`)."""
    executor = pool.executor()
    futures: dict[int, Future] = {}
    nxt = 0
    try:
        with Bar(total=len(args), desc=desc, unit="job", file=sys.stderr, disable=None,
                 leave=False) as bar:
            for i in range(len(args)):
                while nxt < len(args) and nxt < i + max(ahead, 1):
                    futures[nxt] = executor.submit(fn, args[nxt])
                    nxt += 1
                try:
                    r = futures.pop(i).result()
                except BrokenProcessPool as e:
                    raise AsrtrainError(f"{desc}: a job process died (killed or out of "
                                        f"memory) while job {i + 1} of {len(args)} ran") from e
                except AsrtrainError as e:
                    raise AsrtrainError(f"{desc}: job {i + 1} of {len(args)}: {e}") from e
                except Exception as e:
                    raise AsrtrainError(f"{desc}: job {i + 1} of {len(args)} failed: "
                                        f"{type(e).__name__}: {e}") from e
                bar.update()
                yield r
    except BaseException:
        for f in futures.values():
            f.cancel()
        pool.close(cancel=True)   # a failed or interrupted run ends its pool
        raise


def align_result(parts: list[IterResult]) -> AlignResult:
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


def train_iters(model: AcousticModel, pj: PassJobs, cfg: GmmConfig, target_gauss: int,
                plog: PassLog, mllt: MlltHook | None = None,
                fmllr: FmllrHook | None = None) -> tuple[AlignResult, list[IterResult]]:
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
            model.var_floor = cfg.var_floor_factor * parts[0].moments.mean_var()[1]
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
    res = align_result(parts)
    bar.update()
    bar.close()
    check_failures(res, pj.num_utts, cfg.max_fail_fraction, f"{plog.name} final alignment")
    plog(f"training graphs: {pj.compiled} compiled for {pj.num_utts} utterances in "
         f"{plural(len(pj.parts), 'job')} (kept on disk per job for the pass)")
    plog.record(cfg.num_iters + 1, res, res.loglike_per_frame, res.frames, res.seconds,
                model.gmm.num_gauss())
    return res, parts


def _checked(parts: list[IterResult], align: str, pj: PassJobs, cfg: GmmConfig,
             plog: PassLog, it: int) -> AlignResult | None:
    """An iteration's alignment figures (None when it did not align), failures checked."""
    if align != "viterbi":
        return None
    res = align_result(parts)
    check_failures(res, pj.num_utts, cfg.max_fail_fraction, f"{plog.name} iter {it}")
    return res


def pass_utterances(data_dir: Path, lang: Lang) -> tuple[list[str], dict[str, str], DataDir]:
    """The data dir's utterances a pass trains on (its transcript in the lexicon), those
    left out with why, and the data dir (read and checked: features, CMVN; no features read)."""
    data = mfcc_reader(data_dir).data
    words, skipped = transcripts(data, lang)
    return list(words), skipped, data


def aligned_utterances(utts: list[str], skipped: dict[str, str], ali_dir: Path,
                        plog: PassLog, c: GmmConfig) -> list[str]:
    """The utterances that have an alignment in ``ali_dir`` (logged: those skipped or without
    one; the table's keys only are read here, the jobs check the lengths); too few is an
    error."""
    prev = kaldiio.load_scp(str(existing_file(ali_dir / "ali_phone_state.scp")))
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


def existing_file(path: Path) -> Path:
    if not path.is_file():
        raise AsrtrainError(f"{path}: missing")
    return path


def tree_model(pj: PassJobs, features: Features, lang: Lang, ali_dir: Path, c: GmmConfig,
                plog: PassLog, fmllr_model: str | None = None
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
    stats = parts[0].tree   # the blocks' sums (PassJobs.run)
    mean, var = parts[0].moments.mean_var()
    var_floor = c.var_floor_factor * var
    ps = lang.phones
    sets = [[ps.phones[v] for v in ps.variants(b)] for b in ps.bases]
    questions = cluster_phones(stats, sets, var_floor) + ps.questions()
    tree, tsum = build_tree(stats, ps.root_of(), questions, num_states(lang), c.num_leaves,
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


def write_pass(out_dir: Path, model: AcousticModel, lang: Lang, pj: PassJobs, plog: PassLog,
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
