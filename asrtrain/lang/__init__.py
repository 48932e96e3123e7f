"""Language resources: lexicon, phones, L.fst, sentencepiece units, n-gram LMs."""
