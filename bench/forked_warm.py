"""Imported once by bench/forked_cli.py's fork server (its last :data:`forked_cli.PRELOAD`
entry): what every ``asrtrain run`` does first, done there, so that no forked command does it
again. Composing a recipe the first time in a process loads Hydra's plugins and builds its
override grammar's parser (~0.2 CPU-s of a first compose's ~0.6); the commands composed theirs
from scratch, ~300 a suite. The tiny recipe is composed here with the config-group choices the
suite's commands make (none, and recipes/tiny/small.yaml's ``tri1`` set's hybrid input), and
asrtrain.recipe keeps those compositions: a forked command that differs from them only in plain
settings (``exp_dir=``, ``trainer.epochs=``, ``~align.passes.tri2``, ...) applies its own to a
copy (~0.07 s) instead of composing (~0.37 s). Nothing is written; Hydra's global state is
cleared after each compose, and a kept composition is used only while no YAML file of the
recipe or conf/ has changed (asrtrain.recipe._composed)."""

from __future__ import annotations

from pathlib import Path

from asrtrain.recipe import compose_recipe

for groups in ([], ["features@hybrid.features=fbank40"]):
    try:
        compose_recipe(Path(__file__).resolve().parents[1] / "recipes" / "tiny", groups)
    except Exception:  # noqa: BLE001 - a warm-up only: a broken recipe is the command's to report
        pass
