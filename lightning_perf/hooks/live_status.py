"""
Live status
===========

What the progress bar shows while an epoch runs (issue 49): a short status beside Lightning's own metrics, from
numbers the step clock already holds, updated at the logging cadence (``Trainer(log_every_n_steps=...)``).

Notes:
    1. The bar is Lightning's (``TQDMProgressBar`` or ``RichProgressBar``, or any ``ProgressBar`` whose display
       asks ``get_metrics``): its instance's ``get_metrics`` is wrapped for the Trainer call, adding the item
       ``perf``, and put back at its end. Without a progress bar nothing is installed; ``PerfCallback(live=False)``
       installs nothing.
    2. The status: the recent batches' samples per second and data wait (the batches since the last update), the
       median of their phases where the stage has them (:mod:`lightning_perf.collect.phases`), and the ids of the
       stage's warning and critical findings of its latest diagnosed epoch, ``"!dataloader_bound"``:
       ``"812 samples/s, wait 12%, fwd 20.1 bwd 10.2 opt 15.1 ms, !dataloader_bound"``.
    3. No extra clock read, no device synchronization: the lists are the step clock's, and the text is made once
       per logging cadence, over that cadence's batches.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from lightning_perf.collect.steps import StepClock
from lightning_perf.units import count, percent

KEY = "perf"
"""The progress bar's item."""

# A phase's short name on the bar.
_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


def status(clock: StepClock, batches: int, in_force: Sequence[str] = ()) -> str | None:
    """The status of the last ``batches`` batches of ``clock`` (module Notes 2); ``None`` before any."""
    n = min(batches, len(clock.compute))
    if n <= 0:
        return None
    waits, computes = clock.data_wait[-n:], clock.compute[-n:]
    total = sum(waits) + sum(computes)
    parts = []
    sizes = [s for s in clock.batch_sizes[-n:] if s is not None]
    if sizes and total > 0:
        parts.append(f"{count(sum(sizes) / total)} samples/s")
    if total > 0:
        parts.append(f"wait {percent(sum(waits) / total)}")
    phases = clock.phase_marks.phases[-n:] if clock.phase_marks.marked else []
    if phases:
        medians = [statistics.median(batch[i] for batch in phases) * 1e3 for i in range(3)]
        parts.append(
            " ".join(f"{short} {value:.1f}" for short, value in zip(_SHORT.values(), medians, strict=True)) + " ms"
        )
    parts += [f"!{rule}" for rule in in_force]
    return ", ".join(parts)


class LiveStatus:
    """The progress bar's status item for one Trainer call (module Notes).

    Args:
        enabled: ``PerfCallback(live=...)``.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.text: str | None = None
        self._bar: Any = None
        self._in_force: dict[str, list[str]] = {}

    def install(self, trainer: Any) -> None:
        """Wraps the Trainer's progress bar's ``get_metrics`` (Notes 1), where there is one."""
        bar = getattr(trainer, "progress_bar_callback", None)
        if not self.enabled or bar is None or not callable(getattr(bar, "get_metrics", None)):
            return
        self.uninstall()
        self.text = None
        original = bar.get_metrics

        def get_metrics(*args: Any, **kwargs: Any) -> Any:
            metrics = original(*args, **kwargs)
            return {**metrics, KEY: self.text} if self.text else metrics

        bar.get_metrics = get_metrics
        self._bar = bar

    def uninstall(self) -> None:
        """Puts the bar's own ``get_metrics`` back."""
        if self._bar is not None:
            self._bar.__dict__.pop("get_metrics", None)
            self._bar = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a library pickles or deep-copies the callback during a run) wraps no bar: the original's wrapper
        # is on the Trainer's, and the copy installs its own at its setup.
        return {**self.__dict__, "_bar": None, "text": None}

    def update(self, stage: str, clock: StepClock, batches: int) -> None:
        """The status of the stage's last ``batches`` batches, where a bar shows it."""
        if self._bar is not None:
            self.text = status(clock, batches, self._in_force.get(stage, ()))

    def diagnosed(self, stage: str, findings: Sequence[Any] | None) -> None:
        """A stage epoch's findings (``None``: not diagnosed yet): its warnings and critical ones are in force on
        its bar until its next epoch's."""
        if self._bar is not None and findings is not None:
            self._in_force[stage] = [f.id for f in findings if f.severity in ("warning", "critical")]
