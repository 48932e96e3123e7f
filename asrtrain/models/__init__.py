"""Acoustic models: the IBM-style BLSTM body with a CTC or a frame cross-entropy head, and the
schema of their checkpoints (``load_model``)."""

from asrtrain.models.blstm import BLSTM, build_model
from asrtrain.models.checkpoint import ModelCheckpoint, load_model
from asrtrain.models.ctc import greedy_units

__all__ = ["BLSTM", "ModelCheckpoint", "build_model", "greedy_units", "load_model"]
