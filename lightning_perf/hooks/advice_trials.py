"""
Advice trials
=============

When the callback tries a finding's advised setting on the run's own data, and where the result goes (issue 48).

Notes:
    1. A stage epoch's diagnosis (on rank zero) goes through :meth:`AdviceTrials.diagnose`: the rules run with the
       run's trials so far, then :meth:`AdviceTrials.attempt` looks at a training epoch's findings. A
       ``dataloader_bound`` finding (warning or critical) whose advice sets a triable DataLoader setting
       (:func:`~lightning_perf.diagnose.advice_tried.advised_setting`) is tried once per run
       (:func:`~lightning_perf.collect.loader_trial.try_loader_setting`) and the epoch is diagnosed again with the
       record, so that its advice reports the measurement.
    2. **The budget.** A trial is profiling work the budget pays for: it runs only where its estimated cost (the
       epoch's data wait and compute per batch, for every batch it fetches, and
       :data:`~lightning_perf.diagnose.loader_advice.WORKER_STARTUP_GUESS` per worker started) fits
       ``profile_budget`` of the run's wall time so far or of its plan, where longer
       (:func:`~lightning_perf.budget.trial_fits`), and its measured wall time is charged to the budget, and left
       out of the training stage's report and measurement paces (:class:`~lightning_perf.hooks.log_pace.LogPace`),
       which would otherwise hold back the next epochs' findings and group their measurement.
       Where it does not fit, the finding says the advice is untried and why, and a later epoch asks again.
    3. A dataset the trial cannot read (an ``IterableDataset``, no ``__len__``) is recorded as untried, once. A
       trial that raises is warned of once (re-raised under ``strict``), recorded as untried, and training goes on.
    4. The record is ``run.advice_trials.<rule>`` in ``perf_report.json``; the diagnosis reads it back from there
       (:func:`~lightning_perf.diagnosis_context.advice_trials`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_perf.budget import ProfilingBudget, trial_fits
from lightning_perf.collect.loader_trial import TRIAL_BATCHES, TRIAL_REPETITIONS, TRIAL_WARMUP, try_loader_setting
from lightning_perf.collect.run_info import first_dataloader, stage_dataloaders
from lightning_perf.diagnose.advice_tried import advised_setting, loader_setting
from lightning_perf.diagnose.loader_advice import WORKER_STARTUP_GUESS
from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.diagnosis_context import advice_trials
from lightning_perf.hooks.error_policy import ErrorPolicy
from lightning_perf.hooks.stage_measure import StageMeasure
from lightning_perf.records import EpochSummary
from lightning_perf.trial_records import AdviceTrial
from lightning_perf.units import limit, seconds_or_ms

RULE = "dataloader_bound"
PREFETCH_GUESS = 2
"""The batches each worker holds in advance, for the estimate: the DataLoader's default ``prefetch_factor``."""


def trial_estimate(wait: float, compute: float, current_workers: int, setting: dict[str, Any]) -> float:
    """What a DataLoader trial should cost, in seconds (Notes 2): every batch it fetches at ``wait`` (the epoch's
    data wait per batch, an upper bound for the faster setting) and ``compute`` (the step's, slept after each
    fetch), and each worker it starts."""
    advised = int(setting.get("num_workers", current_workers))
    prefetch = PREFETCH_GUESS * (current_workers + advised)  # the warm-up batches the workers hold in advance
    fetched = TRIAL_REPETITIONS * (2 * (TRIAL_WARMUP + TRIAL_BATCHES) + prefetch)
    workers = TRIAL_REPETITIONS * (current_workers + advised)
    return fetched * (max(wait, 0.0) + max(compute, 0.0)) + workers * WORKER_STARTUP_GUESS


