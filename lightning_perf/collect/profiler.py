"""
Profiler windows
================

The only code that touches :mod:`torch.profiler`. A :class:`ProfilerWindow` is one short profiler
session: created when a window's warm-up starts, discarded once torch has exported its trace. Between
windows nothing of the profiler exists, so the training loop runs exactly as it would without us.
:func:`lightning_perf.traces.finish_trace` turns that export into the window's trace file, off the training
process (see :mod:`lightning_perf.hooks.window_close`).

Step spans: ``torch.profiler.profile.step()`` would mark steps, but it marks every step of the session's
life, including warm-up, and it cannot leave out a validation run that Lightning starts in the middle of a
training epoch. So a window writes its own ``ProfilerStep#N`` spans (``N`` = the batch index in the epoch,
the name torch and the TensorBoard plugin use), one per recorded batch, opened and closed at batch
boundaries chosen by the callback.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch
from torch.profiler import ProfilerActivity, _ExperimentalConfig, record_function

from lightning_perf import traces
from lightning_perf.collect.cpu import RunQueue
from lightning_perf.collect.window import WindowState

# Toggling only some activity kinds makes torch print a warning on every toggle; toggling all the kinds it
# knows is silent, and kinds the session does not collect are ignored.
_ALL_ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.CUDA, ProfilerActivity.XPU]


def _trace_only(with_stack: bool) -> Any:
    """torch's ``_ExperimentalConfig(trace_only=True)``, or ``None`` where it does not apply: the session's stop
    then skips the post-processing that only ``profile.events()`` and ``key_averages()`` read (neither is used
    here: the trace is read back from torch's export), a fifth of the stop on a forecaster's 32,000-event window
    (64 -> 50 ms, torch 2.13), with the same export. Stacks need that post-processing (torch turns ``trace_only``
    off with ``with_stack=True``, and warns), and torch releases without the field have none to skip."""
    if with_stack:
        return None
    try:
        return _ExperimentalConfig(trace_only=True)
    except TypeError:  # no such field in this torch
        return None


def torch_profiler_active() -> bool:
    """Whether a torch (autograd/Kineto) profiler is running in this process."""
    return bool(torch.autograd._profiler_enabled())


class ProfilerWindow:
    """One profiler session that records a few consecutive batches of one stage.

    Args:
        use_cuda: Also record CUDA kernels, copies and runtime calls.
        record_shapes, profile_memory, with_stack, with_flops: Passed to ``torch.profiler.profile``.
        metadata: Written into the trace under the top-level key ``lightning_perf``.

    Lifecycle (each call is legal only in the states named)::

        CREATED --warm_up--> WARMING_UP --start--> RECORDING <--pause/resume--> PAUSED
        CREATED --start--> RECORDING;   RECORDING/PAUSED/WARMING_UP --stop--> STOPPED
    """

    def __init__(
        self,
        *,
        use_cuda: bool,
        record_shapes: bool,
        profile_memory: bool,
        with_stack: bool,
        with_flops: bool,
        metadata: dict[str, Any],
    ) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
        self.use_cuda = use_cuda
        self._profiler = torch.profiler.profile(
            activities=activities,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            experimental_config=_trace_only(with_stack),
        )
        self._metadata = dict(metadata)
        self.state = WindowState.CREATED
        self._span: Any = None
        self._span_batch: int | None = None
        self.ran: set[int] = set()  # batches that really ran while the window recorded
        self._run_queue = RunQueue()
        self._queued_at: float | None = None
        #: Seconds the training thread waited for a CPU inside the recorded steps' spans (a busy machine): the
        #: same time as the trace's steps, not the profiler's start and stop; ``None`` where not measured (not
        #: Linux, or no step was recorded).
        self.cpu_waited: float | None = None

    @property
    def recorded(self) -> list[int]:
        """Batches recorded so far, in order."""
        return sorted(self.ran)

    def _expect(self, *states: WindowState) -> None:
        if self.state not in states:
            raise RuntimeError(f"ProfilerWindow is {self.state.value}; expected {[s.value for s in states]}")

    def warm_up(self) -> None:
        self._expect(WindowState.CREATED)
        self._profiler.prepare_trace()
        self.state = WindowState.WARMING_UP

    def start(self) -> None:
        self._expect(WindowState.CREATED, WindowState.WARMING_UP)
        if self.state is WindowState.CREATED:
            self._profiler.prepare_trace()
        self._profiler.start_trace()
        self.state = WindowState.RECORDING

    def begin_step(self, batch: int) -> None:
        """Opens the span of batch ``batch``: everything until :meth:`end_step` belongs to it."""
        self._expect(WindowState.RECORDING)
        self._close_span()
        self._span = record_function(traces.PROFILER_STEP_PREFIX + str(batch))
        self._span.__enter__()
        self._span_batch = batch
        self._queued_at = self._run_queue()

    def mark_ran(self, batch: int) -> None:
        """Notes that ``batch`` started inside its span (a span opened for a batch that never comes is dropped)."""
        if self._span_batch == batch:
            self.ran.add(batch)

    def end_step(self) -> None:
        self._close_span()

    def pause(self) -> None:
        """Stops collecting until :meth:`resume`: what runs in between leaves no trace in this window."""
        self._expect(WindowState.RECORDING)
        if self.use_cuda:
            # Kernels the recorded batch queued must finish while collection is still on.
            torch.cuda.synchronize()
        batch = self._span_batch
        self._close_span()
        self._span_batch = batch
        self._profiler.toggle_collection_dynamic(False, _ALL_ACTIVITIES)
        self.state = WindowState.PAUSED

    def resume(self) -> None:
        self._expect(WindowState.PAUSED)
        self._profiler.toggle_collection_dynamic(True, _ALL_ACTIVITIES)
        self.state = WindowState.RECORDING
        if self._span_batch is not None:
            # The same step again: its first, empty span is dropped when the trace is written.
            self.begin_step(self._span_batch)

    def note(self, key: str, values: dict[str, Any]) -> None:
        """Adds ``values`` to the metadata written under ``key`` when the window stops."""
        self._metadata[key] = {**self._metadata.get(key, {}), **values}

    def stop(self) -> None:
        """Ends the session; the trace can then be exported with :meth:`export`."""
        self._expect(WindowState.WARMING_UP, WindowState.RECORDING, WindowState.PAUSED)
        if self.state is WindowState.PAUSED:
            self._profiler.toggle_collection_dynamic(True, _ALL_ACTIVITIES)
        self._close_span()
        if self.state is not WindowState.WARMING_UP:
            for key, value in self._metadata.items():
                self._profiler.add_metadata_json(key, json.dumps(value))
        self._profiler.stop_trace()
        self._run_queue.close()
        self.state = WindowState.STOPPED

    def export(self) -> str:
        """Exports the trace of a stopped window with torch's own exporter, to a new temporary file outside
        the window directory (where a leftover would look like one more trace to the tools that read it);
        returns its path. The caller removes it (:func:`lightning_perf.traces.finish_trace` does).

        This part of a window's close stays on the training thread: torch's C++ exporter holds the GIL
        throughout (measured with torch 2.13), so a background thread would gain little, and this way it is
        done before the next window's profiler session starts (torch does not say whether exporting one
        session while another records is safe).
        """
        self._expect(WindowState.STOPPED)
        fd, raw = tempfile.mkstemp(prefix="lightning_perf-", suffix=".json")
        os.close(fd)
        try:
            self._profiler.export_chrome_trace(raw)
        except BaseException:
            os.remove(raw)
            raise
        return raw

    def _close_span(self) -> None:
        if self._span is not None:
            self._add_cpu_use()
            self._span.__exit__(None, None, None)
            self._span = None
            self._span_batch = None

    def _add_cpu_use(self) -> None:
        """Adds the span's wait for a CPU to :attr:`cpu_waited`."""
        queued = self._run_queue()
        if queued is not None and self._queued_at is not None:
            self.cpu_waited = (self.cpu_waited or 0.0) + max(queued - self._queued_at, 0.0)
        self._queued_at = None
