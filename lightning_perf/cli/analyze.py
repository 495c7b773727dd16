"""
``lightning-perf analyze``
==========================

The trace-level rules on any Kineto traces, grouped by rank per directory, with the cross-rank findings of a
directory of ranks; ``--html OUT`` also writes them as a page (:mod:`lightning_perf.report.html.traces_page`),
with each trace's operator table. One trace is in memory at a time (per process): what a page needs of it (its
summary, findings, collectives and operator rows) is kept, the trace itself is not. ``--jobs N`` reads and
summarizes the traces in N worker processes, with the same output. Paths are absolute, in ``--json`` and on the
page (as the directories always were), so that the page's commands to open a trace work wherever it is opened.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from lightning_perf.cli.inputs import (
    EXIT_OK,
    TRACES_PAGE,
    UsageError,
    find_traces,
    html_output,
    say_repaired,
    trace_rank,
    write_page,
)
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnosis_context import cross_rank_findings, trace_context, trace_notes, trace_stage
from lightning_perf.readers import InputError, load_trace
from lightning_perf.records import CollectiveStats, OperatorStat, RankSummary, TraceSummary, share
from lightning_perf.report.analyzed import AnalyzedDirectory, AnalyzedTrace
from lightning_perf.report.collectives import collectives_table
from lightning_perf.report.findings import CLEAN, finding_lines, ranks_table, shown_findings
from lightning_perf.summarize.collectives import collective_stats
from lightning_perf.summarize.events import Complete, KinetoTrace, distributed_info
from lightning_perf.summarize.ranks import rank_summary_of_trace
from lightning_perf.summarize.step_summary import summarize_trace
from lightning_perf.units import count, duration_us, percent


def _summary_line(s: TraceSummary) -> str:
    parts = [f"{s.steps} steps of {duration_us(s.step_time * 1e6)}"]
    if (busy := share(s.device_busy, s)) is not None:
        parts.append(f"device busy {percent(busy)}")
    if (exposed := share(s.communication_exposed_time, s)) is not None:
        parts.append(f"exposed communication {percent(exposed)}")
    parts.append(f"{count(s.ops_per_step)} operators per step")
    if (compiled := share(s.compiled_time, s)) is not None:
        parts.append(f"compiled regions {percent(compiled)} of the step")
    if (guards := share(s.guard_time, s)) is not None:
        parts.append(f"guard checks {percent(guards, 1)}")
    return ", ".join(parts)


def _print_findings(findings: Sequence[Finding], verbose: int) -> None:
    """The findings shown at ``verbose``, as the console shows an epoch's, under a trace's line."""
    shown = shown_findings(findings, verbose)
    for line in finding_lines(shown, verbose=verbose) if shown else [CLEAN]:
        print(f"    {line}")


def command_analyze(args: argparse.Namespace) -> int:
    page_path = html_output(args.html, TRACES_PAGE) if args.html else None
    by_dir: dict[str, list[str]] = {}
    for path in find_traces(args.paths):
        by_dir.setdefault(os.path.dirname(os.path.abspath(path)), []).append(path)
    named = frozenset(p for p in args.paths if not os.path.isdir(p))
    results: dict[str, Any] = {}
    pages: list[AnalyzedDirectory] = []
    for directory, paths in by_dir.items():
        one = functools.partial(
            _analyzed_or_skipped,
            named=named,
            precision=args.precision,
            world_size=len(paths),
            operators=page_path is not None,
        )
        analyzed_or_not = _mapped(one, paths, args.jobs)
        for skipped in (r for r in analyzed_or_not if isinstance(r, str)):
            print(f"lightning-perf: warning: skipped {skipped}", file=sys.stderr)
        entries = sorted((r for r in analyzed_or_not if not isinstance(r, str)), key=lambda e: e.rank)
        if not entries:
            continue
        if not args.json:
            print(directory)
        ranks: list[RankSummary] = []
        for entry in entries:
            ranks.append(rank_summary_of_trace(entry.rank, entry.summary))
            results[entry.path] = {
                "rank": entry.rank,
                "summary": dataclasses.asdict(entry.summary),
                "findings": [dataclasses.asdict(f) for f in entry.findings],
                "collectives": [dataclasses.asdict(c) for c in entry.collectives],
            }
            if not args.json:
                print(f"  rank {entry.rank}: {os.path.basename(entry.path)}: {_summary_line(entry.summary)}")
                for line in collectives_table(entry.collectives):
                    print(f"    {line}")
                _print_findings(entry.findings, args.verbose)
        cross: list[Finding] = []
        distinct = len(entries) > 1 and len({r.rank for r in ranks}) == len(ranks)
        if distinct:
            cross = cross_rank_findings(ranks)
            results[directory] = {
                "ranks": [dataclasses.asdict(r) for r in ranks],
                "findings": [dataclasses.asdict(f) for f in cross],
            }
            if not args.json:
                print("  across ranks:")
                for line in ranks_table(ranks):
                    print("    " + line)
                _print_findings(cross, args.verbose)
        elif len(entries) > 1 and not args.json:
            print("  (no cross-rank comparison: these traces do not hold distinct ranks of one run)")
        pages.append(AnalyzedDirectory(directory, tuple(entries), tuple(ranks) if distinct else (), tuple(cross)))
    if not pages:
        raise UsageError(f"{', '.join(args.paths)}: holds no Kineto trace that could be read (each skipped above)")
    if args.json:
        print(json.dumps(results, indent=1))
    if page_path is not None:
        from lightning_perf.report.html.traces_page import traces_page  # the page's modules: with --html only

        write_page(traces_page(pages), page_path, quiet_stdout=args.json)
    return EXIT_OK


def analyzed_trace(path: str, *, precision: str | None, world_size: int, operators: bool) -> AnalyzedTrace:
    """One trace as the page and the printout need it (its operator table only where ``operators``); the trace
    itself is let go: one trace in memory at a time per process."""
    trace, summary, collectives, findings = analyzed(path, precision=precision, world_size=world_size)
    table: tuple[OperatorStat, ...] = ()
    if operators:
        from lightning_perf.summarize.operators import operator_stats  # for the page only

        table = operator_stats(trace)
    rank = trace_rank(path, trace)
    del trace
    # Absolute: the page's commands (tensorboard --logdir, perfetto) must work wherever it is opened.
    return AnalyzedTrace(os.path.abspath(path), rank, summary, tuple(findings), table, collectives)


def _analyzed_or_skipped(path: str, *, named: frozenset[str], **analysis: Any) -> AnalyzedTrace | str:
    """:func:`analyzed_trace`, or, for a file found in a directory (not ``named`` on the command line) that is no
    trace it can read (a config, a report of another tool), why it is skipped: one such file does not stop the
    others' analysis."""
    try:
        return analyzed_trace(path, **analysis)
    except InputError as err:
        if path in named:
            raise
        return str(err)


