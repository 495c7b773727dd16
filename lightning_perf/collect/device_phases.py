"""
Device phases
=============

On CUDA a training batch's phases (:mod:`lightning_perf.collect.phases`) as the device ran them: a CUDA event is
recorded on the current stream at the batch's start, at each of its marks and at its end, and the times between
them are read once the device has passed the batch's last event (``Event.query``), at a later batch's start: never
a synchronization. The host's clock reads say when each phase's kernels were queued; the events say how long the
device took for them.

Notes:
    1. A batch whose events the device has not passed yet is pending; at most :data:`MAX_PENDING` are, the oldest
       dropped past that (a host far ahead of the device), and an epoch's last batches may still be pending at its
       end: the epoch's phases are over the batches read.
    2. Events are reused once read (a pool), so a long run allocates a few dozen.
    3. A failure of the CUDA calls (a driver error) stops the device timeline for the run, said in
       :attr:`DeviceTimeline.broken`: the phases are then the host's, as on a CPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from lightning_perf.collect.phases import MAX_MARKS, split

MAX_PENDING = 16
"""The most batches whose events wait to be read (Notes 1)."""

_END = "end"


class DeviceTimeline:
    """CUDA events at each training batch's start, marks and end, read once the device has passed them.

    Args:
        event: Makes an event (``record()``, ``query()``, ``elapsed_time(other)`` in ms); default: a timing
            ``torch.cuda.Event``.

    Attributes:
        resolved: Per batch index of the epoch, its phases as the device ran them (seconds).
        broken: Why the timeline stopped (Notes 3); ``None`` while it works.
    """

    def __init__(self, event: Callable[[], Any] | None = None) -> None:
        self._event = event
        self._events: list[tuple[str | None, Any]] = []
        self._index = 0
        self._pending: deque[tuple[int, list[tuple[str | None, Any]]]] = deque()
        self._pool: list[Any] = []
        self.resolved: dict[int, tuple[float, float, float, float]] = {}
        self.broken: str | None = None

    def batch_start(self, index: int) -> None:
        """Batch ``index`` of the epoch starts: the batches the device has passed are read, and its first event is
        recorded."""
        self._guarded(self._start, index)

    def mark(self, name: str) -> None:
        if self._events and len(self._events) < MAX_MARKS:
            self._guarded(self._record, name)

    def batch_end(self) -> None:
        if self._events:
            self._guarded(self._end)

    def reset(self) -> None:
        """A new epoch: its batch indices start again (the last epoch's pending batches are forgotten)."""
        self.resolved = {}
        self._pending.clear()
        self._events = []

    def read(self) -> dict[int, tuple[float, float, float, float]]:
        """The batches read so far (those the device has passed since are read first)."""
        self._guarded(self._poll)
        return self.resolved

    def _start(self, index: int) -> None:
        self._poll()
        self._events, self._index = [], index
        self._record(None)

    def _record(self, name: str | None) -> None:
        if self._event is None:
            import torch  # here: the module imports without torch, like the phases it refines

            self._event = lambda: torch.cuda.Event(enable_timing=True)
        event = self._pool.pop() if self._pool else self._event()
        event.record()
        self._events.append((name, event))

    def _end(self) -> None:
        self._record(_END)
        self._pending.append((self._index, self._events))
        self._events = []
        if len(self._pending) > MAX_PENDING:
            self._pending.popleft()  # not pooled: the device has not passed its events

    def _poll(self) -> None:
        while self._pending and self._pending[0][1][-1][1].query():
            index, events = self._pending.popleft()
            start = events[0][1]
            marks = [(name or "", start.elapsed_time(event) / 1e3) for name, event in events[1:-1]]
            self.resolved[index] = split(0.0, marks, start.elapsed_time(events[-1][1]) / 1e3)
            self._pool.extend(event for _, event in events)

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a library pickles or deep-copies the callback during a run) holds no CUDA event of the original's.
        return {**self.__dict__, "_event": None, "_events": [], "_pending": deque(), "_pool": []}

    def _guarded(self, call: Any, *args: Any) -> None:
        if self.broken is not None:
            return
        try:
            call(*args)
        except Exception as err:  # Notes 3
            self.broken = f"{type(err).__name__}: {err}"
            self._events, self._pending = [], deque()
