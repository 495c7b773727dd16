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
    5. **Step trials** (:mod:`~lightning_perf.hooks.step_trials`): ``cpu_threads``' and ``cpu_contention``'s
       ``torch.set_num_threads(N)`` (at any severity: their ``info`` is a gain not known, which the trial
       measures), and ``precision``'s and ``memory_pressure``'s mixed precision (warning), each tried on one real
       step of a copy of the module; their estimate is the epoch's compute per batch for every step they take.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning_perf.budget import ProfilingBudget, trial_fits
from lightning_perf.collect.loader_trial import TRIAL_BATCHES, TRIAL_REPETITIONS, TRIAL_WARMUP, try_loader_setting
from lightning_perf.collect.memory import CudaPeaks
from lightning_perf.collect.optimizer_trial import TRIAL_REPETITIONS as OPTIMIZER_REPETITIONS
from lightning_perf.collect.optimizer_trial import TRIAL_STEPS as OPTIMIZER_STEPS
from lightning_perf.collect.optimizer_trial import TRIAL_WARMUP as OPTIMIZER_WARMUP
from lightning_perf.collect.optimizer_trial import optimizer_copy, step_times, try_optimizer_setting
from lightning_perf.collect.optimizer_trial import untriable as untriable_optimizer
from lightning_perf.collect.run_info import first_dataloader, stage_dataloaders
from lightning_perf.diagnose.advice_tried import advised_setting, loader_setting
from lightning_perf.diagnose.loader_advice import WORKER_STARTUP_GUESS
from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.optimizer_tried import optimizer_setting
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.diagnosis_context import advice_trials
from lightning_perf.hooks.error_policy import ErrorPolicy
from lightning_perf.hooks.stage_measure import StageMeasure
from lightning_perf.hooks.step_trials import precision_trials, thread_trials
from lightning_perf.records import EpochSummary
from lightning_perf.trial_records import AdviceTrial
from lightning_perf.units import limit, seconds_or_ms

RULE = "dataloader_bound"
OPTIMIZER_RULE = "optimizer_heavy"
PREFETCH_GUESS = 2
"""The batches each worker holds in advance, for the estimate: the DataLoader's default ``prefetch_factor``."""