class AdviceTrials:
    """The run's advice trials: which finding's setting to try, when the budget lets it, and the records.

    Args:
        budget: The run's profiling budget, which a trial asks and is charged to.
        policy: Where a trial's failure goes, and a rule's.
        thresholds: The rules' thresholds.
        stages: The stages' measures, whose paces leave a trial's time out (Notes 2).
        enabled: ``PerfCallback(try_advice=...)``.
        clock: Seconds, monotonic (the budget's clock).
    """

    def __init__(
        self,
        budget: ProfilingBudget,
        policy: ErrorPolicy,
        thresholds: Thresholds | None = None,
        stages: Mapping[str, StageMeasure] | None = None,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._budget = budget
        self._policy = policy
        self._thresholds = thresholds
        self._stages = stages or {}
        self.enabled = enabled
        self._clock = clock
        self._done = False  # tried, or found untriable: never again in this run

    def diagnose(self, context: StageEpoch, run: dict[str, Any], trainer: Any) -> list[Finding]:
        """The epoch's findings, with the run's trials so far (``run["advice_trials"]``); a trial the findings call
        for (:meth:`attempt`) runs, and the epoch is diagnosed again with its record (Notes 1)."""
        stage = context.stage
        context = dataclasses.replace(context, advice_trials=advice_trials(run, stage))
        findings = diagnose(context, self._thresholds, on_error=self._policy.rule_failed)
        if self.attempt(trainer, context.epoch, findings, run):  # the advice reports the measurement
            context = dataclasses.replace(context, advice_trials=advice_trials(run, stage))
            findings = diagnose(context, self._thresholds, on_error=self._policy.rule_failed)
        return findings

    def due(self, summary: EpochSummary, findings: Sequence[Finding]) -> str | None:
        """The advised setting to try after this epoch's ``findings`` (as the advice writes it), or ``None``."""
        if not self.enabled or self._done or summary.stage != "train":
            return None
        for finding in findings:
            if finding.id == RULE and finding.severity in ("warning", "critical"):
                return advised_setting(finding.advice)
        return None

    def attempt(self, trainer: Any, summary: EpochSummary, findings: Sequence[Finding], run: dict[str, Any]) -> bool:
        """Tries the setting :meth:`due` names, where the budget has room (Notes 2), and keeps its record in
        ``run["advice_trials"]``; whether a new record was kept (the epoch is then diagnosed again)."""
        written = self.due(summary, findings)
        if written is None:
            return False
        setting = loader_setting(written) or {}
        loader = first_dataloader(stage_dataloaders(trainer, "train"))
        if loader is None:
            return False
        measured = max(summary.measured_batches, 1)
        wait, compute = summary.data_wait / measured, max(summary.step_time - summary.data_wait, 0.0) / measured
        estimate = trial_estimate(wait, compute, int(loader.num_workers), setting)
        record = self._room(summary, written, estimate, trainer)
        if record is None:
            record = self._try(loader, setting, written, summary.epoch, compute)
            self._budget.charge(record.seconds)
            if (st := self._stages.get("train")) is not None:  # the budget pays for it, not the epoch's reports
                st.report_pace.leave_out(record.seconds)
                st.measure_pace.leave_out(record.seconds)
            self._done = True
        run.setdefault("advice_trials", {})[RULE] = record.as_dict()
        return True

    def _room(self, summary: EpochSummary, written: str, estimate: float, trainer: Any) -> AdviceTrial | None:
        """``None`` where the trial fits the budget; else the untried record that says why."""
        budget = self._budget
        spent, elapsed = budget.cost(self._clock()).seconds, budget.elapsed(self._clock())
        planned = _planned_seconds(trainer, summary)
        if trial_fits(budget.share, spent, estimate, max(elapsed, planned)):
            return None
        why = (
            f"the profiling budget ({limit(budget.share or 0.0)} of the run's time) has no room for a trial of about"
            f" {seconds_or_ms(estimate)}; `PerfCallback(profile_budget=...)` sets it"
        )
        return AdviceTrial(rule=RULE, setting=written, epoch=summary.epoch, untried=why)

    def _try(self, loader: Any, setting: dict[str, Any], written: str, epoch: int, compute: float) -> AdviceTrial:
        try:
            return try_loader_setting(
                loader, setting, rule=RULE, written=written, epoch=epoch, compute=compute, clock=self._clock
            )
        except Exception as err:
            if self._policy.strict:
                raise
            self._policy.warn_once(
                f"trial:{RULE}",
                f"PerfCallback: trying `DataLoader({written})` on the training data failed ({type(err).__name__}:"
                f" {err}); the advice stays a prediction, and training goes on.",
            )
            return AdviceTrial(
                rule=RULE, setting=written, epoch=epoch, untried=f"the trial failed: {type(err).__name__}"
            )


def _planned_seconds(trainer: Any, summary: EpochSummary) -> float:
    """The fit's planned training time: its planned batches at the epoch's median step (0 where unknown)."""
    max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
    batches = trainer.num_training_batches * max_epochs if max_epochs >= 0 else math.inf
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        batches = min(batches, trainer.max_steps)
    step = summary.step_time_p50 or 0.0
    return 0.0 if math.isinf(batches) or not step else float(batches) * step
