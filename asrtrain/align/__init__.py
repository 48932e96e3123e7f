"""GMM-HMM training and alignment (Kaldi semantics, in torch): mono, tri passes, Kaldi import."""