def _mapped(one: Callable[[str], AnalyzedTrace | str], paths: Sequence[str], jobs: int) -> list[AnalyzedTrace | str]:
    """``one`` of each path, in order: in ``jobs`` worker processes where there are several paths and jobs (each
    reads and summarizes its traces on its own CPU and sends back the small results), else here."""
    if jobs <= 1 or len(paths) <= 1:
        return [one(path) for path in paths]
    from concurrent.futures import ProcessPoolExecutor  # multiprocessing's modules: with --jobs only

    with ProcessPoolExecutor(max_workers=min(jobs, len(paths))) as pool:
        return list(pool.map(one, paths, chunksize=max(len(paths) // (4 * jobs), 1)))


def analyzed(
    path: str, *, precision: str | None, world_size: int = 1
) -> tuple[KinetoTrace, TraceSummary, tuple[CollectiveStats, ...], list[Finding]]:
    """A trace, its summary, its collectives and the trace-level rules' findings (of ``world_size`` traces
    analysed together)."""
    trace = load_trace(path, on_repair=say_repaired)
    if not any(isinstance(event, Complete) for event in trace.traceEvents):
        raise InputError(f"{path}: the trace holds no operator, kernel or step (no complete event): nothing to analyze")
    summary = summarize_trace(trace, window=os.path.basename(path))
    collectives = collective_stats(trace)
    info = distributed_info(trace)
    context = trace_context(
        summary,
        info,
        stage=trace_stage(trace),
        precision=precision,
        world_size=world_size,
        collectives=collectives,
        notes=trace_notes(trace),
    )
    return trace, summary, collectives, diagnose(context)
