"""
Diagnosis context
=================

What the rules read (:class:`~lightning_perf.diagnose.model.StageEpoch`), built one way from plain records,
by the callback as an epoch ends and by ``lightning-perf analyze`` from saved traces.

- :func:`run_facts`: the run's facts for one stage, from the run-info dict (``perf_report.json``'s ``"run"``).
- :func:`epoch_context`: a measured stage epoch: its summary, history, windows, per-batch times and ranks.
- :func:`trace_context`: one trace alone, its steps as an epoch, the run's facts as far as it tells them
  (:func:`~lightning_perf.summarize.events.distributed_info`, :func:`trace_stage`).
- :func:`ranks_context` and :func:`cross_rank_findings`: the ranks of one window, each known from its trace
  (:func:`~lightning_perf.summarize.ranks.rank_summary_of_trace`), for the cross-rank rules.

Pure (no torch, no Lightning, no file access), and above both ``summarize`` and ``diagnose``: it turns
summaries into the rules' input, so it lives beside its two users, not in ``diagnose`` (whose modules import
nothing of this package but the records and each other).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_perf.config import STAGES
from lightning_perf.diagnose.model import Finding, RunFacts, StageEpoch
from lightning_perf.diagnose.registry import CROSS_RANK_RULES, diagnose
from lightning_perf.diagnose.thresholds import EVIDENCE_BATCHES, Thresholds
from lightning_perf.records import (
    CollectiveStats,
    CompileStats,
    EpochSummary,
    RankSummary,
    TraceSummary,
    WindowRecord,
)
from lightning_perf.summarize.events import KinetoTrace
from lightning_perf.summarize.memory import checked_memory
from lightning_perf.summarize.ranks import rank_cpu_waits, rank_waits, rank_work_times
from lightning_perf.summarize.steps import percentile, pool_epochs, summarize_epoch
from lightning_perf.traces import METADATA_KEY
from lightning_perf.trial_records import AdviceTrial, trials_of


def run_facts(run: Mapping[str, Any], stage: str) -> RunFacts:
    """The facts the rules need about the run and ``stage``'s DataLoader.

    Args:
        run: The run-info dict, as ``perf_report.json``'s ``"run"`` holds it (its ``"dataloaders"`` by stage).
        stage: The stage whose DataLoader settings count.

    Example::

        facts = run_facts(report["run"], "train")
    """
    loader = run.get("dataloaders", {}).get(stage) or {}
    return RunFacts(
        device=run.get("device", "cpu"),
        device_name=run.get("device_name"),
        precision=run.get("precision"),
        world_size=run.get("world_size", 1),
        num_nodes=run.get("num_nodes", 1),
        strategy=run.get("strategy"),
        cpu_count=run.get("cpu_count"),
        cpu_quota=run.get("cpu_quota"),
        torch_threads=run.get("torch_threads"),
        num_workers=loader.get("num_workers"),
        pin_memory=loader.get("pin_memory"),
        persistent_workers=loader.get("persistent_workers"),
        batch_size=loader.get("batch_size"),
        dataset=loader.get("dataset"),
        shared_state=loader.get("shared_state"),
        dataset_class=loader.get("dataset_class"),
        dataset_library=loader.get("dataset_library"),
        dataset_length=loader.get("dataset_length"),
        loader_built_by=loader.get("built_by"),
        loader_builder=loader.get("builder"),
        iterable_class=loader.get("iterable_class"),
        iterable_library=loader.get("iterable_library"),
        peak_flops=run.get("peak_flops"),
        epochs=run.get("max_epochs"),  # a validate, test or predict call plans 1
        compiled_modules=run.get("compiled_modules"),
        progress_bar=run.get("progress_bar"),
        progress_bar_refresh=run.get("progress_bar_refresh"),
        manual_optimization=run.get("manual_optimization"),
        memory=checked_memory(run.get("memory")) if stage == "train" else None,
        val_check_steps=run.get("val_check_steps"),
        optimizer=(run.get("optimizer_info") or {}).get("class"),
        optimizer_fused=(run.get("optimizer_info") or {}).get("fused"),
        optimizer_fusable=(run.get("optimizer_info") or {}).get("fusable"),
        optimizer_built_by=(run.get("optimizer_info") or {}).get("built_by"),
        optimizer_builder=(run.get("optimizer_info") or {}).get("builder"),
    )


def epoch_context(
    summary: EpochSummary,
    *,
    history: Sequence[EpochSummary] = (),
    windows: Sequence[TraceSummary] = (),
    validation: Sequence[EpochSummary] = (),
    facts: RunFacts | None = None,
    data_wait: Sequence[float] = (),
    compute: Sequence[float] = (),
    profiled: Sequence[bool] = (),
    ranks: Sequence[RankSummary] = (),
    compile: CompileStats | None = None,
    evidence_batches: int = EVIDENCE_BATCHES,
    fit_seconds: tuple[float, float] | None = None,
    collectives: Mapping[str, tuple[CollectiveStats, ...]] | None = None,
    advice_trials: Mapping[str, AdviceTrial] | None = None,
) -> StageEpoch:
    """A measured stage epoch, as the rules see it: an epoch of fewer than ``evidence_batches`` measured batches
    is judged together with the latest epochs of ``history`` (:func:`~lightning_perf.summarize.steps.pool_epochs`)
    until they reach it, so that one-batch epochs are judged over the stage's recent batches.

    Args:
        summary: The epoch's summary.
        history: The same stage's earlier epochs, oldest first.
        windows: The trace summaries of this epoch's profiler windows.
        validation: For a training epoch, the validation epochs that ran during it.
        facts: The run's facts (:func:`run_facts`); all unknown when ``None``.
        data_wait, compute: Each batch's data wait and compute time (seconds), in batch order; a batch that
            started and did not end (one more wait than compute) is left out.
        profiled: Whether each batch ran inside a profiler window (its step time is NaN: the profiler slows
            it down); a batch past its end did not.
        ranks: Every rank's summary of the epoch, by global rank (a distributed run, on rank zero); their
            own work per step is what the cross-rank rules compare.
        compile: What ``torch.compile`` did during the epoch, when the run compiled anything.
        evidence_batches: The measured batches the rules judge at the least (``Thresholds.evidence_batches``).
        fit_seconds: For a training epoch, the training and the validation step time of the fit so far, this
            epoch included (``validation_heavy`` judges the fit's share).
        collectives: Each window's collectives, by the window's name.
        advice_trials: The run's advice trials so far, by rule id (a training epoch's; ``run.advice_trials`` of a
            report, through :func:`advice_trials`).

    Example::

        context = epoch_context(summary, history=earlier, facts=run_facts(run, "train"),
                                data_wait=clock.data_wait, compute=clock.compute, profiled=clock.profiled)
        findings = diagnose(context)
    """
    pooled = _recent(summary, history, evidence_batches)
    return StageEpoch(
        epoch=pool_epochs(pooled) if len(pooled) > 1 else summary,
        pooled_epochs=sum(e.epochs for e in pooled),  # a record may hold several (epoch_report, Notes 2)
        history=tuple(history),
        windows=tuple(windows),
        validation=tuple(validation),
        facts=facts if facts is not None else RunFacts(),
        step_times=tuple(
            math.nan if i < len(profiled) and profiled[i] else wait + work
            for i, (wait, work) in enumerate(zip(data_wait, compute, strict=False))
        ),
        rank_step_times=rank_work_times(ranks) or None,
        rank_waits=rank_waits(ranks) or None,
        rank_cpu_waits=rank_cpu_waits(ranks) or None,
        compile=compile,
        fit_seconds=fit_seconds,
        collectives=dict(collectives or {}),
        advice_trials=dict(advice_trials or {}),
    )


def advice_trials(run: Mapping[str, Any], stage: str) -> dict[str, AdviceTrial]:
    """The advice trials a report's ``run`` holds (``run.advice_trials``), for ``stage``: the training DataLoader's
    are the training stage's; a record the report cannot give back is left out."""
    return trials_of(run) if stage == "train" else {}


