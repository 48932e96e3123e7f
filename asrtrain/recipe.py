"""Recipes: config composition (Hydra compose API) and where a recipe's stages read and write.

A recipe is ``recipes/<name>/recipe.yaml``: its ``defaults`` pick groups from ``conf/`` and its body
sets corpus paths and the list of stages. Which stages run, and why, is ``asrtrain.pipeline``'s
business; what each stage does is in ``asrtrain/stages/<stage>.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from asrtrain import REPO_ROOT, AsrtrainError

CONF_DIR = REPO_ROOT / "conf"


def compose_recipe(recipe: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``recipe.yaml`` of the recipe directory with ``conf/`` groups and overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    recipe_dir = Path(recipe).resolve()
    if recipe_dir.is_file():
        recipe_dir = recipe_dir.parent
    if not (recipe_dir / "recipe.yaml").is_file():
        raise AsrtrainError(f"{recipe_dir}/recipe.yaml: no such recipe (try recipes/tiny)")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(recipe_dir), version_base=None):
            cfg = compose(
                "recipe",
                overrides=[f"hydra.searchpath=[file://{CONF_DIR}]",
                           f"+repo_root={REPO_ROOT}", f"+recipe_dir={recipe_dir}", *overrides],
            )
    except (HydraException, OmegaConfBaseException) as e:
        raise AsrtrainError(f"{recipe_dir}/recipe.yaml: cannot compose the config: {e}") from e
    finally:
        GlobalHydra.instance().clear()
    return cfg


@dataclass(frozen=True)
class Paths:
    """Where a recipe's stages read and write, under ``exp_dir`` (docs/architecture.md shows the
    tree). Stages and tasks take their paths from here, never build them by hand."""

    exp: Path

    @property
    def data(self) -> Path:
        return self.exp / "data"

    def data_set(self, name: str) -> Path:
        """The Kaldi data dir of set ``name`` (with the fbank ``feats.scp``)."""
        return self.exp / "data" / name

    def mfcc_set(self, name: str) -> Path:
        """The copy of data set ``name`` that carries MFCCs for the GMMs (Kaldi: a second
        data dir)."""
        return self.exp / "data" / f"{name}_mfcc"

    @property
    def dict_dir(self) -> Path:
        return self.exp / "data" / "local" / "dict"

    @property
    def lang(self) -> Path:
        return self.exp / "lang"

    @property
    def lm(self) -> Path:
        return self.exp / "lm"

    @property
    def feats(self) -> Path:
        """Feature arks of every set (fbank and MFCC)."""
        return self.exp / "feats"

    @property
    def align(self) -> Path:
        return self.exp / "align"

    def align_pass(self, name: str) -> Path:
        """GMM pass ``name``: model, tree, alignments of the training set, ``graph/``."""
        return self.exp / "align" / name

    @property
    def train(self) -> Path:
        return self.exp / "train"

    def model_dir(self, model: str) -> Path:
        """Checkpoints, ``final.pt`` and ``config.yaml`` of the model named ``model``."""
        return self.exp / "train" / model

    @property
    def decode(self) -> Path:
        return self.exp / "decode"

    def decode_dir(self, system: str, data_set: str) -> Path:
        """One layout for every system (a GMM pass, a CTC or hybrid model):
        ``ctm text decode.json score/``."""
        return self.exp / "decode" / system / data_set

    @property
    def logs(self) -> Path:
        return self.exp / "log"

    @property
    def markers(self) -> Path:
        return self.exp / ".done"


def data_sets(cfg: DictConfig) -> list[str]:
    """Every data set the recipe uses: train, dev, then the test sets."""
    return list(dict.fromkeys([str(cfg.sets.train), str(cfg.sets.dev),
                               *(str(s) for s in cfg.sets.test)]))
