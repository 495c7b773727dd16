"""
``torch.cuda.empty_cache`` calls
================================

A run that calls ``torch.cuda.empty_cache()`` every step hands the caching allocator's cache back to the driver
each time, so the next step pays ``cudaMalloc`` again, and the reserved figures no longer show fragmentation.
:class:`EmptyCacheCounter` counts the calls: ``torch.cuda.empty_cache`` is replaced while the callback runs by
:func:`counted_empty_cache` (a module-level counter and the original call, nothing else) and put back at the end
of the Trainer call. The counter is this module's, so a callback pickled or copied mid-run (libraries do) holds
plain numbers only, and any copy can put the original back. Code that imported the function itself
(``from torch.cuda import empty_cache``) before is not seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_original: Callable[[], Any] | None = None  # torch's own, while ours is installed
_calls = 0


def counted_empty_cache() -> Any:
    """``torch.cuda.empty_cache``, counted."""
    global _calls
    _calls += 1
    return (_original or _torch_empty_cache)()


def _torch_empty_cache() -> Any:
    return torch.cuda.memory.empty_cache()


class EmptyCacheCounter:
    """Counts ``torch.cuda.empty_cache()`` calls from :meth:`reset` on, while installed."""

    def __init__(self) -> None:
        self._from = _calls

    @property
    def calls(self) -> int:
        return _calls - self._from

    def reset(self) -> None:
        self._from = _calls

    def install(self) -> None:
        """Puts :func:`counted_empty_cache` in place of ``torch.cuda.empty_cache`` (once). What it calls is what
        was there at the first install in the process: a wrapper that another tool put over ours since (ours
        stays theirs at :meth:`uninstall`) calls ours, and ours calling it back would never end."""
        global _original
        if torch.cuda.empty_cache is not counted_empty_cache:
            if _original is None:
                _original = torch.cuda.empty_cache
            torch.cuda.empty_cache = counted_empty_cache

    def uninstall(self) -> None:
        """Puts the original back, unless something replaced ours since (then it stays theirs)."""
        global _original
        if torch.cuda.empty_cache is counted_empty_cache and _original is not None:
            torch.cuda.empty_cache = _original
            _original = None
