"""``python -m lightning_perf``: the ``lightning-perf`` command line."""

import sys

from lightning_perf.cli import main

if __name__ == "__main__":  # not on import: the docs' API reference imports every module to read its defaults
    sys.exit(main())
