"""Run at the start of every Python process of a test session (``PYTHONPATH``, set by
``tests/conftest.py``): installs the test hooks (:mod:`posstats_test_hooks`)."""

import posstats_test_hooks

posstats_test_hooks.install()
