"""Acoustic models: the registry of model archs (``model.arch``; the built-in ``blstm``, the
IBM-style BLSTM with a CTC or a frame cross-entropy head) and the schema of their checkpoints
(``load_model``).

The names are loaded on first use (PEP 562), so that code which only plans (``--dry-run``,
a stage's config check) reads ``asrtrain.models.average`` or the registry without importing
torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asrtrain.models.blstm import BLSTM
    from asrtrain.models.checkpoint import ModelCheckpoint, load_model
    from asrtrain.models.ctc import greedy_units
    from asrtrain.models.registry import build_model, model_names, register_model

_WHERE = {"BLSTM": "blstm", "ModelCheckpoint": "checkpoint", "load_model": "checkpoint",
          "greedy_units": "ctc", "build_model": "registry", "model_names": "registry",
          "register_model": "registry"}

__all__ = ["BLSTM", "ModelCheckpoint", "build_model", "greedy_units", "load_model",
           "model_names", "register_model"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
