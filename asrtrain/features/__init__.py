"""Kaldi-compatible acoustic features: fbank/MFCC extraction, CMVN statistics, deltas, and the
one reader that applies them at load time (``FeatureReader``)."""

from asrtrain.features.extract import FeatureOptions, compute_features, extract, finish_pass
from asrtrain.features.reader import FeatureReader, chunk_starts, length_batches
from asrtrain.features.transform import FeatureTransform, add_deltas, apply_cmvn, cmvn_stats

__all__ = ["FeatureOptions", "FeatureReader", "FeatureTransform", "add_deltas", "apply_cmvn",
           "chunk_starts", "cmvn_stats", "compute_features", "extract", "finish_pass",
           "length_batches"]
