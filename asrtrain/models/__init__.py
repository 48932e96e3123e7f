"""Acoustic models: the registry of model archs (``model.arch``; the built-in ``blstm``, the
IBM-style BLSTM with a CTC or a frame cross-entropy head) and the schema of their checkpoints
(``load_model``)."""

from asrtrain.models.blstm import BLSTM
from asrtrain.models.checkpoint import ModelCheckpoint, load_model
from asrtrain.models.ctc import greedy_units
from asrtrain.models.registry import build_model, model_names, register_model

__all__ = ["BLSTM", "ModelCheckpoint", "build_model", "greedy_units", "load_model",
           "model_names", "register_model"]
