"""
Optimizer advice tried
======================

What ``optimizer_heavy``'s advice says once its implementation (``fused=True``, ``foreach=True``) was tried on
copies of the run's own optimizer (issue 48, "What is tried" 2;
:mod:`~lightning_perf.collect.optimizer_trial`): the measurement leads; an implementation that showed no gain is
withdrawn, and says so; one that could not be tried says why.

The setting is read from the advice itself: ``optimizer_heavy`` writes each implementation it advises as
``torch.optim.<Class>(..., fused=True)`` or ``(..., foreach=True)``; the first one written is the one tried.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from lightning_perf.trial_records import AdviceTrial
from lightning_perf.units import ms, plural, seconds_or_ms, times

RULE = "optimizer_heavy"

_ADVISED = re.compile(r"`torch\.optim\.\w+\(\.\.\., (fused|foreach)=True\)`")


def optimizer_setting(advice: str | Sequence[str]) -> str | None:
    """The first implementation ``advice`` (a finding's text, or its lines) advises, as ``"fused=True"`` or
    ``"foreach=True"``; ``None`` where it advises none."""
    text = advice if isinstance(advice, str) else " ".join(advice)
    match = _ADVISED.search(text)
    return f"{match.group(1)}=True" if match else None


def tried_optimizer_advice(
    trials: Mapping[str, AdviceTrial], lines: list[str], min_gain: float
) -> tuple[list[str], bool]:
    """``optimizer_heavy``'s advice ``lines`` with its trial's result, and whether the trial withdrew it.

    Notes:
        1. No trial, or a trial of another implementation than the one advised first: unchanged.
        2. Not tried: a sentence after the advice says why (it stays a prediction).
        3. Tried and at least ``min_gain`` times as fast: the measurement leads the advice.
        4. Tried and slower than that: the measurement and "not advised" replace the advice's sentence naming it.
    """
    setting = optimizer_setting(lines)
    trial = trials.get(RULE)
    if setting is None or trial is None or trial.setting != setting:
        return lines, False
    if trial.untried is not None or trial.ratio is None or trial.current is None or trial.advised is None:
        note = f"This is a prediction: `{setting}` was not tried on this run ({trial.untried or 'no measurement'})."
        return [*lines, note], False
    spread = (
        f", {times(trial.spread[0])}-{times(trial.spread[1])} over {plural(trial.repetitions, 'repetition')}"
        if trial.spread is not None
        else ""
    )
    measured = (
        f"a copy of your optimizer, {plural(trial.batches, 'step')} each: with `{setting}` an update takes"
        f" {ms(trial.advised)} against {ms(trial.current)} now ({times(trial.ratio)}{spread}; the trial took"
        f" {seconds_or_ms(trial.seconds)})"
    )
    if trial.ratio >= min_gain:
        return [f"Tried on {measured}.", *lines], False
    # The implementation's sentences go; what else the advice names (fewer, larger tensors; fewer states) stays.
    rest = [line[line.index(_OTHER) :] for line in lines if _OTHER in line]
    return [f"Tried on {measured}: no gain; `{setting}` is not advised.", *rest], True


# Where optimizer_heavy's advice turns from the implementation to the parameters' shapes and the optimizer's states.
_OTHER = "Fewer, larger parameter tensors"
