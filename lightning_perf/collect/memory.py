"""
Memory readings
===============

Host and CUDA memory, read where it is cheap: the process's resident set from ``/proc`` (one small file
read), the CUDA caching allocator's own counters (host-side, no device synchronization). Every reader
returns ``None`` where its source does not exist (no ``/proc``, no CUDA), never raises.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from lightning_perf.collect.procfs import ProcFile

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_STATM = ProcFile("statm")


def host_rss() -> int | None:
    """The process's resident set size now, in bytes (Linux ``/proc/<pid>/statm``, kept open)."""
    data = _STATM()
    try:
        return int(data.split()[1]) * _PAGE_SIZE if data is not None else None
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True, kw_only=True)
class CudaMemory:
    """Peaks of the CUDA caching allocator since its last reset, and the device's size, in bytes."""

    max_allocated: int
    max_reserved: int
    capacity: int
    utilization: int | None  # % of the last sample period the device was busy (needs pynvml), or None


class NestedPeaks:
    """Peaks per period where periods can nest (an epoch and its windows) over one resettable counter.

    ``torch.cuda.reset_peak_memory_stats`` has one peak counter per device. Starting a period resets it, so
    every other open period first keeps the highest peak it has seen. Pure bookkeeping over the values it
    is given, so it is tested without a GPU.
    """

    def __init__(self) -> None:
        self._carried: dict[str, tuple[int, ...]] = {}

    def start(self, period: str, peak_before_reset: tuple[int, ...]) -> None:
        for name, carried in self._carried.items():
            self._carried[name] = tuple(map(max, carried, peak_before_reset))
        self._carried[period] = tuple(0 for _ in peak_before_reset)

    def read(self, period: str, peak_now: tuple[int, ...]) -> tuple[int, ...]:
        carried = self._carried.get(period)
        return peak_now if carried is None else tuple(map(max, carried, peak_now))

    def drop(self, period: str) -> None:
        """Forgets ``period`` (a stretch set apart: :meth:`CudaPeaks.apart`)."""
        self._carried.pop(period, None)


class CudaPeaks:
    """Allocated and reserved peaks of the CUDA caching allocator on one device, per (nested) period."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._peaks = NestedPeaks()

    def start(self, period: str) -> None:
        self._peaks.start(period, self._raw())
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self, period: str, *, utilization: bool = False) -> CudaMemory:
        """The period's peaks; with ``utilization``, also the device's recent busy share (an NVML query)."""
        max_allocated, max_reserved = self._peaks.read(period, self._raw())
        busy: int | None = None
        if utilization:
            try:
                busy = torch.cuda.utilization(self.device)
            except Exception:  # pynvml missing, or NVML unavailable: utilization is optional
                busy = None
        return CudaMemory(
            max_allocated=max_allocated,
            max_reserved=max_reserved,
            capacity=torch.cuda.get_device_properties(self.device).total_memory,
            utilization=busy,
        )

    @contextlib.contextmanager
    def apart(self, period: str = "trial") -> Iterator[None]:
        """A stretch of work no other period sees (an advice trial's, which resets the counter as it likes): each
        open period keeps its peak so far (:meth:`start`), and the counter is reset again after the stretch, so
        that the stretch's own peak reaches none of them."""
        self.start(period)
        try:
            yield
        finally:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._peaks.drop(period)

    def _raw(self) -> tuple[int, int]:
        return torch.cuda.max_memory_allocated(self.device), torch.cuda.max_memory_reserved(self.device)


def device_use(device: torch.device) -> tuple[int, int, int] | None:
    """The CUDA allocator's reserved bytes, the device's bytes in use (by every process and the driver) and its
    size, read together; ``None`` where they cannot be read."""
    try:
        free, total = torch.cuda.mem_get_info(device)
        return torch.cuda.memory_reserved(device), total - free, total
    except Exception:  # no CUDA, or the driver refused: these figures are optional
        return None


# Allocation events the CUDA allocator's history keeps (torch's own default): enough for the allocations alive at
# an out-of-memory error and the steps before it.
HISTORY_ENTRIES = 100_000


def record_history(enabled: bool) -> bool:
    """Starts (or stops) the CUDA allocator's history of allocations with their Python stacks
    (``torch.cuda.memory._record_memory_history``); whether it could."""
    try:
        if enabled:
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
        else:
            torch.cuda.memory._record_memory_history(enabled=None)
        return True
    except Exception:  # no CUDA, or a torch without it: the history is optional
        return False


def history_snapshot(path: str) -> dict[str, Any] | None:
    """Saves the allocator's snapshot (with its history) to ``path``, for pytorch.org/memory_viz, and returns it;
    ``None`` where it cannot be taken. Host memory only: nothing is allocated on the device."""
    try:
        snapshot = torch.cuda.memory._snapshot()
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
        return snapshot
    except Exception:
        return None
