"""Corpus inputs: token batches, tokenizers, readers per format, shards of input files."""
