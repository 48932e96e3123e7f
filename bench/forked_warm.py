"""Imported once by bench/forked_cli.py's fork server (its last :data:`forked_cli.PRELOAD`
entry): what every ``asrtrain run`` does first, done there, so that no forked command does it
again. Composing a recipe the first time in a process loads Hydra's plugins and builds its
override grammar's parser (~0.2 CPU-s of a first compose's ~0.6); the commands composed theirs
from scratch, ~300 a suite. Nothing is written and no state a command reads is kept: Hydra's
global state is cleared after each compose (asrtrain.recipe.compose_recipe)."""

from __future__ import annotations

from pathlib import Path

from asrtrain.recipe import compose_recipe

try:
    compose_recipe(Path(__file__).resolve().parents[1] / "recipes" / "tiny")
except Exception:  # noqa: BLE001 - a warm-up only: a broken recipe is the command's to report
    pass
