"""Decoding: CTC greedy search to words and CTM; graph (HCLG) decoding for hybrid models."""