def _recent(summary: EpochSummary, history: Sequence[EpochSummary], batches: int) -> list[EpochSummary]:
    """``summary``, with the latest epochs of ``history`` before it where it has fewer than ``batches`` measured
    batches (at most ``batches`` epochs back: bounded work per epoch), oldest first: the epochs to pool."""
    pooled = [summary]
    for earlier in reversed(history[-batches:]):
        if sum(e.measured_batches for e in pooled) >= batches:
            break
        pooled.insert(0, earlier)
    return pooled


def trace_notes(trace: KinetoTrace | Mapping[str, Any]) -> Mapping[str, Any]:
    """A trace of ours' ``lightning_perf`` metadata (its stage, epoch, rank; for a stage without a DataLoader
    its iterable and data wait: :func:`~lightning_perf.hooks.profiler_windows.window_notes`); ``{}`` for
    another trace."""
    notes = trace.lightning_perf if isinstance(trace, KinetoTrace) else trace.get(METADATA_KEY)
    return notes if isinstance(notes, dict) else {}


def trace_stage(trace: KinetoTrace | Mapping[str, Any]) -> str:
    """The stage a trace of ours was recorded in (its ``lightning_perf`` metadata), else ``"train"``."""
    stage = trace_notes(trace).get("stage")
    return stage if stage in STAGES else "train"


