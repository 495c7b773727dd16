"""
HTML reports
============

Self-contained pages, readable offline: a run's (:func:`run_page`, of its ``perf_report.json``) and any traces'
(:func:`traces_page`, as ``lightning-perf analyze`` reads them). Built on
:mod:`~lightning_perf.report.html.document`; Plotly is imported only when a page is rendered.
"""

from __future__ import annotations

from lightning_perf.report.html.run_page import run_page
from lightning_perf.report.html.traces_page import AnalyzedDirectory, AnalyzedTrace, traces_page

__all__ = ["AnalyzedDirectory", "AnalyzedTrace", "run_page", "traces_page"]
