"""
DataLoader start-up before the epoch-start hook
===============================================

Lightning creates a stage's DataLoader iterator before it calls the stage's epoch-start hook in two places:
the fit loop's ``setup_data`` (a fit's first epoch: it also requests ``train_dataloader()``) and every
evaluation loop's ``reset`` (every validation, test and predict run). Creating the iterator starts the
worker processes, and for a dataset without a length Lightning fetches the first batch there too. Later
training epochs do it after ``on_train_epoch_start``, inside the first batch's data wait. So that every
epoch's first batch is measured alike, :class:`LoopStartTimer` times those two methods, per stage, by
wrapping them on the trainer's own loop objects for the duration of a run (no per-batch cost: Lightning
calls them once per epoch or run).

The wrappers call the loop's own method and return or raise exactly what it does. Where a loop or its
method is missing (another Lightning version), that stage is not timed and its first batch is measured
from the epoch-start hook, as before.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

# (path of the loop object from the trainer, its method that creates the iterator, the stage it serves)
LOOP_METHODS: tuple[tuple[str, str, str], ...] = (
    ("fit_loop", "setup_data", "train"),
    ("fit_loop.epoch_loop.val_loop", "reset", "validate"),
    ("validate_loop", "reset", "validate"),
    ("test_loop", "reset", "test"),
    ("predict_loop", "reset", "predict"),
)


class LoopStartTimer:
    """Seconds Lightning spent in its loops' iterator creation, per stage, since last taken.

    Args:
        clock: Wall seconds, monotonic.

    Example::

        timer = LoopStartTimer()
        timer.install(trainer)      # at setup
        waited = timer.take("train")   # at the epoch-start hook
        timer.uninstall()           # at teardown
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._seconds: dict[str, float] = {}
        self._installed: list[tuple[Any, str, Callable[..., Any]]] = []

    def install(self, trainer: Any) -> None:
        """Wraps the loops' methods on ``trainer`` (again after :meth:`uninstall`; once per loop object)."""
        self.uninstall()
        for path, method, stage in LOOP_METHODS:
            loop = _find(trainer, path)
            original = getattr(loop, method, None) if loop is not None else None
            if original is None or any(loop is done for done, _, _ in self._installed):
                continue
            setattr(loop, method, self._timed(original, stage))
            self._installed.append((loop, method, original))

    def uninstall(self) -> None:
        """Puts the loops' own methods back."""
        for loop, method, _ in self._installed:
            if method in vars(loop):  # our wrapper, an instance attribute over the class's method
                delattr(loop, method)
        self._installed = []

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a library pickles or deep-copies the callback during a run) holds none of the trainer's loops:
        # the wrappers installed are the original's, and the copy installs its own at its setup.
        return {**self.__dict__, "_installed": []}

    def take(self, stage: str) -> float:
        """The seconds spent for ``stage`` since the last call, and forgets them."""
        return self._seconds.pop(stage, 0.0)

    def _timed(self, original: Callable[..., Any], stage: str) -> Callable[..., Any]:
        clock, seconds = self._clock, self._seconds

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[stage] = seconds.get(stage, 0.0) + clock() - start

        return timed


def _find(root: Any, path: str) -> Any:
    obj = root
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj
