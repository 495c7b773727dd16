"""
Command inputs
==============

What the ``lightning-perf`` commands read (the reports under a run directory, the traces under paths, a
trace's rank) and how they exit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from lightning_perf.diagnosis_context import distributed_info
from lightning_perf.readers import InputError
from lightning_perf.summarize.events import KinetoTrace

EXIT_OK, EXIT_SLOWER, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command ended by SIGPIPE
REPORT_PATTERN = re.compile(r"^perf_report(-\d+)?\.json$")
TRACE_PATTERN = re.compile(r"\.json(\.gz)?$")
RANK_PATTERN = re.compile(r"rank[_-]?(\d+)")


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
