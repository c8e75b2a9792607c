"""Positional counts C[i, v]: the spec, the counting kernel and accumulator, buckets, count files."""
