"""
Advice tried
============

What a finding's advice says once its setting was tried on the run's own data (issue 48): the measurement
leads, in place of the prediction; a setting that showed no gain is withdrawn, and says so; one that could not
be tried says why.

The setting is read from the advice itself: every DataLoader setting the rules advise is written as one
``Set `DataLoader(...)``` call (:mod:`~lightning_perf.diagnose.loader_advice`), and only the settings a new
DataLoader over the same dataset can try alone (:data:`TRIABLE`) make it triable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from lightning_perf.trial_records import AdviceTrial
from lightning_perf.units import ms, plural, seconds_or_ms, times

#: The DataLoader arguments a trial can set alone, on a new DataLoader over the same dataset.
TRIABLE = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")

_SET_LOADER = re.compile(r"Set `DataLoader\(([^()`]*)\)`")
# The prediction a tried setting's sentence carries (loader_advice's "predicted data wait ..."), which the
# measurement replaces.
_PREDICTED = re.compile(r"; predicted data wait [0-9.]+ ms per batch instead of [0-9.]+ ms(?: \(about [^)]*\))?")


def loader_setting(text: str) -> dict[str, int | bool] | None:
    """``"num_workers=2, persistent_workers=True"`` as ``{"num_workers": 2, "persistent_workers": True}``;
    ``None`` where it names anything but :data:`TRIABLE` arguments set to integers or booleans."""
    setting: dict[str, int | bool] = {}
    for part in text.split(","):
        name, _, value = (s.strip() for s in part.partition("="))
        if name not in TRIABLE:
            return None
        if value in ("True", "False"):
            setting[name] = value == "True"
        elif value.isdigit():
            setting[name] = int(value)
        else:
            return None
    return setting or None


def advised_setting(advice: str | Sequence[str]) -> str | None:
    """The first triable DataLoader setting ``advice`` (a finding's text, or its lines) sets, as written there
    (``"num_workers=2, persistent_workers=True"``); ``None`` where it sets none."""
    text = advice if isinstance(advice, str) else " ".join(advice)
    for match in _SET_LOADER.finditer(text):
        if loader_setting(match.group(1)) is not None:
            return match.group(1)
    return None


def tried_advice(
    trials: Mapping[str, AdviceTrial], rule: str, lines: list[str], min_gain: float
) -> tuple[list[str], bool]:
    """The advice ``lines`` of ``rule`` with its trial's result, and whether the trial withdrew the setting.

    Notes:
        1. No trial of ``rule``'s advice, or one of other arguments (``pin_memory`` tried, ``num_workers``
           advised now): unchanged.
        2. Not tried: a sentence after the setting's says why (the advice stays a prediction).
        3. The setting advised was tried, its wait was at least ``min_gain`` times as short, and no repetition
           found it longer (the spread's lowest ratio is 1 or more): the measurement leads the advice, in place of
           the prediction.
        4. It was tried and fell short of that: the setting's sentence is replaced by the measurement and "not
           advised". (On a 2-CPU machine shared with other work, one worker for an in-memory ``TensorDataset``
           timed 1.16x overall with repetitions from 0.74x to 1.15x; applied, the epoch took 1.04x as long.)
        5. The same arguments with other values were tried (the advice, predicted anew each epoch, moved from
           ``num_workers=3`` to ``4``): the measurement of the setting tried leads, and the advice stays as it is.
    """
    setting = advised_setting(lines)
    trial = trials.get(rule)
    if (
        setting is None
        or trial is None
        or set(loader_setting(trial.setting) or ()) != set(loader_setting(setting) or ())
    ):
        return lines, False
    at = next(i for i, line in enumerate(lines) if f"`DataLoader({setting})`" in line)
    if trial.untried is not None or trial.ratio is None or trial.current is None or trial.advised is None:
        if trial.setting != setting:
            return lines, False
        note = f"This is a prediction: `{setting}` was not tried on this run ({trial.untried or 'no measurement'})."
        return [*lines[: at + 1], note, *lines[at + 1 :]], False
    spread = (
        f", {times(trial.spread[0])}-{times(trial.spread[1])} over {plural(trial.repetitions, 'repetition')}"
        if trial.spread is not None
        else ""
    )
    same = trial.setting == setting
    if trial.epoch_batches:  # the steps' time per batch over an epoch (a report before that: the wait alone)
        what, per = "a step takes", "a batch"
        how = (
            f"; over an epoch of {_batches(trial.epoch_batches)}, the workers' start-up, each batch's wait and the"
            f" step's {ms(trial.compute)} of compute"
        )
    else:
        what, per = "the step waits", "for a batch"
        how = f", the step's {ms(trial.compute)} of compute between batches" if trial.compute > 0 else ""
    cost = f"{how}; the trial took {seconds_or_ms(trial.seconds)}"
    if trial.ratio >= min_gain and (trial.spread is None or trial.spread[0] >= 1.0):
        measured = (
            f"Tried on {_batches(trial.batches)} of your data: with `{trial.setting}` {what}"
            f" {ms(trial.advised)} {per} against {ms(trial.current)} now ({times(trial.ratio)}{spread}{cost})."
        )
        return [measured, *(_PREDICTED.sub("", line) if same else line for line in lines)], False
    measured = (
        f"Tried `{trial.setting}` on {_batches(trial.batches)} of your data: {times(trial.ratio)} ({what}"
        f" {ms(trial.advised)} {per} against {ms(trial.current)} now{spread}{cost}), no gain"
    )
    if not same:
        return [f"{measured}.", *lines], False
    return [*lines[:at], f"{measured}; not advised.", *lines[at + 1 :]], True


def _batches(n: int) -> str:
    return f"{n} batch{'' if n == 1 else 'es'}"
