"""Recipes: the list of stages, config composition (Hydra compose API), .done markers and resume.

A recipe is ``recipes/<name>/recipe.yaml``: its ``defaults`` pick groups from ``conf/`` and its body
sets corpus paths and stage lists. Every stage is a function of (config, paths) that validates its
inputs, writes through temporary names, and is recorded as done by a marker holding a hash of the
config it ran with and of the markers before it; a second run skips stages whose marker matches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asrtrain import REPO_ROOT, AsrtrainError
from asrtrain.fileio import write_text

log = logging.getLogger("asrtrain")

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
    """Where a recipe's stages read and write (see DESIGN.md, the data flow)."""

    exp: Path

    @property
    def data(self) -> Path:
        return self.exp / "data"

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
    def align(self) -> Path:
        return self.exp / "align"

    @property
    def train(self) -> Path:
        return self.exp / "train"

    @property
    def decode(self) -> Path:
        return self.exp / "decode"

    @property
    def logs(self) -> Path:
        return self.exp / "log"

    @property
    def markers(self) -> Path:
        return self.exp / ".done"


@dataclass(frozen=True)
class Stage:
    """One step of a recipe: ``run(cfg, paths)`` and the config sections its result depends on."""

    name: str
    run: Callable[[DictConfig, Paths], None]
    config_keys: tuple[str, ...]
    doc: str


def config_hash(cfg: DictConfig, keys: Sequence[str], previous: str) -> str:
    """Hash of the config sections a stage depends on, chained with the previous stage's hash."""
    sections = {k: OmegaConf.to_container(cfg[k], resolve=True) if k in cfg else None
                for k in keys}
    blob = json.dumps({"sections": sections, "previous": previous}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_recipe(cfg: DictConfig, stages: dict[str, Stage], start: str | None = None,
               stop: str | None = None, force: bool = False) -> list[str]:
    """Run the recipe's stages from ``start`` to ``stop``; return the names of stages that ran."""
    names = list(cfg.stages)
    for n in names:
        if n not in stages:
            raise AsrtrainError(f"recipe stage {n!r} is unknown; known stages: {', '.join(stages)}")
    for n in (start, stop):
        if n is not None and n not in names:
            raise AsrtrainError(
                f"stage {n!r} is not in this recipe; its stages: {', '.join(names)}")
    i0 = names.index(start) if start else 0
    i1 = names.index(stop) if stop else len(names) - 1
    paths = Paths(Path(cfg.exp_dir))
    paths.markers.mkdir(parents=True, exist_ok=True)
    ran: list[str] = []
    previous = ""
    t_all = time.time()
    for i, name in enumerate(names):
        stage = stages[name]
        digest = config_hash(cfg, stage.config_keys, previous)
        previous = digest
        if not i0 <= i <= i1:
            continue
        marker = paths.markers / name
        if not force and marker.is_file() and marker.read_text().strip() == digest:
            log.info("stage %-9s already done (config %s): skipped", name, digest)
            continue
        log.info("stage %-9s starts: %s", name, stage.doc)
        marker.unlink(missing_ok=True)
        t0 = time.time()
        _attach_stage_log(paths.logs / f"{name}.log")
        try:
            stage.run(cfg, paths)
        finally:
            _detach_stage_log()
        write_text(marker, digest + "\n")
        log.info("stage %-9s done in %.1f s", name, time.time() - t0)
        ran.append(name)
    if not ran:
        log.info("nothing to do: every stage from %s to %s is done", names[i0], names[i1])
    else:
        log.info("ran %s in %.1f s", ", ".join(ran), time.time() - t_all)
    return ran


_stage_handler: logging.Handler | None = None


def _attach_stage_log(path: Path) -> None:
    global _stage_handler
    path.parent.mkdir(parents=True, exist_ok=True)
    _stage_handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    _stage_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger().addHandler(_stage_handler)


def _detach_stage_log() -> None:
    global _stage_handler
    if _stage_handler is not None:
        logging.getLogger().removeHandler(_stage_handler)
        _stage_handler.close()
        _stage_handler = None
