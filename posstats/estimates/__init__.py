"""Honest estimates at long context: the split-half noise floor, jackknife intervals, sampled stress."""
