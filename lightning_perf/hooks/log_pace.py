"""
Per-batch scalar pacing
=======================

Whether a stage's per-batch scalars are written at this logging point: the plain logic that keeps them cheap
however often the Trainer logs. No torch and no Lightning here.

The callback writes its per-batch scalars (step time, data wait, compute, throughput, loss) at the Trainer's
``log_every_n_steps`` cadence. Each write costs about 0.2-0.4 ms on a 2-CPU machine (five events through the
loggers, TensorBoard's writer thread serializing them on the same GIL, a ``/proc`` read, the loss's
``.item()``): nothing at Lightning's default of 50, but at ``log_every_n_steps=1`` a tiny MLP's fit took 1.31x
as long with the callback as without it, 1.84x where the model logged nothing of its own (``benchmarks/
log_cadence.py``; README, Cost).

Notes:
    1. A stage writes while what its writes cost so far (measured: each write's wall time) stays within
       :data:`LOG_SHARE` of the wall time since its first write, plus :data:`LOG_BURST`:
       ``spent <= LOG_BURST + LOG_SHARE * (now - first)``. Otherwise the logging point is skipped.
    2. The burst lets a short run, or the first seconds of any run, write at every logging point; a long run
       at a cadence too fine for its steps then writes about every ``cost / LOG_SHARE`` seconds, always at a
       logging point of the Trainer's.
    3. Per stage: one stage logs at a time, so together they stay within the share.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# What the per-batch scalars may cost, as a share of the wall time: the standing goal is 1-2% for all the
# callback's work between windows, and its per-batch hooks take 7-20 us a batch, 0.2% of a 3-ms step and 2% of a
# 1-ms one (README, Cost).
LOG_SHARE = 0.01
# What they may cost before the share applies: 25-50 writes at 0.2-0.4 ms. A 1-s run stays within 1% of its
# time; the demo's 16 writes and the tests' short runs write at every logging point. Our judgment.
LOG_BURST = 0.01


class LogPace:
    """One stage's per-batch scalar pacing (module Notes 1-3).

    Args:
        share: The share of the wall time the writes may cost.
        burst: Seconds of writes allowed beyond the share.
        clock: Seconds, monotonic (``time.perf_counter``; a test's own).

    Example::

        pace = LogPace()
        if pace.due():
            started = time.perf_counter()
            write_scalars()
            pace.spent(time.perf_counter() - started)
    """

    def __init__(
        self, *, share: float = LOG_SHARE, burst: float = LOG_BURST, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._share = share
        self._burst = burst
        self._clock = clock
        self._first: float | None = None
        self._spent = 0.0
        #: Logging points skipped so far.
        self.skipped = 0

    def due(self) -> bool:
        """Whether the scalars are written at this logging point (a skipped point is counted)."""
        now = self._clock()
        if self._first is None:
            self._first = now
        if self._spent <= self._burst + self._share * (now - self._first):
            return True
        self.skipped += 1
        return False

    def spent(self, seconds: float) -> None:
        """A write took ``seconds``."""
        self._spent += seconds
