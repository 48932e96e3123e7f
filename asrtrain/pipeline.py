"""The stage graph: which stages of a recipe must run, and why (docs/architecture.md, "The stage
graph").

Each stage declares the stages whose outputs it reads and the config keys its result depends on.
Its digest is a hash of those config values and of its inputs' digests, so a change reaches
exactly the stages downstream of it and independent branches never invalidate each other. A
finished stage leaves ``exp/.done/<stage>``, a JSON record of its digest, config and inputs; a
stage reruns when, and only when, its digest differs from that record, ``--force`` names it, or a
stage it reads reruns. Inside a stage, steps that are expensive to redo (a GMM pass, a training
run's checkpoints) are keyed by ``StageContext.resume_key``, which changes with any input, so a run
killed mid-stage resumes at the step it was in and nothing is reused once an input changed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError, Interrupted, interrupt_signal
from asrtrain.fileio import describe_os_error, remove_temporaries, write_text
from asrtrain.jobs import JobConfig, job_log_dir, set_threads
from asrtrain.recipe import Paths
from asrtrain.records import read_marker

log = logging.getLogger("asrtrain")

#: Sentinel for a config key the composed config does not have.
ABSENT = "<absent>"


@dataclass(frozen=True)
class Stage:
    """One node of the graph.

    ``reads``: the stages whose outputs it reads (those absent from a recipe count as absent).
    ``config``: dotted config keys whose values its result depends on, or a function of the
    config giving those values (when the stage composes its settings, as ``train_hybrid`` does).
    ``ignored``: dotted keys under those that never change the result (how a run is launched or
    logged, e.g. ``trainer.threads``): left out of the digest.
    ``resumable``: dotted keys that may change without discarding the progress of its inner
    steps (e.g. ``trainer.epochs``: more epochs continue from the last checkpoint).
    ``check``: validates the config without touching disk; run for every stage that will run
    before any of them starts.
    ``verify``: for a stage whose record is up to date, why its outputs cannot be trusted (e.g.
    a model cut short after it was written), or None; a reason makes it run again, resuming.
    ``files``: the files the user gives that it reads (a data dir's tables, a lexicon): they
    enter its digest by content (``FileDigests``), so an edit reruns it and a touch does not.
    ``step_files``: those of ``files`` that only some inner steps read (as ``resumable`` for
    keys): left out of the resume key; the steps that read them key on ``StageContext.files``.
    ``parts``: outputs of its own with a digest of their own, each depending on some of its
    config keys only (``lang``'s ``units``: not on the lexicon); a reader names one as
    ``"lang:units"`` and reruns only when that part's digest changes.
    """

    name: str
    run: Callable[[StageContext], None]
    reads: tuple[str, ...]
    config: tuple[str, ...] | Callable[[DictConfig], dict[str, Any]]
    doc: str
    ignored: tuple[str, ...] = ()
    resumable: tuple[str, ...] = ()
    check: Callable[[DictConfig], None] | None = None
    verify: Callable[[DictConfig, Paths], str | None] | None = None
    checks_first: bool = False  # calls ``StageContext.start`` itself, after checking its inputs
    files: Callable[[DictConfig], Sequence[Path]] | None = None
    step_files: Callable[[DictConfig], Sequence[Path]] | None = None
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class StageContext:
    """What a running stage gets: the config, the paths, and the keys of its inner steps."""

    cfg: DictConfig
    paths: Paths
    stage: Stage
    digest: str
    resume_key: str
    fresh: bool = False      # forced, or an input reran: discard inner progress
    on_start: Callable[[bool], None] | None = None
    parts: dict[str, str] = field(default_factory=dict)   # the digest of each of its parts
    files: dict[str, str] = field(default_factory=dict)   # its input files' content digests
    inputs: dict[str, str | None] = field(default_factory=dict)  # the digests of what it reads
    forced: bool = False     # ``--force`` named it (a fresh start may also be an input's rerun)

    def start(self, keep_record: bool = False) -> None:
        """The stage has checked its inputs and now changes its outputs: its old record goes
        (``keep_record``: this run writes none of what it vouches for, e.g. another model's)
        and a fresh start's generation is written. Before that a failed run leaves a finished
        stage as it was. The pipeline calls it before ``run`` unless the stage ``checks_first``."""
        if self.on_start is not None:
            on_start, self.on_start = self.on_start, None
            on_start(keep_record)

    def jobs(self) -> JobConfig:
        """How this stage's jobs run (Kaldi's ``$cmd`` and ``--nj``): the recipe's ``nj``,
        ``cmd``, ``threads`` and ``slurm`` (launch settings: top-level keys, outside the stages'
        digests, as the results do not depend on them); job logs under the exp dir's ``log/``."""
        return JobConfig.from_config(self.cfg, log_dir=job_log_dir(self.paths.exp))

    def step_key(self, *parts: Any) -> str:
        """Key of an inner step: the stage's resume key and whatever identifies the step."""
        return _hash({"resume": self.resume_key, "step": parts})

    def step_done(self, marker: Path, key: str) -> bool:
        """Whether the inner step recorded in ``marker`` ran with ``key`` (never when fresh)."""
        return not self.fresh and marker.is_file() and marker.read_text().strip() == key


@dataclass
class Decision:
    """What the plan says of one stage."""

    stage: str
    run: bool
    reasons: list[str] = field(default_factory=list)
    digest: str = ""
    in_range: bool = True


def _hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def select(cfg: DictConfig, key: str) -> Any:
    """The resolved value of dotted ``key`` in ``cfg`` as plain data, or ``ABSENT``."""
    value = OmegaConf.select(cfg, key, default=ABSENT)
    if isinstance(value, DictConfig) or OmegaConf.is_list(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _config_values(cfg: DictConfig, keys: Sequence[str] | Callable) -> dict[str, Any]:
    return keys(cfg) if callable(keys) else {k: select(cfg, k) for k in keys}


def _strip(values: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``values`` without ``keys`` (each a dotted key, under one of ``values``' keys)."""
    out = json.loads(json.dumps(values, default=str))
    for key in keys:
        for top in out:
            if key == top:
                out[top] = ABSENT
            elif key.startswith(top + ".") and isinstance(out[top], dict):
                node = out[top]
                *parents, leaf = key[len(top) + 1:].split(".")
                for p in parents:
                    node = node.get(p) if isinstance(node, dict) else None
                if isinstance(node, dict):
                    node.pop(leaf, None)
    return out


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}"))
        return out or {prefix: {}}
    return {prefix: value}


def _config_changes(old: dict[str, Any], new: dict[str, Any], limit: int = 3) -> str:
    a = {k: v for key, val in old.items() for k, v in _flatten(val, key).items()}
    b = {k: v for key, val in new.items() for k, v in _flatten(val, key).items()}
    changed = [f"{k}: {a.get(k, ABSENT)!r} -> {b.get(k, ABSENT)!r}"
               for k in sorted(set(a) | set(b)) if a.get(k, ABSENT) != b.get(k, ABSENT)]
    more = f" and {len(changed) - limit} more" if len(changed) > limit else ""
    return "; ".join(changed[:limit]) + more


#: A user's file that does not exist (yet), in a record of file digests.
MISSING = "missing"


class FileDigests:
    """The content hashes of the files the user gives, with a cache in ``exp/.done/.files``:
    a file whose size and modification time equal the cached ones keeps its cached hash (the
    fast path); any other is read and hashed, so only a change of content changes its digest."""

    def __init__(self, cache: Path):
        self.cache_path = cache
        try:
            self.cache: dict[str, list] = json.loads(cache.read_text())
            if not isinstance(self.cache, dict):
                self.cache = {}
        except (OSError, ValueError):
            self.cache = {}
        self.changed = False

    def digest(self, path: Path) -> str:
        key = str(path)
        try:
            st = path.stat()
        except OSError:
            return MISSING
        if not path.is_file():
            return MISSING
        cached = self.cache.get(key)
        if isinstance(cached, list) and cached[:2] == [st.st_size, st.st_mtime_ns]:
            return str(cached[2])
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        except OSError as e:
            raise AsrtrainError(f"{path}: cannot read it: {e.strerror or e}") from e
        value = h.hexdigest()[:16]
        self.cache[key] = [st.st_size, st.st_mtime_ns, value]
        self.changed = True
        return value

    def save(self) -> None:
        """Keep the cache for the next run (only where the exp dir's records are)."""
        if self.changed and self.cache_path.parent.is_dir():
            try:
                write_text(self.cache_path, json.dumps(self.cache, indent=0, sort_keys=True))
            except OSError:   # a cache only: a read-only exp dir is refused elsewhere
                pass
            self.changed = False


def _file_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Why the recorded input files differ from those now, one reason a file."""
    out = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        if b is None:
            out.append(f"no longer read: {path}")
        elif a is None:
            out.append(f"new input: {path}")
        elif b == MISSING:
            out.append(f"removed: {path}")
        else:
            out.append(f"changed: {path}")
    return out


def _base(read: str) -> str:
    """The stage of a read (``lang`` of ``lang:units``)."""
    return read.split(":", 1)[0]


class Pipeline:
    """A recipe's stages in order, with their digests; ``plan`` says which must run and why."""

    def __init__(self, cfg: DictConfig, stages: dict[str, Stage]):
        self.cfg = cfg
        self.names = [str(n) for n in cfg.stages]
        for n in self.names:
            if n not in stages:
                raise AsrtrainError(f"recipe stage {n!r} is unknown; known stages: "
                                    f"{', '.join(stages)}")
        if len(set(self.names)) != len(self.names):
            raise AsrtrainError(f"stages: {self.names} names a stage twice")
        self.stages = {n: stages[n] for n in self.names}
        self.paths = Paths(Path(cfg.exp_dir))
        self.values: dict[str, dict[str, Any]] = {}
        self.generations: dict[str, str | None] = {}
        self.files: dict[str, dict[str, str]] = {}
        file_digests = FileDigests(self.paths.markers / ".files")
        for i, name in enumerate(self.names):
            stage = self.stages[name]
            for r in stage.reads:
                base, _, part = r.partition(":")
                if base in self.stages and self.names.index(base) > i:
                    raise AsrtrainError(f"stages: {name} reads {base}, which comes after it; "
                                        f"put {base} first")
                if part and (base not in stages or part not in stages[base].parts):
                    raise AsrtrainError(f"stage {name} reads {r}: stage {base} has no part "
                                        f"{part!r}")
            self.values[name] = _strip(_config_values(cfg, stage.config), stage.ignored)
            files = stage.files(cfg) if stage.files is not None else ()
            if files:   # only stages that read a user's files: the others keep their digests
                self.files[name] = {str(p): file_digests.digest(Path(p)) for p in files}
            generation = self._generation_file(name)
            self.generations[name] = (generation.read_text().strip() if generation.is_file()
                                      else None)
        file_digests.save()
        self.inputs: dict[str, dict[str, str | None]] = {}
        self.digests: dict[str, str] = {}
        self._digest_from(0)

    def _generation_file(self, name: str) -> Path:
        return self.paths.markers / f".{name}.generation"

    def _force_note(self, name: str) -> tuple[Path, str]:
        """Where a forced run that started ``name`` says so, and what it says: the stage's
        settings and inputs. While it is there (until a run ends well), ``--force`` of the same
        stage with the same settings resumes that run (a SLURM requeue, "run the same command
        to resume" after Ctrl-C) instead of starting it over once more."""
        return (self.paths.markers / f".{name}.forced",
                _hash({"config": _strip(self.values[name], self.stages[name].resumable),
                       "inputs": self.inputs[name]}))

    def _force_begun(self, name: str) -> bool:
        note, key = self._force_note(name)
        return note.is_file() and note.read_text().strip() == key

    def _digest_from(self, first: int) -> None:
        """(Re)compute the digests of the stages from index ``first`` on, in order."""
        for name in self.names[first:]:
            stage = self.stages[name]
            self.inputs[name] = {r: self.digests.get(r) for r in stage.reads}
            content: dict[str, Any] = {"config": self.values[name], "inputs": self.inputs[name],
                                       "generation": self.generations[name]}
            if name in self.files:
                content["files"] = self.files[name]
            self.digests[name] = _hash(content)
            for part, keys in stage.parts.items():
                self.digests[f"{name}:{part}"] = _hash(
                    {"part": part, "config": {k: select(self.cfg, k) for k in keys},
                     "inputs": self.inputs[name], "generation": self.generations[name]})

    def resume_key(self, name: str) -> str:
        """The key of the stage's inner progress: its digest less the resumable settings. The
        digest holds the generation of the stage's last fresh start (a forced run, or one after
        an input reran), so no inner step made from the inputs before is reused."""
        stage = self.stages[name]
        content: dict[str, Any] = {"config": _strip(self.values[name], stage.resumable),
                                   "inputs": self.inputs[name],
                                   "generation": self.generations[name]}
        if name in self.files:   # an edited input file: no inner step made from it is reused
            steps = {str(p) for p in stage.step_files(self.cfg)} if stage.step_files else set()
            kept = {p: d for p, d in self.files[name].items() if p not in steps}
            if kept:
                content["files"] = kept
        return _hash(content)

    def plan(self, start: str | None = None, stop: str | None = None,
             force: bool | Collection[str] = False) -> list[Decision]:
        """Which stages from ``start`` to ``stop`` run, and why; ``force`` is True (every stage
        in the range) or the names of stages to rerun (with what reads them)."""
        for n in (start, stop):
            if n is not None and n not in self.names:
                raise AsrtrainError(f"stage {n!r} is not in this recipe; its stages: "
                                    f"{', '.join(self.names)}")
        i0 = self.names.index(start) if start else 0
        i1 = self.names.index(stop) if stop else len(self.names) - 1
        if i0 > i1:
            raise AsrtrainError(f"--stage {start} comes after --to {stop} in this recipe")
        forced = set(self.names[i0:i1 + 1]) if force is True else set(force or ())
        unknown = forced - set(self.names)
        if unknown:
            raise AsrtrainError(f"--force {', '.join(sorted(unknown))}: not a stage of this "
                                f"recipe; its stages: {', '.join(self.names)}")
        decisions: dict[str, Decision] = {}
        for i, name in enumerate(self.names):
            d = Decision(name, False, digest=self.digests[name], in_range=i0 <= i <= i1)
            if name in forced:   # the same command again after a stop resumes, not restarts
                d.reasons.append("forced: resuming the forced run that stopped"
                                 if self._force_begun(name) else "forced")
            record = read_marker(self.paths.markers / name)
            if record is None:
                d.reasons.append("not done yet")
            elif record["digest"] != self.digests[name]:
                d.reasons.extend(self._why_changed(name, record))
            elif (bad := self._verify(name)) is not None:
                d.reasons.append(bad)
            for r in self.stages[name].reads:
                base = _base(r)
                if base in decisions and decisions[base].run:
                    if (":" in r and record is not None
                            and record.get("inputs", {}).get(r) == self.digests.get(r)):
                        continue   # its part is kept as it was: what reads only that part stays
                    d.reasons = [x for x in d.reasons if x != f"{r} changed"]
                    d.reasons.append(f"{r} reruns")
            d.run = bool(d.reasons)
            if d.run and d.in_range and self._fresh(d):
                # A fresh start is a new generation: a new digest, which its readers see.
                self.generations[name] = f"{time.time_ns()}-{name}"
                self._digest_from(i)
                d.digest = self.digests[name]
            decisions[name] = d
        self._check_inputs_outside_range(decisions)
        return list(decisions.values())

    def _verify(self, name: str) -> str | None:
        verify = self.stages[name].verify
        return verify(self.cfg, self.paths) if verify is not None else None

    @staticmethod
    def _fresh(d: Decision) -> bool:
        """Inner progress stays usable only when the stage's own record was the reason."""
        return any(r == "forced" or r.endswith(" reruns") for r in d.reasons)

    def _why_changed(self, name: str, record: dict) -> list[str]:
        reasons = []
        old_inputs = record.get("inputs", {})
        for r, digest in self.inputs[name].items():
            if old_inputs.get(r, ABSENT) != digest:
                reasons.append(f"{r} changed" if digest else f"{r} is not in the recipe now")
        changes = _config_changes(record.get("config", {}), self.values[name])
        if changes:
            reasons.append(f"config changed: {changes}")
        files = _file_changes(record.get("files") or {}, self.files.get(name, {}))
        if len(files) > 3:   # e.g. a data dir whose every table changed
            files = [*files[:3], f"and {len(files) - 3} more input files"]
        reasons.extend(files)
        return reasons or ["its record differs"]

    def _check_inputs_outside_range(self, decisions: dict[str, Decision]) -> None:
        """A stage that runs must not read the stale output of a stage the range leaves out."""
        for d in decisions.values():
            if not (d.run and d.in_range):
                continue
            for read in self.stages[d.stage].reads:
                r = _base(read)
                dr = decisions.get(r)
                if dr is not None and dr.run and not dr.in_range:
                    record = read_marker(self.paths.markers / d.stage) or {}
                    if ":" in read and record.get("inputs", {}).get(read) == self.digests[read]:
                        continue   # the part it reads is the one it was made from: not stale
                    raise AsrtrainError(
                        f"stage {d.stage} reads {r}, which is not up to date "
                        f"({'; '.join(dr.reasons)}) and not in --stage/--to; run {r} first "
                        f"(e.g. --stage {r})")

    def check(self, decisions: Sequence[Decision]) -> None:
        """Validate the config of every stage that will run, before any of them starts."""
        nj = self.cfg.get("nj", 1)
        if isinstance(nj, bool) or not isinstance(nj, int) or nj < 1:
            raise AsrtrainError(f"nj={nj!r}: the number of parallel jobs must be a whole number "
                                "of at least 1")
        for d in decisions:
            check = self.stages[d.stage].check
            if d.run and d.in_range and check is not None:
                check(self.cfg)

    def context(self, d: Decision) -> StageContext:
        """The running stage's context; a fresh start's new generation is written when the
        stage starts (``StageContext.start``), so a run killed after it resumes within that
        generation and one refused before it leaves the stage as it was."""
        fresh = self._fresh(d)
        note = self._force_note(d.stage)

        def start(keep_record: bool) -> None:
            if not keep_record:
                (self.paths.markers / d.stage).unlink(missing_ok=True)
            if fresh:
                write_text(self._generation_file(d.stage), f"{self.generations[d.stage]}\n")
            if "forced" in d.reasons:
                write_text(note[0], note[1] + "\n")
        parts = {p: self.digests[f"{d.stage}:{p}"] for p in self.stages[d.stage].parts}
        return StageContext(self.cfg, self.paths, self.stages[d.stage], self.digests[d.stage],
                            self.resume_key(d.stage), fresh, start, parts,
                            dict(self.files.get(d.stage, {})), dict(self.inputs[d.stage]),
                            any(r.startswith("forced") for r in d.reasons))

    def record(self, name: str) -> None:
        record = {"digest": self.digests[name], "config": self.values[name],
                  "inputs": self.inputs[name], "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        if name in self.files:
            record["files"] = self.files[name]
        write_text(self.paths.markers / name, json.dumps(record, indent=1, sort_keys=True,
                                                         default=str) + "\n")


def describe_plan(decisions: Sequence[Decision]) -> str:
    """The ``--dry-run`` listing: one line a stage."""
    lines = []
    for d in decisions:
        if not d.in_range:
            what = "outside --stage/--to"
        elif d.run:
            what = "runs: " + "; ".join(d.reasons)
        else:
            what = f"done (digest {d.digest})"
        lines.append(f"{d.stage:<14} {what}")
    return "\n".join(lines)


def run_recipe(cfg: DictConfig, stages: dict[str, Stage], start: str | None = None,
               stop: str | None = None, force: bool | Collection[str] = False,
               dry_run: bool = False) -> list[str]:
    """Run the recipe's stages from ``start`` to ``stop`` that the plan says must run; return
    their names (with ``dry_run``, print the plan and run nothing)."""
    pipeline = Pipeline(cfg, stages)
    decisions = pipeline.plan(start, stop, force)
    todo = [d for d in decisions if d.run and d.in_range]
    pipeline.check(todo)  # a dry run too: a plan the real run would refuse is no plan
    if dry_run:
        print(describe_plan(decisions), flush=True)
        _rescore(cfg, pipeline.paths.exp, dry_run=True)
        return [d.stage for d in todo]
    paths = pipeline.paths
    ran: list[str] = []
    t_all = time.time()
    with exp_lock(paths.exp):
        _remove_temporaries(paths.exp, "left by a run that was killed")
        for d in decisions:
            if not d.in_range:
                continue
            if not d.run:
                log.info("stage %-13s already done (digest %s): skipped", d.stage, d.digest)
                continue
            stage = pipeline.stages[d.stage]
            log.info("stage %-13s starts: %s (%s)", d.stage, stage.doc, "; ".join(d.reasons))
            ctx = pipeline.context(d)
            if not stage.checks_first:
                ctx.start()
            _use_scoring(cfg)
            set_threads(int(cfg.get("threads", 1) or 1))   # the stage's own process; its jobs
            #                                                set theirs (asrtrain.jobs)
            t0 = time.time()
            with _stage_log(paths.logs / f"{d.stage}.log"), _stage_failure(d.stage, paths.exp):
                stage.run(ctx)
                ctx.start()  # if the stage had nothing to change
            pipeline.record(d.stage)
            log.info("stage %-13s done in %.1f s", d.stage, time.time() - t0)
            ran.append(d.stage)
        _rescore(cfg, paths.exp)
    for note in paths.markers.glob(".*.forced"):  # the forced run is over
        note.unlink(missing_ok=True)
    in_range = [d.stage for d in decisions if d.in_range]
    where = paths.exp.resolve()   # where a relative exp_dir landed
    if not ran:
        log.info("nothing to do: every stage from %s to %s is done in %s", in_range[0],
                 in_range[-1], where)
    else:
        log.info("ran %s in %.1f s; the experiment is in %s", ", ".join(ran),
                 time.time() - t_all, where)
    return ran


def _scoring(cfg: DictConfig) -> dict[str, Any] | None:
    """The recipe's scoring options (``score.kaldi_filter``, ``score.backend``), or None."""
    if OmegaConf.select(cfg, "score") is None:
        return None
    return {"kaldi_filter": bool(OmegaConf.select(cfg, "score.kaldi_filter", default=True)),
            "backend": str(OmegaConf.select(cfg, "score.backend", default="python"))}


def _use_scoring(cfg: DictConfig) -> None:
    """Every stage that scores (``score``, ``align``'s GMM passes, ``decode_hybrid``) scores
    with the recipe's ``score.*``."""
    from asrtrain.score import set_scoring_options

    set_scoring_options(**(_scoring(cfg) or {}))


def _rescore(cfg: DictConfig, exp: Path, dry_run: bool = False) -> None:
    """RESULTS.md never mixes scorings: rows scored with other ``score.*`` options than the
    recipe's now (their stage did not rerun) are scored again (``asrtrain.score.rescore``)."""
    from asrtrain.score.rescore import rescore_stale, stale

    options = _scoring(cfg)
    if options is None or not (exp / "decode").is_dir():
        return
    if dry_run:
        rows = stale(exp, options)
        if rows:
            log.info("%d scored decode dir(s) hold other score.* options than %s (%s): the run "
                     "rescores them", len(rows), options, ", ".join(
                         f"{d.parent.name}/{d.name}" for d, _ in rows))
        return
    rescore_stale(exp, options)


def _remove_temporaries(exp: Path, why: str) -> None:
    count = remove_temporaries(exp)
    if count:
        log.info("removed %d half-written temporary file(s) under %s (%s)", count, exp, why)


@contextmanager
def _stage_failure(name: str, exp: Path) -> Iterator[None]:
    """Turn how a stage can end badly into one line naming the stage, and leave no half-written
    temporaries behind: an interruption (Ctrl-C, SIGTERM) and an error writing a file (a full
    disk, a read-only directory) are the user's to fix, not tracebacks."""
    try:
        yield
    except BaseException as e:
        _remove_temporaries(exp, f"stage {name} failed")
        signum = interrupt_signal(e)
        if signum is not None:
            raise Interrupted(f"stage {name} interrupted by {signal.Signals(signum).name}: what "
                              "finished is kept; run the same command to resume", signum) from e
        if isinstance(e, OSError):
            log.debug("stage %s failed", name, exc_info=True)
            raise AsrtrainError(f"stage {name}: {describe_os_error(e, exp)}") from e
        raise


@contextmanager
def exp_lock(exp: Path, name: str = ".lock", what: str | None = None) -> Iterator[None]:
    """Hold an exclusive lock on the experiment directory: two runs on one ``exp`` dir would
    overwrite each other's outputs, so the second one stops and says who holds it. ``name`` and
    ``what``: another lock file of it and what it guards (a node's ``.node<k>.lock``)."""
    path = exp / name
    try:
        exp.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise AsrtrainError(f"the experiment directory: {describe_os_error(e, exp)}") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another run"
            raise AsrtrainError(f"{exp}{' ' + what if what else ''} is in use by {holder}; "
                                "wait for it to finish") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%H:%M:%S')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


@contextmanager
def _stage_log(path: Path) -> Iterator[None]:
    """Copy every log record to the stage's own log file while the stage runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
