"""
Memory rules
============

``memory_pressure`` (the GPU's memory is nearly full), ``memory_breakdown`` (what fills memory, and the cures
for its largest part, from ``run.memory``) and ``memory_growth`` (host or GPU memory rises epoch after epoch: a
leak).
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_perf.diagnose.model import Finding, Severity, StageEpoch
from lightning_perf.diagnose.out_of_memory import ACTIVATIONS_UNMEASURED, memory_cures, memory_parts
from lightning_perf.diagnose.rule_helpers import (
    FP32_PRECISIONS,
    accumulation,
    batch_end_hook,
    epoch_end_hook,
    finding,
    on_cuda,
    reaches,
    stage_name,
    step_method,
)
from lightning_perf.diagnose.step_tried import bf16_memory_clause
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import EpochSummary
from lightning_perf.units import limit, percent, signed_size, size


def memory_pressure(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The CUDA caching allocator's peak reservation nears the device's capacity.

    Notes:
        1. Measures the epoch's peak reserved memory / the device's total memory.
        2. Fires at ``memory_pressure_warning``; critical at ``memory_pressure_critical``.
        3. When the reserved memory holds ``memory_fragmentation`` or more that is not allocated, the advice
           leads with the allocator's ``expandable_segments``. The rest fits the stage: gradient accumulation
           and activation checkpointing only help training.
        4. Where ``Trainer(precision="bf16-mixed")`` was tried on one real step (``StageEpoch.advice_trials``,
           :func:`~lightning_perf.diagnose.step_tried.bf16_memory_clause`), its clause says the step's peak memory
           measured with and without it, in place of the prediction. The severity stays: the pressure was measured.
    """
    epoch = ctx.epoch
    reserved, capacity = epoch.cuda_max_reserved, epoch.cuda_capacity
    if reserved is None or not capacity:
        return None
    fraction = reserved / capacity
    if not reaches(fraction, t.memory_pressure_warning):
        return None
    severity: Severity = "critical" if reaches(fraction, t.memory_pressure_critical) else "warning"
    evidence = [
        f"peak reserved {size(reserved)} of {size(capacity)} ({percent(fraction)})"
        f" (warning >= {limit(t.memory_pressure_warning)}, critical >= {limit(t.memory_pressure_critical)})"
    ]
    advice = []
    allocated = epoch.cuda_max_allocated
    if allocated is not None and reserved > 0:
        unused = max(reserved - allocated, 0)
        evidence.append(
            f"peak allocated {size(allocated)}: {size(unused)} ({percent(unused / reserved)}) reserved but unused"
        )
        if reaches(unused / reserved, t.memory_fragmentation):
            advice.append(
                "The cache is fragmented: set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the"
                " environment (before the first CUDA allocation) so the allocator grows segments instead of"
                " keeping many partly used blocks."
            )
    if ctx.stage == "train":
        advice.append(
            "To free memory: a smaller `batch_size` with"
            f" {accumulation('N', manual=ctx.facts.manual_optimization)} keeps the effective"
            " batch; activation checkpointing (`torch.utils.checkpoint.checkpoint` around blocks) trades compute"
            " for activations"
        )
    else:
        advice.append(
            f"To free memory: a smaller `batch_size` in the {stage_name(ctx.stage).lower()} DataLoader, which"
            " changes no result here (each batch is computed on its own)"
        )
    if ctx.facts.precision is None or ctx.facts.precision in FP32_PRECISIONS:
        advice[-1] += "; " + bf16_memory_clause(ctx.advice_trials, "memory_pressure", t.advice_trial_min_gain)
    else:
        advice[-1] += "."
    if severity == "critical":
        advice.append("At this level one larger batch or longer sequence is an out-of-memory error.")
    return finding(
        ctx,
        "memory_pressure",
        severity,
        f"GPU memory {percent(fraction)} full during {stage_name(ctx.stage).lower()}",
        evidence,
        advice,
    )


# What memory_breakdown weighs: the training step's own memory, not what the device has besides.
_NOT_TRAINING = frozenset({"outside the allocator", "free"})


