"""
Results view
============

What :class:`~lightning_perf.PerfCallback` has measured, read back: its windows, epochs, findings and report,
and where the report goes. Read-only views over the callback's :class:`~lightning_perf.hooks.epoch_report.
EpochReporter`; the callback inherits them, so that it stays its hooks and their wiring.
"""

from __future__ import annotations

from typing import Any

from lightning_perf.diagnose.model import Finding
from lightning_perf.hooks.epoch_report import EpochReporter
from lightning_perf.layout import page_path
from lightning_perf.records import EpochSummary, WindowRecord


class ResultsView:
    """The measured results of the epochs reporter in ``_epochs``, as properties."""

    _epochs: EpochReporter

    @property
    def windows(self) -> list[WindowRecord]:
        """Every window saved so far in this process, in order."""
        return self._epochs.windows

    @property
    def epochs(self) -> list[EpochSummary]:
        """Every stage epoch measured so far in this process, in order."""
        return self._epochs.epochs

    @property
    def findings(self) -> list[Finding]:
        """The findings of the latest stage epoch that ended (on rank zero)."""
        return self._epochs.findings

    @property
    def report(self) -> dict[str, Any]:
        """Everything measured so far, as written to ``perf_report.json`` (see docs/schema.md)."""
        return self._epochs.report()

    def findings_for(self, stage: str, epoch: int | None = None) -> list[Finding]:
        """The findings of a stage's epoch, or of all its epochs (``epoch=None``), oldest first."""
        by_epoch = self._epochs.findings_by_epoch
        return [f for (s, e), found in by_epoch.items() if s == stage and epoch in (None, e) for f in found]

    @property
    def report_path(self) -> str | None:
        """Where ``perf_report.json`` goes: ``perf_report-1.json``, ... when another run's is already there;
        ``None`` before setup, and under ``fast_dev_run`` (nothing is written)."""
        return self._epochs.report_path

    @property
    def page_path(self) -> str | None:
        """The run's HTML report, beside :attr:`report_path` (``report.html``); ``None`` where that is. A run of
        predict calls alone with no window and no finding writes none (``hooks/epoch_report.draw_page``)."""
        return None if self._epochs.report_path is None else page_path(self._epochs.report_path)
