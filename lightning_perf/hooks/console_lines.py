"""
Console lines
=============

:class:`ConsoleLines`: what each reported stage epoch prints on the console, and when. Its findings are split
into the new or changed ones, printed in full, and those printed before, named on the line's head
(:class:`~lightning_perf.report.findings.ShownFindings`). A line with something new (a new or changed finding
that the line shows: at ``verbose=1`` a warning or worse), a stage's first in a process, an interrupted epoch's
and a Trainer call's last are printed at once; a line with nothing new (its findings unchanged, or none, or new
ones it does not show) at most every :data:`STATUS_SECONDS` per stage, the latest one held back printed at the
call's end. TensorBoard and the report keep every epoch's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from lightning_perf.diagnose.model import Finding
from lightning_perf.records import MANUAL_NOTE, CompileStats, EpochSummary, RankSummary
from lightning_perf.report.findings import ShownFindings, console_report, shown_findings

# A run of 10-ms epochs printed a line per stage epoch for its first 0.3 s (the report pace's burst): 48 of its 104
# lines, each saying what the one before had said. The groups of short epochs last up to 3 s
# (stage_measure.GROUP_SECONDS). Our judgment.
STATUS_SECONDS = 2.0


class ConsoleLines:
    """The stage epochs' console lines (on rank zero), printed by a ``say`` function as the module says.

    Args:
        verbose: ``PerfCallback(verbose=...)``: 0 no findings, 1 the warnings and worse, 2 all.
        clock: Seconds, monotonic.
        flops: Why the run's FLOPs are not counted yet (``None``: they are), said after the headline of a
            training epoch without them (:meth:`~lightning_perf.hooks.flop_count.FlopCounting.not_counted`).

    Example::

        lines = ConsoleLines(verbose=1)
        lines.epoch(say, summary, findings, order=order)  # at each reported epoch
        lines.flush(say)  # at the end of the Trainer call
    """

    def __init__(
        self,
        verbose: int,
        clock: Callable[[], float] = time.perf_counter,
        flops: Callable[[], str | None] | None = None,
    ) -> None:
        self._verbose = verbose
        self._clock = clock
        self._flops = flops
        self._shown = ShownFindings()
        self._said: dict[str, float] = {}  # when each stage's last line was printed
        self._held: dict[str, tuple[int, str]] = {}  # each stage's latest line held back, and its epoch's order

    def epoch(
        self,
        say: Callable[[str], None],
        summary: EpochSummary,
        findings: Sequence[Finding],
        *,
        order: int,
        first: bool = False,
        now: bool = False,
        ranks: tuple[RankSummary, ...] = (),
        compiled: CompileStats | None = None,
        too_little: str | None = None,
        manual: bool = False,
    ) -> None:
        """A reported stage epoch's line (``order``: its epoch's among the run's; ``first``: the stage's first in
        this process, with its per-rank table): printed ``now``, where something is new, or where the stage's last
        line is :data:`STATUS_SECONDS` old; else held back, until a later line of the stage or the end.
        ``too_little``: the epoch's batches where too few to judge (``"1 measured batch"``), said instead of a clean
        result; ``manual``: the run optimizes manually, said beside a training epoch's phases (:data:`MANUAL_NOTE`)."""
        stage = summary.stage
        uncounted = stage == "train" and summary.flops_per_batch is None
        notes = [
            MANUAL_NOTE if manual and summary.forward_p50 is not None else None,
            self._flops() if uncounted and self._flops is not None else None,
        ]
        note = "; ".join(n for n in notes if n) or None
        fresh, unchanged = self._shown.split(stage, findings)
        message = console_report(
            summary,
            fresh,
            verbose=self._verbose,
            ranks=ranks if fresh or first else (),
            unchanged=unchanged,
            compile=compiled,
            note=note,
            too_little=too_little,
        )
        if not message:
            return
        clock = self._clock()
        new = bool(shown_findings(fresh, self._verbose))  # a fresh info finding hidden at verbose=1 is no news
        if now or new or first or clock - self._said.get(stage, -math.inf) >= STATUS_SECONDS:
            say(message)
            self._said[stage] = clock
            self._held.pop(stage, None)
        else:
            self._held[stage] = (order, message)

    def flush(self, say: Callable[[str], None]) -> None:
        """Prints the lines held back, in their epochs' order (a Trainer call's end: each stage's latest status)."""
        for _, message in sorted(self._held.values()):
            say(message)
        self._held.clear()
