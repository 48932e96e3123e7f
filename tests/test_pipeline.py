"""The stage graph on toy stages: digests, exact invalidation, --force, inner steps, the plan,
the exp-dir lock. (The same on the real tiny recipe: tests/test_invalidation.py.)

The toy graph:   a ──> b ──> c        a ──> d      (b and d are independent branches)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from asrtrain import AsrtrainError, Interrupted
from asrtrain.pipeline import Stage, StageContext, exp_lock, run_recipe

READS = {"a": (), "b": ("a",), "c": ("b",), "d": ("a",)}


def _stages(log: list, fail: frozenset[str] = frozenset(), **extra) -> dict[str, Stage]:
    def make(name: str) -> Stage:
        def run(ctx: StageContext) -> None:
            log.append((name, ctx.fresh))
            if name in fail:
                raise RuntimeError(f"{name} failed")
            (ctx.paths.exp / f"{name}.out").write_text(str(ctx.cfg[name]))
        return Stage(name, run, READS[name], (name,), f"the {name} stage", **extra.get(name, {}))
    return {n: make(n) for n in READS}


def _cfg(tmp_path: Path, **sections) -> OmegaConf:
    return OmegaConf.create({"exp_dir": str(tmp_path / "exp"), "stages": ["a", "b", "c", "d"],
                             "a": {"x": 1}, "b": {"y": 2}, "c": {"z": 3}, "d": {"w": 4},
                             **sections})


def _ran(log: list) -> list[str]:
    return [name for name, _ in log]


def test_second_run_does_nothing(tmp_path: Path) -> None:
    log: list = []
    assert run_recipe(_cfg(tmp_path), _stages(log)) == ["a", "b", "c", "d"]
    assert run_recipe(_cfg(tmp_path), _stages(log)) == []
    assert _ran(log) == ["a", "b", "c", "d"]


def test_a_change_reruns_what_reads_it_and_not_the_other_branch(tmp_path: Path) -> None:
    log: list = []
    run_recipe(_cfg(tmp_path), _stages(log))
    assert run_recipe(_cfg(tmp_path, b={"y": 5}), _stages(log)) == ["b", "c"]
    assert run_recipe(_cfg(tmp_path, b={"y": 5}, d={"w": 0}), _stages(log)) == ["d"]
    assert run_recipe(_cfg(tmp_path, b={"y": 5}, d={"w": 0}, c={"z": 0}),
                      _stages(log)) == ["c"]
    # the root reaches everything
    assert run_recipe(_cfg(tmp_path, a={"x": 9}, b={"y": 5}, d={"w": 0}, c={"z": 0}),
                      _stages(log)) == ["a", "b", "c", "d"]


def test_changing_a_key_back_reruns_again(tmp_path: Path) -> None:
    log: list = []
    run_recipe(_cfg(tmp_path), _stages(log))
    run_recipe(_cfg(tmp_path, b={"y": 5}), _stages(log))
    assert run_recipe(_cfg(tmp_path), _stages(log)) == ["b", "c"]


def test_force_a_stage_reruns_it_and_its_readers_fresh(tmp_path: Path) -> None:
    log: list = []
    run_recipe(_cfg(tmp_path), _stages(log))
    log.clear()
    assert run_recipe(_cfg(tmp_path), _stages(log), force={"b"}) == ["b", "c"]
    assert log == [("b", True), ("c", True)]
    log.clear()
    assert run_recipe(_cfg(tmp_path), _stages(log), force=True, start="c", stop="c") == ["c"]
    with pytest.raises(AsrtrainError, match="--force x: not a stage"):
        run_recipe(_cfg(tmp_path), _stages(log), force={"x"})


def test_failed_stage_leaves_no_record_and_the_rerun_resumes_there(tmp_path: Path) -> None:
    log: list = []
    with pytest.raises(RuntimeError):
        run_recipe(_cfg(tmp_path), _stages(log, fail=frozenset({"b"})))
    assert not (tmp_path / "exp" / ".done" / "b").exists()
    log.clear()
    assert run_recipe(_cfg(tmp_path), _stages(log)) == ["b", "c", "d"]
    # b's own record was missing: its inner steps may be resumed; c reads a stage that reran
    assert log == [("b", False), ("c", True), ("d", False)]


def test_a_stale_input_outside_the_range_is_an_error(tmp_path: Path) -> None:
    log: list = []
    run_recipe(_cfg(tmp_path), _stages(log))
    with pytest.raises(AsrtrainError, match=r"stage c reads b, which is not up to date "
                                            r"\(config changed: b.y: 2 -> 7\)"):
        run_recipe(_cfg(tmp_path, b={"y": 7}), _stages(log), start="c")
    # an input that was rerun separately is seen as changed
    assert run_recipe(_cfg(tmp_path, b={"y": 7}), _stages(log), stop="b") == ["b"]
    assert run_recipe(_cfg(tmp_path, b={"y": 7}), _stages(log), start="c") == ["c"]


def test_dry_run_says_why_and_runs_nothing(tmp_path: Path, capsys) -> None:
    log: list = []
    run_recipe(_cfg(tmp_path), _stages(log))
    log.clear()
    would = run_recipe(_cfg(tmp_path, b={"y": 5}), _stages(log), dry_run=True)
    assert would == ["b", "c"] and log == []
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["a", "done"]
    assert "config changed: b.y: 2 -> 5" in out[1]
    assert "b reruns" in out[2]
    assert out[3].split()[:2] == ["d", "done"]


def test_ignored_and_resumable_keys(tmp_path: Path) -> None:
    log: list = []
    keys: dict[str, str] = {}

    def stages():
        s = _stages(log, b={"ignored": ("b.threads",), "resumable": ("b.epochs",)})
        run_b = s["b"].run

        def run(ctx: StageContext) -> None:
            keys[ctx.digest] = ctx.resume_key
            run_b(ctx)
        return {**s, "b": Stage("b", run, ("a",), ("b",), "b", ("b.threads",), ("b.epochs",))}

    run_recipe(_cfg(tmp_path, b={"epochs": 1, "threads": 1}), stages())
    # a launch setting changes nothing
    assert run_recipe(_cfg(tmp_path, b={"epochs": 1, "threads": 4}), stages()) == []
    # more epochs rerun the stage with the same resume key: it continues where it was
    assert run_recipe(_cfg(tmp_path, b={"epochs": 2, "threads": 1}), stages()) == ["b", "c"]
    assert len(keys) == 2 and len(set(keys.values())) == 1


def test_inner_steps_resume_within_one_digest_only(tmp_path: Path) -> None:
    done: list[str] = []

    def run_b(ctx: StageContext) -> None:
        for step in ("one", "two", "three"):
            marker = ctx.paths.exp / f"b.{step}.done"
            key = ctx.step_key(step)
            if ctx.step_done(marker, key):
                continue
            if step == "two" and ctx.cfg.b.get("die"):
                raise KeyboardInterrupt
            done.append(step)
            marker.write_text(key)

    def stages():
        s = _stages([])
        return {**s, "b": Stage("b", run_b, ("a",), ("b",), "b", resumable=("b.die",))}

    with pytest.raises(Interrupted, match="stage b interrupted by SIGINT") as e:
        run_recipe(_cfg(tmp_path, b={"y": 2, "die": True}), stages())
    assert e.value.exit_code == 130
    assert done == ["one"]
    run_recipe(_cfg(tmp_path, b={"y": 2}), stages())
    assert done == ["one", "two", "three"]          # resumed at the step it was in
    run_recipe(_cfg(tmp_path, a={"x": 5}, b={"y": 2}), stages())
    assert done == ["one", "two", "three"] * 2      # an input changed: every step again
    run_recipe(_cfg(tmp_path, a={"x": 5}, b={"y": 2}), stages(), force={"b"})
    assert done == ["one", "two", "three"] * 3      # forced: every step again


def test_a_stage_before_its_input_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AsrtrainError, match="b reads a, which comes after it"):
        run_recipe(_cfg(tmp_path, stages=["b", "a"]), _stages([]))


def test_checks_run_before_anything_is_written(tmp_path: Path) -> None:
    log: list = []

    def check(cfg) -> None:
        if cfg.c.z < 0:
            raise AsrtrainError("c.z must be >= 0")

    with pytest.raises(AsrtrainError, match="c.z must be"):
        run_recipe(_cfg(tmp_path, c={"z": -1}), _stages(log, c={"check": check}))
    assert log == [] and not (tmp_path / "exp" / ".done").exists()
    with pytest.raises(AsrtrainError, match="c.z must be"):  # a dry run refuses it too
        run_recipe(_cfg(tmp_path, c={"z": -1}), _stages(log, c={"check": check}), dry_run=True)


def test_the_record_is_json_with_config_and_inputs(tmp_path: Path) -> None:
    run_recipe(_cfg(tmp_path), _stages([]))
    record = json.loads((tmp_path / "exp" / ".done" / "c").read_text())
    b = json.loads((tmp_path / "exp" / ".done" / "b").read_text())
    assert record["config"] == {"c": {"z": 3}} and record["inputs"] == {"b": b["digest"]}


def test_a_second_run_on_one_exp_dir_is_refused(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    with exp_lock(exp):
        code = ("from pathlib import Path; from asrtrain.pipeline import exp_lock\n"
                f"with exp_lock(Path({str(exp)!r})): pass")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode != 0 and f"{exp} is in use by pid" in proc.stderr
    with exp_lock(exp):     # released: free again
        pass


def test_the_makefile_has_one_target_per_stage_of_the_table() -> None:
    from asrtrain.stages import STAGES

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    line = next(ln for ln in makefile.splitlines() if ln.startswith("STAGES :="))
    assert line.split(":=")[1].split() == list(STAGES)


def test_every_stage_lives_in_the_module_named_after_it() -> None:
    from asrtrain.stages import STAGES

    for name, stage in STAGES.items():
        assert stage.run.__module__ == f"asrtrain.stages.{name}", name
        for r in stage.reads:
            base, _, part = r.partition(":")
            assert base in STAGES, f"{name} reads unknown stage {r}"
            assert not part or part in STAGES[base].parts, f"{name} reads unknown part {r}"


# ------------------------------------------------------------- a stage's parts, user files
def _part_stages(log: list, tmp_path: Path) -> dict[str, Stage]:
    """a has a part p (its key a.p only); b reads that part, c reads b, d reads all of a; a
    reads the user's file in.txt."""
    stages = _stages(log)
    stages["a"] = Stage("a", stages["a"].run, (), ("a",), "the a stage",
                        files=lambda cfg: [tmp_path / "in.txt"], parts={"p": ("a.p",)})
    stages["b"] = Stage("b", stages["b"].run, ("a:p",), ("b",), "the b stage")
    return stages


