"""A busy machine for the tests that need one: CPU-burning processes beside the run, stopped when done."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def cpu_burners(n: int | None = None) -> Iterator[None]:
    """Runs ``n`` processes that spin on a CPU each (default: as many as this process may use), like
    ``python -c "while True: pass"`` beside a run; they are killed when the block ends, whatever happens."""
    count = n if n is not None else len(os.sched_getaffinity(0))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()
