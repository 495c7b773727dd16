"""
``lightning-perf compare``
==========================

Two runs (or two traces) side by side: step times, throughput, FLOP/s and MFU, data wait, memory peaks, what
``torch.compile`` did where either side shows it (a run's compile time, graph breaks and recompiles over its
training epochs; a trace's share of the step in compiled regions and guard checks), the findings fixed, new
and kept, and the operators that changed most; ``--fail-if-slower PCT`` for CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from lightning_perf.cli.analyze import analyzed
from lightning_perf.cli.inputs import EXIT_OK, EXIT_SLOWER, REPORT_PATTERN, UsageError, find_reports
from lightning_perf.diagnose.model import Finding
from lightning_perf.readers import load_report, load_trace
from lightning_perf.records import OperatorStat, share
from lightning_perf.report.json_report import ReportEpoch, report_epochs
from lightning_perf.summarize.operators import operator_stats
from lightning_perf.units import change, count, duration_us, flops_rate, mib, percent


@dataclasses.dataclass(frozen=True)
class _Side:
    label: str
    step_p50: float | None
    step_p90: float | None
    throughput: float | None
    flops_per_second: float | None
    mfu: float | None
    data_wait: float | None
    host_peak: float | None
    cuda_peak: float | None
    findings: dict[str, str]  # id -> severity, warnings and critical only
    operators: dict[str, OperatorStat]
    # What torch.compile did over a run's training epochs; None: it compiled nothing there (or a trace).
    compile_seconds: float | None = None
    graph_breaks: int | None = None
    recompiles: int | None = None
    # A trace's share of the step in compiled regions and in dynamo's guard checks; None: none in it (or a run).
    compiled_share: float | None = None
    guard_share: float | None = None


def _compile_totals(epochs: Sequence[ReportEpoch]) -> tuple[float | None, int | None, int | None]:
    """The compile seconds, graph breaks and recompiles of ``epochs`` summed; ``None`` where no epoch has
    compile stats (a run that compiled nothing)."""
    stats = [e.compile for e in epochs if e.compile is not None]
    if not stats:
        return None, None, None
    return sum(s.seconds for s in stats), sum(s.breaks for s in stats), sum(s.recompiles for s in stats)


def _side_of_run(path: str) -> _Side:
    reports = find_reports(path)
    if len(reports) > 1:
        shown = ", ".join(os.path.relpath(r, path) for r in reports[:3]) + (", ..." if len(reports) > 3 else "")
        raise UsageError(f"{path}: holds {len(reports)} reports ({shown}); compare one run: pass its directory")
    report = load_report(reports[0])
    epochs = [e for e in report_epochs(report) if e.summary.stage == "train"]
    train = [e for e in epochs if e.summary.batches]
    if not train:
        raise UsageError(f"{path}: its report has no measured training epoch")
    last, findings = train[-1].summary, train[-1].findings  # the last epoch: past start-up effects
    compile_seconds, graph_breaks, recompiles = _compile_totals(epochs)
    operators: dict[str, OperatorStat] = {}
    windows = [w for w in report.get("windows", []) if w["stage"] == "train" and os.path.exists(w["trace_path"])]
    if windows:
        operators = {op.name: op for op in operator_stats(load_trace(windows[-1]["trace_path"]))}
    return _Side(
        label=path,
        step_p50=last.step_time_p50,
        step_p90=last.step_time_p90,
        throughput=last.throughput,
        flops_per_second=last.flops_per_second,
        mfu=last.mfu,
        data_wait=last.data_wait_fraction,
        host_peak=last.host_rss_peak,
        cuda_peak=last.cuda_max_allocated,
        findings=_severities(findings),
        operators=operators,
        compile_seconds=compile_seconds,
        graph_breaks=graph_breaks,
        recompiles=recompiles,
    )


def _severities(findings: Sequence[Finding]) -> dict[str, str]:
    """The warning and critical findings' severities, by rule."""
    return {f.id: f.severity for f in findings if f.severity != "info"}


