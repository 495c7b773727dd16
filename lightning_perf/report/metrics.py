"""
Metric names
============

The scalars we log, named under one ``perf/`` namespace, with their units in their names. Every stage has
its own step axis: training series are logged at the trainer's ``global_step``; validation, test and
predict series at the number of batches that stage has run so far, so they never pile onto the training
steps (see docs/output.md, "Logged metrics").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lightning_perf.records import PHASES, EpochSummary

MS = 1e3
MB = 1 / 2**20
TERA = 1e12


def batch_metrics(
    stage: str, *, data_wait: float, compute: float, batch_size: int | None, loss: float | None
) -> dict[str, float]:
    """One batch's scalars (logged at the trainer's ``log_every_n_steps`` cadence)."""
    step = data_wait + compute
    prefix = f"perf/{stage}/batch/"
    metrics = {
        prefix + "step_time_ms": step * MS,
        prefix + "data_wait_ms": data_wait * MS,
        prefix + "compute_ms": compute * MS,
    }
    if batch_size is not None and step > 0:
        metrics[prefix + "samples_per_s"] = batch_size / step
    if loss is not None:
        metrics[prefix + "loss"] = loss
    return metrics


def epoch_metrics(summary: EpochSummary) -> dict[str, float]:
    """One epoch's scalars."""
    prefix = f"perf/{summary.stage}/epoch/"
    metrics = {
        prefix + "step_time_p50_ms": summary.step_time_p50 * MS,
        prefix + "step_time_p90_ms": summary.step_time_p90 * MS,
        prefix + "step_time_max_ms": summary.step_time_max * MS,
        prefix + "data_wait_fraction": summary.data_wait_fraction,
        prefix + "batches": float(summary.batches),
    }
    optional = {
        "samples_per_s": summary.throughput,
        "loss": summary.loss,
        "host_rss_mb": None if summary.host_rss is None else summary.host_rss * MB,
        "host_rss_peak_mb": None if summary.host_rss_peak is None else summary.host_rss_peak * MB,
        "cuda_max_allocated_mb": None if summary.cuda_max_allocated is None else summary.cuda_max_allocated * MB,
        "cuda_max_reserved_mb": None if summary.cuda_max_reserved is None else summary.cuda_max_reserved * MB,
        "cuda_capacity_mb": None if summary.cuda_capacity is None else summary.cuda_capacity * MB,
        "cuda_utilization_pct": None if summary.cuda_utilization is None else float(summary.cuda_utilization),
        "tflops": None if summary.flops_per_second is None else summary.flops_per_second / TERA,
        "mfu": summary.mfu,  # a share, 0-1
    }
    metrics.update({prefix + name: value for name, value in optional.items() if value is not None})
    for phase in PHASES:  # a training epoch's split of each batch (collect.phases)
        for quantile in ("p50", "p90"):
            if (value := getattr(summary, f"{phase}_{quantile}")) is not None:
                metrics[f"{prefix}{phase}_{quantile}_ms"] = value * MS
    return metrics


def charts_layout(stages: Iterable[str]) -> dict[str, Any]:
    """The charts TensorBoard's Custom Scalars dashboard draws from our scalars (``SummaryWriter.
    add_custom_scalars``), one category: per stage, each batch's step time with its data wait and compute on
    one chart (logged at the trainer's ``log_every_n_steps``), and each epoch's step time p50, p90 and max. Its
    axes, scale, legend and tooltips are TensorBoard's; each chart's tags are regular expressions over ours."""
    charts: dict[str, list[Any]] = {}
    for stage in stages:
        charts[f"{stage}: step time per batch, data wait and compute (ms)"] = [
            "Multiline",
            [rf"^perf/{stage}/batch/(step_time|data_wait|compute)_ms$"],
        ]
        charts[f"{stage}: step time per epoch, p50, p90 and max (ms)"] = [
            "Multiline",
            [rf"^perf/{stage}/epoch/step_time_(p50|p90|max)_ms$"],
        ]
        if stage == "train":
            charts[f"{stage}: each batch's phases per epoch, p50 and p90 (ms)"] = [
                "Multiline",
                [rf"^perf/{stage}/epoch/(forward|backward|optimizer|other)_(p50|p90)_ms$"],
            ]
    return {"lightning-perf": charts}
