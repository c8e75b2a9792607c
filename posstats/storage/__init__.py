"""The ground floor's storage: files written atomically and published by rename, checksums,
store locks, JSON text and the safetensors reader. Imports only :mod:`posstats.errors` and
:mod:`posstats.processes` (tests/test_layers.py holds the rank table)."""
