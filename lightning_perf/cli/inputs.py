"""
Command inputs
==============

What the ``lightning-perf`` commands read (the reports under a run directory, the traces under paths, a
trace's rank), what they say of a trace read repaired, where their ``--html OUT`` pages go, and how they exit.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lightning_perf.readers import InputError
from lightning_perf.summarize.events import KinetoTrace, distributed_info
from lightning_perf.units import signed_size

if TYPE_CHECKING:  # the pages are imported where one is drawn: not at every command's start
    from lightning_perf.report.html import Page

EXIT_OK, EXIT_SLOWER, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command ended by SIGPIPE
REPORT_PATTERN = re.compile(r"^perf_report(-\d+)?\.json$")
TRACE_PATTERN = re.compile(r"\.json(\.gz)?$")
RANK_PATTERN = re.compile(r"rank[_-]?(\d+)")
# The page each command's ``--html OUT`` writes into OUT where OUT is a directory (a run's page: the name the
# callback gives it beside perf_report.json, lightning_perf.layout.page_path).
REPORT_PAGE, TRACES_PAGE, COMPARE_PAGE = "report.html", "traces.html", "compare.html"


class UsageError(InputError):
    """A path that holds nothing this command can read."""


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


def one_report(path: str, purpose: str) -> str:
    """The one ``perf_report*.json`` under ``path`` (:func:`find_reports`); a directory of several runs is a
    usage error that names some of them and says what ``purpose`` needs."""
    reports = find_reports(path)
    if len(reports) > 1:
        shown = ", ".join(os.path.relpath(r, path) for r in reports[:3]) + (", ..." if len(reports) > 3 else "")
        raise UsageError(f"{path}: holds {len(reports)} reports ({shown}); {purpose}: pass its directory")
    return reports[0]


def html_output(out: str, page_name: str) -> str:
    """Where ``--html OUT`` writes its page: ``OUT`` itself, or ``OUT/<page_name>`` where ``OUT`` is an existing
    directory. Checked before a command does its work: the directory the page goes into must exist."""
    path = os.path.join(out, page_name) if os.path.isdir(out) else out
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"--html {out}: no such directory: {parent}")
    return path


def write_page(page: Page, path: str, *, quiet_stdout: bool = False) -> None:
    """Writes an HTML page atomically (a browser open on ``path`` reloads the old page or the new one, never
    half of one), and says where on stdout (on stderr where stdout holds ``--json``)."""
    try:
        size = page.write(path)
    except OSError as err:
        raise UsageError(f"--html {path}: cannot write: {err.strerror or err}") from err
    print(
        f"HTML page: {path} ({signed_size(size)}, self-contained: open it in a browser)",
        file=sys.stderr if quiet_stdout else sys.stdout,
    )


def say_repaired(message: str) -> None:
    """What :func:`~lightning_perf.readers.load_trace` repaired in a trace (its ``on_repair``): one line on
    stderr, so that ``--json`` output stays JSON."""
    print(f"lightning-perf: warning: {message}", file=sys.stderr)


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
