"""Hand-built diagnosis contexts for the rule tests: windows of 1-s steps, collectives, step spreads, and
``run``/``ids`` to judge them (the summaries themselves are tests/summaries.py)."""

import dataclasses
import pathlib

from lightning_perf.diagnose.model import Finding, RunFacts, StageEpoch
from lightning_perf.diagnose.registry import RULES, diagnose
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import CollectiveStats, EpochSummary, TraceSummary
from summaries import CPU, GPU, W1, epoch, gpu_epoch, window

ROOT = pathlib.Path(__file__).resolve().parents[2]
MiB, GiB = 2**20, 2**30


def gpu_window(name: str = W1, **kw) -> TraceSummary:
    """A healthy GPU window: the device busy 95% of the step, no syncs, tensor cores in use."""
    values = dict(
        device_busy=0.0095,
        kernels_per_step=300.0,
        median_kernel_time=25e-6,
        kernel_time=0.009,
        fp32_gemm_time=0.0,
        h2d_time=0.0003,
        h2d_exposed_time=0.0001,
        h2d_pageable=False,
        syncs_per_step=0.0,
        sync_idle_time=0.0,
        device_name="NVIDIA A100-SXM4-80GB",
        tensor_core_capable=True,
    )
    values.update(kw)
    return window(name, **values)


def gw(name: str = W1, **kw) -> TraceSummary:
    """A GPU window of 1 s steps, 90% busy: every time given reads as a share of the step."""
    return gpu_window(name, **{"step_time": 1.0, "device_busy": 0.9, **kw})


def cw(name: str = W1, **kw) -> TraceSummary:
    """A CPU window of 1 s steps: every time given reads as a share of the step."""
    return window(name, **{"step_time": 1.0, **kw})


def tiny_ops(name: str = W1, **kw) -> TraceSummary:
    """A CPU window exactly at launch_bound's threshold: 30% of the step in 1500 tiny operators of its own."""
    values = {"tiny_op_time": 0.3, "tiny_ops_per_step": 1500.0, "host_op_time": 0.8, "framework_time": 0.1}
    return cw(name, **{**values, **kw})


def scalar_reduces(per_step: float, seconds_per_step: float, *, nbytes: int | None = None, steps: int = 3):
    """A window's all-reduces of ``nbytes`` each (``None``: gloo, no sizes), ``per_step`` a step."""
    calls = round(per_step * steps)
    return CollectiveStats(
        kind="all_reduce",
        group="default_pg",
        ranks=2,
        calls=calls,
        per_step=per_step,
        bytes=None if nbytes is None else nbytes * calls,
        seconds=seconds_per_step * steps,
        exposed_seconds=seconds_per_step * steps,
        on_device=nbytes is not None,
    )


def slow_reduce(per_call: int, bus_bandwidth: float, *, calls: int = 3) -> CollectiveStats:
    """A window's all-reduces of ``per_call`` bytes at ``bus_bandwidth`` (bytes/s) among 2 ranks."""
    return CollectiveStats(
        kind="allreduce", group="default_pg", ranks=2, calls=calls, per_step=1.0, bytes=per_call * calls,
        seconds=per_call * calls / bus_bandwidth, exposed_seconds=0.0, on_device=True,
        algorithm_bandwidth=bus_bandwidth, bus_bandwidth=bus_bandwidth,
    )  # fmt: skip


def fsdp(*, exposed: float, units: int = 12, gather_bytes: int = 64 * 2**20, steps: int = 3):
    """A window of FSDP's collectives for ``units`` units: two all-gathers and a reduce-scatter per unit a step,
    the all-gathers ``exposed`` seconds a step in the open (of twice that in all)."""

    def stats(kind: str, per_step: int, seconds: float, exposed_seconds: float) -> CollectiveStats:
        return CollectiveStats(
            kind=kind, group="default_pg", ranks=8, calls=per_step * steps, per_step=float(per_step),
            bytes=gather_bytes * per_step * steps, seconds=seconds * steps, exposed_seconds=exposed_seconds * steps,
            on_device=True,
        )  # fmt: skip

    return (
        stats("_allgather_base", 2 * units, 2 * exposed, exposed),
        stats("_reduce_scatter_base", units, 0.1, 0.01),
    )


def spread(p50: float, p90: float) -> tuple[float, ...]:
    """21 step times whose median is ``p50`` and whose p90 is ``p90`` (the 19th of 21, exactly): the three slow ones
    at batches 5, 11 and 17, over three quarters of the epoch (``step_time_unstable`` warns of slow steps spread
    over it)."""
    return tuple(p90 if i in (5, 11, 17) else p50 for i in range(21))


def ctx(epoch_=None, *windows, facts=CPU, **kw) -> StageEpoch:
    if epoch_ is None:
        epoch_ = gpu_epoch() if facts.device == "cuda" else epoch()
    return StageEpoch(epoch=epoch_, windows=windows, facts=facts, step_times=kw.pop("step_times", (0.01,) * 100), **kw)


def gpu_ctx(epoch_=None, *windows, **kw) -> StageEpoch:
    return ctx(epoch_, *(windows or (gpu_window(),)), facts=kw.pop("facts", GPU), **kw)


def facts(base: RunFacts = CPU, **kw) -> RunFacts:
    return dataclasses.replace(base, **kw)


def run(rule_id: str, context: StageEpoch, **overrides) -> Finding | None:
    return RULES[rule_id](context, Thresholds.with_overrides(overrides))


def ids(context: StageEpoch, severities=("warning", "critical")) -> set[str]:
    return {f.id for f in diagnose(context) if f.severity in severities}


def history(*peaks_mib, field="host_rss_peak") -> tuple[EpochSummary, ...]:
    """Epochs 0..n-1 whose ``field`` peaks are the given MiB values (the last one is "this" epoch)."""
    return tuple(epoch(epoch=i, **{field: int(p * MiB)}) for i, p in enumerate(peaks_mib))


def with_history(*peaks_mib, field="host_rss_peak", facts=CPU) -> StageEpoch:
    epochs = history(*peaks_mib, field=field)
    return ctx(epochs[-1], facts=facts, history=epochs[:-1])


DDP2 = facts(GPU, world_size=2)  # two ranks on GPUs
