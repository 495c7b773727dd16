"""
Rank staging
============

What the ranks of a distributed run share at each stage epoch's end, and when their traces get their names:
each rank's epoch numbers gathered on rank zero for the per-rank table, and each rank's traces written
under a staged name until every rank has written its own (:mod:`lightning_perf.collect.ranks` says how the
gathers run and why no callback order can deadlock them).
"""

from __future__ import annotations

import os

from lightning_perf.collect.ranks import WAIT_SECONDS, RankExchange
from lightning_perf.hooks.error_policy import ErrorPolicy
from lightning_perf.records import EpochSummary, RankSummary, TraceSummary
from lightning_perf.summarize.ranks import rank_values

#: (written, final): a trace written under its staged name, and the name it gets once every rank has its own.
Staged = tuple[str, str]


class RankStaging:
    """The cross-rank gathers of a run, and the traces staged until they are done.

    Args:
        policy: Where warnings and notes go.

    Single-process runs have no exchange: :meth:`gather` returns ``()`` and :meth:`publish` renames at once
    (nothing is staged there).
    """

    def __init__(self, policy: ErrorPolicy) -> None:
        self._policy = policy
        self._staged: list[Staged] = []  # published at epoch ends
        self._exchange: RankExchange[list[Staged]] | None = None  # the cross-rank gathers; from setup on

    def open(self) -> None:
        """Our own process group for the cross-rank summaries (at setup: every rank creates it, in order)."""
        self.close()  # a run that ended with neither teardown nor on_exception
        try:
            self._exchange = RankExchange.open()
        except Exception as err:
            self._policy.warn_once(
                "exchange", f"PerfCallback: no cross-rank summaries: creating their group failed ({err})."
            )
            return
        if self._exchange is None:
            self._policy.info_once(
                "exchange",
                "PerfCallback: torch.distributed is not initialized under this strategy: no cross-rank summaries"
                " (each rank still measures its own epochs).",
            )

    def close(self) -> None:
        """Lets the process group go."""
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.close()

    @property
    def node_ranks(self) -> frozenset[int]:
        """The process ids of the run's other ranks on this node (none in a single process)."""
        return self._exchange.node_ranks if self._exchange is not None else frozenset()

    @property
    def exchanging(self) -> bool:
        """Whether every stage epoch's end joins a cross-rank gather (a distributed run's)."""
        return self._exchange is not None

    def stage(self, written: str, final: str) -> None:
        """A trace written at ``written``, to be renamed ``final`` once every rank has written its own."""
        self._staged.append((written, final))

    def gather(
        self, stage: str, summary: EpochSummary | None, windows: tuple[TraceSummary, ...], *, global_zero: bool
    ) -> tuple[RankSummary, ...]:
        """Every rank's epoch numbers, on rank zero; ``()`` on the other ranks and in a single process.

        Every rank issues the gather, whatever happened to its own measurements, and goes on; rank zero alone
        waits for it. The traces staged so far go with it, published once it is done.

        Args:
            stage: The stage whose epoch ended.
            summary: This rank's epoch summary (``None``: it measured nothing).
            windows: The trace summaries of this rank's windows in that epoch.
            global_zero: This process is rank zero.
        """
        exchange = self._exchange
        if exchange is None:
            return ()
        try:
            values = rank_values(summary, windows)
        except Exception:  # whatever went wrong, this rank still takes part in the collective
            values = rank_values(None, [])
        try:
            exchange.issue(values, payload=self._staged)
            self._staged = []
            ranks = exchange.wait(WAIT_SECONDS) if global_zero else ()
        except Exception as err:
            self._policy.warn_once("gather", f"PerfCallback: gathering the ranks' epoch summaries failed ({err}).")
            return ()
        if ranks is None:
            self._policy.warn_once(
                "gather-timeout",
                f"PerfCallback: a rank did not reach the end of the {stage} epoch within {WAIT_SECONDS:g} s of rank"
                " zero: that epoch has no per-rank table (training goes on).",
            )
            return ()
        return ranks

    def publish(self, wait: float | None = None) -> None:
        """Gives this rank's traces their final names once every rank has written its own.

        The traces staged before an epoch end's gather are written on every rank once that gather is done,
        which this rank checks without blocking; at the end of a run (``wait``), it waits that long at most
        for its gathers, then publishes every trace. TensorBoard's profiler plugin loads a run directory once,
        when it first holds a trace: the ranks of a window must appear together, or the later ones would be
        missed.
        """
        exchange = self._exchange
        if exchange is None and not self._staged:
            return  # at every stage epoch's start of a run between windows
        if exchange is None:  # a single process, or no torch.distributed: nothing to wait for
            ready, self._staged = [self._staged], []
        elif wait is None:
            ready = exchange.poll()
        else:
            ready, _ = exchange.drain(wait)
            ready.append(self._staged)
            self._staged = []
        for staged in ready:
            for written, final in staged:
                if os.path.exists(written):
                    os.replace(written, final)
