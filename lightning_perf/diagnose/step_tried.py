"""
Step advice tried
=================

What a setting that changes how the step computes says once it was tried on one real step of the run (issue 48,
"What is tried" 3 and 4; :mod:`~lightning_perf.collect.step_trial`): torch's thread count (``cpu_threads``,
``cpu_contention``) and an autocast dtype (``precision``). The measurement leads; a setting that showed no gain is
withdrawn, and says so; one that could not be tried says why.

The setting is read from the advice itself: ``torch.set_num_threads(N)`` as the rules write it, and
``Trainer(precision="bf16-mixed")`` or ``"16-mixed"``; the first one written is the one tried.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lightning_perf.trial_records import AdviceTrial
from lightning_perf.units import ms, plural, seconds_or_ms, size, times

THREAD_RULES = ("cpu_threads", "cpu_contention")
"""The rules whose advice may set torch's thread count."""

_THREADS = re.compile(r"`(torch\.set_num_threads\((\d+)\))`")
_PRECISION = re.compile(r'`Trainer\((precision="(bf16-mixed|16-mixed)")\)`')
#: The autocast dtype each advised precision runs its forward in.
AUTOCAST = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}


def _text(advice: str | Sequence[str]) -> str:
    return advice if isinstance(advice, str) else " ".join(advice)


def thread_setting(advice: str | Sequence[str]) -> str | None:
    """The first thread count ``advice`` (a finding's text, or its lines) sets, as ``"torch.set_num_threads(2)"``;
    ``None`` where it sets none."""
    match = _THREADS.search(_text(advice))
    return match.group(1) if match else None


def threads_of(setting: str) -> int | None:
    """``"torch.set_num_threads(2)"`` -> ``2``; ``None`` for another setting."""
    match = _THREADS.fullmatch(f"`{setting}`")
    return int(match.group(2)) if match else None


def precision_setting(advice: str | Sequence[str]) -> str | None:
    """The first mixed precision ``advice`` advises, as ``'precision="bf16-mixed"'``; ``None`` where it advises
    none."""
    match = _PRECISION.search(_text(advice))
    return match.group(1) if match else None


def autocast_dtype(setting: str) -> str | None:
    """``'precision="bf16-mixed"'`` -> ``"bfloat16"`` (:data:`AUTOCAST`); ``None`` for another setting."""
    match = _PRECISION.fullmatch(f"`Trainer({setting})`")
    return AUTOCAST[match.group(2)] if match else None


@dataclass(frozen=True)
class StepTried:
    """A step trial's sentence for the advice, and what it found.

    Attributes:
        sentence: The measurement, or why the setting was not tried.
        outcome: ``"gain"`` (at least the minimum gain: the measurement leads the advice), ``"no gain"`` (the setting
            is withdrawn: the sentence says "not advised") or ``"untried"`` (the advice stays a prediction).
    """

    sentence: str
    outcome: str