def _side_of_trace(path: str, args: argparse.Namespace) -> _Side:
    trace, summary, findings = analyzed(path, precision=args.precision)
    return _Side(
        label=path,
        step_p50=summary.step_time,
        step_p90=None,
        throughput=None,
        flops_per_second=None,
        mfu=None,
        data_wait=share(summary.dataloader_time, summary),
        host_peak=None,
        cuda_peak=None,
        findings=_severities(findings),
        operators={op.name: op for op in operator_stats(trace)},
        compiled_share=share(summary.compiled_time, summary),
        guard_share=share(summary.guard_time, summary),
    )


def _side(path: str, args: argparse.Namespace) -> _Side:
    if os.path.isdir(path) or REPORT_PATTERN.match(os.path.basename(path)):
        return _side_of_run(path)
    return _side_of_trace(path, args)


# (name, formatter, before, after, lower is better: None where neither way is)
_Metric = tuple[str, Callable[[float | None], str], float | None, float | None, bool | None]


def _change(before: float | None, after: float | None, *, lower_is_better: bool | None = True) -> str:
    if before is None or after is None or before == 0:
        return ""
    ratio = after / before - 1
    if lower_is_better is None:
        return change(ratio)
    better = ratio < 0 if lower_is_better else ratio > 0
    word = "better" if better else "worse" if ratio else "same"
    return f"{change(ratio)} ({word})"


def _op_time(op: OperatorStat) -> float:
    return op.self_device_time if op.self_device_time else op.self_cpu_time


def command_compare(args: argparse.Namespace) -> int:
    return _print_comparison(_side(args.before, args), _side(args.after, args), args)


def _print_comparison(before: _Side, after: _Side, args: argparse.Namespace) -> int:
    def time(v: float | None) -> str:
        return "-" if v is None else duration_us(v * 1e6)

    def share(v: float | None) -> str:
        return "-" if v is None else percent(v)  # rounded down, as everywhere

    def memory(v: float | None) -> str:
        return "-" if v is None else mib(v)

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{count(v)}/s"

    def flop_rate(v: float | None) -> str:
        return "-" if v is None else flops_rate(v)

    metrics: list[_Metric] = [
        ("step time p50", time, before.step_p50, after.step_p50, True),
        ("step time p90", time, before.step_p90, after.step_p90, True),
        ("throughput", rate, before.throughput, after.throughput, False),
        ("FLOP/s", flop_rate, before.flops_per_second, after.flops_per_second, False),
        ("MFU", share, before.mfu, after.mfu, False),
        ("data wait", share, before.data_wait, after.data_wait, True),
        ("host memory peak", memory, before.host_peak, after.host_peak, True),
        ("CUDA allocated peak", memory, before.cuda_peak, after.cuda_peak, True),
    ]
    metrics += _compile_metrics(before, after)
    if args.json:  # what is unknown on a side is null (the table's "-"), and so is a change not computed
        known: list[tuple[str, str | None, str | None, str | None]] = [
            (
                name,
                fmt(b) if b is not None else None,
                fmt(a) if a is not None else None,
                _change(b, a, lower_is_better=lower) or None,
            )
            for name, fmt, b, a, lower in metrics
        ]
        print(json.dumps(_comparison_json(before, after, known), indent=1))
    else:
        rows = [(name, fmt(b), fmt(a), _change(b, a, lower_is_better=lower)) for name, fmt, b, a, lower in metrics]
        print(f"before: {before.label}\nafter:  {after.label}\n")
        table = [("", "before", "after", "change"), *rows]
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        for row in table:
            cells = zip(row, widths, strict=True)
            print("  " + "  ".join(c.ljust(w) if i in (0, 3) else c.rjust(w) for i, (c, w) in enumerate(cells)))
        print()
        fixed, new, kept = _finding_changes(before, after)
        print(f"findings fixed: {', '.join(fixed) or 'none'}")
        print(f"findings new:   {', '.join(new) or 'none'}")
        print(f"findings kept:  {', '.join(kept) or 'none'}")
        _print_operator_changes(before, after, args.operators)
    if args.fail_if_slower is not None and before.step_p50 and after.step_p50:
        slower = after.step_p50 / before.step_p50 - 1
        if slower * 100 > args.fail_if_slower:
            print(
                f"lightning-perf: step time p50 is {change(slower, signed=False)} slower"
                f" (limit --fail-if-slower {args.fail_if_slower:g}%)",
                file=sys.stderr,
            )
            return EXIT_SLOWER
    return EXIT_OK


