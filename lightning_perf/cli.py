"""
Command line
============

``lightning-perf`` (or ``python -m lightning_perf``): the offline side of the loop measure, change one
thing, measure again, compare.

- ``report RUN_DIR``: a run's per-epoch summaries and findings, from its ``perf_report.json`` (with its FLOPs
  per batch, achieved FLOP/s, MFU and top modules by FLOPs where they were counted).
- ``analyze PATH...``: the trace-level rules on any Kineto traces, grouped by rank per directory.
- ``compare BEFORE AFTER``: two runs (or two traces) side by side (MFU before and after, where known);
  ``--fail-if-slower PCT`` for CI.

One code path with the callback: the same readers, summaries, rules and formatters; no second
implementation of a rule. Bad input (a missing file, a truncated gzip, a malformed report) is one line on
stderr and exit code 2. Nothing here imports torch or Lightning, so the commands start fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from lightning_perf import __version__
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnosis_context import cross_rank_findings, distributed_info, trace_context, trace_stage
from lightning_perf.readers import InputError, load_report, load_trace
from lightning_perf.records import EpochSummary, OperatorStat, RankSummary, TraceSummary, share
from lightning_perf.report.findings import CLEAN, console_report, finding_lines, ranks_table, shown_findings
from lightning_perf.report.json_report import report_epochs, report_top_modules
from lightning_perf.summarize.events import KinetoTrace
from lightning_perf.summarize.operators import operator_stats
from lightning_perf.summarize.ranks import rank_summary_of_trace
from lightning_perf.summarize.step_summary import summarize_trace
from lightning_perf.traces import collector_paused
from lightning_perf.units import change, count, duration_us, flops, flops_rate, mib, percent

EXIT_OK, EXIT_SLOWER, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command ended by SIGPIPE
REPORT_PATTERN = re.compile(r"^perf_report(-\d+)?\.json$")
TRACE_PATTERN = re.compile(r"\.json(\.gz)?$")
RANK_PATTERN = re.compile(r"rank[_-]?(\d+)")
TOP_MODULES_SHOWN = 5  # of the report's run.flops.by_module, on `report`'s line of modules by FLOPs share


class UsageError(InputError):
    """A path that holds nothing this command can read."""


# ------------------------------------------------------------------ finding files


def find_reports(run_dir: str) -> list[str]:
    """The ``perf_report*.json`` files under ``run_dir`` (or ``run_dir`` itself when it is one)."""
    if os.path.isfile(run_dir):
        return [run_dir]
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir}: no such file or directory")
    found = sorted(
        os.path.join(root, name) for root, _, files in os.walk(run_dir) for name in files if REPORT_PATTERN.match(name)
    )
    if not found:
        raise UsageError(f"{run_dir}: holds no perf_report.json (is it a run directory written by PerfCallback?)")
    return found


def find_traces(paths: Iterable[str]) -> list[str]:
    """Kineto trace files: the files given, and the ``*.json``/``*.json.gz`` files under directories given."""
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found += sorted(
                os.path.join(root, name)
                for root, _, files in os.walk(path)
                for name in files
                if TRACE_PATTERN.search(name) and not REPORT_PATTERN.match(name)
            )
        elif os.path.exists(path):
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or directory")
    if not found:
        raise UsageError(f"{', '.join(paths)}: holds no Kineto trace (*.json or *.json.gz)")
    return found


def trace_rank(path: str, trace: KinetoTrace | Mapping[str, Any]) -> int:
    """A trace's global rank: its ``distributedInfo``, else a ``rank<N>`` in its file name, else 0."""
    info = distributed_info(trace)
    if isinstance(info.get("rank"), int) and not isinstance(info["rank"], bool):
        return info["rank"]
    match = RANK_PATTERN.search(os.path.basename(path))
    return int(match.group(1)) if match else 0


# ------------------------------------------------------------------ report


def command_report(args: argparse.Namespace) -> int:
    reports = [(path, load_report(path)) for path in find_reports(args.run_dir)]
    if args.json:
        data: Any = reports[0][1] if len(reports) == 1 else dict(reports)
        print(json.dumps(data, indent=1))
        return EXIT_OK
    for path, report in reports:
        run = report.get("run", {})
        print(f"{path}")
        print(
            f"  {run.get('device', '?')} {run.get('device_name') or ''}, world size {run.get('world_size', 1)},"
            f" precision {run.get('precision')}, torch {run.get('torch')}, lightning {run.get('lightning')}"
        )
        for line in _run_flops_lines(run):
            print(f"  {line}")
        for summary, findings, ranks in report_epochs(report):
            print(_with_flops_per_batch(console_report(summary, findings, verbose=args.verbose, ranks=ranks), summary))
        windows = report.get("windows", [])
        if windows:
            print(f"  {len(windows)} profiler window(s): " + ", ".join(w["name"] for w in windows))
    return EXIT_OK


def _run_flops_lines(run: Mapping[str, Any]) -> list[str]:
    """The run's FLOPs facts, where known: the peak MFU divides by, and the modules with the largest share of
    a counted batch's FLOPs. Nothing for a run whose FLOPs were not counted."""
    lines = []
    peak = run.get("peak_flops")
    if isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0:
        lines.append(f"peak {flops_rate(peak)} per device (what MFU divides by)")
    if modules := report_top_modules(run):
        shown = ", ".join(f"{name} {percent(part)}" for name, part in modules[:TOP_MODULES_SHOWN])
        lines.append(f"top modules by FLOPs: {shown}")
    return lines