def memory_breakdown(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """What fills memory in training, and the cures for its largest part with their predicted savings.

    Notes:
        1. Reads ``run.memory`` (``RunFacts.memory``): the parts the model holds and, on CUDA, the activations and
           the allocator's overhead.
        2. Information (``verbose=2`` shows it), a warning where the epoch's peak reserved memory reaches
           ``memory_tight`` of the device: then the cures are what keeps the next larger batch from an
           out-of-memory error.
        3. The largest part's cures first (:func:`~lightning_perf.diagnose.out_of_memory.memory_cures`), then the
           others, largest saving first.
    """
    memory = ctx.facts.memory
    if ctx.stage != "train" or not memory:
        return None
    parts = {name: value for name, value in memory_parts(memory) if name not in _NOT_TRAINING}
    total = sum(parts.values())
    if total <= 0:
        return None
    largest = max(parts, key=lambda name: parts[name])
    epoch = ctx.epoch
    reserved, capacity = epoch.cuda_max_reserved, epoch.cuda_capacity
    tight = (
        reserved is not None and capacity is not None and capacity > 0 and reaches(reserved / capacity, t.memory_tight)
    )
    evidence = [", ".join(f"{name} {signed_size(value)}" for name, value in parts.items() if value)]
    if tight and reserved is not None and capacity is not None:
        evidence.append(f"peak reserved {size(reserved)} of {size(capacity)} (warning >= {limit(t.memory_tight)})")
    elif memory.get("activations") is None and not memory.get("activations_saved"):
        evidence.append(ACTIVATIONS_UNMEASURED)
    facts = ctx.facts
    cures = memory_cures(
        memory, world_size=facts.world_size, precision=facts.precision, manual=facts.manual_optimization
    )
    ordered = [c for c in cures if largest in c.shrinks] + [c for c in cures if largest not in c.shrinks]
    advice = [
        "What would shrink it, with the predicted savings: "
        + "; ".join(f"{cure.text}: about {signed_size(cure.saving)}" for cure in ordered)
        + "."
        if ordered
        else "Nothing counted here has a cure that shrinks it."
    ]
    return finding(
        ctx,
        "memory_breakdown",
        "warning" if tight else "info",
        f"The largest part of training memory: {largest}, {percent(parts[largest] / total)}"
        f" ({signed_size(parts[largest])})",
        evidence,
        advice,
    )


def _rising(values: Sequence[int | None], t: Thresholds) -> tuple[int, int, int] | None:
    """``(first, last, epochs)`` of the trailing run of epochs over which ``values`` never fell, when it is
    long enough, rose in its last epoch, and rose by both growth thresholds; else ``None``."""
    run: list[int] = []
    for value in reversed(values):
        if value is None or (run and value > run[-1]):
            break
        run.append(value)
    if len(run) < max(t.memory_growth_epochs, 2) or run[0] <= run[1]:
        return None
    first, last = run[-1], run[0]
    grown = last - first
    if grown < t.memory_growth_bytes or first <= 0 or not reaches(grown / first, t.memory_growth_fraction):
        return None
    return first, last, len(run)


def memory_growth(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Host memory (or the GPU's allocated memory) rises epoch after epoch.

    Notes:
        1. Reads the peaks of the stage's earlier epochs and this one: ``host_rss_peak`` and
           ``cuda_max_allocated``.
        2. Fires, as a warning, when a peak has not fallen over the last ``memory_growth_epochs`` epochs or
           more (this one included), rose in this epoch, and rose in all by at least
           ``memory_growth_fraction`` and ``memory_growth_bytes``.
    """
    epochs: tuple[EpochSummary, ...] = (*ctx.history, ctx.epoch)
    found = []
    for label, values in (
        ("host memory (RSS peak)", [e.host_rss_peak for e in epochs]),
        ("GPU allocated memory (peak)", [e.cuda_max_allocated for e in epochs]),
    ):
        rise = _rising(values, t)
        if rise is not None:
            first, last, records = rise  # the records of short epochs measured together hold several each
            found.append((label, first, last, sum(e.epochs for e in epochs[len(epochs) - records :])))
    if not found:
        return None
    evidence = [
        f"{label} rose over {count} epochs: {size(first)} -> {size(last)}"
        f" (+{size(last - first)}, +{percent((last - first) / first)})"
        for label, first, last, count in found
    ]
    evidence.append(
        f"warning: not falling over >= {t.memory_growth_epochs} epochs, rising in this one, by >="
        f" {limit(t.memory_growth_fraction)} and >= {size(t.memory_growth_bytes)}"
    )
    label, first, last, count = found[0]
    where = "Host" if label.startswith("host") else "GPU"
    stage = ctx.stage
    if stage == "train":
        kept = (
            "losses or outputs kept with their graph (append `loss.detach()`, or `loss.item()` at logging time,"
            " never `loss`)"
        )
    else:
        kept = "outputs kept across batches (e.g. for a metric at the epoch's end) and never released"
    tools = (
        "`tracemalloc` (host) or `torch.cuda.memory._record_memory_history()` (GPU) show"
        if on_cuda(ctx)
        else "`tracemalloc` (a snapshot per epoch, compared) shows"
    )
    advice = [
        f"Something keeps references from step to step. Usually: {kept}; lists grown in `{step_method(stage)}`,"
        f" `{batch_end_hook(stage)}` or a callback and never cleared (clear them in `{epoch_end_hook(stage)}`);"
        f" caches keyed by batch. {tools} what holds the memory."
    ]
    if stage == "predict":
        advice.append(
            "`trainer.predict` itself keeps every batch's predictions to return them:"
            " `trainer.predict(..., return_predictions=False)` with a `BasePredictionWriter` writing each batch"
            " keeps them out of memory."
        )
    return finding(
        ctx,
        "memory_growth",
        "warning",
        f"{where} memory grows every {stage_name(ctx.stage).lower()} epoch: +{size(last - first)} over {count} epochs",
        evidence,
        advice,
    )