def _compile_metrics(before: _Side, after: _Side) -> list[_Metric]:
    """The rows of what ``torch.compile`` did, each where either side shows it: a run's compile time, graph
    breaks and recompiles over its training epochs (lower is better); a trace's share of the step in compiled
    regions (neither way is better: faster compiled code shrinks it too) and in guard checks (lower is better).
    """

    def time(v: float | None) -> str:
        return "-" if v is None else duration_us(v * 1e6)

    def number(v: float | None) -> str:
        return "-" if v is None else count(v)

    def share(v: float | None) -> str:
        return "-" if v is None else percent(v)

    def small_share(v: float | None) -> str:
        return "-" if v is None else percent(v, 1)  # as `analyze` shows it

    rows: list[_Metric] = []
    if before.compile_seconds is not None or after.compile_seconds is not None:
        rows += [
            ("compile time", time, before.compile_seconds, after.compile_seconds, True),
            ("graph breaks", number, before.graph_breaks, after.graph_breaks, True),
            ("recompiles", number, before.recompiles, after.recompiles, True),
        ]
    if before.compiled_share is not None or after.compiled_share is not None:
        rows.append(("compiled regions", share, before.compiled_share, after.compiled_share, None))
    if before.guard_share is not None or after.guard_share is not None:
        rows.append(("guard checks", small_share, before.guard_share, after.guard_share, True))
    return rows


def _finding_changes(before: _Side, after: _Side) -> tuple[list[str], list[str], list[str]]:
    """Finding ids fixed, new and kept (a kept one with its change of severity, e.g. ``critical -> warning``)."""
    fixed = sorted(set(before.findings) - set(after.findings))
    new = sorted(set(after.findings) - set(before.findings))
    kept = [
        name
        if before.findings[name] == after.findings[name]
        else f"{name} ({before.findings[name]} -> {after.findings[name]})"
        for name in sorted(set(before.findings) & set(after.findings))
    ]
    return fixed, new, kept


def _operator_changes(before: _Side, after: _Side) -> list[tuple[str, float, float]]:
    names = set(before.operators) | set(after.operators)
    changes = [
        (
            name,
            _op_time(before.operators[name]) if name in before.operators else 0.0,
            _op_time(after.operators[name]) if name in after.operators else 0.0,
        )
        for name in names
    ]
    return sorted(changes, key=lambda c: -abs(c[2] - c[1]))


def _print_operator_changes(before: _Side, after: _Side, limit: int) -> None:
    changes = _operator_changes(before, after)
    if not changes:
        return
    clock = "device" if any(op.self_device_time for op in after.operators.values()) else "CPU"
    print(f"\noperators whose self time changed most (per window, {clock} time):")
    for name, b, a in changes[:limit]:
        word = "faster" if a < b else "slower"
        print(f"  {name[:60]:<60} {duration_us(b):>10} -> {duration_us(a):>10}  {word}")


def _comparison_json(
    before: _Side, after: _Side, rows: list[tuple[str, str | None, str | None, str | None]]
) -> dict[str, Any]:
    return {
        "before": before.label,
        "after": after.label,
        "metrics": {name: {"before": b, "after": a, "change": c} for name, b, a, c in rows},
        "findings": dict(zip(("fixed", "new", "kept"), _finding_changes(before, after), strict=True)),
        "operators": [{"name": n, "before_us": b, "after_us": a} for n, b, a in _operator_changes(before, after)[:20]],
    }