def trial_estimate(wait: float, compute: float, current_workers: int, setting: dict[str, Any]) -> float:
    """What a DataLoader trial should cost, in seconds (Notes 2): every batch it fetches at ``wait`` (the epoch's
    data wait per batch, an upper bound for the faster setting) and ``compute`` (the step's, spent after each
    fetch), and each worker it starts."""
    advised = int(setting.get("num_workers", current_workers))
    prefetch = 2 * PREFETCH_GUESS * (current_workers + advised)  # read past what the workers hold in advance
    if setting.get("persistent_workers"):  # the untimed pass that starts them, and what they load meanwhile
        prefetch += 1 + PREFETCH_GUESS * advised
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
        self.clock = clock
        self._done: set[str] = set()  # the rules tried, or found untriable: never again in this run
        self._optimizer_step: float | None = None  # one step of a copy of the optimizer, for the estimate

    def diagnose(
        self, context: StageEpoch, run: dict[str, Any], trainer: Any, peaks: CudaPeaks | None = None
    ) -> list[Finding]:
        """The epoch's findings, with the run's trials so far (``run["advice_trials"]``); a trial the findings call
        for (:meth:`attempt`) runs, and the epoch is diagnosed again with its record (Notes 1). ``peaks``: the
        callback's CUDA peaks, which a step trial's memory is kept apart from."""
        stage = context.stage
        context = dataclasses.replace(context, advice_trials=advice_trials(run, stage))
        findings = diagnose(context, self._thresholds, on_error=self._policy.rule_failed)
        if self.attempt(trainer, context.epoch, findings, run, peaks):  # the advice reports the measurement
            context = dataclasses.replace(context, advice_trials=advice_trials(run, stage))
            findings = diagnose(context, self._thresholds, on_error=self._policy.rule_failed)
        return findings

    def due(
        self,
        summary: EpochSummary,
        findings: Sequence[Finding],
        rule: str = RULE,
        severities: Sequence[str] = ("warning", "critical"),
    ) -> Finding | None:
        """The finding of ``rule`` (of ``severities``) whose advice this training epoch may try, or ``None``."""
        if not self.enabled or rule in self._done or summary.stage != "train":
            return None
        return next((f for f in findings if f.id == rule and f.severity in severities), None)

    def attempt(
        self,
        trainer: Any,
        summary: EpochSummary,
        findings: Sequence[Finding],
        run: dict[str, Any],
        peaks: CudaPeaks | None = None,
    ) -> bool:
        """Tries each setting a finding advises (DataLoader, optimizer, threads, precision), where the budget has
        room (Notes 2), and keeps its record in ``run["advice_trials"]``; whether a new record was kept (the epoch
        is then diagnosed again)."""
        tried = [self._loader(trainer, summary, findings), self._optimizer(trainer, summary, findings)]
        tried += thread_trials(self, trainer, summary, findings, run.get("advice_trials") or {})
        tried += precision_trials(self, trainer, summary, findings, run.get("advice_trials") or {}, peaks)
        records = [record for record in tried if record is not None]
        for record in records:
            run.setdefault("advice_trials", {})[record.rule] = record.as_dict()
        return bool(records)

    def _loader(self, trainer: Any, summary: EpochSummary, findings: Sequence[Finding]) -> AdviceTrial | None:
        """``dataloader_bound``'s advised DataLoader setting, tried (or why not); ``None``: nothing to try."""
        finding = self.due(summary, findings, RULE)
        written = None if finding is None else advised_setting(finding.advice)
        loader = first_dataloader(stage_dataloaders(trainer, "train")) if written is not None else None
        if written is None or loader is None:
            return None
        setting = loader_setting(written) or {}
        measured = max(summary.measured_batches, 1)
        wait, compute = summary.data_wait / measured, max(summary.step_time - summary.data_wait, 0.0) / measured
        estimate = trial_estimate(wait, compute, int(loader.num_workers), setting)
        planned = trainer.num_training_batches
        epoch_batches = int(planned) if isinstance(planned, int) else summary.measured_batches
        return self.room(RULE, summary, written, estimate, trainer) or self.run(
            RULE,
            written,
            summary.epoch,
            f"`DataLoader({written})` on the training data",
            lambda: try_loader_setting(
                loader,
                setting,
                rule=RULE,
                written=written,
                epoch=summary.epoch,
                compute=compute,
                epoch_batches=epoch_batches,
                clock=self.clock,
            ),
        )

    def _optimizer(self, trainer: Any, summary: EpochSummary, findings: Sequence[Finding]) -> AdviceTrial | None:
        """``optimizer_heavy``'s advised implementation, tried on a copy of the first optimizer (or why not);
        ``None``: nothing to try. Its estimate is one step of a copy, timed first (and charged)."""
        finding = self.due(summary, findings, OPTIMIZER_RULE)
        written = None if finding is None else optimizer_setting(finding.advice)
        optimizers = list(getattr(trainer, "optimizers", None) or ())
        if written is None or not optimizers or untriable_optimizer(optimizers[0]) is not None:
            return None if written is None or not optimizers else self._untried(optimizers[0], written, summary)
        optimizer, setting = optimizers[0], {written.partition("=")[0]: True}
        if self._optimizer_step is None:  # timed once: a copy of a large optimizer is not made every epoch
            started = self.clock()
            self._optimizer_step = step_times(optimizer_copy(optimizer, {}), 1, 0, self.clock)[0]
            self._budget.charge(self.clock() - started)
        estimate = 2 * OPTIMIZER_REPETITIONS * (OPTIMIZER_WARMUP + OPTIMIZER_STEPS) * self._optimizer_step
        return self.room(OPTIMIZER_RULE, summary, written, estimate, trainer) or self.run(
            OPTIMIZER_RULE,
            written,
            summary.epoch,
            f"`{written}` on a copy of the optimizer",
            lambda: try_optimizer_setting(
                optimizer, setting, rule=OPTIMIZER_RULE, written=written, epoch=summary.epoch, clock=self.clock
            ),
        )

    def _untried(self, optimizer: Any, written: str, summary: EpochSummary) -> AdviceTrial:
        self._done.add(OPTIMIZER_RULE)
        why = untriable_optimizer(optimizer) or "no optimizer"
        return AdviceTrial(rule=OPTIMIZER_RULE, setting=written, epoch=summary.epoch, untried=why)

    def room(self, rule: str, summary: EpochSummary, written: str, estimate: float, trainer: Any) -> AdviceTrial | None:
        """``None`` where the trial fits the budget; else the untried record that says why."""
        budget = self._budget
        spent, elapsed = budget.cost(self.clock()).seconds, budget.elapsed(self.clock())
        planned = _planned_seconds(trainer, summary)
        if trial_fits(budget.share, spent, estimate, max(elapsed, planned)):
            return None
        why = (
            f"the profiling budget ({limit(budget.share or 0.0)} of the run's time) has no room for a trial of about"
            f" {seconds_or_ms(estimate)}; `PerfCallback(profile_budget=...)` sets it"
        )
        return AdviceTrial(rule=rule, setting=written, epoch=summary.epoch, untried=why)

    def run(self, rule: str, written: str, epoch: int, what: str, trial: Callable[[], AdviceTrial]) -> AdviceTrial:
        """Runs ``trial`` once in the run: its time charged to the budget and left out of the training stage's
        paces (Notes 2); a failure is warned of once and recorded as untried (Notes 3)."""
        started = self.clock()
        try:
            record = trial()
        except Exception as err:
            if self._policy.strict:
                raise
            self._policy.warn_once(
                f"trial:{rule}",
                f"PerfCallback: trying {what} failed ({type(err).__name__}: {err}); the advice stays a prediction,"
                " and training goes on.",
            )
            record = AdviceTrial(
                rule=rule, setting=written, epoch=epoch, untried=f"the trial failed: {type(err).__name__}"
            )
        seconds = self.clock() - started
        self._budget.charge(seconds)
        if (st := self._stages.get("train")) is not None:  # the budget pays for it, not the epoch's reports
            st.report_pace.leave_out(seconds)
            st.measure_pace.leave_out(seconds)
        self._done.add(rule)
        return record

    def settle(self, rule: str) -> None:
        """``rule``'s advice is not asked again in this run (tried, or found untriable)."""
        self._done.add(rule)

    def untried(self, rule: str, written: str, epoch: int, why: str) -> AdviceTrial:
        """The record of a setting that cannot be tried in this run (``why``): never asked again."""
        self.settle(rule)
        return AdviceTrial(rule=rule, setting=written, epoch=epoch, untried=why)


def _planned_seconds(trainer: Any, summary: EpochSummary) -> float:
    """The fit's planned training time: its planned batches at the epoch's median step (0 where unknown)."""
    max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
    batches = trainer.num_training_batches * max_epochs if max_epochs >= 0 else math.inf
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        batches = min(batches, trainer.max_steps)
    step = summary.step_time_p50 or 0.0
    return 0.0 if math.isinf(batches) or not step else float(batches) * step
