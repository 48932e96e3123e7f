"""Speaker adaptation and speaker features (Kaldi's LDA+MLLT, fMLLR, i-vectors), in torch.

The estimators are libraries: statistics are accumulated from frames and per-frame posteriors
(pdf alignments through :func:`asrtrain.adapt.posteriors.component_posteriors`, or a UBM's
Gaussian posteriors) and estimated in float64, batched, on the device the tensors are on.

- :mod:`.splice` -- ``splice-feats`` (±N frames, edges repeated).
- :mod:`.lda` -- ``acc-lda`` / ``est-lda``.
- :mod:`.mllt` -- ``gmm-acc-mllt`` / ``est-mllt``.
- :mod:`.fmllr` -- ``gmm-est-fmllr`` (full update, per speaker).
- :mod:`.ivector` -- diagonal UBM, i-vector extractor training and extraction (batch and
  online, as ``ivector-extract-online2``).
"""
