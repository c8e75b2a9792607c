"""``python -m posstats ...``: the same command line as ``posstats ...``."""

import sys

from posstats.cli import main

sys.exit(main())
