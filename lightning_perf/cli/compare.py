"""
``lightning-perf compare``
==========================

Two runs (or two traces) side by side: step times, throughput, FLOP/s and MFU, data wait, memory peaks, what
``torch.compile`` did where either side shows it (a run's compile time, graph breaks and recompiles over its
training epochs; a trace's share of the step in compiled regions and guard checks), the findings fixed, new
and kept, and the operators that changed most; ``--fail-if-slower PCT`` for CI, ``--html OUT`` for the same as
a page (:mod:`lightning_perf.report.html.compare_page`). What is compared, and how, is
:mod:`lightning_perf.report.comparison`; this module reads the two sides and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from lightning_perf.cli.analyze import analyzed
from lightning_perf.cli.inputs import (
    COMPARE_PAGE,
    EXIT_OK,
    EXIT_SLOWER,
    REPORT_PATTERN,
    UsageError,
    html_output,
    one_report,
    say_repaired,
    write_page,
)
from lightning_perf.readers import load_report, load_trace
from lightning_perf.report.comparison import (
    NOISE_POINTS,
    NOISE_RATIO,
    NOISE_US,
    ComparedSide,
    Metric,
    advice_state,
    finding_changes,
    headline_metrics,
    kept_label,
    operator_changes,
    operator_clock,
    run_side,
    trace_side,
)
from lightning_perf.report.findings import aligned
from lightning_perf.report.json_report import window_record
from lightning_perf.summarize.operators import operator_stats
from lightning_perf.units import change, duration_us


def command_compare(args: argparse.Namespace) -> int:
    page_path = html_output(args.html, COMPARE_PAGE) if args.html else None
    before, after = _side(args.before, args), _side(args.after, args)
    status = _print_comparison(before, after, args)
    if page_path is not None:  # also when slower: the page is what a CI job keeps to show why
        from lightning_perf.report.html.compare_page import compare_page

        write_page(compare_page(before, after), page_path, quiet_stdout=args.json)
    return status


def _side(path: str, args: argparse.Namespace) -> ComparedSide:
    if os.path.isdir(path) or REPORT_PATTERN.match(os.path.basename(path)):
        return _side_of_run(path)
    trace, summary, _, findings = analyzed(path, precision=args.precision)
    return trace_side(path, summary, findings, operator_stats(trace))


def _side_of_run(path: str) -> ComparedSide:
    report_path = one_report(path, "compare one run")
    report = load_report(report_path)
    side = run_side(path, report)
    if side is None:
        raise UsageError(f"{path}: its report has no measured training epoch")
    windows = [w for w in report.get("windows", []) if w["stage"] == "train"]
    if not windows:
        return side
    window = windows[-1]  # the last: past start-up effects, as the headline's epoch
    if (trace := _trace_file(window, report_path)) is not None:
        operators = operator_stats(load_trace(trace, on_repair=say_repaired))
        return dataclasses.replace(side, operators={op.name: op for op in operators}, operators_from=window["name"])
    kept = list(window_record(window).operators)
    return dataclasses.replace(
        side,
        operators={op.name: op for op in kept},
        operators_from=f"{window['name']} (its top {len(kept)} operators, as the report keeps them)" if kept else None,
    )


def _trace_file(window: dict[str, Any], report_path: str) -> str | None:
    """A window's trace: the one beside the report (its window's directory), else where the run wrote it;
    ``None`` where neither exists. Beside the report first: a run directory moved or renamed (copied off a
    cluster) may leave its recorded path to a later run of the same name, whose operators are not this run's."""
    recorded = window["trace_path"]
    beside = os.path.join(os.path.dirname(report_path), window["name"], os.path.basename(recorded))
    return next((path for path in (beside, recorded) if os.path.exists(path)), None)


def _print_comparison(before: ComparedSide, after: ComparedSide, args: argparse.Namespace) -> int:
    metrics = headline_metrics(before, after)
    if args.json:
        print(json.dumps(_comparison_json(before, after, metrics), indent=1))
    else:
        rows = [(m.name, m.text(m.before), m.text(m.after), m.change) for m in metrics]
        print(f"before: {before.label}\nafter:  {after.label}\n")
        for line in aligned([("", "before", "after", "change"), *rows], left=(0, 3)):
            print("  " + line)
        print(
            f"  (same: within run-to-run noise, a change under {NOISE_RATIO:.0%}; a share's, in percentage points,"
            f" under {NOISE_POINTS * 100:g} pp)\n"
        )
        fixed, new, kept = _finding_ids(before, after, tried=True)
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


def _finding_ids(
    before: ComparedSide, after: ComparedSide, *, tried: bool = False
) -> tuple[list[str], list[str], list[str]]:
    """Finding ids fixed, new and kept (a kept one with its change of severity, e.g. ``critical -> warning``);
    ``tried``: each with whether its advice was tried on its side's run (:func:`advice_state`), as
    ``dataloader_bound [advice tried: 7.04x]``."""
    changes = finding_changes(before, after)

    def label(side: ComparedSide, rule: str, text: str) -> str:
        state = advice_state(side, rule) if tried else ""
        return f"{text} [advice {state}]" if state else text

    return (
        [label(before, f.id, f.id) for f in changes.fixed],
        [label(after, f.id, f.id) for f in changes.new],
        [label(after, a.id, kept_label(b, a)) for b, a in changes.kept],
    )


def _print_operator_changes(before: ComparedSide, after: ComparedSide, limit: int) -> None:
    changes = operator_changes(before, after)
    if not changes:
        return
    clock = operator_clock(before, after)
    print(
        f"\noperators whose self time changed most (per window, {clock} time; same: under {NOISE_RATIO:.0%}"
        f" or {NOISE_US:g} us):"
    )
    for c in changes[:limit]:
        print(f"  {c.name[:60]:<60} {duration_us(c.before):>10} -> {duration_us(c.after):>10}  {c.word}")


def _comparison_json(before: ComparedSide, after: ComparedSide, metrics: Sequence[Metric]) -> dict[str, Any]:
    """The comparison as ``--json`` prints it: what is unknown on a side is null (the table's "-"), and so is
    a change not computed."""
    return {
        "before": before.label,
        "after": after.label,
        "metrics": {
            m.name: {
                "before": None if m.before is None else m.format(m.before),
                "after": None if m.after is None else m.format(m.after),
                "change": m.change or None,
            }
            for m in metrics
        },
        "findings": dict(zip(("fixed", "new", "kept"), _finding_ids(before, after), strict=True)),
        "advice_trials": {
            name: {rule: advice_state(side, rule) for rule in side.trials}
            for name, side in (("before", before), ("after", after))
        },
        "operators": [
            {"name": c.name, "before_us": c.before, "after_us": c.after, "change": c.word}
            for c in operator_changes(before, after)[:20]
        ],
    }
