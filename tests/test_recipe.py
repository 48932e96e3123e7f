"""Recipe machinery: config composition, .done markers, resume and reruns after config changes."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from asrtrain import AsrtrainError
from asrtrain.recipe import Stage, compose_recipe, run_recipe


def _stages(log: list[str], fail: set[str] = frozenset()):
    def make(name):
        def run(cfg, paths):
            log.append(name)
            if name in fail:
                raise RuntimeError(f"{name} failed")
            (paths.exp / f"{name}.out").write_text(str(cfg.get(name)))
        return Stage(name, run, (name,), f"the {name} stage")
    return {n: make(n) for n in ("a", "b", "c")}


def _cfg(tmp_path: Path, **sections):
    return OmegaConf.create({"exp_dir": str(tmp_path / "exp"), "stages": ["a", "b", "c"],
                             "a": {"x": 1}, "b": {"y": 2}, "c": {"z": 3}, **sections})


def test_second_run_does_nothing(tmp_path: Path) -> None:
    log: list[str] = []
    assert run_recipe(_cfg(tmp_path), _stages(log)) == ["a", "b", "c"]
    assert run_recipe(_cfg(tmp_path), _stages(log)) == []
    assert log == ["a", "b", "c"]


def test_changed_config_reruns_that_stage_and_the_later_ones(tmp_path: Path) -> None:
    log: list[str] = []
    run_recipe(_cfg(tmp_path), _stages(log))
    log.clear()
    assert run_recipe(_cfg(tmp_path, b={"y": 5}), _stages(log)) == ["b", "c"]
    assert run_recipe(_cfg(tmp_path, b={"y": 5}), _stages(log), force=True, start="c") == ["c"]


def test_failed_stage_leaves_no_marker_and_resumes_there(tmp_path: Path) -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError):
        run_recipe(_cfg(tmp_path), _stages(log, fail={"b"}))
    assert not (tmp_path / "exp" / ".done" / "b").exists()
    log.clear()
    assert run_recipe(_cfg(tmp_path), _stages(log)) == ["b", "c"]


def test_stage_range_and_unknown_stage(tmp_path: Path) -> None:
    log: list[str] = []
    assert run_recipe(_cfg(tmp_path), _stages(log), start="b", stop="b") == ["b"]
    with pytest.raises(AsrtrainError, match="stage 'x' is not in this recipe"):
        run_recipe(_cfg(tmp_path), _stages(log), start="x")


def test_compose_recipe_with_overrides() -> None:
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny"
    cfg = compose_recipe(recipe, ["trainer.backend=adpsgd", "trainer.learners=4",
                                  "model=blstm_ibm"])
    assert cfg.trainer.backend == "adpsgd" and cfg.trainer.learners == 4
    assert (cfg.model.layers, cfg.model.cells, cfg.model.bottleneck) == (6, 512, 256)
    assert Path(cfg.repo_root) == recipe.parents[1]


def test_missing_recipe_and_bad_override(tmp_path: Path) -> None:
    with pytest.raises(AsrtrainError, match="no such recipe"):
        compose_recipe(tmp_path)
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny"
    with pytest.raises(AsrtrainError, match="cannot compose"):
        compose_recipe(recipe, ["model=nonexistent"])
