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
- ``run [OPTIONS] SCRIPT ARGS`` (or ``-m MODULE ARGS``): a program as ``python`` runs it, with a ``PerfCallback`` in
  every Trainer it builds (:mod:`lightning_perf.cli.run`).

The first three also write their output as one self-contained HTML page with ``--html OUT`` (a file, or
``OUT/report.html``, ``OUT/traces.html``, ``OUT/compare.html`` where ``OUT`` is a directory): no network needed to
open it.

One code path with the callback: the same readers, summaries, rules and formatters; no second
implementation of a rule. Bad input (a missing file, a truncated gzip, a malformed report) is one line on
stderr and exit code 2. Nothing here imports torch or Lightning, so the commands start fast (``run``'s program
imports them).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from lightning_perf import __version__
from lightning_perf.cli.inputs import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, UsageError, find_traces
from lightning_perf.peak_table import LIGHTNING_PRECISIONS
from lightning_perf.readers import InputError
from lightning_perf.traces import collector_paused

__all__ = ["UsageError", "build_parser", "find_traces", "main"]


def build_parser(*, run_flags: bool = True) -> argparse.ArgumentParser:
    """The ``lightning-perf`` parser; without ``run``'s option flags where ``run_flags`` is false (what the other
    commands parse: a few ms fewer at their start)."""
    parser = argparse.ArgumentParser(prog="lightning-perf", description=__doc__.split("\n\n")[1].strip())
    parser.add_argument("--version", action="version", version=f"lightning-perf {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    report = commands.add_parser("report", help="a run's per-epoch summaries and findings")
    report.add_argument("run_dir", help="a run directory (searched for perf_report.json) or a report file")
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument(
        "-v", "--verbose", type=int, default=2, choices=(1, 2), help="2: also info findings and evidence"
    )
    _html_option(report, "report.html", "the run's page (the one the callback writes beside perf_report.json; one run)")

    analyze = commands.add_parser("analyze", help="the trace-level rules on Kineto traces")
    analyze.add_argument(
        "paths", nargs="+", help="trace files or directories (a directory of ranks: cross-rank findings)"
    )
    analyze.add_argument(
        "--precision",
        type=_precision,
        default=None,
        help='the run\'s Lightning precision, e.g. "32-true" (enables the precision rule)',
    )
    analyze.add_argument("--json", action="store_true", help="print the summaries and findings as JSON")
    analyze.add_argument(
        "-v", "--verbose", type=int, default=1, choices=(1, 2), help="2: also info findings and evidence"
    )
    analyze.add_argument(
        "-j",
        "--jobs",
        type=_at_least_one("--jobs", "processes"),
        default=1,
        help="read the traces in this many processes",
    )
    _html_option(analyze, "traces.html", "a page of the traces (step breakdowns, findings, operator tables)")

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
    compare.add_argument(
        "--operators", type=_at_least_one("--operators", "operators"), default=10, help="how many operators to list"
    )
    compare.add_argument("--precision", type=_precision, default=None, help=argparse.SUPPRESS)
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    _html_option(compare, "compare.html", "a page of the two side by side (deltas, findings, operator changes)")

    run = commands.add_parser(
        "run",
        help="run a program with a PerfCallback in every Trainer it builds",
        description="Run a program as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would, with one PerfCallback"
        " in every Trainer it builds. Options go before the program; everything after it is the program's.",
        allow_abbrev=False,
    )
    run.add_argument(
        "-m", dest="module", metavar="MODULE", default=None, help="run library module MODULE, as `python -m MODULE`"
    )
    run.add_argument("script", nargs="?", default=None, help="the program's file, as `python SCRIPT` runs it")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments: its `sys.argv[1:]`")
    if run_flags:
        from lightning_perf.cli.run_options import add_option_flags

        add_option_flags(run)
    return parser


def split_program(argv: Sequence[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """``run``'s command line, up to its program (``SCRIPT`` or ``-m MODULE``), and the program's arguments after
    it, kept as they are (``--`` and ``--help`` included): argparse would read the program's options as ours."""
    run = _subcommand(parser, "run")
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "-m":
            return list(argv[: i + 2]), list(argv[i + 2 :])
        if not token.startswith("-") or token == "-" or token.startswith("-m"):  # `-mMODULE`, as Python takes it
            return list(argv[: i + 1]), list(argv[i + 1 :])
        action = run._option_string_actions.get(token)
        i += 1 if action is None or action.nargs == 0 else 2  # an unknown one is argparse's to refuse
    return list(argv), []


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _at_least_one(option: str, what: str) -> Callable[[str], int]:
    """An option's type: a whole number of ``what``, at least 1 (``--jobs``, ``--operators``)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise argparse.ArgumentTypeError(f"{option} must be a whole number of {what}, at least 1; got {value!r}")
        return number

    return parse


def _precision(value: str) -> str:
    """``--precision``: one of Lightning's precision settings (what ``Trainer(precision=...)`` accepts)."""
    if value not in LIGHTNING_PRECISIONS:
        raise argparse.ArgumentTypeError(
            f"--precision must be one of Lightning's precisions ({', '.join(LIGHTNING_PRECISIONS)}); got {value!r}"
        )
    return value


def _html_option(command: argparse.ArgumentParser, page_name: str, what: str) -> None:
    command.add_argument(
        "--html",
        metavar="OUT",
        default=None,
        help=f"also write {what} to OUT: one self-contained HTML file that opens offline; OUT/{page_name} where"
        " OUT is a directory (which must exist). Written atomically; its path is printed last (on stderr with"
        " --json)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(run_flags=argv[:1] == ["run"])
    if argv[:1] == ["run"]:
        # The program's own run: its arguments kept apart, and none of the other commands' ways (the collector).
        ours, program = split_program(argv, parser)
        args = parser.parse_args(ours)
        args.args = program
        from lightning_perf.cli.run import command_run

        return command_run(args)
    args = parser.parse_args(argv)
    # The command's own module only (`lightning_perf.cli.analyze` for `analyze`): a command imports no other's.
    run = getattr(importlib.import_module(f"lightning_perf.cli.{args.command}"), f"command_{args.command}")
    try:
        with collector_paused():  # a command is short-lived and builds 10^5 acyclic records: it runs without
            return run(args)
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