def trace_context(
    summary: TraceSummary,
    info: Mapping[str, Any],
    *,
    stage: str = "train",
    precision: str | None = None,
    world_size: int = 1,
    collectives: tuple[CollectiveStats, ...] = (),
    notes: Mapping[str, Any] | None = None,
) -> StageEpoch:
    """What the rules need from a trace alone.

    Args:
        summary: The trace's summary; its steps make the epoch (each as long as their mean, no data wait).
        info: The trace's :func:`~lightning_perf.summarize.events.distributed_info`; its world size counts when
            larger than ``world_size``.
        stage: The stage it was recorded in (a trace of ours says which: :func:`trace_stage`).
        precision: Lightning's precision string, which a trace does not tell (enables the precision rule).
        world_size: How many traces (ranks) are analysed together.
        collectives: The trace's collectives (:func:`~lightning_perf.summarize.collectives.collective_stats`).
        notes: The trace's own metadata (:func:`trace_notes`): where the stage iterated no DataLoader, its
            iterable (``RunFacts.iterable_class``) and the steps' data wait, which no span of the trace shows.

    Example::

        context = trace_context(summarize_trace(trace), distributed_info(trace), stage=trace_stage(trace))
    """
    facts = RunFacts(
        device="cuda" if summary.device_busy is not None else "cpu",
        device_name=summary.device_name,
        precision=precision,
        world_size=max(world_size, int(info.get("world_size") or 1)),
        iterable_class=(notes or {}).get("iterable_class"),
        iterable_library=(notes or {}).get("iterable_library"),
    )
    wait = (notes or {}).get("data_wait") if facts.iterable_class is not None else None
    epoch = _steps(stage, summary.step_time, summary.steps, wait=wait if isinstance(wait, float) else 0.0)
    return StageEpoch(epoch=epoch, windows=(summary,), facts=facts, collectives={summary.window: collectives})


def ranks_context(ranks: Sequence[RankSummary]) -> StageEpoch:
    """The ranks of one training window for the cross-rank rules: each rank's own work per step, and the
    median rank's step as the epoch's.

    Args:
        ranks: One summary per rank (:func:`~lightning_perf.summarize.ranks.rank_summary_of_trace`).
    """
    median = percentile([r.step_time_p50 or 0.0 for r in ranks], 50)
    return StageEpoch(
        epoch=_steps("train", median, 1),
        facts=RunFacts(world_size=len(ranks)),
        rank_step_times=rank_work_times(ranks) or None,
        rank_waits=rank_waits(ranks) or None,
    )


def cross_rank_findings(ranks: Sequence[RankSummary], thresholds: Thresholds | None = None) -> list[Finding]:
    """The cross-rank rules' findings over one window's ranks (the rules the callback runs at epoch end).

    Example::

        findings = cross_rank_findings([rank_summary_of_trace(rank, summary) for rank, summary in traces])
    """
    return diagnose(ranks_context(ranks), thresholds, rules=CROSS_RANK_RULES)


def _steps(stage: str, step_time: float, steps: int, *, wait: float = 0.0) -> EpochSummary:
    """An epoch of ``stage`` as a trace tells it: ``steps`` steps of ``step_time`` seconds each, ``wait`` of it
    the data wait (a DataLoader's time is in the trace's summary, not per step: none) and no batch size."""
    wait = min(max(wait, 0.0), step_time)
    return summarize_epoch(
        stage=stage,
        epoch=0,
        data_wait=[wait] * steps,
        compute=[step_time - wait] * steps,
        batch_sizes=[None] * steps,
    )


def with_cpu_use(record: WindowRecord) -> TraceSummary:
    """A window's trace summary with the time per step its training thread waited for a CPU
    (``TraceSummary.cpu_wait_time``: what a busy machine explains)."""
    summary = record.summary
    assert summary is not None
    if record.cpu_wait is None or not summary.steps:
        return summary
    return dataclasses.replace(summary, cpu_wait_time=record.cpu_wait / summary.steps)


def window_summaries(
    windows: Sequence[WindowRecord], stage: str, epoch: int, *, latest: bool = False
) -> tuple[TraceSummary, ...]:
    """The trace summaries of the stage epoch's ``windows``, with what the training thread did per step while each
    recorded (:func:`with_cpu_use`); ``latest``: where the epoch has none, the stage's latest earlier window
    (under a profiling budget most epochs have none, and their findings still rest on what one showed)."""
    return tuple(with_cpu_use(w) for w in epoch_windows(windows, stage, epoch, latest=latest))


def epoch_windows(
    windows: Sequence[WindowRecord], stage: str, epoch: int, *, latest: bool = False
) -> list[WindowRecord]:
    """The stage epoch's summarized ``windows`` (see :func:`window_summaries`)."""
    mine = [w for w in windows if w.stage == stage and w.summary]
    own = [w for w in mine if w.epoch == epoch]
    return own if own or not latest else [w for w in mine if w.epoch < epoch][-1:]
