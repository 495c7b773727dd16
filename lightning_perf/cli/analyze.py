"""
``lightning-perf analyze``
==========================

The trace-level rules on any Kineto traces, grouped by rank per directory, with the cross-rank findings of a
directory of ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from lightning_perf.cli.inputs import EXIT_OK, find_traces, trace_rank
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnosis_context import cross_rank_findings, distributed_info, trace_context, trace_stage
from lightning_perf.readers import load_trace
from lightning_perf.records import RankSummary, TraceSummary, share
from lightning_perf.report.findings import CLEAN, finding_lines, ranks_table, shown_findings
from lightning_perf.summarize.events import KinetoTrace
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
    by_dir: dict[str, list[str]] = {}
    for path in find_traces(args.paths):
        by_dir.setdefault(os.path.dirname(os.path.abspath(path)), []).append(path)
    results: dict[str, Any] = {}
    for directory, paths in by_dir.items():
        entries = []
        for path in paths:
            trace, summary, findings = analyzed(path, precision=args.precision, world_size=len(paths))
            entries.append((trace_rank(path, trace), path, summary, findings))
            del trace  # one trace in memory at a time
        entries.sort(key=lambda e: e[0])
        if not args.json:
            print(directory)
        ranks: list[RankSummary] = []
        for rank, path, summary, findings in entries:
            ranks.append(rank_summary_of_trace(rank, summary))
            results[path] = {
                "rank": rank,
                "summary": dataclasses.asdict(summary),
                "findings": [dataclasses.asdict(f) for f in findings],
            }
            if not args.json:
                print(f"  rank {rank}: {os.path.basename(path)}: {_summary_line(summary)}")
                _print_findings(findings, args.verbose)
        if len(entries) > 1 and len({r.rank for r in ranks}) == len(ranks):
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
    if args.json:
        print(json.dumps(results, indent=1))
    return EXIT_OK


def analyzed(
    path: str, *, precision: str | None, world_size: int = 1
) -> tuple[KinetoTrace, TraceSummary, list[Finding]]:
    """A trace, its summary and the trace-level rules' findings (of ``world_size`` traces analysed together)."""
    trace = load_trace(path)
    summary = summarize_trace(trace, window=os.path.basename(path))
    info = distributed_info(trace)
    context = trace_context(summary, info, stage=trace_stage(trace), precision=precision, world_size=world_size)
    return trace, summary, diagnose(context)
