"""
Advice trials
=============

The record of an advised setting tried on the run's own data, side by side with the current one (issue 48):
what the finding's advice reports instead of its prediction, and what ``perf_report.json`` keeps
(``run.advice_trials``, by rule).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class AdviceTrial:
    """An advised setting tried once in the run, alternately with the current one, after a warm-up.

    Attributes:
        rule: The rule whose advice was tried (``"dataloader_bound"``).
        setting: The advised setting as the advice writes it, e.g. ``"num_workers=2, persistent_workers=True"``.
        epoch: The training epoch at whose end it was tried (or found untriable).
        compute: The step's compute per batch (seconds) the trial spent between fetches, as the step would.
        current: With the current settings, the time per batch of a step (a DataLoader trial: the wait for the
            batch and ``compute``, over an epoch of ``epoch_batches``), of an optimizer step, or of a training step
            on a copy of the module (a step trial), in seconds: the median over the repetitions; ``None`` where not
            tried.
        advised: The same with the advised setting (seconds, as ``current``); ``None`` where not tried.
        ratio: ``current / advised``: how many times as fast the advised setting is (below 1: slower).
        spread: The lowest and highest of the repetitions' own ratios.
        batches: The batches (a step trial: the steps) timed with each setting, all repetitions together.
        epoch_batches: The training epoch's batches, over which a DataLoader trial's times are per batch (the
            workers' start-up included); 0 where the figures are per step timed.
        repetitions: The repetitions, each timing both settings (their order alternating).
        seconds: The trial's own wall time, charged to the profiling budget.
        current_peak: A step trial's peak CUDA memory above what was allocated before the step (bytes), with the
            current setting; ``None`` where not measured (on a CPU, or a trial of no step).
        advised_peak: The same with the advised setting (bytes); ``None`` where not measured.
        untried: Why the setting was not tried (``None``: it was).
    """

    rule: str
    setting: str
    epoch: int
    compute: float = 0.0
    current: float | None = None
    advised: float | None = None
    ratio: float | None = None
    spread: tuple[float, float] | None = None
    batches: int = 0
    epoch_batches: int = 0
    repetitions: int = 0
    seconds: float = 0.0
    current_peak: int | None = None
    advised_peak: int | None = None
    untried: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for ``perf_report.json``."""
        values = dataclasses.asdict(self)
        values["spread"] = list(self.spread) if self.spread is not None else None
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> AdviceTrial:
        """The record :meth:`as_dict` wrote (keys it does not know are left out)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kept = {name: value for name, value in values.items() if name in known}
        if kept.get("spread") is not None:
            low, high = kept["spread"]
            kept["spread"] = (float(low), float(high))
        return cls(**kept)


def trials_of(run: Mapping[str, Any]) -> dict[str, AdviceTrial]:
    """The advice trials a report's ``run`` holds (``run.advice_trials``), by rule; a record the report cannot give
    back is left out."""
    trials = {}
    for rule, values in (run.get("advice_trials") or {}).items():
        try:
            trials[rule] = AdviceTrial.from_dict(values)
        except (TypeError, ValueError):
            continue
    return trials


def alternated(
    measure: Callable[[str], float],
    repetitions: int,
    *,
    rule: str,
    setting: str,
    epoch: int,
    batches: int,
    started: float,
    clock: Callable[[], float],
    compute: float = 0.0,
    enough: Callable[[], bool] | None = None,
) -> AdviceTrial:
    """A trial's record from ``repetitions`` of ``measure("current")`` and ``measure("advised")`` (each a
    repetition's time per batch or step, in seconds), current first then advised first by turns, so that a
    machine's drift falls on both: the medians over the repetitions, their ratio, and the spread of the
    repetitions' own ratios. ``batches``: what each setting timed in all; ``started``: the trial's start by
    ``clock``; ``enough``: asked after each repetition, stops the trial early where true (its record counts the
    repetitions done)."""
    timed: dict[str, list[float]] = {"current": [], "advised": []}
    ratios = []
    for rep in range(repetitions):
        values = {}
        for name in ("current", "advised") if rep % 2 == 0 else ("advised", "current"):
            values[name] = measure(name)
            timed[name].append(values[name])
        if values["advised"] > 0:
            ratios.append(values["current"] / values["advised"])
        if enough is not None and rep + 1 < repetitions and enough():
            break
    current = statistics.median(timed["current"]) if timed["current"] else 0.0
    advised = statistics.median(timed["advised"]) if timed["advised"] else 0.0
    return AdviceTrial(
        rule=rule,
        setting=setting,
        epoch=epoch,
        compute=compute,
        current=current,
        advised=advised,
        ratio=current / advised if advised > 0 else None,
        spread=(min(ratios), max(ratios)) if ratios else None,
        batches=batches,
        repetitions=len(timed["current"]),
        seconds=clock() - started,
    )
