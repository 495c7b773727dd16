"""
Per-batch scalar pacing
=======================

Whether a stage's per-batch scalars are written at this logging point: the plain logic that keeps them cheap
however often the Trainer logs. No torch and no Lightning here. The same pace, with a share of its own
(:data:`REPORT_SHARE`), says whether a stage epoch's findings are reported now (:mod:`~lightning_perf.hooks.
epoch_report`, Notes 1), and with :data:`MEASURE_SHARE`, whether an epoch is measured on its own or with the
next ones (Notes 2 there).

The callback writes its per-batch scalars (step time, data wait, compute, throughput, loss) at the Trainer's
``log_every_n_steps`` cadence. Each write costs about 0.2-0.4 ms on a 2-CPU machine (five events through the
loggers, TensorBoard's writer thread serializing them on the same GIL, a ``/proc`` read, the loss's
``.item()``): nothing at Lightning's default of 50, but at ``log_every_n_steps=1`` a tiny MLP's fit took 1.31x
as long with the callback as without it, 1.84x where the model logged nothing of its own (``benchmarks/
log_cadence.py``; docs/cost.md).

Notes:
    1. A stage writes while what its writes cost so far stays within :data:`LOG_SHARE` of the wall time since its
       first write, plus :data:`LOG_BURST`: ``spent <= LOG_BURST + LOG_SHARE * (now - first)``. Otherwise the
       logging point is skipped. A write's cost is measured: its wall time, less what the thread waited for a CPU
       meanwhile (:class:`~lightning_perf.collect.cpu.RunQueue`). On a busy machine a write preempted for a
       scheduler slice took 3-5 ms of wall time, which the other processes took from the run, not the write; so
       charged, a run beside two CPU burners spent its burst in a few writes and lost its first points.
    2. The burst lets a short run, or the first seconds of any run, write at every logging point; a long run
       at a cadence too fine for its steps then writes about every ``cost / LOG_SHARE`` seconds, always at a
       logging point of the Trainer's.
    3. One pace for all stages (the callback's): a pace per stage let each spend the share where training's
       short epochs alternate with the validation runs inside them (2% of such a run, its two stages' writes).
    4. A write is charged at most :data:`LOG_STALL`, or :data:`LOG_STALL_RATIO` times the cheapest write
       so far where that is more. A write that took far longer than its stage's others was stalled by what is not
       its own (a full collection by Python's garbage collector late in a long process, a first event file, a
       preemption the run queue did not show: CI's log did not say which). Charged in full, one such stall of
       about 10 ms spent a short run's burst at its second validation write, and the stage lost every later
       point. A logger whose every write is slow (a remote one) is still charged in full: its cheapest write is
       slow too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lightning_perf.collect.cpu import RunQueue

# What the per-batch scalars may cost, as a share of the wall time: the standing goal is 1-2% for all the
# callback's work between windows, and its per-batch hooks take 7-20 us a batch, 0.2% of a 3-ms step and 2% of a
# 1-ms one (docs/cost.md).
LOG_SHARE = 0.01
# What they may cost before the share applies: 50-100 writes at 0.2-0.4 ms, of all stages together (Notes 3).
# The demo's 16 writes and the tests' short runs write at every logging point. 0.01 while each stage had a pace
# of its own; once shared, a CSV-logged test's 24 training and validation writes spent it on a slow machine and
# lost a point. Our judgment.
LOG_BURST = 0.02
# An epoch's findings (epoch_report, Notes 1) are paced the same way, per stage: about 1 ms each, so a stage of
# 10-ms epochs reports about every 20th once its burst is spent; together with the scalars' share within the
# standing goal's 1-2%. Our judgment.
REPORT_SHARE = 0.005
# ... after the first 0.02 s of them: the first 10-20 epochs of a run of short epochs (3-6 ms each there, their
# caches cold), every epoch of the tests' short runs. 0.05 s until 2026-12-06: with the measurement's burst below,
# 0.2% of a 10-s run of 10-ms epochs (the callback's own time there 4.0-4.1% -> 3.8-3.9%, its first 100 epochs
# 111-117 -> 77-89 ms, `benchmarks/epoch_blocks.py --whole --epochs 1000`, two fits each). Our judgment.
REPORT_BURST = 0.02
# A stage epoch's measurement (epoch_report, Notes 2: its CPU readings, summary, scalars and report, about
# 1.5-2.5 ms with the findings' share, 3-6 ms between the steps of a fit, its caches cold) may cost this share of
# the wall time; shorter epochs are measured in groups. At 1% it was a quarter of what a run of 10-ms epochs paid
# for the callback (groups of about 0.2 s). At 0.5%, with the burst below at 0.1 s, the callback's hooks took 4.8%
# of a 1000-epoch fit of 10-ms epochs (11-12 s), a third of it in the first 100 epochs; at 0.3% and 0.05 s, 3.7-3.8%
# (two fits each, hooks timed inside the fit), leaving issue 26's 5% of any 10-s run room for Lightning's dispatch
# of the hooks (about 1%). A pace charges a measurement's wall time less the thread's waits for a CPU, so a
# busy machine's runs spend about twice the share in wall time. Our judgment.
MEASURE_SHARE = 0.003
# ... after the first 0.03 s of measurement: every epoch of a short run (the tests' and the demo's), the first
# 10-20 stage epochs of a run of short epochs (0.05 s until 2026-12-06, see REPORT_BURST). Our judgment.
MEASURE_BURST = 0.03
# What one write is charged at most (Notes 4): 5-10 times a write's usual 0.2-0.4 ms, a fifth of the burst. Our
# judgment.
LOG_STALL = 2e-3
# ... unless the cheapest write so far, this many times over, is more: a logger slow at every write.
LOG_STALL_RATIO = 4.0


class LogPace:
    """The per-batch scalars' pacing (module Notes 1-3), or another paced write's.

    Args:
        share: The share of the wall time the writes may cost.
        burst: Seconds of writes allowed beyond the share.
        clock: Seconds, monotonic (``time.perf_counter``; a test's own).
        waited: Seconds, cumulative, the thread has waited for a CPU (a :class:`~lightning_perf.collect.cpu.
            RunQueue`; a test's own); ``None`` where not known.

    Example::

        pace = LogPace()
        if pace.due():
            pace.start()
            write_scalars()
            pace.end()
    """

    def __init__(
        self,
        *,
        share: float = LOG_SHARE,
        burst: float = LOG_BURST,
        clock: Callable[[], float] = time.perf_counter,
        waited: Callable[[], float | None] | None = None,
    ) -> None:
        self._share = share
        self._burst = burst
        self._clock = clock
        self._waited = waited if waited is not None else RunQueue()
        self._first: float | None = None
        self._spent = 0.0
        self._cheapest = float("inf")  # the cheapest write so far (Notes 4)
        self._started = (0.0, 0.0)  # the write's start: the clock, and the thread's wait for a CPU so far
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

    def start(self) -> None:
        """A write starts now."""
        self._started = (self._clock(), self._waited() or 0.0)

    def end(self) -> None:
        """The write :meth:`started <start>` has ended: its wall time, less the thread's wait for a CPU meanwhile,
        is what it cost (Notes 1)."""
        clock, waited = self._started
        self.spent(self._clock() - clock - max((self._waited() or 0.0) - waited, 0.0))

    def leave_out(self, seconds: float) -> None:
        """Leaves ``seconds`` of the write under way out of its cost: work the profiling budget pays for instead (an
        advice trial: :mod:`~lightning_perf.hooks.advice_trials`)."""
        clock, waited = self._started
        self._started = (clock + max(seconds, 0.0), waited)

    def spent(self, seconds: float) -> None:
        """A write took ``seconds``: charged up to the stall cap (Notes 4)."""
        seconds = max(seconds, 0.0)
        self._cheapest = min(self._cheapest, seconds)
        self._spent += min(seconds, max(LOG_STALL, LOG_STALL_RATIO * self._cheapest))
