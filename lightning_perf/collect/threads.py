"""
Training's threads while a window is processed
==============================================

torch runs a CPU operator on ``torch.get_num_threads()`` threads (OpenMP; by default one per CPU), and each
parallel operator ends when its slowest thread does. While the window process works, it holds one of those
CPUs, so one of training's threads keeps losing its CPU and every parallel operator waits for it. Measured on
this project's 2-CPU machine (torch 2.13, ``benchmarks/threads_beside.py``: a median training step of
``benchmarks/forecaster.py``): 24-34 ms alone with 2 threads, 67 ms with 2 threads beside one busy process,
26-28 ms with 1 thread beside it.

:class:`TrainingThreads` lowers training's thread count by one while a closed window is processed, where
training's threads take every CPU the process may run on, and puts the count back once the window is done.
Both calls belong on the training thread: OpenMP keeps the count per calling thread.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform says, else all of them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on this platform
        return os.cpu_count() or 1


class TrainingThreads:
    """Leaves one CPU to the window process while it works (see the module docstring).

    Left alone: a count below 2, a count below the usable CPUs (a CPU is free already), and runs with
    ``torch.use_deterministic_algorithms(True)`` (Lightning's ``deterministic=True``): a parallel reduction may
    split its work by the thread count, so its last bits could differ from a run without the callback.
    A copy (pickled, deep-copied) has lowered nothing.

    Example::

        threads = TrainingThreads()
        threads.lower()  # a window closed: its processing starts
        ...
        threads.restore()  # it is done
    """

    def __init__(self) -> None:
        self._lowered: tuple[int, int] | None = None  # (the count before, the count set here)

    @property
    def lowered(self) -> bool:
        """The count is lowered now (until :meth:`restore`)."""
        return self._lowered is not None

    def lower(self) -> None:
        """Lowers the count by one, where it applies and it is not lowered already."""
        if self._lowered is not None:
            return
        before = torch.get_num_threads()
        if before < 2 or before < usable_cpus() or torch.are_deterministic_algorithms_enabled():
            return
        torch.set_num_threads(before - 1)
        self._lowered = (before, before - 1)

    def restore(self) -> None:
        """Puts back the count :meth:`lower` found, unless someone set another count meanwhile (theirs stays)."""
        if self._lowered is None:
            return
        before, ours = self._lowered
        self._lowered = None
        if torch.get_num_threads() == ours:
            torch.set_num_threads(before)

    def __getstate__(self) -> dict[str, Any]:
        return {"_lowered": None}
