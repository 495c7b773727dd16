"""
Analyzed traces
===============

What ``lightning-perf analyze`` keeps of each trace it reads (:class:`AnalyzedTrace`) and of each directory
(:class:`AnalyzedDirectory`): what its printout and its page (:mod:`lightning_perf.report.html.traces_page`)
show. Apart from the page, so that the command without ``--html`` does not import the page's modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_perf.diagnose.model import Finding
from lightning_perf.records import CollectiveStats, OperatorStat, RankSummary, TraceSummary


@dataclass(frozen=True)
class AnalyzedTrace:
    """One trace as ``analyze`` read it.

    Attributes:
        path: The trace file.
        rank: Its global rank.
        summary: Its summary.
        findings: The trace-level rules' findings.
        operators: Its operator table (all rows; the page shows the top ones).
        collectives: Its collectives per kind and process group.
    """

    path: str
    rank: int
    summary: TraceSummary
    findings: tuple[Finding, ...] = ()
    operators: tuple[OperatorStat, ...] = ()
    collectives: tuple[CollectiveStats, ...] = ()


@dataclass(frozen=True)
class AnalyzedDirectory:
    """The traces of one directory, and, for distinct ranks of one run, their cross-rank table and findings.

    Attributes:
        path: The directory.
        traces: Its traces, by rank.
        ranks: The per-rank table (empty unless the traces are distinct ranks of one run).
        findings: The cross-rank findings.
    """

    path: str
    traces: tuple[AnalyzedTrace, ...]
    ranks: tuple[RankSummary, ...] = ()
    findings: tuple[Finding, ...] = ()
