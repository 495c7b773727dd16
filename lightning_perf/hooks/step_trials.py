"""
Step trials of advice
=====================

Which thread count and which mixed precision a training epoch's findings advise, tried on one real step of the
run (issue 48, "What is tried" 3 and 4): :class:`~lightning_perf.hooks.advice_trials.AdviceTrials` asks, and the
trial runs through it (the budget, the record, a failure warned of once; its Notes 2-5).

Notes:
    1. ``cpu_threads`` and ``cpu_contention`` are due at any severity; ``precision`` and ``memory_pressure`` (its
       ``Trainer(precision="bf16-mixed")``) as a warning or critical.
    2. A count equal to the run's own is not tried (nothing to compare). Where two rules advise the same setting,
       the second takes the first's record: one measurement, the same step.
    3. The estimate: every step the trial takes (:func:`step_estimate`) at the epoch's compute per batch (its
       step time less its data wait; a thread trial whose steps read their batch in the training process: the whole
       step time), which includes the optimizer's step the trial does not take. A trial past
       :data:`~lightning_perf.collect.step_trial.TRIAL_OVERRUN` times it stops after the repetition it is in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from lightning_perf.collect.memory import CudaPeaks
from lightning_perf.collect.precision_trial import try_precision
from lightning_perf.collect.run_info import first_dataloader, stage_dataloaders
from lightning_perf.collect.step_trial import TRIAL_OVERRUN, TRIAL_REPETITIONS, TRIAL_STEPS, TRIAL_WARMUP, untriable
from lightning_perf.collect.thread_trial import try_threads
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.step_tried import (
    THREAD_RULES,
    autocast_dtype,
    precision_setting,
    thread_setting,
    threads_of,
)
from lightning_perf.records import EpochSummary
from lightning_perf.trial_records import AdviceTrial

if TYPE_CHECKING:
    from lightning_perf.hooks.advice_trials import AdviceTrials

PRECISION_RULES = ("precision", "memory_pressure")
"""The rules whose advice may name a mixed precision (``memory_pressure``'s, for its activations)."""
Trial = Callable[[Any, Any, str, str, int, float], AdviceTrial]
"""A step trial as :func:`_step_trial` runs it: ``(trainer, loader, rule, written, epoch, limit)``."""
ANY_SEVERITY = ("info", "warning", "critical")


def step_estimate(summary: EpochSummary, *, loads: bool = False) -> float:
    """What a step trial should cost, in seconds (Notes 3): its first step, and each repetition's warm-up and timed
    steps for both settings, at the epoch's compute per batch, and its data wait where each step ``loads`` its
    batch in the training process."""
    per_batch = summary.step_time if loads else max(summary.step_time - summary.data_wait, 0.0)
    return (1 + 2 * TRIAL_REPETITIONS * (TRIAL_WARMUP + TRIAL_STEPS)) * per_batch / max(summary.measured_batches, 1)


def thread_trials(
    trials: AdviceTrials,
    trainer: Any,
    summary: EpochSummary,
    findings: Sequence[Finding],
    earlier: Mapping[str, Mapping[str, Any]],
) -> list[AdviceTrial | None]:
    """Each thread rule's advised ``torch.set_num_threads(N)``, tried (or why not); ``earlier``: the run's records
    so far (``run["advice_trials"]``), whose measurement of the same count serves again (Notes 2)."""
    records: list[AdviceTrial | None] = []
    for rule in THREAD_RULES:
        finding = trials.due(summary, findings, rule, ANY_SEVERITY)
        written = None if finding is None else thread_setting(finding.advice)
        threads = None if written is None else threads_of(written)
        if written is None or threads is None or threads == torch.get_num_threads():
            continue
        what = f"`{written}` on a step of a copy of the module"
        records.append(
            _same(trials, rule, written, THREAD_RULES, records, earlier)
            or _step_trial(trials, trainer, summary, rule, written, what, _thread_trial(trials, threads))
        )
    return records


def _thread_trial(trials: AdviceTrials, threads: int) -> Trial:
    """The thread trial of ``threads``, as :func:`_step_trial` runs it."""

    def trial(trainer: Any, loader: Any, rule: str, written: str, epoch: int, limit: float) -> AdviceTrial:
        return try_threads(
            trainer, loader, threads, rule=rule, written=written, epoch=epoch, limit=limit, clock=trials.clock
        )

    return trial


def precision_trials(
    trials: AdviceTrials,
    trainer: Any,
    summary: EpochSummary,
    findings: Sequence[Finding],
    earlier: Mapping[str, Mapping[str, Any]],
    peaks: CudaPeaks | None,
) -> list[AdviceTrial | None]:
    """Each precision rule's advised mixed precision, tried on a step of a copy of the module (or why not);
    ``earlier``: as :func:`thread_trials`'; ``peaks``: the callback's CUDA peaks, kept apart from the trial's
    memory."""
    records: list[AdviceTrial | None] = []
    for rule in PRECISION_RULES:
        finding = trials.due(summary, findings, rule)
        written = None if finding is None else precision_setting(finding.advice)
        dtype = None if written is None else autocast_dtype(written)
        if written is None or dtype is None:
            continue
        what = f"`{written}` (autocast to {dtype}) on a step of a copy of the module"
        records.append(
            _same(trials, rule, written, PRECISION_RULES, records, earlier)
            or _step_trial(trials, trainer, summary, rule, written, what, _precision_trial(trials, dtype, peaks))
        )
    return records


def _precision_trial(trials: AdviceTrials, dtype: str, peaks: CudaPeaks | None) -> Trial:
    """The precision trial of ``dtype``, as :func:`_step_trial` runs it."""

    def trial(trainer: Any, loader: Any, rule: str, written: str, epoch: int, limit: float) -> AdviceTrial:
        return try_precision(
            trainer,
            loader,
            dtype,
            rule=rule,
            written=written,
            epoch=epoch,
            apart=peaks.apart if peaks is not None else None,
            limit=limit,
            clock=trials.clock,
        )

    return trial


def _same(
    trials: AdviceTrials,
    rule: str,
    written: str,
    rules: Sequence[str],
    records: Sequence[AdviceTrial | None],
    earlier: Mapping[str, Mapping[str, Any]],
) -> AdviceTrial | None:
    """Another of ``rules``' measurement of ``written`` this epoch or before, as ``rule``'s record (Notes 2)."""
    done = [*(r for r in records if r is not None), *(AdviceTrial.from_dict(v) for v in earlier.values())]
    same = next((r for r in done if r.rule in rules and r.setting == written and r.untried is None), None)
    if same is None:
        return None
    trials.settle(rule)
    return dataclasses.replace(same, rule=rule)


def _step_trial(
    trials: AdviceTrials,
    trainer: Any,
    summary: EpochSummary,
    rule: str,
    written: str,
    what: str,
    trial: Trial,
) -> AdviceTrial:
    """A step trial through ``trials``: untriable said once; else the budget asked (Notes 3), the trial run."""
    loader = first_dataloader(stage_dataloaders(trainer, "train"))
    why = untriable(trainer, loader)
    if why is not None or loader is None:
        return trials.untried(rule, written, summary.epoch, why or "no training DataLoader")
    estimate = step_estimate(summary, loads=rule in THREAD_RULES and not loader.num_workers)
    limit = TRIAL_OVERRUN * estimate
    return trials.room(rule, summary, written, estimate, trainer) or trials.run(
        rule, written, summary.epoch, what, lambda: trial(trainer, loader, rule, written, summary.epoch, limit)
    )
