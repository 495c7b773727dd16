"""
perf_report.json
================

The run's report as one JSON document, rewritten atomically (so that it is valid whenever it is read, even
after an interrupted run) by a :class:`ReportFile`: at epoch ends within a time budget, and always at the
end of each ``fit``/``validate``/``test``/``predict`` and on an interruption. Its schema (``version`` 1):

.. code-block:: text

    {
      "version": 1,
      "generated_by": "lightning-perf <version>",
      "run": {torch, lightning, device, device_name, world_size, precision, strategy,
              dataloaders: {<stage>: {num_workers, pin_memory, persistent_workers, batch_size}},
              peak_flops,
              flops: {by_module: [[<module>, <FLOPs>], ...], counted: [{flops, samples, shape}, ...]}},
      "stages": {<stage>: {"epochs": [{<EpochSummary fields>, "findings": [<Finding fields>, ...],
                                       "ranks": [<RankSummary fields>, ...],
                                       "compile": {<CompileStats fields>,
                                                   "break_sites": [{reason, location, count}, ...],
                                                   "recompile_guards": [{function, guard, count}, ...],
                                                   "steps": [<batch>, ...]}}, ...]}},
      "windows": [{<WindowRecord fields but operators>, "summary": {<TraceSummary fields>}}, ...]
    }

Times are in seconds, memory in bytes, work in FLOPs (rates in FLOP/s, ``peak_flops`` per device); ``null``
where a value could not be measured. ``run.flops`` is absent when no batch's FLOPs were counted: ``counted``
holds each batch shape counted, ``by_module`` the largest modules of the first one.

An epoch's ``compile`` (:class:`~lightning_perf.records.CompileStats`: ``graphs``, ``breaks``, ``recompiles``,
``limit_reached``, ``seconds``, ``seconds_before``, ``limit_function``, and the graph breaks by reason and
place, the recompiles by function and failed guard, the batches that compiled) is what ``torch.compile`` did
during it; the key is absent from every epoch of a run that compiled nothing (and from reports written before
it was measured).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from lightning_perf.diagnose.model import Finding
from lightning_perf.layout import REPORT_SCHEMA_VERSION, write_atomically
from lightning_perf.records import (
    CompileStats,
    EpochSummary,
    GraphBreak,
    RankSummary,
    Recompile,
    WindowRecord,
    from_values,
    plain,
)

SCHEMA_VERSION = REPORT_SCHEMA_VERSION
REPORT_FILENAME = "perf_report.json"

# The report holds every epoch, so one rewrite costs more the longer the run (a 1,000-epoch run's report is
# about 1.4 MB: tens of ms to build and write). Between epoch ends it is rewritten only once the time since
# the last rewrite is at least 1/REWRITE_TIME_SHARE times what that rewrite cost: at most 1% of the run's
# wall time, however long the run, and at every epoch end while the report is small (a 10 ms rewrite: once
# a second at most).
REWRITE_TIME_SHARE = 0.01


def report_dict(
    *,
    generated_by: str,
    run: Mapping[str, Any],
    epochs: Iterable[EpochSummary],
    windows: Iterable[WindowRecord],
    findings: Mapping[tuple[str, int], Sequence[Finding]] | None = None,
    ranks: Mapping[tuple[str, int], Sequence[RankSummary]] | None = None,
    compile: Mapping[tuple[str, int], CompileStats] | None = None,
) -> dict[str, Any]:
    """The report as plain JSON-ready data; ``findings``, ``ranks`` (the per-rank table of a distributed run)
    and ``compile`` (what ``torch.compile`` did) by ``(stage, epoch)``. An epoch without compile stats gets
    no ``compile`` key."""
    findings, ranks, compile = findings or {}, ranks or {}, compile or {}
    stages: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for summary in epochs:
        key = (summary.stage, summary.epoch)
        entry = plain(summary)
        entry["findings"] = [plain(f) for f in findings.get(key, ())]
        entry["ranks"] = [plain(r) for r in ranks.get(key, ())]
        stats = compile.get(key)
        if stats is not None:
            entry["compile"] = compile_dict(stats)
        stages.setdefault(summary.stage, {"epochs": []})["epochs"].append(entry)
    return {
        "version": SCHEMA_VERSION,
        "generated_by": generated_by,
        "run": dict(run),
        "stages": stages,
        "windows": [window_dict(w) for w in windows],
    }


def compile_dict(stats: CompileStats) -> dict[str, Any]:
    """An epoch's compile stats as plain data, as the report's ``compile`` holds them."""
    entry = plain(stats)
    entry["break_sites"] = [plain(b) for b in stats.break_sites]
    entry["recompile_guards"] = [plain(r) for r in stats.recompile_guards]
    entry["steps"] = list(stats.steps)
    return entry


def compile_record(values: Mapping[str, Any]) -> CompileStats:
    """:class:`~lightning_perf.records.CompileStats` from a report's ``compile`` (as ``readers.load_report``
    checked it): the inverse of :func:`compile_dict`."""
    return from_values(
        CompileStats,
        {
            **values,
            "break_sites": tuple(from_values(GraphBreak, b) for b in values.get("break_sites", ())),
            "recompile_guards": tuple(from_values(Recompile, r) for r in values.get("recompile_guards", ())),
            "steps": tuple(values.get("steps", ())),
        },
    )


@dataclasses.dataclass(frozen=True)
class ReportEpoch:
    """One stage epoch of a report, as records.

    Attributes:
        summary: Its summary.
        findings: Its findings.
        ranks: Its per-rank table (a distributed run).
        compile: What ``torch.compile`` did during it; ``None`` where the run compiled nothing.
    """

    summary: EpochSummary
    findings: tuple[Finding, ...] = ()
    ranks: tuple[RankSummary, ...] = ()
    compile: CompileStats | None = None


def report_epochs(report: Mapping[str, Any]) -> list[ReportEpoch]:
    """The epochs of a report (as :func:`report_dict` writes it, checked by ``readers.load_report``), each with
    its findings, per-rank table and compile stats: the inverse of :func:`report_dict`'s ``stages``."""
    return [
        ReportEpoch(
            summary=from_values(EpochSummary, entry),
            findings=tuple(from_values(Finding, f) for f in entry.get("findings", [])),
            ranks=tuple(from_values(RankSummary, r) for r in entry.get("ranks", [])),
            compile=compile_record(entry["compile"]) if entry.get("compile") is not None else None,
        )
        for stage in report.get("stages", {}).values()
        for entry in stage.get("epochs", [])
    ]