def _with_flops_per_batch(text: str | None, summary: EpochSummary) -> str | None:
    """An epoch's console text with its FLOPs per batch under the headline, where they were counted."""
    if text is None or summary.flops_per_batch is None:
        return text
    head, *rest = text.split("\n")
    return "\n".join([head, f"  FLOPs per batch: {flops(summary.flops_per_batch)} (forward and backward)", *rest])


# ------------------------------------------------------------------ analyze


def _summary_line(s: TraceSummary) -> str:
    parts = [f"{s.steps} steps of {duration_us(s.step_time * 1e6)}"]
    if (busy := share(s.device_busy, s)) is not None:
        parts.append(f"device busy {percent(busy)}")
    if (exposed := share(s.communication_exposed_time, s)) is not None:
        parts.append(f"exposed communication {percent(exposed)}")
    parts.append(f"{count(s.ops_per_step)} operators per step")
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
            trace, summary, findings = _analyzed(path, precision=args.precision, world_size=len(paths))
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


def _analyzed(
    path: str, *, precision: str | None, world_size: int = 1
) -> tuple[KinetoTrace, TraceSummary, list[Finding]]:
    """A trace, its summary and the trace-level rules' findings (of ``world_size`` traces analysed together)."""
    trace = load_trace(path)
    summary = summarize_trace(trace, window=os.path.basename(path))
    info = distributed_info(trace)
    context = trace_context(summary, info, stage=trace_stage(trace), precision=precision, world_size=world_size)
    return trace, summary, diagnose(context)


# ------------------------------------------------------------------ compare


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


def _side_of_run(path: str) -> _Side:
    reports = find_reports(path)
    if len(reports) > 1:
        shown = ", ".join(os.path.relpath(r, path) for r in reports[:3]) + (", ..." if len(reports) > 3 else "")
        raise UsageError(f"{path}: holds {len(reports)} reports ({shown}); compare one run: pass its directory")
    report = load_report(reports[0])
    train = [(s, f) for s, f, _ in report_epochs(report) if s.stage == "train" and s.batches]
    if not train:
        raise UsageError(f"{path}: its report has no measured training epoch")
    last, findings = train[-1]  # the last epoch: past start-up effects
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
    )


def _severities(findings: Sequence[Finding]) -> dict[str, str]:
    """The warning and critical findings' severities, by rule."""
    return {f.id: f.severity for f in findings if f.severity != "info"}


def _side_of_trace(path: str, args: argparse.Namespace) -> _Side:
    trace, summary, findings = _analyzed(path, precision=args.precision)
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
    )


def _side(path: str, args: argparse.Namespace) -> _Side:
    if os.path.isdir(path) or REPORT_PATTERN.match(os.path.basename(path)):
        return _side_of_run(path)
    return _side_of_trace(path, args)


def _change(before: float | None, after: float | None, *, lower_is_better: bool = True) -> str:
    if before is None or after is None or before == 0:
        return ""
    ratio = after / before - 1
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

    metrics: list[tuple[str, Callable[[float | None], str], float | None, float | None, bool]] = [
        # (name, formatter, before, after, lower is better)
        ("step time p50", time, before.step_p50, after.step_p50, True),
        ("step time p90", time, before.step_p90, after.step_p90, True),
        ("throughput", rate, before.throughput, after.throughput, False),
        ("FLOP/s", flop_rate, before.flops_per_second, after.flops_per_second, False),
        ("MFU", share, before.mfu, after.mfu, False),
        ("data wait", share, before.data_wait, after.data_wait, True),
        ("host memory peak", memory, before.host_peak, after.host_peak, True),
        ("CUDA allocated peak", memory, before.cuda_peak, after.cuda_peak, True),
    ]
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


# ------------------------------------------------------------------ entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightning-perf", description=__doc__.split("\n\n")[1].strip())
    parser.add_argument("--version", action="version", version=f"lightning-perf {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    report = commands.add_parser("report", help="a run's per-epoch summaries and findings")
    report.add_argument("run_dir", help="a run directory (searched for perf_report.json) or a report file")
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument(
        "-v", "--verbose", type=int, default=2, choices=(1, 2), help="2: also info findings and evidence"
    )
    report.set_defaults(run=command_report)

    analyze = commands.add_parser("analyze", help="the trace-level rules on Kineto traces")
    analyze.add_argument(
        "paths", nargs="+", help="trace files or directories (a directory of ranks: cross-rank findings)"
    )
    analyze.add_argument(
        "--precision", default=None, help='the run\'s Lightning precision, e.g. "32-true" (enables the precision rule)'
    )
    analyze.add_argument("--json", action="store_true")
    analyze.add_argument("-v", "--verbose", type=int, default=1, choices=(1, 2))
    analyze.set_defaults(run=command_analyze)

    compare = commands.add_parser("compare", help="two runs or two traces side by side")
    compare.add_argument("before", help="a run directory, a perf_report.json, or a trace")
    compare.add_argument("after", help="a run directory, a perf_report.json, or a trace")
    compare.add_argument(
        "--fail-if-slower",
        type=float,
        metavar="PCT",
        default=None,
        help="exit 1 if step time p50 grew by more than PCT percent",
    )
    compare.add_argument("--operators", type=int, default=10, help="how many operators to list")
    compare.add_argument("--precision", default=None, help=argparse.SUPPRESS)
    compare.add_argument("--json", action="store_true")
    compare.set_defaults(run=command_compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with collector_paused():  # a command is short-lived and builds 10^5 acyclic records: it runs without
            return args.run(args)
    except InputError as err:
        print(f"lightning-perf: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader went away (`lightning-perf report ... | head`): stop quietly, as other commands do, and
        # point stdout at nothing so that the interpreter's final flush does not raise again (Python's
        # documented recipe, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
