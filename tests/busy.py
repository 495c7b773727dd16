"""A busy machine for the tests that need one: CPU-burning processes beside the run, stopped when done."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

# Starts the burner and exits at once: the burner is then no child of the test's process (it is reparented),
# as another user's program beside a run would be; the callback counts its own children's CPU as the run's.
# (Its output goes nowhere: a burner holding the pipe would keep the reader waiting.)
_DETACH = (
    "import subprocess as s, sys; quiet = s.DEVNULL;"
    " print(s.Popen([sys.executable, '-c', 'while True: pass'], stdin=quiet, stdout=quiet, stderr=quiet).pid)"
)


#: The most CPUs other programs may use while a timing test runs for its contrast to be judged; beyond, a test whose
#: contrast another program's load can hide skips, saying the load it saw (:func:`others_cpus`).
QUIET_CPUS = 0.5


@contextlib.contextmanager
def cpu_burners(n: int | None = None) -> Iterator[None]:
    """Runs ``n`` processes that spin on a CPU each (default: as many as this process may use), like
    ``python -c "while True: pass"`` started beside a run, not by it; they are killed when the block ends,
    whatever happens."""
    count = n if n is not None else len(os.sched_getaffinity(0))
    pids = []
    try:
        for _ in range(count):
            pids.append(int(subprocess.run([sys.executable, "-c", _DETACH], capture_output=True, check=True).stdout))
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def others_cpus(run: Callable[[], object]) -> float:
    """The CPUs' worth the machine's other processes used while ``run()`` ran (all of ``/proc/stat``, less this
    process and its children): whatever CPUs this process's threads were pinned to meanwhile."""

    def machine() -> float:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")

    def own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    start, mine, wall = machine(), own(), time.perf_counter()
    run()
    wall = time.perf_counter() - wall
    return max(machine() - start - (own() - mine), 0.0) / wall