def test_a_reader_of_a_part_reruns_only_when_that_part_changes(tmp_path: Path) -> None:
    log: list = []
    (tmp_path / "in.txt").write_text("hello\n")
    cfg = _cfg(tmp_path, a={"x": 1, "p": 1})
    assert run_recipe(cfg, _part_stages(log, tmp_path)) == ["a", "b", "c", "d"]
    # a key outside the part: a and what reads all of a, not the part's reader
    assert run_recipe(_cfg(tmp_path, a={"x": 2, "p": 1}),
                      _part_stages(log, tmp_path)) == ["a", "d"]
    assert run_recipe(_cfg(tmp_path, a={"x": 2, "p": 2}),
                      _part_stages(log, tmp_path)) == ["a", "b", "c", "d"]
    # a forced (fresh) run makes every part anew: its readers follow
    assert run_recipe(_cfg(tmp_path, a={"x": 2, "p": 2}), _part_stages(log, tmp_path),
                      force=["a"]) == ["a", "b", "c", "d"]
    assert run_recipe(_cfg(tmp_path, a={"x": 2, "p": 2}), _part_stages(log, tmp_path)) == []


def test_a_user_file_enters_the_digest_by_content(tmp_path: Path, capsys) -> None:
    import os

    log: list = []
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    cfg = _cfg(tmp_path, a={"x": 1, "p": 1})
    assert run_recipe(cfg, _part_stages(log, tmp_path)) == ["a", "b", "c", "d"]
    record = json.loads((tmp_path / "exp" / ".done" / "a").read_text())
    assert list(record["files"]) == [str(src)]
    # touched, or rewritten with the same content: nothing reruns
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 5_000_000_000))
    assert run_recipe(cfg, _part_stages(log, tmp_path)) == []
    src.write_text("hello\n")
    assert run_recipe(cfg, _part_stages(log, tmp_path)) == []
    # the same size and time, another content: the cache's fast path would miss it, so an
    # edit that keeps both is still found once the cache entry is gone (a new exp dir's cache)
    src.write_text("hellO\n")
    capsys.readouterr()
    assert run_recipe(cfg, _part_stages(log, tmp_path), dry_run=True) == ["a", "d"]
    assert f"a              runs: changed: {src}" in capsys.readouterr().out
    assert run_recipe(cfg, _part_stages(log, tmp_path)) == ["a", "d"]
    src.unlink()
    capsys.readouterr()
    run_recipe(cfg, _part_stages(log, tmp_path), dry_run=True)
    assert f"runs: removed: {src}" in capsys.readouterr().out
    # many files changed at once: three named, the rest counted
    many = [tmp_path / f"t{i}" for i in range(5)]
    stages = _part_stages(log, tmp_path)
    stages["a"] = Stage("a", stages["a"].run, (), ("a",), "the a stage",
                        files=lambda cfg: many, parts={"p": ("a.p",)})
    capsys.readouterr()
    run_recipe(cfg, stages, dry_run=True)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("a "))
    assert f"no longer read: {src}; new input: {many[0]}; new input: {many[1]}; and 3 more " \
        "input files" in line, line


