"""
perf_report.json
================

The run's report as one JSON document, rewritten atomically at every epoch end, so that it is valid
whenever it is read, even after an interrupted run. Its schema (``version`` 1):

.. code-block:: text

    {
      "version": 1,
      "generated_by": "lightning-perf <version>",
      "run": {torch, lightning, device, device_name, world_size, precision, strategy,
              dataloaders: {<stage>: {num_workers, pin_memory, persistent_workers, batch_size}}},
      "stages": {<stage>: {"epochs": [{<EpochSummary fields>, "findings": [<Finding fields>, ...],
                                       "ranks": [<RankSummary fields>, ...]}, ...]}},
      "windows": [{<WindowRecord fields but operators>, "summary": {<TraceSummary fields>}}, ...]
    }

Times are in seconds, memory in bytes; ``null`` where a value could not be measured.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lightning_perf.diagnose.model import Finding
from lightning_perf.layout import write_atomically
from lightning_perf.records import EpochSummary, RankSummary, WindowRecord

SCHEMA_VERSION = 1
REPORT_FILENAME = "perf_report.json"


def report_dict(
    *,
    generated_by: str,
    run: Mapping[str, Any],
    epochs: Iterable[EpochSummary],
    windows: Iterable[WindowRecord],
    findings: Mapping[tuple[str, int], Sequence[Finding]] | None = None,
    ranks: Mapping[tuple[str, int], Sequence[RankSummary]] | None = None,
) -> dict[str, Any]:
    """The report as plain JSON-ready data; ``findings`` and ``ranks`` (the per-rank table of a distributed
    run) by ``(stage, epoch)``."""
    findings, ranks = findings or {}, ranks or {}
    stages: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for summary in epochs:
        entry = dataclasses.asdict(summary)
        entry["findings"] = [dataclasses.asdict(f) for f in findings.get((summary.stage, summary.epoch), ())]
        entry["ranks"] = [dataclasses.asdict(r) for r in ranks.get((summary.stage, summary.epoch), ())]
        stages.setdefault(summary.stage, {"epochs": []})["epochs"].append(entry)
    return {
        "version": SCHEMA_VERSION,
        "generated_by": generated_by,
        "run": dict(run),
        "stages": stages,
        "windows": [window_dict(w) for w in windows],
    }


def window_dict(window: WindowRecord, *, with_summary: bool = True) -> dict[str, Any]:
    """A window as plain data: without its operators (they are in the ``*.operators.md`` file beside the
    trace), and with its trace summary unless ``with_summary`` is false."""
    entry = {f.name: getattr(window, f.name) for f in dataclasses.fields(window) if f.name not in ("operators", "summary")}
    if with_summary:
        entry["summary"] = None if window.summary is None else dataclasses.asdict(window.summary)
    return entry


def write_json_atomically(data: Mapping[str, Any], path: str) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename: readers see the old or the new file."""
    write_atomically(json.dumps(data, indent=1, allow_nan=False), path)
