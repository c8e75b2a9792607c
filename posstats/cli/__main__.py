import sys

from posstats.cli import main

sys.exit(main())
