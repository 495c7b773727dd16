"""
Profiler window interface
=========================

What a profiler window is to the code that drives it: its states and its calls, without ``torch``.
:class:`~lightning_perf.collect.profiler.ProfilerWindow` is the real one; the window controller
(:mod:`lightning_perf.hooks.window_control`) drives any object of this shape, so its tests use a fake.
"""

from __future__ import annotations

import enum
from collections.abc import Set
from typing import Any, Protocol


class WindowState(enum.Enum):
    """Where a window is in its lifecycle (drawn in :class:`~lightning_perf.collect.profiler.ProfilerWindow`)."""

    CREATED = "created"
    WARMING_UP = "warming up"
    RECORDING = "recording"
    PAUSED = "paused"
    STOPPED = "stopped"


class Window(Protocol):
    """One profiler session that records a few consecutive batches of one stage."""

    state: WindowState
    #: Seconds the training thread waited for a CPU while the window recorded, once stopped (``None``: unknown).
    cpu_waited: float | None

    @property
    def ran(self) -> Set[int]:
        """The batches that really ran while the window recorded."""

    @property
    def recorded(self) -> list[int]:
        """The batches recorded so far, in order."""

    def warm_up(self) -> None:
        """CREATED -> WARMING_UP: the profiler starts, its events are not kept."""

    def start(self) -> None:
        """CREATED or WARMING_UP -> RECORDING."""

    def begin_step(self, batch: int) -> None:
        """Opens the step span of ``batch`` (RECORDING)."""

    def mark_ran(self, batch: int) -> None:
        """Notes that ``batch`` started inside its span."""

    def end_step(self) -> None:
        """Closes the open step span."""

    def pause(self) -> None:
        """RECORDING -> PAUSED: what runs meanwhile leaves no trace."""

    def resume(self) -> None:
        """PAUSED -> RECORDING, in the step span it paused in."""

    def note(self, key: str, values: dict[str, Any]) -> None:
        """Adds ``values`` to the trace's metadata under ``key``, written when the window stops."""

    def stop(self) -> None:
        """WARMING_UP, RECORDING or PAUSED -> STOPPED."""

    def export(self) -> str:
        """Exports a stopped window's trace to a temporary file; returns its path."""
