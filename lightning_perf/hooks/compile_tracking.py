"""
Compile tracking
================

Where the run is when ``torch.compile`` compiles (the stage epoch and its batch), for the
:class:`~lightning_perf.collect.compile.CompileWatch` that counts what it does, and each stage epoch's numbers
(:class:`~lightning_perf.records.CompileStats`) once it ends.

Notes:
    1. Only the stages a run measures count: a validation run inside a training epoch is the validation's (the
       innermost stage in its epoch), and the sanity check's compiles count in the first validation epoch
       (:attr:`~lightning_perf.records.CompileStats.seconds_before`).
    2. The batch is the one between its start and end hooks; a compile between batches (a hook's) counts in
       the epoch, at no batch.
    3. A run that compiles nothing has no numbers at all (``None``): no ``compile`` in its report.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightning_perf.collect.compile import CompileSite, CompileWatch
from lightning_perf.records import CompileStats

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_perf.hooks.stage_measure import StageMeasure

# The stages in the order a compile is attributed to them: validation runs inside a training epoch.
INNERMOST_FIRST = ("validate", "test", "predict", "train")


class CompileTracking:
    """The run's compile numbers per stage epoch.

    Args:
        stages: Each stage's measurement (whether it is in an epoch, its clock's batches).

    Example::

        tracking.install(trainer)  # at setup
        stats = tracking.take("train")  # at the stage epoch's end: None while nothing compiled
        tracking.uninstall()  # at teardown
    """

    def __init__(self, stages: Mapping[str, StageMeasure]) -> None:
        self._stages = stages
        self._trainer: Any = None  # a weak reference to the trainer (set at install)
        self.watch = CompileWatch(self.site)

    def install(self, trainer: pl.Trainer) -> bool:
        """Starts counting (at setup); whether this torch has the compile callbacks."""
        self._trainer = weakref.ref(trainer)
        return self.watch.install()

    def epoch_start(self) -> None:
        """A stage epoch starts: the watch is still registered with torch (a ``torch._dynamo.reset()`` drops it)."""
        self.watch.keep_installed()

    def uninstall(self) -> None:
        self.watch.uninstall()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_trainer": None}  # a weak reference pickles not (``ddp_spawn``); setup sets it

    def site(self) -> CompileSite | None:
        """Where the run is: the innermost stage in its epoch and its batch, the sanity check (the first
        validation epoch's, before it), or ``None`` (between stages)."""
        for stage in INNERMOST_FIRST:
            measure = self._stages.get(stage)
            if measure is not None and measure.in_epoch:
                clock = measure.clock
                in_batch = len(clock.data_wait) > len(clock.compute)
                return CompileSite(stage, len(clock.compute) if in_batch else None)
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is not None and trainer.sanity_checking:
            return CompileSite("validate", None, before_epoch=True)
        return None

    def take(self, stage: str) -> CompileStats | None:
        """The stage epoch's numbers, which then start again from zero; ``None`` while nothing compiled."""
        return self.watch.take(stage)
