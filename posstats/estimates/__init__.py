"""Honest estimates at long context: the split-half noise floor, the shard bootstrap, sampled stress."""
