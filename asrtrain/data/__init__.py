"""Kaldi data directories, audio reading and the corpus preparers."""

from asrtrain.data.datadir import DataDir, Segment

__all__ = ["DataDir", "Segment"]
