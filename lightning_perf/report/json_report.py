"""
perf_report.json
================

The run's report as one JSON document, rewritten atomically (so that it is valid whenever it is read, even
after an interrupted run) by a :class:`ReportFile`: at epoch ends within a time budget (at most every
:data:`REWRITE_MIN_SECONDS`), and always at the end of each ``fit``/``validate``/``test``/``predict`` and on an
interruption (an exception, Ctrl-C, SIGTERM). Its schema (``version`` 1):

.. code-block:: text

    {
      "version": 1,
      "generated_by": "lightning-perf <version>",
      "run": {torch, lightning, device, device_name, world_size, precision, strategy,
              dataloaders: {<stage>: {num_workers, pin_memory, persistent_workers, batch_size}},
              peak_flops,
              flops: {by_module: [[<module>, <forward FLOPs>], ...], forward: <FLOPs>,
                      counted: [{flops, samples, shape}, ...], uncounted: [[<op>, <calls>], ...]}},
      "stages": {<stage>: {"epochs": [{<EpochSummary fields>, "findings": [<Finding fields>, ...],
                                       "ranks": [<RankSummary fields>, ...],
                                       "compile": {<CompileStats fields>,
                                                   "break_sites": [{reason, location, count}, ...],
                                                   "recompile_guards": [{function, guard, count}, ...],
                                                   "steps": [<batch>, ...]},
                                       "steps": {data_wait: [...], compute: [...], per_bar, profiled: [[first,
                                                 last], ...], compiled: [<batch>, ...]}}, ...]}},
      "windows": [{<WindowRecord fields but operators>, "summary": {<TraceSummary fields>},
                   "operators": [<OperatorStat fields>, ...],
                   "collectives": [<CollectiveStats fields>, ...]}, ...]
    }

An epoch's ``profiled_batches`` are the batches left out of its times, not only the profiled ones, despite the
name: those in a profiler window or right after one, the one whose FLOPs were counted (so a training epoch without
any window can have one) and those that compiled.

Times are in seconds, memory in bytes, work in FLOPs (rates in FLOP/s, ``peak_flops`` per device); ``null``
where a value could not be measured. ``run.flops`` is absent when no batch's FLOPs were counted: ``counted``
holds each batch shape counted, ``by_module`` the largest modules of the first one by their forward FLOPs
(``forward`` their whole: autograd's backward cannot be charged to modules reliably), ``uncounted`` the ops
doing matrix work that the count left out (no FLOP formula in torch: the figures are lower bounds).

An epoch's ``compile`` (:class:`~lightning_perf.records.CompileStats`: ``graphs``, ``breaks``, ``recompiles``,
``limit_reached``, ``seconds``, ``seconds_before``, ``limit_function``, and the graph breaks by reason and
place, the recompiles by function and failed guard, the batches that compiled) is what ``torch.compile`` did
during it; the key is absent from every epoch of a run that compiled nothing (and from reports written before
it was measured).

An epoch's ``steps`` (:class:`~lightning_perf.records.StepSplit`) is its step time per batch split into data
wait and compute, for the HTML report's chart; it is kept for a stage's epochs 0, 1, 2, 4, 8, ..., every epoch
with a profiler window and the stage's latest epoch (:func:`keeps_step_split`), so that the report grows with
the logarithm of the run's length, not with it. A window's ``operators`` are its top :data:`OPERATOR_ROWS`
operators (by self device time on a GPU, else self CPU time; times in seconds, as everywhere in the report,
where the record keeps microseconds); its whole table is in the ``*.operators.md`` file beside its trace. Both
keys are absent from reports written before they were kept.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import msgspec

from lightning_perf.budget import ProfilingCost
from lightning_perf.diagnose.model import Finding
from lightning_perf.layout import REPORT_SCHEMA_VERSION, write_atomically
from lightning_perf.records import (
    CollectiveStats,
    CompileStats,
    EpochSummary,
    GraphBreak,
    OperatorStat,
    RankSummary,
    Recompile,
    StepSplit,
    TraceSummary,
    WindowRecord,
    from_values,
    plain,
)
from lightning_perf.summarize.operators import default_sort_key, top_operators

if TYPE_CHECKING:  # (the page imports this module)
    from lightning_perf.report.html.document import Page

SCHEMA_VERSION = REPORT_SCHEMA_VERSION
REPORT_FILENAME = "perf_report.json"

# The report holds every epoch, so one rewrite costs more the longer the run (a 1,000-epoch run's report is
# about 1.4 MB: tens of ms to build and write). Between epoch ends it is rewritten only once the time since
# the last rewrite is at least 1/REWRITE_TIME_SHARE times what that rewrite cost: at most 0.25% of the run's
# wall time, however long the run. The HTML page has a budget of its own, alike (it takes longer: 20-300 ms), so
# the two together take at most 0.5%: the rewrites are a cost outside the windows, beside the profiling budget's
# 2%, and at 1% each they took about 1% of a fit of pytorch-forecasting's TFT (issue 26).
REWRITE_TIME_SHARE = 0.0025
# And at most this often, however cheap the rewrite: a small report costs 1-5 ms and its page 20-30 ms, so the
# shares alone let them be rewritten every few seconds. The report is for after the run (TensorBoard's scalars
# are the live view), and the first epoch end, the end of each Trainer call and an interruption always write it;
# a run of epochs longer than this still gets it at every epoch end. The page is first drawn this long after
# the report's first write (or at the call's end): 20-30 ms that a short run need not pay twice (issue 26).
REWRITE_MIN_SECONDS = 30.0
# A window's operators the report keeps (the HTML report's sortable table): the rows that hold nearly all of a
# step's time in the traces we have seen (the 50th operator of a ResNet or GPT window holds well under 1%).
OPERATOR_ROWS = 50


def keeps_step_split(epoch: int, has_window: bool) -> bool:
    """Whether a stage epoch's per-batch step split stays in the report once the stage's next epoch has ended:
    at its epochs 0, 1, 2, 4, 8, ... and at every epoch with a profiler window (``has_window``: the split has a
    profiled stretch, which a FLOP-counted batch also makes, at most 4 times a run); the latest epoch's is kept
    until then."""
    return has_window or epoch & (epoch - 1) == 0


def keep_step_split(splits: dict[tuple[str, int], StepSplit], stage: str, epoch: int, split: StepSplit) -> None:
    """Keeps a stage epoch's ``split`` in ``splits`` and drops the stage's earlier ones the report does not keep for
    good (:func:`keeps_step_split`: a batch the profiler ran on marks an epoch with a window)."""
    for (s, e), kept in list(splits.items()):
        if s == stage and e != epoch and not keeps_step_split(e, bool(kept.profiled)):
            del splits[(s, e)]
    splits[(stage, epoch)] = split


def report_dict(
    *,
    generated_by: str,
    run: Mapping[str, Any],
    epochs: Iterable[EpochSummary],
    windows: Iterable[WindowRecord],
    findings: Mapping[tuple[str, int], Sequence[Finding]] | None = None,
    ranks: Mapping[tuple[str, int], Sequence[RankSummary]] | None = None,
    compile: Mapping[tuple[str, int], CompileStats] | None = None,
    steps: Mapping[tuple[str, int], StepSplit] | None = None,
) -> dict[str, Any]:
    """The report as plain JSON-ready data; ``findings``, ``ranks`` (the per-rank table of a distributed run),
    ``compile`` (what ``torch.compile`` did) and ``steps`` (the per-batch step split) by ``(stage, epoch)``. An
    epoch without compile stats or step split gets no ``compile`` or ``steps`` key."""
    findings, ranks, compile, steps = findings or {}, ranks or {}, compile or {}, steps or {}
    stages: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for summary in epochs:
        key = (summary.stage, summary.epoch)
        entry = plain(summary)
        entry["findings"] = [plain(f) for f in findings.get(key, ())]
        entry["ranks"] = [plain(r) for r in ranks.get(key, ())]
        stats = compile.get(key)
        if stats is not None:
            entry["compile"] = compile_dict(stats)
        split = steps.get(key)
        if split is not None:
            entry["steps"] = steps_dict(split)
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


def steps_dict(split: StepSplit) -> dict[str, Any]:
    """An epoch's step split as plain data, as the report's ``steps`` holds it."""
    return {
        "data_wait": list(split.data_wait),
        "compute": list(split.compute),
        "per_bar": split.per_bar,
        "profiled": [list(stretch) for stretch in split.profiled],
        "compiled": list(split.compiled),
    }


def steps_record(values: Mapping[str, Any]) -> StepSplit:
    """:class:`~lightning_perf.records.StepSplit` from a report's ``steps`` (as ``readers.load_report`` checked
    it): the inverse of :func:`steps_dict`."""
    return StepSplit(
        data_wait=tuple(values["data_wait"]),
        compute=tuple(values["compute"]),
        per_bar=values.get("per_bar", 1),
        profiled=tuple((first, last) for first, last in values.get("profiled", ())),
        compiled=tuple(values.get("compiled", ())),
    )


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
        steps: Its per-batch step split; ``None`` where the report does not keep it.
    """

    summary: EpochSummary
    findings: tuple[Finding, ...] = ()
    ranks: tuple[RankSummary, ...] = ()
    compile: CompileStats | None = None
    steps: StepSplit | None = None