def step_tried(trials: Mapping[str, AdviceTrial], rule: str, setting: str | None, min_gain: float) -> StepTried | None:
    """The sentence a finding of ``rule`` whose advice sets ``setting`` gets from its step trial; ``None`` where there
    is no trial of that setting.

    Notes:
        1. A trial of another setting (the advice, written anew each epoch, moved from 2 threads to 3): none.
        2. Not tried: "This is a prediction: ... was not tried on this run (why)."
        3. Tried: each setting's median step, their ratio ``current / advised`` with the repetitions' spread, the
           peak memory where measured (on CUDA; a precision trial on a CPU says it was not), and the trial's cost.
           At least ``min_gain`` (and no repetition slower, the spread's lowest 1 or more): a gain; else no gain.
    """
    trial = trials.get(rule)
    if setting is None or trial is None or trial.setting != setting:
        return None
    if trial.untried is not None or trial.ratio is None or trial.current is None or trial.advised is None:
        why = trial.untried or "no measurement"
        return StepTried(f"This is a prediction: `{setting}` was not tried on this run ({why}).", "untried")
    spread = (
        f", {times(trial.spread[0])}-{times(trial.spread[1])} over {plural(trial.repetitions, 'repetition')}"
        if trial.spread is not None
        else ""
    )
    memory = ""
    if trial.current_peak is not None and trial.advised_peak is not None:
        memory = f"; its peak memory {size(trial.advised_peak)} against {size(trial.current_peak)}"
    elif rule == "precision":
        memory = "; peak memory not measured off CUDA"
    where = f"one batch of your data, {plural(trial.batches, 'step')} each on a copy of your module"
    takes = "a forward and backward take" if rule == "precision" else "a step takes"
    cost = f"{spread}{memory}; the trial took {seconds_or_ms(trial.seconds)}"
    if trial.ratio >= min_gain and (trial.spread is None or trial.spread[0] >= 1.0):
        return StepTried(
            f"Tried on {where}: with `{setting}` {takes} {ms(trial.advised)} against"
            f" {ms(trial.current)} now ({times(trial.ratio)}{cost}).",
            "gain",
        )
    return StepTried(
        f"Tried `{setting}` on {where}: {times(trial.ratio)} ({takes} {ms(trial.advised)} against"
        f" {ms(trial.current)} now{cost}), no gain; not advised.",
        "no gain",
    )


def without_sentence(text: str, marker: str) -> str:
    """``text`` less its sentences that contain ``marker`` (a withdrawn setting's)."""
    sentences = re.split(r"(?<=\.)\s+(?=[A-Z`(])", text)
    return " ".join(s for s in sentences if marker not in s)


def tried_step_advice(
    trials: Mapping[str, AdviceTrial],
    rule: str,
    lines: list[str],
    min_gain: float,
    setting: str | None,
    kept: list[str] | None = None,
) -> tuple[list[str], bool]:
    """``rule``'s advice ``lines`` with the step trial of ``setting`` (:func:`step_tried`), and whether the trial
    withdrew it: a gain leads the advice; no gain replaces it by the measurement, followed by ``kept`` (where
    ``None``: the lines less the sentences naming the setting); untried, the advice says why after it."""
    tried = step_tried(trials, rule, setting, min_gain)
    if tried is None or setting is None:
        return lines, False
    if tried.outcome == "gain":
        return [tried.sentence, *lines], False
    if tried.outcome == "untried":
        return [*lines, tried.sentence], False
    rest = kept if kept is not None else [without_sentence(line, setting) for line in lines]
    return [tried.sentence, *(line for line in rest if line)], True


BF16 = 'precision="bf16-mixed"'


def bf16_memory_clause(trials: Mapping[str, AdviceTrial], rule: str, min_gain: float) -> str:
    """A memory rule's clause on ``Trainer(precision="bf16-mixed")`` (after a "; "), with its step trial's peak
    memory where one was made (:mod:`~lightning_perf.collect.precision_trial`, on CUDA).

    Notes:
        1. No trial, or one without peaks: the prediction, "halves activation memory".
        2. Not tried: the prediction, and why it was not tried.
        3. A step's peak at least ``min_gain`` times as low with it: the measurement, with the step's time.
        4. Less than that: the measurement, "no saving; not advised".
    """
    call = f"`Trainer({BF16})`"
    trial = trials.get(rule)
    if trial is None or trial.setting != BF16:
        return f"{call} halves activation memory."
    if trial.untried is not None:
        return f"{call} halves activation memory (a prediction: it was not tried on this run, {trial.untried})."
    if trial.current_peak is None or trial.advised_peak is None or trial.ratio is None:
        return f"{call} halves activation memory."
    where = f"{call} was tried on one batch of your data"
    peaks = f"a step's peak memory {size(trial.advised_peak)} against {size(trial.current_peak)} now"
    lower = trial.current_peak / trial.advised_peak if trial.advised_peak > 0 else None
    if lower is not None and lower >= min_gain:
        return f"{where}: {peaks} ({times(lower)} lower; the step {times(trial.ratio)} as fast)."
    return f"{where}: {peaks}, no saving; not advised."
