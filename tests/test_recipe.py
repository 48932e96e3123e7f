"""Recipe config composition (the stage graph is tests/test_pipeline.py's)."""

from pathlib import Path

import pytest

from asrtrain import AsrtrainError
from asrtrain.recipe import compose_recipe


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
