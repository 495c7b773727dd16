"""
HTML reports
============

Self-contained pages, readable offline: a run's (:func:`run_page`, of its ``perf_report.json``) and any traces'
(:func:`traces_page`, as ``lightning-perf analyze`` reads them), each a :class:`Page` to write. Built on
:mod:`~lightning_perf.report.html.document`; Plotly's JavaScript is copied from its package into each page
written with a chart.
"""

from __future__ import annotations

from lightning_perf.report.analyzed import AnalyzedDirectory, AnalyzedTrace
from lightning_perf.report.html.document import Page
from lightning_perf.report.html.run_page import run_page
from lightning_perf.report.html.traces_page import traces_page

__all__ = ["AnalyzedDirectory", "AnalyzedTrace", "Page", "run_page", "traces_page"]