def test_a_part_unchanged_outside_the_range_is_no_stale_input(tmp_path: Path) -> None:
    log: list = []
    (tmp_path / "in.txt").write_text("hello\n")
    run_recipe(_cfg(tmp_path, a={"x": 1, "p": 1}), _part_stages(log, tmp_path))
    # a is out of date (a.x) and left out, but b reads only its part p, which a.x leaves alone
    cfg = _cfg(tmp_path, a={"x": 2, "p": 1}, b={"y": 7})
    assert run_recipe(cfg, _part_stages(log, tmp_path), start="b", stop="c") == ["b", "c"]
    # d reads all of a: refused
    with pytest.raises(AsrtrainError, match="stage d reads a, which is not up to date"):
        run_recipe(cfg, _part_stages(log, tmp_path), start="b")
    # and the part changed: b is refused too
    with pytest.raises(AsrtrainError, match="stage b reads a, which is not up to date"):
        run_recipe(_cfg(tmp_path, a={"x": 2, "p": 2}, b={"y": 8}), _part_stages(log, tmp_path),
                   start="b", stop="c")


def test_a_stage_reading_an_unknown_part_is_refused(tmp_path: Path) -> None:
    stages = _stages([])
    stages["b"] = Stage("b", stages["b"].run, ("a:q",), ("b",), "the b stage")
    with pytest.raises(AsrtrainError, match="stage b reads a:q: stage a has no part 'q'"):
        run_recipe(_cfg(tmp_path), stages)
