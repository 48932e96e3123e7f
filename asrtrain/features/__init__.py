"""Kaldi-compatible acoustic features: fbank/MFCC extraction, CMVN statistics, deltas."""

from asrtrain.features.extract import FeatureOptions, compute_features, extract
from asrtrain.features.transform import FeatureTransform, add_deltas, apply_cmvn, cmvn_stats

__all__ = ["FeatureOptions", "FeatureTransform", "add_deltas", "apply_cmvn", "cmvn_stats",
           "compute_features", "extract"]
