"""
``lightning-perf report``
=========================

A run's per-epoch summaries and findings, from its ``perf_report.json`` (with its FLOPs per batch, achieved
FLOP/s, MFU and top modules by FLOPs where they were counted, and what ``torch.compile`` did in each epoch
where it compiled something); ``--html OUT`` also writes the run's page
(:mod:`lightning_perf.report.html.run_page`, the page the callback writes beside the report).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from lightning_perf.cli.inputs import EXIT_OK, REPORT_PAGE, find_reports, html_output, one_report, write_page
from lightning_perf.readers import load_report
from lightning_perf.records import EpochSummary
from lightning_perf.report.findings import console_report
from lightning_perf.report.json_report import (
    report_epochs,
    report_profiling,
    report_top_modules,
    report_uncounted_ops,
)
from lightning_perf.report.memory import memory_line
from lightning_perf.report.profiling import profiling_line
from lightning_perf.summarize.memory import checked_memory
from lightning_perf.units import flops, flops_rate, percent

TOP_MODULES_SHOWN = 5  # of the report's run.flops.by_module, on `report`'s line of modules by FLOPs share


def command_report(args: argparse.Namespace) -> int:
    page_path = html_output(args.html, REPORT_PAGE) if args.html else None
    paths = [one_report(args.run_dir, "--html writes one run's page")] if page_path else find_reports(args.run_dir)
    reports = [(path, load_report(path)) for path in paths]
    if args.json:
        data: Any = reports[0][1] if len(reports) == 1 else dict(reports)
        print(json.dumps(data, indent=1))
    else:
        _print_reports(reports, verbose=args.verbose)
    if page_path is not None:
        from lightning_perf.report.html.run_page import run_page

        [(path, report)] = reports
        write_page(run_page(report, source=path), page_path, quiet_stdout=args.json)
    return EXIT_OK


def _print_reports(reports: list[tuple[str, dict[str, Any]]], *, verbose: int) -> None:
    for path, report in reports:
        run = report.get("run", {})
        print(f"{path}")
        print(
            f"  {run.get('device', '?')} {run.get('device_name') or ''}, world size {run.get('world_size', 1)},"
            f" precision {run.get('precision')}, torch {run.get('torch')}, lightning {run.get('lightning')}"
        )
        for line in _run_flops_lines(run):
            print(f"  {line}")
        if (memory := checked_memory(run.get("memory"))) is not None:
            print(f"  {memory_line(memory).removeprefix('lightning-perf: ')}")
        for epoch in report_epochs(report):
            text = console_report(
                epoch.summary, epoch.findings, verbose=verbose, ranks=epoch.ranks, compile=epoch.compile
            )
            print(_with_flops_per_batch(text, epoch.summary))
        windows = report.get("windows", [])
        if windows:
            print(f"  {len(windows)} profiler window(s): " + ", ".join(w["name"] for w in windows))
        if (cost := report_profiling(run)) is not None and (said := profiling_line(cost)):
            print(f"  {said.removeprefix('lightning-perf: ')}")


def _run_flops_lines(run: Mapping[str, Any]) -> list[str]:
    """The run's FLOPs facts, where known: the peak MFU divides by, and the modules with the largest share of
    a counted batch's FLOPs. Nothing for a run whose FLOPs were not counted."""
    lines = []
    peak = run.get("peak_flops")
    if isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0:
        lines.append(f"peak {flops_rate(peak)} per device (what MFU divides by)")
    if modules := report_top_modules(run):
        shown = ", ".join(f"{name} {percent(part)}" for name, part in modules[:TOP_MODULES_SHOWN])
        lines.append(f"top modules by forward FLOPs: {shown}")
    if uncounted := report_uncounted_ops(run):
        shown = ", ".join(f"{op} ({calls} calls)" for op, calls in uncounted[:TOP_MODULES_SHOWN])
        lines.append(f"not counted (no FLOP formula in torch; the figures are lower bounds): {shown}")
    return lines


def _with_flops_per_batch(text: str | None, summary: EpochSummary) -> str | None:
    """An epoch's console text with its FLOPs per batch under the headline, where they were counted."""
    if text is None or summary.flops_per_batch is None:
        return text
    head, *rest = text.split("\n")
    return "\n".join([head, f"  FLOPs per batch: {flops(summary.flops_per_batch)} (forward and backward)", *rest])
