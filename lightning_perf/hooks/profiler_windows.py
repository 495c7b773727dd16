"""
Profiler windows of a run
=========================

The real windows, outside the window controller: :class:`ProfilerWindows` makes the
:class:`~lightning_perf.collect.profiler.ProfilerWindow` the controller opens (its factory), and saves those it
closes through the per-window pipeline of :mod:`lightning_perf.hooks.window_close`: :func:`hand_over` on the training
thread, :func:`process_window` in the window process (:mod:`lightning_perf.hooks.window_process`), which a
:class:`WindowWorker`'s thread waits for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from lightning_perf.budget import ProfilingBudget
from lightning_perf.collect.memory import CudaPeaks
from lightning_perf.collect.profiler import ProfilerWindow, torch_profiler_active
from lightning_perf.collect.steps import StepClock
from lightning_perf.config import PerfConfig
from lightning_perf.hooks.error_policy import ErrorPolicy
from lightning_perf.hooks.rank_staging import RankStaging
from lightning_perf.hooks.window_close import ClosedWindow, WindowOptions, WindowWorker, hand_over
from lightning_perf.hooks.window_control import WindowToSave
from lightning_perf.hooks.window_process import WindowProcess
from lightning_perf.records import WindowRecord
from lightning_perf.report.outputs import Outputs
from lightning_perf.traces import METADATA_KEY

OPERATORS_TAG = "perf/operators/{stage}"


class ProfilerWindows:
    """Makes the windows the controller opens, and saves those it closes.

    Args:
        config: The callback's options (the profiler's, and the pipeline's).
        policy: Where the one-time warnings go (a window skipped for another profiler, a trace cut to
            ``max_trace_mb``, a trace torch exported as invalid JSON, repaired).
        staging: Where a trace written under its staged name waits for the other ranks.
        add: Takes each window's record, on the worker's thread, in the order the windows closed.
        budget: Charged each close's stall and each wait for the windows' processing.
        notes: What a closing window of a stage adds to its trace's ``lightning_perf`` metadata (the
            :func:`window_notes`).

    The callback calls :meth:`prepare` at setup, :meth:`join` before anything reads the records, and :meth:`end` at
    the end of each Trainer call, all on the training thread. Training's thread count is never touched: a step run
    on fewer threads gives other last bits (the window process yields its CPU instead, see
    :mod:`lightning_perf.hooks.window_process`).
    """

    def __init__(
        self,
        config: PerfConfig,
        policy: ErrorPolicy,
        staging: RankStaging,
        add: Callable[[WindowRecord], None],
        budget: ProfilingBudget,
        notes: Callable[[str], dict[str, Any]],
    ) -> None:
        self._config = config
        self._policy = policy
        self._staging = staging
        self._add = add
        self._notes = notes
        self._budget = budget
        self._options = WindowOptions.of(config)
        self._worker = WindowWorker()  # waits for the closed windows off the training thread, in order
        self._window_process = WindowProcess()  # writes and summarizes them, off the training process's GIL
        self._dirpath: str | None = None
        self._rank = 0
        self._staged = False
        self._large = False  # a window's trace was too large to process here: the next ones start the child early
        self._cuda_peaks: CudaPeaks | None = None
        self._outputs: Outputs | None = None

    def prepare(
        self, dirpath: str | None, outputs: Outputs | None, *, rank: int, world_size: int, cuda_peaks: CudaPeaks | None
    ) -> None:
        """Where the windows go (``dirpath``) and their operator tables also go (``outputs``), this process's
        rank among ``world_size`` (several ranks stage their traces), the CUDA peaks (``None``: no CUDA)."""
        self._dirpath, self._rank, self._staged = dirpath, rank, world_size > 1
        self._cuda_peaks, self._outputs = cuda_peaks, outputs

    def new_window(self, stage: str, epoch: int) -> ProfilerWindow | None:
        """The controller's window factory: a new window of ``stage``'s epoch ``epoch``; ``None`` (with a
        warning, once per stage) while another torch profiler runs."""
        if torch_profiler_active():
            self._policy.warn_once(
                f"busy:{stage}",
                f"PerfCallback: a {stage} window was skipped because another torch profiler is running.",
            )
            return None
        config = self._config
        return ProfilerWindow(
            use_cuda=self._cuda_peaks is not None,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
            with_flops=config.with_flops,
            metadata={METADATA_KEY: {"stage": stage, "epoch": epoch, "global_rank": self._rank}},
        )

    def save(self, to_save: WindowToSave | None) -> bool:
        """Stops the window and has torch export its trace, here (the training thread's stall is the record's
        ``close_seconds``); queues the rest for the worker. ``None``: nothing to save. Whether a window closed."""
        if to_save is None:
            return False
        started = time.perf_counter()
        if notes := self._notes(to_save.open.stage):
            to_save.open.window.note(METADATA_KEY, notes)
        if self._large:
            self._window_process.start()  # its start runs beside the export (see WindowProcess.start)
        cuda = self._cuda_peaks.read("window") if self._cuda_peaks is not None else None
        assert self._dirpath is not None
        closed = hand_over(
            to_save,
            dirpath=self._dirpath,
            rank=self._rank,
            staged=self._staged,
            device="cuda" if self._cuda_peaks is not None else "cpu",
            cuda=cuda,
            started=started,
        )
        here = self._window_process.small(closed.export_path)
        if not here:
            self._large = True
            self._window_process.start()
        self._budget.charge(closed.record.close_seconds)
        if self._staged:
            self._staging.stage(closed.written_path, closed.record.trace_path)
        self._worker.submit(self._process, closed, here)
        return True

    @property
    def busy(self) -> bool:
        """A saved window is still being written and summarized (by the window process, or its thread here)."""
        return self._worker.busy

    def join(self) -> float:
        """Waits until every window saved so far is written and added; a window the worker failed to write goes
        to the error policy here, on the caller's thread (:meth:`WindowWorker.join`). The seconds it waited (a
        cost of the windows', charged to the budget)."""
        if not self._worker.pending:
            return 0.0  # nothing saved since the last join: every epoch end of a run between windows
        busy, started = self._worker.busy, time.perf_counter()
        self._worker.join(on_error=self._failed)
        waited = time.perf_counter() - started if busy else 0.0
        self._budget.charge(waited)
        return waited

    def end(self) -> None:
        """A Trainer call ends: :meth:`join`, then the window process is let go (the next window starts another)."""
        try:
            self.join()
        finally:
            self._window_process.close()

    def _failed(self, err: Exception) -> None:
        self._policy.fail(None, err)

    def _process(self, closed: ClosedWindow, here: bool) -> None:
        """The worker's job, on its thread: the window's trace, operator table and record from the window process
        (or from this thread, where it cannot run), the table to TensorBoard, then the record to ``add`` (jobs run
        one at a time, in order, so the records stay in order)."""
        processed = self._window_process.process(closed, self._options, here=here)
        if self._window_process.broken is not None:
            self._policy.warn_once(
                "window-process",
                f"PerfCallback: {self._window_process.broken}; windows are processed on a thread of the training"
                " process instead (nothing is lost; the close costs training more).",
            )
        stage = closed.record.stage
        if processed.cut_to is not None:
            self._policy.warn_once(
                f"cut:{stage}",
                f"PerfCallback: a {stage} window's trace was larger than max_trace_mb={self._config.max_trace_mb:g};"
                f" it keeps its first {processed.cut_to} step(s). Record fewer batches (`schedule.active`), or"
                " raise `max_trace_mb`.",
            )
        if processed.repaired is not None:
            self._policy.warn_once(
                "repaired",
                f"PerfCallback: a {stage} window's trace, as torch exported it, was not valid JSON:"
                f" {processed.repaired} (torch's `export_chrome_trace` does not escape them). It was repaired and"
                " saved as valid JSON.",
            )
        if self._outputs is not None:
            self._outputs.add_text(OPERATORS_TAG.format(stage=stage), processed.table, processed.record.step)
        self._add(processed.record)


def window_notes(loader: Mapping[str, Any] | None, clock: StepClock) -> dict[str, Any]:
    """What a closing window's trace says beside its events, for ``lightning-perf analyze`` to judge it as the
    callback does: where the stage iterates no DataLoader (``loader``, the report's ``run.dataloaders.<stage>``;
    a DataLoader's spans would show its time), that iterable and the recorded batches' mean data wait
    (``data_wait``, seconds), which the trace holds as Python outside any operator. Else nothing."""
    if not loader or "iterable_class" not in loader:
        return {}
    wait = clock.window_data_wait()
    return {
        "iterable_class": loader["iterable_class"],
        "iterable_library": loader.get("iterable_library"),
        **({"data_wait": wait} if wait is not None else {}),
    }
