"""`python -m eplb.cli ARGS`: the `eplb` console script without installing it."""

import sys

from eplb.cli.main import main

sys.exit(main())
