"""
Window close
============

What becomes of a profiler window once the window controller has closed it, and the worker that does most
of it off the training thread.

:func:`hand_over` is the training thread's part: it stops the window, has torch export its trace and
returns a :class:`ClosedWindow`. :func:`process_window` is the rest of the per-window
pipeline, one plain function of plain values (collect -> summarize -> report):

1. torch's export is read back and turned into the window's trace file
   (:func:`~lightning_perf.traces.finish_trace`: its recorded steps, its size limit, the
   TensorBoard rewrite, a gzipped atomic write; an export torch wrote as invalid JSON, repaired);
2. the trace is summarized: its operators (:func:`~lightning_perf.summarize.operators.operator_stats`) and
   the per-step summary the trace-level rules read (:func:`~lightning_perf.summarize.step_summary.summarize_trace`);
3. the operator table is written beside the trace (:mod:`lightning_perf.report`), and returned for
   TensorBoard's text, which the training process writes;
4. out comes the window's :class:`~lightning_perf.records.WindowRecord`.

:func:`process_window` runs in a child process (:class:`~lightning_perf.hooks.window_process.WindowProcess`):
its CPU work, most of a window's cost, holds that process's GIL, not the training process's. In the training
process, :class:`WindowWorker` runs each window's job on one background thread, one at a time and in the
order they came: the job hands the window to the child, waits for its record without the GIL, and adds the
record (and the table's TensorBoard text); where the child cannot run, the job processes the window itself,
as before (see docs/cost.md). This module imports neither torch nor Lightning, so that the child starts
fast.

The callback joins the worker before an epoch's diagnosis reads the windows, before a checkpoint stores them
and at the run's end, and lets the child go at each Trainer call's end; a job still queued when the
interpreter exits is run first (the executor's exit handler joins its thread, and the child, in a session of
its own, is out of reach of the terminal's Ctrl-C and waits for its pipe to close).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightning_perf import layout
from lightning_perf.collect.interrupts import interrupts_held
from lightning_perf.collect.window import WindowState
from lightning_perf.records import WindowRecord
from lightning_perf.report.markdown import operator_table
from lightning_perf.summarize.collectives import collective_stats
from lightning_perf.summarize.operators import default_sort_key, operator_stats, top_operators
from lightning_perf.summarize.step_summary import summarize_trace
from lightning_perf.traces import collector_paused, finish_trace

if TYPE_CHECKING:  # torch's, and the training side's: the window process imports this module and no more
    from lightning_perf.collect.memory import CudaMemory
    from lightning_perf.config import PerfConfig, SortKey
    from lightning_perf.hooks.window_control import WindowToSave


@dataclass(frozen=True, kw_only=True)
class ClosedWindow:
    """A stopped window as the training thread hands it over: plain values only.

    Attributes:
        record: The window's record, but for what its trace tells (``operators``, ``summary``).
        export_path: torch's own export of the trace (a temporary file, removed by :func:`process_window`).
        written_path: Where the trace goes: ``record.trace_path``, or a staged name under several ranks
            (renamed to ``record.trace_path`` once every rank has written its own).
        operators_path: Where the operator table goes (markdown).
        ran: The batches that ran while the window recorded: their ``ProfilerStep#N`` spans are kept.
    """

    record: WindowRecord
    export_path: str
    written_path: str
    operators_path: str
    ran: frozenset[int]


@dataclass(frozen=True, kw_only=True)
class WindowOptions:
    """The callback's options that :func:`process_window` reads: plain values, for the window process
    (a :class:`~lightning_perf.config.PerfConfig` may hold a ``batch_size_fn`` that does not pickle).

    Attributes:
        tensorboard_compat, record_shapes, sort_by, row_limit: As ``PerfConfig``'s.
        max_bytes: ``PerfConfig.max_trace_mb`` in bytes.
    """

    tensorboard_compat: bool
    max_bytes: int
    record_shapes: bool
    sort_by: SortKey | None
    row_limit: int

    @classmethod
    def of(cls, config: PerfConfig) -> WindowOptions:
        """The options of ``config``."""
        return cls(
            tensorboard_compat=config.tensorboard_compat,
            max_bytes=int(config.max_trace_mb * 2**20),
            record_shapes=config.record_shapes,
            sort_by=config.sort_by,
            row_limit=config.row_limit,
        )


@dataclass(frozen=True, kw_only=True)
class ProcessedWindow:
    """What :func:`process_window` made of a window.

    Attributes:
        record: The complete record.
        table: The operator table (markdown), as written to ``ClosedWindow.operators_path``.
        cut_to: The steps the trace keeps, when it was cut to ``max_trace_mb`` (else ``None``).
        repaired: What was repaired in torch's export, which was not valid JSON, in words (else ``None``).
    """

    record: WindowRecord
    table: str
    cut_to: int | None = None
    repaired: str | None = None


def hand_over(
    to_save: WindowToSave,
    *,
    dirpath: str,
    rank: int,
    staged: bool,
    device: str,
    cuda: CudaMemory | None,
    started: float,
) -> ClosedWindow:
    """The training thread's part of a window's close: stops the window, has torch export its trace, and
    hands over what :func:`process_window` needs.

    Args:
        to_save: The window, as :class:`~lightning_perf.hooks.window_control.WindowControl` closed it.
        dirpath: The output directory: the window's own directory goes in it (``layout.window_dirname``, or
            an unused variant when another run's trace of this rank is there).
        rank: This process's global rank (the trace's and the operator table's file names).
        staged: Write the trace under a name no trace reader picks up (several ranks: renamed once every
            rank has written its own).
        device: ``"cuda"`` when the window recorded CUDA, else ``"cpu"``.
        cuda: The CUDA caching allocator's peaks over the window (``None``: no CUDA).
        started: ``time.perf_counter()`` when the close started: the record's ``close_seconds`` runs from
            there to the end of the export (the training thread's stall).

    Raises:
        OSError: The window's directory cannot be made.
    """
    open_, recorded = to_save.open, to_save.recorded
    window = open_.window
    if window.state is not WindowState.STOPPED:
        window.stop()
    name = layout.window_dirname(open_.stage, open_.epoch, recorded[0], recorded[-1])
    window_dir = os.path.join(dirpath, name)
    if os.path.exists(os.path.join(window_dir, layout.trace_filename(rank))):
        window_dir = os.path.join(dirpath, layout.unused_name(dirpath, name))
    os.makedirs(window_dir, exist_ok=True)
    trace_path = os.path.join(window_dir, layout.trace_filename(rank))
    export_path = window.export()
    record = WindowRecord(
        stage=open_.stage,
        epoch=open_.epoch,
        first_batch=recorded[0],
        last_batch=recorded[-1],
        name=os.path.basename(window_dir),
        trace_path=trace_path,
        step=open_.step,
        device=device,
        shortened=to_save.shortened,
        cuda_max_allocated=cuda.max_allocated if cuda else None,
        cuda_max_reserved=cuda.max_reserved if cuda else None,
        close_seconds=time.perf_counter() - started,
        cpu_wait=window.cpu_waited,
    )
    return ClosedWindow(
        record=record,
        export_path=export_path,
        written_path=layout.staged_path(trace_path) if staged else trace_path,
        operators_path=os.path.join(window_dir, layout.operators_filename(rank)),
        ran=frozenset(window.ran),
    )


def process_window(closed: ClosedWindow, options: WindowOptions) -> ProcessedWindow:
    """Writes a closed window's trace and operator table, and returns its record and table (see the module
    docstring).

    Args:
        closed: The window, as the training thread handed it over.
        options: The callback's options that the pipeline reads.

    Notes:
        1. The cyclic garbage collector waits meanwhile: reading a trace back builds many small acyclic
           objects, over which it would run again and again for nothing (half the time on large traces).
           The pause is process-wide: in the window process nothing else waits; where a window is processed
           on the training process's thread instead, the training thread's cyclic garbage waits too, for the
           few tens of ms a job takes (jobs run one at a time, so pauses never overlap).
    """
    record = closed.record
    with collector_paused():
        finished = finish_trace(
            closed.export_path,
            closed.written_path,
            steps=closed.ran,
            tensorboard_compat=options.tensorboard_compat,
            max_bytes=options.max_bytes,
            shapes=options.record_shapes,
        )
        typed = finished.trace  # the trace as saved, as the analyses read it
        record = dataclasses.replace(
            record,
            operators=operator_stats(typed, group_by_input_shape=options.record_shapes),
            summary=summarize_trace(typed, window=record.name),
            collectives=collective_stats(typed),
        )
        cut_to, repaired = finished.cut_to, finished.repaired
        del typed, finished
    sort_by = options.sort_by or default_sort_key(record.device)
    table = operator_table(
        record, top_operators(record.operators, sort_by=sort_by, row_limit=options.row_limit), sort_by=sort_by
    )
    with open(closed.operators_path, "w", encoding="utf-8") as f:
        f.write(table)
    return ProcessedWindow(record=record, table=table, cut_to=cut_to, repaired=repaired)


class WindowWorker:
    """Runs jobs on a background thread, one at a time, in the order they were submitted.

    The thread starts with the first job after a :meth:`join` and ends at the next :meth:`join`, which waits
    for every job submitted so far and hands what each one raised to the caller's error policy, on the
    caller's thread: between a window's close and the epoch's end there is one more thread in the process,
    otherwise none. A copy (pickled for a spawned process, deep-copied) starts with no thread and no jobs.

    Example::

        worker = WindowWorker()
        worker.submit(print, "processed in the background")
        worker.join(on_error=lambda err: print("failed:", err))
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[Any]] = []

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet joined (finished or not)."""
        return len(self._pending)

    @property
    def busy(self) -> bool:
        """A job submitted is still running or queued."""
        return bool(self._pending) and any(not job.done() for job in self._pending)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Queues ``fn(*args, **kwargs)`` after the jobs already submitted."""
        with interrupts_held():  # the first submit starts the thread (lightning_perf.collect.interrupts)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning_perf-windows")
            self._pending.append(self._executor.submit(fn, *args, **kwargs))

    def join(self, on_error: Callable[[Exception], None]) -> None:
        """Waits for every job submitted so far and lets the thread go; then calls ``on_error`` with each
        exception a job raised, in the order of the jobs. ``on_error`` may raise (the jobs after it are then not
        reported). A ``KeyboardInterrupt`` while waiting leaves the jobs to the next join."""
        if self._executor is None:
            return
        wait(self._pending)
        done, self._pending = self._pending, []
        self._executor.shutdown(wait=True)
        self._executor = None
        for future in done:
            err = future.exception()
            if isinstance(err, Exception):
                on_error(err)
            elif err is not None:  # SystemExit and the like: not ours to swallow
                raise err

    def __getstate__(self) -> dict[str, Any]:
        return {"_executor": None, "_pending": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