def report_epochs(report: Mapping[str, Any]) -> list[ReportEpoch]:
    """The epochs of a report (as :func:`report_dict` writes it, checked by ``readers.load_report``), each with
    its findings, per-rank table and compile stats: the inverse of :func:`report_dict`'s ``stages``."""
    return [
        ReportEpoch(
            summary=from_values(EpochSummary, entry),
            findings=tuple(from_values(Finding, f) for f in entry.get("findings", [])),
            ranks=tuple(from_values(RankSummary, r) for r in entry.get("ranks", [])),
            compile=compile_record(entry["compile"]) if entry.get("compile") is not None else None,
            steps=steps_record(entry["steps"]) if entry.get("steps") is not None else None,
        )
        for stage in report.get("stages", {}).values()
        for entry in stage.get("epochs", [])
    ]


def report_top_modules(run: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``(module, share of the forward's FLOPs)`` from a report's ``run`` (its ``flops``), largest first: each
    module of ``by_module`` over ``forward``, the forward FLOPs of the batch they were counted on (reports
    without ``forward``: over that batch's FLOPs, the first of ``counted``). Empty where the report holds no counted
    batch; entries of another shape are left out (``run.flops`` is not part of the schema
    ``readers.load_report`` checks)."""
    counts = run.get("flops")
    if not isinstance(counts, Mapping):
        return []
    counted, by_module = counts.get("counted"), counts.get("by_module")
    if not isinstance(counted, list) or not counted or not isinstance(counted[0], Mapping):
        return []
    total = counts.get("forward") if _is_number(counts.get("forward")) else counted[0].get("flops")
    if not isinstance(by_module, list) or not _is_number(total) or total <= 0:
        return []
    return sorted(((name, flops / total) for name, flops in _named_numbers(by_module)), key=lambda m: -m[1])


def report_uncounted_ops(run: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``(op, calls in a counted batch)`` from a report's ``run.flops.uncounted``: the ops doing matrix work that
    the FLOP count left out (no formula in torch); empty where there were none or the entries are of another
    shape."""
    counts = run.get("flops")
    entries = counts.get("uncounted") if isinstance(counts, Mapping) else None
    return [(op, int(calls)) for op, calls in _named_numbers(entries)]


def report_profiling(run: Mapping[str, Any]) -> ProfilingCost | None:
    """:class:`~lightning_perf.budget.ProfilingCost` from a report's ``run.profiling``; ``None`` where the report
    has none (written before it was) or of another shape (``run.profiling`` is not part of the checked schema)."""
    values = run.get("profiling")
    if not isinstance(values, Mapping):
        return None
    numbers = [values.get(name) for name in ("seconds", "run_seconds", "windows", "skipped")]
    budget = values.get("budget")
    if not all(_is_number(n) for n in numbers) or not (budget is None or _is_number(budget)):
        return None
    seconds, run_seconds, windows, skipped = numbers
    held = values.get("flops_held") is True  # absent from reports written before the FLOP count was budgeted
    return ProfilingCost(budget, float(seconds), float(run_seconds), int(windows), int(skipped), held)  # type: ignore[arg-type]


def _named_numbers(entries: Any) -> list[tuple[str, float]]:
    """The ``[name, number]`` pairs of a report's list (``run.flops.by_module``, ``run.flops.uncounted``); entries of
    another shape, or a value that is no list, give nothing (``run.flops`` is not part of the checked schema)."""
    if not isinstance(entries, list):
        return []
    return [
        (entry[0], entry[1])
        for entry in entries
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str) and _is_number(entry[1])
    ]


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def window_dict(window: WindowRecord, *, with_analysis: bool = True) -> dict[str, Any]:
    """A window as plain data: its record, and unless ``with_analysis`` is false its trace summary and its top
    :data:`OPERATOR_ROWS` operators (all of them are in the ``*.operators.md`` file beside the trace)."""
    entry = {f.name: getattr(window, f.name) for f in dataclasses.fields(window) if f.name not in WINDOW_ANALYSIS}
    if with_analysis:
        entry["summary"] = None if window.summary is None else plain(window.summary)
        entry["collectives"] = [plain(c) for c in window.collectives]
        top = top_operators(window.operators, sort_by=default_sort_key(window.device), row_limit=OPERATOR_ROWS)
        entry["operators"] = [_scaled(plain(op), 1e-6) for op in top]  # the record's microseconds, as seconds
    return entry


_OPERATOR_TIMES = ("self_cpu_time", "cpu_time", "self_device_time", "device_time")
#: A window's fields that hold what its trace shows (written unless ``with_analysis`` is false).
WINDOW_ANALYSIS = ("operators", "summary", "collectives")


def _scaled(values: dict[str, Any], factor: float) -> dict[str, Any]:
    """An operator's values with its times multiplied by ``factor`` (``None`` kept)."""
    return {k: v * factor if k in _OPERATOR_TIMES and v is not None else v for k, v in values.items()}


def window_record(values: Mapping[str, Any]) -> WindowRecord:
    """:class:`~lightning_perf.records.WindowRecord` from a report's window (as ``readers.load_report`` checked
    it), with its summary and the operators the report kept: the inverse of :func:`window_dict`."""
    summary = values.get("summary")
    return from_values(
        WindowRecord,
        {
            **values,
            "summary": None if summary is None else from_values(TraceSummary, summary),
            "operators": tuple(from_values(OperatorStat, _scaled(op, 1e6)) for op in values.get("operators", ())),
            "collectives": tuple(from_values(CollectiveStats, c) for c in values.get("collectives", ())),
        },
    )


class ReportFile:
    """``perf_report.json``, and the HTML page that shows it, each rewritten on a time budget of its own
    (:data:`REWRITE_TIME_SHARE`, and at most every ``min_interval`` seconds): a page that takes longer to write
    than the report is written less often, and the report stays as fresh as without it.

    Args:
        path: Where the report goes.
        clock: Seconds, monotonic.
        min_interval: The fewest seconds between two rewrites of a file by :meth:`update` (:meth:`write` is not
            held back).
        page: Where the page goes and what draws it from the report's data
            (:func:`lightning_perf.report.html.run_page`; a drawing of ``None``: no page for this data);
            ``None``: no page. :meth:`update` first draws it ``min_interval`` seconds after this report file is
            made (:meth:`write`, at once).

    Example::

        report = ReportFile("perf/perf_report.json", page=("perf/report.html", run_page))
        report.update(lambda: build_report())  # at an epoch end: each file written only if its budget allows
                                               # (the first: the report; the page from min_interval on)
        report.write(build_report())  # at the end of the run: both, always
    """

    def __init__(
        self,
        path: str,
        clock: Callable[[], float] = time.perf_counter,
        *,
        min_interval: float = 0.0,
        page: tuple[str, Callable[[Mapping[str, Any]], Page | None]] | None = None,
    ) -> None:
        self.path = path
        self.min_interval = min_interval
        self.page_path = None if page is None else page[0]
        self._draw = None if page is None else page[1]
        self._clock = clock
        #: How many times the report has been written (not the page): a caller tells what the file on disk holds.
        self.writes = 0
        # When each file may be rewritten next: the first update writes the report; the page waits
        # ``min_interval`` from now (:data:`REWRITE_MIN_SECONDS`: a short run gets it at its end, and
        # ``lightning-perf report DIR --html`` draws it from any report).
        self._next_due = {"report": -float("inf")}
        if page is not None:
            self._next_due["page"] = clock() + min_interval

    def update(self, build: Callable[[], Mapping[str, Any]]) -> bool:
        """Rewrites the report and the page with ``build()``, each if its budget allows it now (``build`` is not
        called when neither does); returns whether either was written."""
        now = self._clock()
        due = [part for part, next_due in self._next_due.items() if now >= next_due]
        if due:
            self._write(build(), due, now)
        return bool(due)

    def write(self, data: Mapping[str, Any]) -> None:
        """Rewrites both now; the next :meth:`update` of each waits in proportion to what it cost."""
        self._write(data, list(self._next_due), self._clock())

    def _write(self, data: Mapping[str, Any], parts: Sequence[str], start: float) -> None:
        for part in parts:  # the report first: a page that fails to draw leaves the report written
            if part == "report":
                write_json_atomically(data, self.path)
                self.writes += 1
            elif self._draw is not None and self.page_path is not None and (page := self._draw(data)) is not None:
                page.write(self.page_path)
            end = self._clock()
            self._next_due[part] = end + max((end - start) / REWRITE_TIME_SHARE, self.min_interval)
            start = end


def write_json_atomically(data: Mapping[str, Any], path: str) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename: readers see the old or the new file.
    Indented by one space, as ``json.dumps(data, indent=1)``, but by msgspec, as the traces are: 0.13 ms for a
    4-epoch report of 72 kB where ``json``'s encoder, pure Python once it indents, takes 2.4 ms (a 1,000-epoch
    report is 1.4 MB). A value JSON cannot hold (NaN, infinity) is written ``null``: the report stays readable."""
    write_atomically(msgspec.json.format(msgspec.json.encode(data, enc_hook=builtin_value), indent=1), path)


def builtin_value(value: Any) -> Any:
    """A subclass of ``str``, ``int`` or ``float`` (``torch.__version__``, numpy's ``float64``) as the builtin, as
    ``json`` writes it; any other type msgspec cannot encode fails, as in ``json``."""
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    raise TypeError(f"JSON cannot hold a {type(value).__name__}: {value!r}")