def report_top_modules(run: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``(module, share of the batch's FLOPs)`` from a report's ``run`` (its ``flops``), largest first: each
    module of ``by_module`` over the FLOPs of the batch they were counted on (the first of ``counted``). Empty
    where the report holds no counted batch; entries of another shape are left out (``run.flops`` is not part
    of the schema ``readers.load_report`` checks)."""
    counts = run.get("flops")
    counted = counts.get("counted") if isinstance(counts, Mapping) else None
    by_module = counts.get("by_module") if isinstance(counts, Mapping) else None
    if not isinstance(counted, list) or not counted or not isinstance(counted[0], Mapping):
        return []
    total = counted[0].get("flops")
    if not isinstance(by_module, list) or not _is_number(total) or total <= 0:
        return []
    modules = [
        (entry[0], entry[1] / total)
        for entry in by_module
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str) and _is_number(entry[1])
    ]
    return sorted(modules, key=lambda m: -m[1])


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def window_dict(window: WindowRecord, *, with_summary: bool = True) -> dict[str, Any]:
    """A window as plain data: without its operators (they are in the ``*.operators.md`` file beside the
    trace), and with its trace summary unless ``with_summary`` is false."""
    entry = {
        f.name: getattr(window, f.name) for f in dataclasses.fields(window) if f.name not in ("operators", "summary")
    }
    if with_summary:
        entry["summary"] = None if window.summary is None else plain(window.summary)
    return entry


class ReportFile:
    """``perf_report.json``, rewritten on a time budget (:data:`REWRITE_TIME_SHARE`).

    Args:
        path: Where the report goes.
        clock: Seconds, monotonic.

    Example::

        report = ReportFile("perf/perf_report.json")
        report.update(lambda: build_report())  # at an epoch end: written only if the budget allows
        report.write(build_report())  # at the end of the run: always
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.path = path
        self._clock = clock
        self._next_due = -float("inf")  # the first update writes

    def update(self, build: Callable[[], Mapping[str, Any]]) -> bool:
        """Rewrites the report with ``build()`` if the budget allows it now (``build`` is not called
        otherwise); returns whether it did."""
        start = self._clock()
        if start < self._next_due:
            return False
        self._write(build(), start)
        return True

    def write(self, data: Mapping[str, Any]) -> None:
        """Rewrites the report now; the next :meth:`update` waits in proportion to what this cost."""
        self._write(data, self._clock())

    def _write(self, data: Mapping[str, Any], start: float) -> None:
        write_json_atomically(data, self.path)
        end = self._clock()
        self._next_due = end + (end - start) / REWRITE_TIME_SHARE


def write_json_atomically(data: Mapping[str, Any], path: str) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename: readers see the old or the new file."""
    write_atomically(json.dumps(data, indent=1, allow_nan=False), path)
