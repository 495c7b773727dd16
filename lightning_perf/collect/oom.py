"""
Out-of-memory errors
====================

What an out-of-memory error tells, read when it reaches the callback (``on_exception``), at no cost before:

- :func:`is_out_of_memory`: ``torch.OutOfMemoryError`` (CUDA's, and any raised by hand), or a ``RuntimeError``
  whose message says "out of memory" (CPU allocators, older CUDA builds, MPS), through its causes;
- :func:`failed_batch`: the batch the failing step was given, read from the exception's traceback (the step
  method's ``batch`` argument, else the innermost frame's ``batch``): nothing is kept per batch for it;
- :func:`message_sizes`: what CUDA's message says it tried to allocate and what was free.

Nothing here allocates device memory.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

import torch

from lightning_perf.collect.flops import shape_key

STEP_METHODS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)"
_REQUESTED = re.compile(rf"Tried to allocate {_SIZE}")
_FREE = re.compile(rf"of which {_SIZE} is free")
_CAUSES = 4  # how far down __cause__/__context__ an out-of-memory error is looked for


def is_out_of_memory(exception: BaseException) -> bool:
    """``exception`` is, or was caused by, an out-of-memory error."""
    seen: BaseException | None = exception
    for _ in range(_CAUSES):
        if seen is None:
            return False
        if isinstance(seen, torch.OutOfMemoryError):
            return True
        if isinstance(seen, RuntimeError) and "out of memory" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def failed_batch(exception: BaseException) -> Any | None:
    """The batch of the step that raised ``exception``: the ``batch`` argument of the innermost step method in
    its traceback, else the innermost ``batch`` local; ``None`` where there is none."""
    frames = [frame for frame, _ in traceback.walk_tb(exception.__traceback__)]
    for frame in reversed(frames):
        if frame.f_code.co_name in STEP_METHODS and "batch" in frame.f_locals:
            return frame.f_locals["batch"]
    for frame in reversed(frames):
        if "batch" in frame.f_locals:
            return frame.f_locals["batch"]
    return None


def batch_shapes(batch: Any) -> list[list[int]]:
    """The shapes of the tensors in ``batch``, depth-first (as the FLOP count keys batches)."""
    return [list(shape) for shape in shape_key(batch)] if batch is not None else []


def message_sizes(message: str) -> tuple[int | None, int | None]:
    """``(requested, free)`` in bytes, from CUDA's message ("Tried to allocate 2.00 GiB. GPU 0 has a total capacity
    of 79.15 GiB of which 1.03 GiB is free."); ``None`` for what it does not say."""

    def read(pattern: re.Pattern[str]) -> int | None:
        found = pattern.search(message)
        return int(float(found.group(1)) * _UNITS[found.group(2)]) if found else None

    return read(_REQUESTED), read(_FREE)
