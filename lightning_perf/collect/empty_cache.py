"""
``torch.cuda.empty_cache`` calls
================================

A run that calls ``torch.cuda.empty_cache()`` every step hands the caching allocator's cache back to the driver
each time, so the next step pays ``cudaMalloc`` again, and the reserved figures no longer show fragmentation.
:class:`EmptyCacheCounter` counts the calls: ``torch.cuda.empty_cache`` is wrapped while the callback runs (a
counter and the original call, nothing else) and put back at the end of the Trainer call. Code that imported the
function itself (``from torch.cuda import empty_cache``) before is not seen.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


class EmptyCacheCounter:
    """Counts ``torch.cuda.empty_cache()`` calls while installed."""

    def __init__(self) -> None:
        self.calls = 0
        self._original: Callable[[], Any] | None = None
        self._wrapper: Callable[[], Any] | None = None

    def install(self) -> None:
        """Wraps ``torch.cuda.empty_cache`` (once; again after :meth:`uninstall`)."""
        if self._original is not None:
            return
        original = torch.cuda.empty_cache

        @functools.wraps(original)
        def counted() -> Any:
            self.calls += 1
            return original()

        self._original, self._wrapper = original, counted
        torch.cuda.empty_cache = counted

    def uninstall(self) -> None:
        """Puts the original back, unless something replaced our wrapper since (then it stays theirs)."""
        if self._original is not None and torch.cuda.empty_cache is self._wrapper:
            torch.cuda.empty_cache = self._original
        self._original = self._wrapper = None
