"""Acoustic models: the IBM-style BLSTM body with a CTC or a frame cross-entropy head."""

from asrtrain.models.blstm import BLSTM, build_model

__all__ = ["BLSTM", "build_model"]
