"""``python -m lightning_perf``: the ``lightning-perf`` command line."""

import sys

from lightning_perf.cli import main

sys.exit(main())
