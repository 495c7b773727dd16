"""The bottleneck rules on hand-built summaries: each fires at its threshold with the right severity, stays
silent just below it, names the window that shows it, and adapts its advice to the run; the thresholds'
overrides; the registry; and that the diagnose package never imports torch or lightning."""

import ast
import dataclasses
import pathlib
import re

import pytest

from lightning_perf.diagnose import rules_device
from lightning_perf.diagnose.links import INFINIBAND, node_link
from lightning_perf.diagnose.model import Finding, RunFacts, StageEpoch
from lightning_perf.diagnose.registry import RULES, diagnose
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.diagnosis_context import trace_context
from lightning_perf.readers import load_trace
from lightning_perf.records import CollectiveStats, EpochSummary, GraphBreak, Recompile, TraceSummary
from lightning_perf.summarize import step_summary
from lightning_perf.summarize.collectives import collective_stats
from purity import heavy_modules_loaded_by
from summaries import ADAM_MEMORY, CPU, FP32_GPU, GPU, W1, W2, compile_stats, epoch, gpu_epoch, window

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


# --- every rule: (context, expected warning/critical finding ids) -------------------------------------------


def tiny_ops(name: str = W1, **kw) -> TraceSummary:
    """A CPU window exactly at launch_bound's threshold: 30% of the step in 1500 tiny operators of its own."""
    values = {"tiny_op_time": 0.3, "tiny_ops_per_step": 1500.0, "host_op_time": 0.8, "framework_time": 0.1}
    return cw(name, **{**values, **kw})


SHORT_STEP = {"step_time": 0.003, "framework_time": 0.0001}  # 3 ms steps, 33% tiny operators under 1 ms


def fp32_gemms(share: float, name: str = W1, **kw) -> TraceSummary:
    """A busy tensor-core GPU window whose fp32 GEMMs without tensor cores take ``share`` of kernel time."""
    return gw(name, **{"device_busy": 0.95, "kernel_time": 1.0, "fp32_gemm_time": share, **kw})


def spiky(*indices: int, spike: float = 0.03, n: int = 100, base: float = 0.01) -> tuple[float, ...]:
    """``base`` (10 ms) steps, with ``spike`` seconds at ``indices``."""
    return tuple(spike if i in indices else base for i in range(n))


def validated(train: float, val: float) -> StageEpoch:
    return ctx(epoch(step_time=train), validation=(epoch(stage="validate", step_time=val),))


DDP2 = facts(GPU, world_size=2)
NO_WORKERS_ONE_THREAD = facts(torch_threads=1, num_workers=0)

CASES = {
    "healthy cpu": (ctx(None, window()), set()),
    "healthy gpu": (gpu_ctx(), set()),
    "healthy, no windows": (ctx(), set()),
    # dataloader_bound: data wait / step >= 10%
    "data wait at 10%": (ctx(epoch(data_wait_fraction=0.10, data_wait=0.10)), {"dataloader_bound"}),
    "data wait just below": (ctx(epoch(data_wait_fraction=0.0999, data_wait=0.0999)), set()),
    # host_sync: >= 1 sync per step with >= 5% of the step idle, CUDA only
    "syncs at threshold": (gpu_ctx(None, gw(syncs_per_step=1.0, sync_idle_time=0.05)), {"host_sync"}),
    "syncs with less idle": (gpu_ctx(None, gw(syncs_per_step=1.0, sync_idle_time=0.0499)), set()),
    "fewer than one sync": (gpu_ctx(None, gw(syncs_per_step=0.99, sync_idle_time=0.2)), set()),
    "syncs on cpu": (ctx(None, gw(syncs_per_step=3.0, sync_idle_time=0.2)), set()),
    # device_idle: busy < 80% warning, < 50% critical, CUDA only
    "busy just below 80%": (gpu_ctx(None, gw(device_busy=0.7999)), {"device_idle"}),
    "busy at 80%": (gpu_ctx(None, gw(device_busy=0.80)), set()),
    "idle on cpu": (ctx(None, gw(device_busy=0.1)), set()),
    # launch_bound, GPU: median kernel < 10 us with busy < 80%
    "short kernels, idle gpu": (
        gpu_ctx(None, gw(device_busy=0.79, median_kernel_time=9.9e-6)),
        {"launch_bound", "device_idle"},
    ),
    "10 us kernels": (gpu_ctx(None, gw(device_busy=0.79, median_kernel_time=10e-6)), {"device_idle"}),
    "short kernels, busy gpu": (gpu_ctx(None, gw(device_busy=0.80, median_kernel_time=2e-6)), set()),
    # launch_bound, CPU: the step's own tiny ops >= 30% of the step and >= 1 ms per step
    "tiny ops at threshold": (ctx(None, tiny_ops()), {"launch_bound"}),
    "tiny ops just below": (ctx(None, tiny_ops(tiny_op_time=0.2999)), set()),
    "tiny ops at the floor": (ctx(None, tiny_ops(**SHORT_STEP, tiny_op_time=0.001)), {"launch_bound"}),
    "tiny ops under the floor": (ctx(None, tiny_ops(**SHORT_STEP, tiny_op_time=0.000999)), set()),
    # thousands of short operators, most of them the DataLoader's or the step's time in long ones
    "many ops, few tiny ones": (
        ctx(None, cw(ops_per_step=5000.0, median_op_time=4e-6, host_op_time=0.95, tiny_op_time=0.1)),
        set(),
    ),
    "tiny ops on cuda": (gpu_ctx(None, tiny_ops(device_busy=0.95)), set()),
    # h2d_copy: exposed copies >= 10% of the step, CUDA only
    "exposed copies at 10%": (gpu_ctx(None, gw(h2d_exposed_time=0.10)), {"h2d_copy"}),
    "exposed copies just below": (gpu_ctx(None, gw(h2d_exposed_time=0.0999)), set()),
    # precision: fp32 GEMMs >= 30% of kernel time, "32-true", tensor cores
    "fp32 gemm at 30%": (gpu_ctx(None, fp32_gemms(0.3), facts=FP32_GPU), {"precision"}),
    "fp32 gemm just below": (gpu_ctx(None, fp32_gemms(0.2999), facts=FP32_GPU), set()),
    "fp32 gemm in bf16-mixed": (gpu_ctx(None, fp32_gemms(0.9)), set()),
    # memory_pressure: reserved / capacity >= 90% warning, >= 97% critical
    "memory at 90%": (gpu_ctx(gpu_epoch(cuda_max_reserved=72 * GiB)), {"memory_pressure"}),
    "memory just below 90%": (gpu_ctx(gpu_epoch(cuda_max_reserved=int(71.9 * GiB))), set()),
    # memory_growth: not falling over >= 3 epochs, +10% and +100 MiB
    "host memory +10%, +100 MiB": (with_history(1000, 1050, 1100), {"memory_growth"}),
    "host memory +99 MiB": (with_history(1000, 1050, 1099), set()),
    # optimizer_heavy: update >= 20% of the step
    "optimizer at 20%": (ctx(None, cw(optimizer_update_time=0.2, framework_time=0.05)), {"optimizer_heavy"}),
    "optimizer just below": (ctx(None, cw(optimizer_update_time=0.1999, framework_time=0.05)), set()),
    # validation_heavy: validation >= 30% of the training epoch's step time
    "validation at 30%": (validated(0.7, 0.3), {"validation_heavy"}),
    "validation just below": (validated(0.7, 0.2999), set()),
    # framework_overhead: outside torch ops >= 15% of the step
    "framework at 15%": (ctx(None, cw(framework_time=0.15)), {"framework_overhead"}),
    "framework just below": (ctx(None, cw(framework_time=0.1499)), set()),
    # step_time_unstable: p90/p50 >= 1.5, or >= 3 steps >= 3x the median
    "p90 1.5x p50": (ctx(step_times=spread(0.01, 0.015)), {"step_time_unstable"}),
    "p90 just below 1.5x": (ctx(step_times=spread(0.01, 0.01499)), set()),
    "p90 2x p50 of 9 batches": (ctx(step_times=spread(0.01, 0.02)[:9]), set()),
    "three spikes": (ctx(step_times=spiky(10, 40, 70)), {"step_time_unstable"}),
    "two spikes": (ctx(step_times=spiky(10, 40)), set()),
    "three steps just below 3x": (ctx(step_times=spiky(10, 40, 70, spike=0.0299)), set()),
    # communication_bound: exposed communication >= 15%, distributed only
    "communication at 15%": (
        gpu_ctx(None, gw(communication_time=0.3, communication_exposed_time=0.15), facts=DDP2),
        {"communication_bound"},
    ),
    "communication just below": (
        gpu_ctx(None, gw(communication_time=0.3, communication_exposed_time=0.1499), facts=DDP2),
        set(),
    ),
    "single process, no communication": (gpu_ctx(None, gw(communication_exposed_time=0.5)), set()),
    # rank_straggler: slowest / median rank >= 1.2
    "straggler at 1.2x": (ctx(rank_step_times={0: 0.010, 1: 0.010, 2: 0.012}), {"rank_straggler"}),
    "straggler just below": (ctx(rank_step_times={0: 0.010, 1: 0.010, 2: 0.0119}), set()),
    # cpu_threads: compute-bound CPU run on fewer threads than CPUs (warning below half, without workers)
    "one thread of eight": (ctx(facts=NO_WORKERS_ONE_THREAD), {"cpu_threads"}),
    "one thread, data-bound": (
        ctx(epoch(data_wait_fraction=0.5, data_wait=0.5), facts=NO_WORKERS_ONE_THREAD),
        {"dataloader_bound"},
    ),
    "one thread on cuda": (gpu_ctx(facts=facts(GPU, torch_threads=1, num_workers=0)), set()),
}


@pytest.mark.parametrize(("context", "expected"), CASES.values(), ids=CASES.keys())
def test_rules_fire_at_their_threshold_and_not_below(context, expected):
    assert ids(context) == expected


def exposed(seconds: float) -> TraceSummary:
    """A GPU window of 3 ms steps with ``seconds`` of exposed communication per step."""
    return gpu_window(step_time=0.003, communication_time=0.001, communication_exposed_time=seconds)


def short_step(**kw) -> TraceSummary:
    """A healthy GPU window of 1 ms steps, 90% busy."""
    values = dict(step_time=0.001, device_busy=0.0009, optimizer_update_time=1e-4, h2d_exposed_time=1e-5)
    return gpu_window(**{**values, **kw})


# Absolute floors: each case is well over its rule's relative threshold, at or just under its floor.
FLOOR_CASES = {
    # framework_overhead: >= 1 ms per step outside torch operators (25% of a 4 ms step)
    "framework at 1 ms": (ctx(None, window(step_time=0.004, framework_time=0.001)), {"framework_overhead"}),
    "framework under 1 ms": (ctx(None, window(step_time=0.004, framework_time=0.000999)), set()),
    # step_time_unstable: p90 - p50 >= 4 ms, a scheduler slice (2x the median)
    "p90 4 ms over p50": (ctx(step_times=spread(0.004, 0.008)), {"step_time_unstable"}),
    "p90 under 4 ms over p50": (ctx(step_times=spread(0.004, 0.007999)), set()),
    # step_time_unstable: spikes >= 4 ms over the median (3.5x a 1.6 ms median)
    "spikes 4 ms over the median": (
        ctx(step_times=spiky(10, 40, 70, spike=0.0056, base=0.0016)),
        {"step_time_unstable"},
    ),
    "spikes under 4 ms over the median": (ctx(step_times=spiky(10, 40, 70, spike=0.0055999, base=0.0016)), set()),
    # optimizer_heavy: >= 0.5 ms per step (25% of a 2 ms step)
    "optimizer 0.5 ms": (ctx(None, window(step_time=0.002, optimizer_update_time=0.0005)), {"optimizer_heavy"}),
    "optimizer under 0.5 ms": (ctx(None, window(step_time=0.002, optimizer_update_time=0.000499)), set()),
    # validation_heavy: >= 0.1 s of validation per training epoch (a third of it)
    "validation 0.1 s": (validated(0.2, 0.1), {"validation_heavy"}),
    "validation under 0.1 s": (validated(0.2, 0.0999), set()),
    # host_sync: >= 0.1 ms of GPU idle per step inside syncs (10% of a 1 ms step)
    "sync idle 0.1 ms": (gpu_ctx(None, short_step(syncs_per_step=1.0, sync_idle_time=1e-4)), {"host_sync"}),
    "sync idle under 0.1 ms": (gpu_ctx(None, short_step(syncs_per_step=1.0, sync_idle_time=0.99e-4)), set()),
    # device_idle: >= 0.5 ms idle per step (75% busy in a 2 ms step)
    "gpu idle 0.5 ms": (
        gpu_ctx(None, gpu_window(step_time=0.002, device_busy=0.0015, optimizer_update_time=0.0001)),
        {"device_idle"},
    ),
    "gpu idle under 0.5 ms": (
        gpu_ctx(None, gpu_window(step_time=0.002, device_busy=0.001501, optimizer_update_time=0.0001)),
        set(),
    ),
    # communication_bound: >= 0.5 ms exposed per step (a sixth of a 3 ms step)
    "communication 0.5 ms": (gpu_ctx(None, exposed(5e-4), facts=DDP2), {"communication_bound"}),
    "communication under 0.5 ms": (gpu_ctx(None, exposed(4.99e-4), facts=DDP2), set()),
    # rank_straggler: the slowest rank's excess >= 1 ms per step (1.25x, a fifth of a 5 ms step)
    "straggler 1 ms over": (
        ctx(epoch(step_time_p50=0.005, step_time_p90=0.0055), rank_step_times={0: 0.004, 1: 0.004, 2: 0.005}),
        {"rank_straggler"},
    ),
    "straggler under 1 ms over": (
        ctx(epoch(step_time_p50=0.005, step_time_p90=0.0055), rank_step_times={0: 0.004, 1: 0.004, 2: 0.004999}),
        set(),
    ),
    # h2d_copy: >= 0.5 ms of exposed copies per step (25% of a 2 ms step)
    "h2d 0.5 ms": (
        gpu_ctx(None, gpu_window(step_time=0.002, h2d_exposed_time=5e-4, h2d_time=6e-4, optimizer_update_time=1e-4)),
        {"h2d_copy"},
    ),
    "h2d under 0.5 ms": (
        gpu_ctx(None, gpu_window(step_time=0.002, h2d_exposed_time=4.99e-4, h2d_time=6e-4, optimizer_update_time=1e-4)),
        set(),
    ),
    # precision: fp32 GEMMs of >= 0.5 ms per step (half of a 1 ms kernel time)
    "fp32 GEMMs 0.5 ms": (
        gpu_ctx(None, gpu_window(kernel_time=0.001, fp32_gemm_time=5e-4), facts=FP32_GPU),
        {"precision"},
    ),
    "fp32 GEMMs under 0.5 ms": (
        gpu_ctx(None, gpu_window(kernel_time=0.001, fp32_gemm_time=4.99e-4), facts=FP32_GPU),
        set(),
    ),
    # cpu_threads: only steps of 1 ms or more (one thread of eight)
    "one thread, 1 ms steps": (
        ctx(epoch(step_time_p50=0.001, step_time_p90=0.0011), facts=NO_WORKERS_ONE_THREAD),
        {"cpu_threads"},
    ),
    "one thread, steps under 1 ms": (
        ctx(epoch(step_time_p50=0.000999, step_time_p90=0.0011), facts=NO_WORKERS_ONE_THREAD),
        set(),
    ),
}


@pytest.mark.parametrize(("context", "expected"), FLOOR_CASES.values(), ids=FLOOR_CASES.keys())
def test_a_fraction_of_a_millisecond_stays_under_the_floors(context, expected):
    assert ids(context) == expected


FIRING = {name: case for name, case in CASES.items() if case[1]}


@pytest.mark.parametrize(("context", "expected"), FIRING.values(), ids=FIRING.keys())
def test_every_finding_shows_its_numbers_threshold_and_advice(context, expected):
    findings = diagnose(context)
    assert findings
    for f in findings:
        assert f.stage == context.stage and f.epoch == context.epoch.epoch
        assert f.title and "\n" not in f.title and len(f.title) < 90, f.title
        assert re.search(r"\d", f.evidence) and re.search(r"(>=|<) ?\d", f.evidence), f.evidence
        assert "`" in f.advice, f.advice  # names a concrete argument or call


# --- advice fits the device and the stage -------------------------------------------------------------------


def with_stage(context: StageEpoch, stage: str) -> StageEpoch:
    return dataclasses.replace(context, epoch=dataclasses.replace(context.epoch, stage=stage))


# Remedies that need a CUDA device (or, `foreach`, pay only there: on CPU it runs the same per-parameter loop).
CUDA_ONLY = (
    "cuda", "gpu", "nccl", "nvidia", "cudnn", "tensor core", "pin_memory=True", "non_blocking",
    "expandable_segments", "foreach=True",
)  # fmt: skip
# Hooks, settings and code that only training runs: in validation, test and predict they change nothing.
TRAINING_ONLY = (
    "on_train_batch", "on_train_epoch", "training_step", "log_every_n_steps", "every_n_train_steps",
    "accumulate_grad_batches", "val_check_interval", "optimizer", "backward", "torch.utils.checkpoint",
    "loss scaler", "gradient_as_bucket_view",
)  # fmt: skip
TRAINING_RULES = {
    "fsdp_all_gathers",
    "memory_breakdown",
    "optimizer_heavy",
    "validation_heavy",
    "rank_straggler",
    "compile_unused",
}  # judged in training epochs only
STAGES = ("train", "validate", "test", "predict")

# Dynamo's graph-break reasons and failed guards, one per class of advice (torch 2.13's texts).
COMPILE_BREAK_REASONS = (
    "Unsupported Tensor.item() call with capture_scalar_outputs=False",
    "logging.Logger method not supported for non-export cases",
    "Data-dependent branching",
    "Dynamic shape operator",
    "Failed to trace builtin operator",
    "Skip calling `torch.compiler.disable()`d function",
    "Call to `torch._dynamo.graph_break()`",
)
COMPILE_GUARDS = (
    "0/0: n == 1",
    "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 2",
    "0/0: L['self'].training == True",
    "tensor 'x' dtype mismatch. expected Float, actual Half",
    "0/0: ___check_obj_id(L['cfg'], 140234)",
)

# Per rule and device, contexts that fire it in training, one per branch of its advice.
ADVICE_CASES = {
    "dataloader_bound": {
        "cpu": [
            ctx(epoch(data_wait_fraction=0.5, data_wait=0.5), facts=facts(num_workers=8, cpu_count=8)),
            ctx(epoch(data_wait_fraction=0.5, data_wait=0.5), facts=facts(num_workers=0, pin_memory=False)),
        ],
        "cuda": [gpu_ctx(gpu_epoch(data_wait_fraction=0.5, data_wait=0.5), facts=facts(GPU, pin_memory=False))],
    },
    "host_sync": {"cuda": [gpu_ctx(None, gw(syncs_per_step=2.0, sync_idle_time=0.1))]},
    "device_idle": {
        "cuda": [
            gpu_ctx(None, gw(device_busy=0.3)),
            gpu_ctx(None, gw(device_busy=0.3, framework_time=0.3, communication_exposed_time=0.2), facts=DDP2),
        ]
    },
    "launch_bound": {
        "cpu": [ctx(None, tiny_ops())],
        "cuda": [gpu_ctx(None, gw(device_busy=0.5, median_kernel_time=4e-6))],
    },
    "h2d_copy": {
        "cuda": [gpu_ctx(None, gw(h2d_exposed_time=0.3, h2d_pageable=True), facts=facts(GPU, pin_memory=False))]
    },
    "precision": {
        "cuda": [
            gpu_ctx(None, fp32_gemms(0.6), facts=FP32_GPU),
            gpu_ctx(None, fp32_gemms(0.6, device_name="Tesla V100-SXM2-16GB"), facts=FP32_GPU),
        ]
    },
    "memory_pressure": {
        "cuda": [gpu_ctx(gpu_epoch(cuda_max_reserved=79 * GiB, cuda_max_allocated=50 * GiB), facts=FP32_GPU)]
    },
    "memory_breakdown": {
        "cpu": [ctx(facts=facts(CPU, memory=ADAM_MEMORY))],
        "cuda": [
            gpu_ctx(
                gpu_epoch(cuda_max_reserved=70 * GiB, cuda_max_allocated=60 * GiB),
                facts=facts(FP32_GPU, memory={**ADAM_MEMORY, "activations": 40 * GiB, "allocator_overhead": 10 * GiB}),
            )
        ],
    },
    "memory_growth": {
        "cpu": [with_history(1000, 1100, 1200)],
        "cuda": [with_history(1000, 1100, 1200, field="cuda_max_allocated", facts=GPU)],
    },
    "optimizer_heavy": {
        "cpu": [ctx(None, cw(optimizer_update_time=0.3, optimizer_foreach=foreach)) for foreach in (False, True)],
        "cuda": [gpu_ctx(None, gw(optimizer_update_time=0.3, optimizer_foreach=foreach)) for foreach in (False, True)],
    },
    "validation_heavy": {
        "cpu": [validated(0.7, 0.5)],
        "cuda": [dataclasses.replace(validated(0.7, 0.5), facts=GPU)],
    },
    "framework_overhead": {"cpu": [ctx(None, cw(framework_time=0.3))], "cuda": [gpu_ctx(None, gw(framework_time=0.3))]},
    "step_time_unstable": {
        device: [
            ctx(step_times=spiky(49, 99, 149, 199, n=200), facts=run_facts),  # every 50 batches
            ctx(step_times=spiky(5, 17, 60, 61), facts=run_facts),  # irregular
            ctx(step_times=spiky(5, 17, 60, 61), facts=facts(run_facts, num_workers=0)),
            ctx(step_times=spread(0.01, 0.025), facts=run_facts),  # a wide spread
        ]
        for device, run_facts in (("cpu", CPU), ("cuda", GPU))
    },
    "communication_bound": {
        "cpu": [ctx(None, cw(communication_time=0.3, communication_exposed_time=0.3), facts=facts(world_size=2))],
        "cuda": [gpu_ctx(None, gw(communication_time=0.4, communication_exposed_time=0.3), facts=DDP2)],
    },
    "small_collectives": {
        "cpu": [ctx(None, cw(step_time=0.1), facts=facts(world_size=2), collectives={W1: (scalar_reduces(8, 0.008),)})],
        "cuda": [gpu_ctx(None, gw(), facts=DDP2, collectives={W1: (scalar_reduces(8, 0.08, nbytes=4),)})],
    },
    "fsdp_all_gathers": {"cuda": [gpu_ctx(None, gw(), facts=DDP2, collectives={W1: fsdp(exposed=0.3)})]},
    "low_bus_bandwidth": {"cuda": [gpu_ctx(None, gw(), facts=DDP2, collectives={W1: (slow_reduce(32 * 2**20, 1.0),)})]},
    "rank_straggler": {
        device: [ctx(facts=facts(run_facts, world_size=2), rank_step_times={0: 0.03, 1: 0.01})]
        for device, run_facts in (("cpu", CPU), ("cuda", GPU))
    },
    "cpu_threads": {"cpu": [ctx(facts=NO_WORKERS_ONE_THREAD), ctx(facts=facts(torch_threads=1, num_workers=2))]},
    "cpu_contention": {
        device: [ctx(epoch(cpu_wait_share=0.6, wall_time=1.0), facts=run_facts)]
        for device, run_facts in (("cpu", CPU), ("cuda", GPU))
    },
    "compile_graph_breaks": {
        device: [
            ctx(facts=run_facts, compile=compile_stats(breaks=1, break_sites=(GraphBreak(reason, "/tmp/m.py:9", 1),)))
            for reason in (*COMPILE_BREAK_REASONS, "")
        ]
        for device, run_facts in (("cpu", CPU), ("cuda", GPU))
    },
    "compile_recompiles": {
        device: [
            ctx(
                facts=run_facts,
                compile=compile_stats(recompiles=8, recompile_guards=(Recompile("g (m.py:3)", guard, 8),)),
            )
            for guard in (*COMPILE_GUARDS, "new")
        ]
        + [ctx(facts=run_facts, compile=compile_stats(recompiles=1, limit_reached=True))]
        for device, run_facts in (("cpu", CPU), ("cuda", GPU))
    },
    "compile_time": {
        device: [
            ctx(facts=run_facts, compile=compile_stats(seconds=0.5)),
            ctx(facts=run_facts, compile=compile_stats(seconds=0.5, recompiles=2), history=(epoch(),)),
        ]
        for device, run_facts in (("cpu", CPU), ("cuda", GPU))
    },
    "compile_unused": {
        device: [ctx(facts=facts(run_facts, compiled_modules="`LightningModule`"))]
        for device, run_facts in (("cpu", CPU), ("cuda", GPU))
    },
}
ADVICE = [
    pytest.param(rule_id, device, i, stage, id=f"{rule_id}-{device}-{i}-{stage}")
    for rule_id, devices in ADVICE_CASES.items()
    for device, contexts in devices.items()
    for i in range(len(contexts))
    for stage in STAGES
]


@pytest.mark.parametrize(("rule_id", "device", "case", "stage"), ADVICE)
def test_advice_fits_the_device_and_the_stage(rule_id, device, case, stage):
    assert set(ADVICE_CASES) == set(RULES)  # every rule in the registry
    context = ADVICE_CASES[rule_id][device][case]
    assert (context.facts.device == "cpu") == (device == "cpu")
    assert run(rule_id, with_stage(context, "train")) is not None  # the case fires
    f = run(rule_id, with_stage(context, stage))
    if rule_id in TRAINING_RULES and stage != "train":
        assert f is None
        return
    assert f is not None and f.stage == stage
    text = f"{f.title} {f.advice}".lower()
    if device == "cpu":
        assert [word for word in CUDA_ONLY if word.lower() in text] == [], f.advice
    if stage != "train":
        assert [word for word in TRAINING_ONLY if word.lower() in text] == [], f.advice


def test_catalogue_ids_and_order_are_fixed():
    assert list(RULES) == [
        "cpu_contention", "dataloader_bound", "host_sync", "device_idle", "launch_bound", "h2d_copy", "precision",
        "memory_pressure", "memory_breakdown", "memory_growth", "optimizer_heavy", "validation_heavy",
        "framework_overhead", "step_time_unstable", "compile_graph_breaks", "compile_recompiles", "compile_time",
        "compile_unused", "communication_bound", "small_collectives", "low_bus_bandwidth", "fsdp_all_gathers",
        "rank_straggler", "cpu_threads",
    ]  # fmt: skip


# --- memory_breakdown ---------------------------------------------------------------------------------------


def test_memory_breakdown_names_the_largest_part_and_its_cures_first_and_warns_when_memory_is_tight():
    info = run("memory_breakdown", ctx(facts=facts(CPU, memory=ADAM_MEMORY)))
    assert (
        info.severity == "info" and info.title == "The largest part of training memory: optimizer state, 50% (8.0 GiB)"
    )
    assert info.advice.startswith("What would shrink it, with the predicted savings: an optimizer with one state")
    assert "activations are measured on CUDA, or in a training window with profile_memory=True" in info.evidence
    tight = gpu_ctx(
        gpu_epoch(cuda_max_reserved=70 * GiB, cuda_max_allocated=60 * GiB),
        facts=facts(FP32_GPU, memory={**ADAM_MEMORY, "activations": 40 * GiB, "allocator_overhead": 10 * GiB}),
    )
    f = run("memory_breakdown", tight)
    assert f.severity == "warning" and "activations and temporaries, 60%" in f.title  # 40 of 66 GiB
    # Half the batch saves half the activations (20 GiB); bf16-mixed as much less autocast's bf16 weights (18 GiB).
    assert f.advice.startswith("What would shrink it, with the predicted savings: half the `batch_size`")
    bf16 = '`Trainer(precision="bf16-mixed")`: activations in bf16, less the bf16 copies of the weights: about 18.0'
    assert bf16 in f.advice
    assert "peak reserved 70.0 GiB of 80.0 GiB (warning >= 85%)" in f.evidence
    assert run("memory_breakdown", ctx(facts=CPU)) is None  # not counted (validate, test, predict; no training)


# --- dataloader_bound: tests/diagnose/test_loader_advice.py---------------------------------------------------


# --- host_sync ----------------------------------------------------------------------------------------------


def test_host_sync_names_the_window_with_the_most_idle_time_and_what_causes_syncs():
    context = gpu_ctx(
        None,
        gw(W1, syncs_per_step=4.0, sync_idle_time=0.06),
        gw(W2, syncs_per_step=2.0, sync_idle_time=0.12),
    )
    f = run("host_sync", context)
    assert f.severity == "warning" and f.window == W2
    assert "2 host-device syncs per step leave the GPU idle 12% of the step" in f.evidence
    assert "(warning: >= 1 per step with >= 5% of the step idle and >= 0.10 ms per step)" in f.evidence
    for pattern in (".item()", "sync_dist=True", "torch.nonzero", "log_every_n_steps"):
        assert pattern in f.advice


# --- device_idle --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("busy", "severity"), [(0.7999, "warning"), (0.50, "warning"), (0.4999, "critical")])
def test_device_idle_severity(busy, severity):
    f = run("device_idle", gpu_ctx(None, gw(device_busy=busy)))
    assert f.severity == severity


def test_device_idle_names_the_least_busy_window_and_its_explanation():
    context = gpu_ctx(
        gpu_epoch(data_wait_fraction=0.4),
        gw(W1, device_busy=0.7),
        gw(W2, device_busy=0.3, dataloader_time=0.5),
    )
    f = run("device_idle", context)
    assert f.window == W2 and f.title == "GPU busy only 30% of each training step"
    assert "(warning < 80%, critical < 50%, with >= 0.50 ms idle per step)" in f.evidence
    assert "dataloader_bound" in f.advice and "No other signal" not in f.advice


def test_device_idle_advice_names_syncs_or_short_kernels_when_they_explain_it():
    syncs = gw(device_busy=0.6, syncs_per_step=2.0, sync_idle_time=0.2)
    assert "host_sync" in run("device_idle", gpu_ctx(None, syncs)).advice
    short = gw(device_busy=0.6, median_kernel_time=3e-6)
    assert "launch_bound" in run("device_idle", gpu_ctx(None, short)).advice
    unexplained = run("device_idle", gpu_ctx(None, gw(device_busy=0.6)))
    assert "No other signal explains it" in unexplained.advice and "batch_size" in unexplained.advice


# --- launch_bound -------------------------------------------------------------------------------------------


def test_launch_bound_on_gpu_names_the_least_busy_window_and_suggests_compile():
    context = gpu_ctx(
        None,
        gw(W1, device_busy=0.7, median_kernel_time=4e-6),
        gw(W2, device_busy=0.4, median_kernel_time=4e-6),
    )
    f = run("launch_bound", context)
    assert f.severity == "warning" and f.window == W2
    assert "median kernel 4.0 us (threshold < 10.0 us)" in f.evidence and "GPU busy 40%" in f.evidence
    assert "torch.compile(model)" in f.advice and "trainer.fit" in f.advice and "CUDA graph" in f.advice


def test_launch_bound_on_cpu_names_the_window_with_the_largest_tiny_op_share_and_suggests_vectorizing():
    context = ctx(None, tiny_ops(W1, tiny_op_time=0.4, tiny_ops_per_step=3000.0), tiny_ops(W2, tiny_op_time=0.629))
    f = run("launch_bound", context)
    assert f.window == W2 and f.title == "Training spends 62% of each step in 1,500 tiny operators"
    assert f.evidence == (
        "62% of the step (629.00 ms of 1000.00 ms) in 1,500 operators shorter than 20.0 us each and the Python"
        f" calling them, outside the DataLoader in window {W2} (the strongest of 2 windows) (warning >= 30% and"
        " >= 1.00 ms per step)"
    )
    assert "Vectorize" in f.advice and "torch.compile" in f.advice and "CUDA" not in f.advice
    # The GPU rule reads kernels, not host operators: the same window on CUDA is not launch-bound.
    assert run("launch_bound", ctx(None, tiny_ops(tiny_op_time=0.9), facts=GPU)) is None


def test_launch_bound_on_cpu_counts_no_operators_a_report_did_not_measure():
    # A report from before tiny operators were measured: thousands of short operators covering the step.
    old = cw(ops_per_step=5000.0, median_op_time=4e-6, host_op_time=0.95, framework_time=0.01)
    assert old.tiny_op_time is None and run("launch_bound", ctx(None, old)) is None


def test_launch_bound_thresholds_override_and_its_cutoff_is_the_summarys():
    assert run("launch_bound", ctx(None, tiny_ops(tiny_op_time=0.2)), launch_cpu_tiny_ops=0.2) is not None
    floor = tiny_ops(step_time=0.01, tiny_op_time=0.005, framework_time=0.001)
    assert run("launch_bound", ctx(None, floor)) is not None
    assert run("launch_bound", ctx(None, floor), launch_cpu_min_time=0.0051) is None
    assert pytest.approx(step_summary.TINY_OP_US * 1e-6) == rules_device.TINY_OP_TIME


# --- h2d_copy -----------------------------------------------------------------------------------------------


def test_h2d_copy_from_pageable_memory_advises_pinning():
    pageable = gw(W2, h2d_time=0.3, h2d_exposed_time=0.2, h2d_pageable=True)
    f = run("h2d_copy", gpu_ctx(None, gpu_window(W1), pageable, facts=facts(GPU, pin_memory=False)))
    assert f.window == W2 and f.severity == "warning"
    assert (
        "take 20% of the step" in f.evidence
        and "(warning >= 10% and >= 0.50 ms per step)" in f.evidence
        and "pageable" in f.evidence
    )
    assert "`DataLoader(pin_memory=True)`" in f.advice and "non_blocking=True" in f.advice


def test_h2d_copy_already_pinned_advises_fewer_bytes():
    pinned = gw(h2d_time=0.3, h2d_exposed_time=0.2, h2d_pageable=False)
    f = run("h2d_copy", gpu_ctx(None, pinned))
    assert "pin_memory=True" not in f.advice and "smaller dtypes" in f.advice


def test_h2d_copy_is_cuda_only():
    copies = gw(h2d_exposed_time=0.5)
    assert run("h2d_copy", ctx(None, copies)) is None


# --- precision ----------------------------------------------------------------------------------------------


def _fp32_gemms(name=W1, **kw):
    return gpu_window(name, **{"step_time": 1.0, "device_busy": 0.95, "kernel_time": 1.0, "fp32_gemm_time": 0.6, **kw})


@pytest.mark.parametrize(
    ("precision", "tensor_cores", "fires"),
    [("32-true", True, True), ("32", True, True), ("bf16-mixed", True, False), ("16-mixed", True, False),
     ("32-true", False, False), (None, True, False)],
)  # fmt: skip
def test_precision_only_for_fp32_on_a_tensor_core_gpu(precision, tensor_cores, fires):
    context = gpu_ctx(None, _fp32_gemms(tensor_core_capable=tensor_cores), facts=facts(GPU, precision=precision))
    assert (run("precision", context) is not None) == fires


def test_precision_is_cuda_only():
    assert run("precision", ctx(None, _fp32_gemms(), facts=facts(precision="32-true"))) is None


def test_precision_advice_on_ampere_is_bf16_or_tf32_and_on_volta_fp16():
    a100 = run("precision", gpu_ctx(None, _fp32_gemms(W2), facts=facts(GPU, precision="32-true")))
    assert a100.window == W2 and a100.title == "60% of GPU time in fp32 matmuls without tensor cores"
    assert '`Trainer(precision="bf16-mixed")`' in a100.advice
    assert 'torch.set_float32_matmul_precision("high")' in a100.advice and "2-8x" in a100.advice
    v100 = _fp32_gemms(device_name="Tesla V100-SXM2-16GB")
    f = run("precision", gpu_ctx(None, v100, facts=facts(GPU, precision="32-true", device_name="Tesla V100-SXM2-16GB")))
    assert '`Trainer(precision="16-mixed")`' in f.advice and "bf16-mixed" not in f.advice


# --- memory_pressure ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reserved", "severity"), [(0.90, "warning"), (0.9699, "warning"), (0.97, "critical")])
def test_memory_pressure_severity(reserved, severity):
    capacity = 100 * GiB
    e = gpu_epoch(
        cuda_capacity=capacity, cuda_max_reserved=int(reserved * capacity), cuda_max_allocated=int(0.89 * capacity)
    )
    f = run("memory_pressure", gpu_ctx(e))
    assert f.severity == severity and f.window is None
    assert "(warning >= 90%, critical >= 97%)" in f.evidence


def test_memory_pressure_advice_leads_with_expandable_segments_when_fragmented():
    fragmented = gpu_epoch(cuda_capacity=80 * GiB, cuda_max_reserved=76 * GiB, cuda_max_allocated=50 * GiB)
    f = run("memory_pressure", gpu_ctx(fragmented))
    assert f.title == "GPU memory 95% full during training"
    assert "26.0 GiB (34%) reserved but unused" in f.evidence
    assert f.advice.startswith("The cache is fragmented") and "expandable_segments:True" in f.advice
    assert "accumulate_grad_batches" in f.advice
    tight = gpu_epoch(cuda_capacity=80 * GiB, cuda_max_reserved=76 * GiB, cuda_max_allocated=75 * GiB)
    assert "expandable_segments" not in run("memory_pressure", gpu_ctx(tight)).advice


def test_memory_pressure_suggests_bf16_only_in_fp32():
    full = gpu_epoch(cuda_capacity=80 * GiB, cuda_max_reserved=76 * GiB, cuda_max_allocated=75 * GiB)
    assert "bf16-mixed" not in run("memory_pressure", gpu_ctx(full)).advice  # already bf16-mixed
    assert "bf16-mixed" in run("memory_pressure", gpu_ctx(full, facts=facts(GPU, precision="32-true"))).advice


def test_memory_pressure_needs_cuda_numbers():
    assert run("memory_pressure", ctx(epoch())) is None


# --- memory_growth ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peaks", "fires"),
    [
        ((1000, 1100, 1200), True),
        ((1000, 1200), False),  # two epochs are no trend
        ((900, 1000, 1000, 1100), True),  # flat epochs are allowed inside the run
        ((1000, 1100, 1100), False),  # not rising in this epoch
        ((1000, 1300, 1200, 1250, 1300), False),  # fell two epochs ago: the run is 1200 -> 1300, +8%
        ((2000, 2050, 2150), False),  # +150 MiB but only +7.5%
        ((500, 530, 560), False),  # +12% but only +60 MiB
    ],
)  # fmt: skip
def test_memory_growth_needs_a_sustained_rise(peaks, fires):
    assert (run("memory_growth", with_history(*peaks)) is not None) == fires


def test_memory_growth_evidence_and_advice():
    f = run("memory_growth", with_history(1024, 1100, 1200, 1300))
    assert f.severity == "warning" and f.title == "Host memory grows every training epoch: +276 MiB over 4 epochs"
    assert "host memory (RSS peak) rose over 4 epochs: 1.0 GiB -> 1.3 GiB (+276 MiB, +26%)" in f.evidence
    assert ">= 3 epochs" in f.evidence and ">= 10%" in f.evidence and ">= 100 MiB" in f.evidence
    assert "loss.detach()" in f.advice


def test_memory_growth_counts_the_epochs_of_records_measured_together():
    # Short epochs measured in groups (epoch_report, Notes 2): four records of 1, 5, 5 and 5 epochs.
    context = with_history(1024, 1100, 1200, 1300)
    grouped = [
        dataclasses.replace(e, epochs=1 if i == 0 else 5) for i, e in enumerate((*context.history, context.epoch))
    ]
    f = run("memory_growth", ctx(grouped[-1], facts=CPU, history=grouped[:-1]))
    assert f.title == "Host memory grows every training epoch: +276 MiB over 16 epochs"
    assert "rose over 16 epochs" in f.evidence


def test_memory_growth_on_the_gpu():
    f = run("memory_growth", with_history(1000, 1100, 1200, field="cuda_max_allocated", facts=GPU))
    assert f.title.startswith("GPU memory grows") and "GPU allocated memory" in f.evidence


def test_memory_growth_epochs_is_a_threshold():
    assert run("memory_growth", with_history(1000, 1100, 1200), memory_growth_epochs=4) is None
    assert run("memory_growth", with_history(1000, 1200), memory_growth_epochs=2) is not None


# --- optimizer_heavy ----------------------------------------------------------------------------------------


def test_optimizer_heavy_single_tensor_update_advises_foreach_or_fused():
    context = ctx(
        None,
        cw(W1, optimizer_update_time=0.25, framework_time=0.05),
        cw(W2, optimizer_update_time=0.40, optimizer_update_ops=1600.0, optimizer_foreach=False, framework_time=0.05),
    )
    f = run("optimizer_heavy", context)
    assert f.window == W2 and f.title == "Optimizer update takes 40% of each training step"
    assert "1,600 operators" in f.evidence and "(warning >= 20% and >= 0.50 ms per step)" in f.evidence
    # On CPU `foreach` runs the same per-parameter loop (no faster, measured): only `fused` is advised there.
    assert "fused=True" in f.advice and "foreach=True" not in f.advice and "does not help" in f.advice
    looped = gw(W2, optimizer_update_time=0.40, optimizer_foreach=False)
    on_gpu = run("optimizer_heavy", gpu_ctx(None, looped))
    assert "`torch.optim.AdamW(..., foreach=True)`" in on_gpu.advice and "fused=True" in on_gpu.advice


def test_optimizer_heavy_with_foreach_already_advises_fused_and_fewer_tensors():
    f = run("optimizer_heavy", gpu_ctx(None, gw(optimizer_update_time=0.3)))
    assert "already uses multi-tensor kernels" in f.advice
    assert "fused=True" in f.advice and "Fewer optimizer states" in f.advice
    on_cpu = run("optimizer_heavy", ctx(None, cw(optimizer_update_time=0.3, optimizer_foreach=True)))
    assert "On CPU `foreach` runs the same per-parameter loop" in on_cpu.advice and "fused=True" in on_cpu.advice


def optimizer_ctx(**kw):
    return ctx(None, cw(optimizer_update_time=0.3, optimizer_foreach=True), facts=facts(**kw))


def test_optimizer_heavy_advises_only_what_would_change_the_runs_own_optimizer():
    # Already fused (the trace shows aten::_fused_adam_): no `fused=True` again.
    fused = run("optimizer_heavy", optimizer_ctx(optimizer="Adam", optimizer_fused=True, optimizer_fusable=True))
    assert "already fused (`Adam(..., fused=True)`)" in fused.advice and "fused=True)`," not in fused.advice
    # SGD: fused SGD, never "SGD with momentum instead of Adam".
    sgd = run("optimizer_heavy", optimizer_ctx(optimizer="SGD", optimizer_fused=False, optimizer_fusable=True))
    assert "`torch.optim.SGD(..., fused=True)`" in sgd.advice and "instead of Adam" not in sgd.advice
    assert "SGD with momentum" not in sgd.advice
    # A class with no fused kernels (RMSprop, a library's): no fused advice at all.
    other = run("optimizer_heavy", optimizer_ctx(optimizer="RMSprop", optimizer_fusable=False))
    assert "fused=True" not in other.advice and "`RMSprop` has no fused implementation" in other.advice


# --- validation_heavy ---------------------------------------------------------------------------------------


def test_validation_heavy_counts_every_validation_run_of_the_epoch():
    runs = tuple(epoch(stage="validate", epoch=i, step_time=0.5, batches=20) for i in range(3))
    f = run("validation_heavy", ctx(epoch(step_time=1.0), validation=runs))
    assert f.title == "Validation takes 60% of each training epoch"
    assert "validation 60% of the epoch's step time (1.50 s, training 1.00 s); this epoch 3 runs of 60 batches" in (
        f.evidence
    )
    assert "limit_val_batches" in f.advice and "check_val_every_n_epoch" in f.advice
    assert "val_check_interval" in f.advice  # several runs per epoch


def test_validation_heavy_from_one_training_batch_is_information():
    # Trainer(fast_dev_run=True): one training batch and one validation batch, whose start-up made validation 31%
    # of the epoch in 1 of 6 runs: a warning from one batch each, before.
    smoke = ctx(epoch(step_time=0.02, batches=1), validation=(epoch(stage="validate", step_time=0.2, batches=1),))
    [f] = [f for f in diagnose(smoke) if f.id == "validation_heavy"]
    assert f.severity == "info" and f.evidence.startswith("from 1 batch only (a warning needs 8); ")


def test_validation_heavy_judges_the_fit_and_names_step_based_validation():
    # Validation every 100 steps across one-batch epochs: one epoch holds a whole run (49% of that epoch), the
    # fit so far 5%: no finding.
    one_run = (epoch(stage="validate", step_time=0.96, batches=20),)
    one_batch = epoch(step_time=1.0, batches=1)
    step_based = facts(val_check_steps=100)
    assert run("validation_heavy", ctx(one_batch, validation=one_run, facts=step_based)) is not None  # per epoch
    fit = ctx(one_batch, validation=one_run, facts=step_based, fit_seconds=(19.0, 0.96))
    assert run("validation_heavy", fit) is None
    heavy = run("validation_heavy", ctx(one_batch, validation=one_run, facts=step_based, fit_seconds=(1.0, 0.96)))
    assert heavy.title == "Validation takes 48% of the fit" and "the fit so far's step time" in heavy.evidence
    assert "every 100 training batches" in heavy.advice and "validates every N epochs" not in heavy.advice


def test_validation_heavy_is_for_training_epochs_only():
    val = (epoch(stage="validate", step_time=5.0),)
    assert run("validation_heavy", ctx(epoch(stage="validate"), validation=val)) is None
    assert run("validation_heavy", ctx(epoch())) is None


# --- framework_overhead -------------------------------------------------------------------------------------


def test_framework_overhead_names_the_window_and_the_usual_suspects():
    context = ctx(None, cw(W1, framework_time=0.2), cw(W2, framework_time=0.5))
    f = run("framework_overhead", context)
    assert f.window == W2 and f.title == "Training spends 50% of each step outside torch operators"
    for pattern in ("sync_dist=True", "TQDMProgressBar(refresh_rate=", "log_every_n_steps", "on_train_batch_end"):
        assert pattern in f.advice


def test_framework_overhead_names_the_stages_own_hook_and_logging():
    heavy = cw(framework_time=0.3)
    validation = run("framework_overhead", ctx(epoch(stage="validate"), heavy))
    assert "`on_validation_batch_end`" in validation.advice
    # Eval logs once per epoch by default, but each `self.log` call costs the same bookkeeping every batch.
    assert "`self.log(...)` in `validation_step`" in validation.advice
    assert "log them once in `on_validation_epoch_end`" in validation.advice
    assert "log_every_n_steps" not in validation.advice  # it paces training's logging only
    prediction = run("framework_overhead", ctx(epoch(stage="predict"), heavy))
    assert "`on_predict_batch_end`" in prediction.advice and "self.log" not in prediction.advice  # predict can't log
    assert "0.3-1 ms" in prediction.advice  # Lightning's own loop, which no setting removes


# --- step_time_unstable -------------------------------------------------------------------------------------


def _steps(spikes, n=200, base=0.01, spike=0.05):
    return tuple(spike if i in spikes else base for i in range(n))


def test_periodic_spikes_are_named_with_their_period():
    f = run("step_time_unstable", ctx(step_times=_steps({7, 15, 23, 31, 39}, n=40)))
    assert f.title == "Training stalls every 8 batches"
    assert "5 steps >= 3x the median 10.00 ms at batches 7, 15, 23, 31, 39 (every 8 batches)" in f.evidence
    # On a cadence: the program's, judged from 1 ms above the median (an irregular spike needs a scheduler slice).
    assert "(warning >= 3 spikes, each >= 1.00 ms above the median)" in f.evidence
    assert "Something runs every 8 batches" in f.advice and "log_every_n_steps" in f.advice


def test_a_stray_spike_does_not_hide_the_period():
    f = run("step_time_unstable", ctx(step_times=_steps({7, 15, 23, 26, 31, 39}, n=40)))
    assert f.title == "Training stalls every 8 batches"
    assert "at batches 7, 15, 23, 26, 31, 39 (5 of them every 8 batches)" in f.evidence


def test_spikes_on_a_cadence_in_one_stretch_of_the_epoch_are_no_cadence():
    # Every 8 batches in the first 40 of 200, then none: the cycle does not hold across the epoch (the cadence's own
    # tests: tests/diagnose/test_cadence.py).
    f = run("step_time_unstable", ctx(step_times=_steps({7, 15, 23, 31, 39})))
    assert "every" not in f.title and "Irregular stalls" in f.advice


def test_spikes_every_50_batches_point_at_lightnings_logging_cadence():
    f = run("step_time_unstable", ctx(step_times=_steps({49, 99, 149, 199})))
    assert "(50 is Lightning's default `log_every_n_steps`: most likely logging)" in f.advice


def test_irregular_spikes_get_generic_advice():
    f = run("step_time_unstable", ctx(step_times=_steps({5, 17, 60, 61})))
    assert "every" not in f.title and "Irregular stalls" in f.advice and "gc.freeze()" in f.advice


def test_the_first_step_is_warm_up_not_a_spike():
    assert run("step_time_unstable", ctx(step_times=_steps({0, 50, 100}))) is None


# A checkpoint every 8 batches of 1.1-ms steps (Lightning's BoringModel with ModelCheckpoint(every_n_train_steps=8)):
# each save 1.9 ms slower, under a scheduler slice, 2.7x the median: a spread, on a cadence.
CHECKPOINTS = tuple(0.003 if i % 8 == 7 else 0.0011 for i in range(96))


def test_slow_steps_on_a_cadence_are_named_from_1_ms_with_their_period():
    f = run("step_time_unstable", ctx(step_times=CHECKPOINTS))
    assert f.title == "Training stalls every 8 batches"
    assert (
        "every 8 batches (at batches 7, 15, 23, 31, 39, 47, 55, 63, ...) a step 1.90 ms slower than the other batches'"
        " median 1.10 ms, in 12 of 12 cycles (a cadence: each cycle's slow step at the same position, from 1.00 ms"
        " above the others and 2% of the epoch)" in f.evidence
    )
    assert "(warning >= 1.5x and >= 1.00 ms above it)" in f.evidence
    assert "`ModelCheckpoint(every_n_train_steps=...)`" in f.advice


@pytest.mark.parametrize(
    "steps",
    [
        # the same slow steps at random batches: a busy machine's preemptions, under a slice
        tuple(0.003 if i in {3, 9, 10, 22, 29, 41, 44, 58, 66, 67, 80, 91} else 0.0011 for i in range(96)),
        # a cadence of 2: gradient accumulation's optimizer step, or random stalls dense enough to fill its slots
        tuple(0.003 if i % 2 else 0.0011 for i in range(96)),
    ],
    ids=["irregular", "every 2"],
)
def test_slow_steps_under_a_scheduler_slice_off_a_cadence_are_steady(steps):
    assert run("step_time_unstable", ctx(step_times=steps)) is None


def test_a_wide_spread_without_spikes():
    f = run("step_time_unstable", ctx(step_times=spread(0.01, 0.025)))
    assert f.title == "Training step time unstable: p90 2.50x the median"
    assert "p90 step 25.00 ms is 2.50x the median 10.00 ms (warning >= 1.5x and >= 4.00 ms above it)" in f.evidence
    assert "bucket" in f.advice
    assert "dataloader_bound" not in f.advice  # 1% data wait: no such finding to point at


# A freshly booted 2-CPU VM, nothing else running: a clean compiled model's 4-ms steps read "p90 2.19x the median", a
# well-tuned one's "1.57x" (warnings). A few steps late by a scheduler slice, or the host taking the vCPU in a burst.
VM_BURST = tuple(0.0088 if i in (12, 13, 14, 15) else 0.004 for i in range(32))


def test_slow_steps_bunched_in_one_stretch_are_information():
    f = run("step_time_unstable", ctx(step_times=VM_BURST))
    assert f.title == "Training step time unstable: p90 2.08x the median" and f.severity == "info"
    assert f.evidence.startswith(
        "the slow steps' time beyond the median is bunched: 100% of it in one quarter of the epoch, in 1 of its 4"
        " quarters (warning: in >= 3, none holding more than half)"
    )
    # The same slow steps spread over the epoch: a warning.
    spread_over = tuple(0.0088 if i in (4, 12, 20, 28) else 0.004 for i in range(32))
    assert run("step_time_unstable", ctx(step_times=spread_over)).severity == "warning"


def test_a_few_spikes_in_a_long_epoch_are_information():
    # Three stalls of 20 ms among 200 steps of 10 ms: 3% of the epoch, as a busy machine's scheduler makes.
    f = run("step_time_unstable", ctx(step_times=_steps({40, 100, 160}, spike=0.03)))
    assert f.title == "Training step time spikes 3 times" and f.severity == "info"
    assert f.evidence.startswith("the slow steps (>= 1.5x the median and 4.00 ms above it) took 2% of the epoch")


def test_a_wide_spread_names_an_uneven_data_wait_where_the_epoch_waits_for_data():
    f = run("step_time_unstable", ctx(epoch(data_wait=0.3, data_wait_fraction=0.3), step_times=spread(0.01, 0.025)))
    assert "an uneven data wait (data wait is 30% of this epoch: `dataloader_bound`)" in f.advice


# --- communication_bound and rank_straggler -------------------------------------------------------------------


def test_communication_bound_names_the_window_and_ddp_settings():
    comm = dict(step_time=1.0, device_busy=0.9, communication_time=0.4)
    context = gpu_ctx(
        None,
        gpu_window(W1, communication_exposed_time=0.2, **comm),
        gpu_window(W2, communication_exposed_time=0.3, **comm),
        facts=facts(GPU, world_size=8),
    )
    f = run("communication_bound", context)
    assert f.window == W2 and "30% of the step" in f.evidence
    assert "(warning >= 15% and >= 0.50 ms per step)" in f.evidence
    for pattern in ("gradient_as_bucket_view=True", "bucket_cap_mb", "static_graph=True", "accumulate_grad_batches"):
        assert pattern in f.advice
    assert "NCCL_DEBUG" in f.advice


def test_communication_in_a_trace_counts_without_world_size():
    w = cw(communication_time=0.3, communication_exposed_time=0.3)
    f = run("communication_bound", ctx(None, w))
    assert f is not None and "gloo" in f.advice


def test_small_collectives_counts_the_small_ones_a_step_and_advises_logging_once_per_epoch():
    # 12 scalar all-reduces and 6 barriers a step on gloo (Lightning's sync_dist=True on every step), beside
    # one 25 MiB gradient bucket that is no small collective.
    bucket = dataclasses.replace(scalar_reduces(1, 0.02, nbytes=25 * 2**20), kind="allreduce", on_device=False)
    barriers = dataclasses.replace(scalar_reduces(6, 0.003), kind="barrier")
    step = cw(step_time=0.1)
    context = ctx(
        None, step, facts=facts(world_size=2), collectives={W1: (scalar_reduces(12, 0.006), barriers, bucket)}
    )
    f = run("small_collectives", context)
    assert f.title == "Training runs 18 small collectives a step" and f.window == W1
    assert "18 small collectives a step (12 all_reduce, 6 barrier), 9% of the 100.00 ms step" in f.evidence
    assert "gloo records none" in f.evidence
    assert "on_step=False, on_epoch=True" in f.advice and "sync_dist" in f.advice and "`training_step`" in f.advice
    # Fewer than 8 a step, or too little of the step: nothing.
    assert run("small_collectives", ctx(None, step, collectives={W1: (scalar_reduces(7, 0.007),)})) is None
    assert run("small_collectives", ctx(None, step, collectives={W1: (scalar_reduces(12, 0.004),)})) is None
    # With sizes (NCCL): small by their bytes, not their time.
    sized = {W1: (scalar_reduces(10, 0.01, nbytes=4),)}
    assert "the largest mean message 4 B" in run("small_collectives", ctx(None, step, collectives=sized)).evidence
    large = {W1: (scalar_reduces(10, 0.01, nbytes=2**20),)}
    assert run("small_collectives", ctx(None, step, collectives=large)) is None


def test_rank_straggler_names_the_slow_rank():
    f = run("rank_straggler", ctx(facts=facts(world_size=4), rank_step_times={0: 0.010, 1: 0.011, 2: 0.010, 3: 0.020}))
    assert f.title == "Rank 3 is 1.90x slower than the median rank"
    assert (
        "rank 3's own work per step (its median step less its wait in collectives) 20.00 ms is 1.90x the median"
        " over 4 ranks (10.50 ms" in f.evidence
    )
    assert "(warning >= 1.2x, and >= 10% of the" in f.evidence
    assert "rank 3" in f.advice and "rank_zero_only" not in f.advice
    zero = run("rank_straggler", ctx(facts=facts(world_size=2), rank_step_times={0: 0.03, 1: 0.01}))
    assert zero.title.startswith("Rank 0") and "rank_zero_only" in zero.advice


def test_time_in_collectives_is_told_a_wait_for_a_late_rank_or_the_transfer_itself():
    waiting = ctx(facts=facts(world_size=4), rank_step_times={0: 0.010, 1: 0.011, 2: 0.010, 3: 0.020},
                  rank_waits={0: 0.45, 1: 0.40, 2: 0.44, 3: 0.05})  # fmt: skip
    f = run("rank_straggler", waiting)
    assert (
        "a wait, not the transfer: the ranks spend 5%-45% of their step in collectives, rank 3 the least: the"
        " others arrive earlier and wait for it" in f.evidence
    )
    window = cw(communication_time=0.4, communication_exposed_time=0.4)
    same = {0: 0.40, 1: 0.38, 2: 0.41, 3: 0.39}
    f = run("communication_bound", ctx(None, window, facts=facts(world_size=4), rank_waits=same))
    assert "the transfer itself, not a wait: every rank spends 38%-41% of its step in collectives" in f.evidence
    assert "waiting for a late rank" not in f.advice
    late = {0: 0.40, 1: 0.38, 2: 0.41, 3: 0.10}
    f = run("communication_bound", ctx(None, window, facts=facts(world_size=4), rank_waits=late))
    assert "rank 3 the least" in f.evidence and f.advice.startswith("Most of it is waiting for a late rank")
    alone = run("communication_bound", ctx(None, window, facts=facts(world_size=2)))
    assert "a wait" not in alone.evidence and "the transfer itself" not in alone.evidence  # ranks unknown


def test_a_late_rank_zero_leaves_the_others_waiting_in_collectives():
    """Rank zero, whose windows the rules read, is the late rank: its own share is low, the other's is the wait."""
    window = cw(step_time=0.02, communication_time=0.0028, communication_exposed_time=0.0028)
    context = ctx(None, window, facts=facts(world_size=2), rank_waits={0: 0.14, 1: 0.91})
    f = run("communication_bound", context)
    assert f.evidence.startswith(
        "rank 1 spends 91% of its step in collectives with no compute overlapping it (about 18.20 ms of the 20.00 ms"
    )
    assert "rank 0 14%) (warning >= 15% and >= 0.50 ms per step)" in f.evidence
    assert "rank 0 the least" in f.evidence and f.advice.startswith("Most of it is waiting for a late rank")
    # Rank zero's own window over the limit: judged on it, the others' wait in the evidence.
    over = cw(step_time=0.02, communication_time=0.004, communication_exposed_time=0.004)
    f = run("communication_bound", ctx(None, over, facts=facts(world_size=2), rank_waits={0: 0.2, 1: 0.91}))
    assert f.title == "Training waits on communication 20% of each step" and "20%-91%" in f.evidence
    # Every rank under the limit, or rank zero's share unknown: nothing.
    for waits in ({0: 0.1, 1: 0.12}, {1: 0.9}):
        assert run("communication_bound", ctx(None, window, facts=facts(world_size=2), rank_waits=waits)) is None


@pytest.mark.parametrize(
    ("name", "link"),
    [
        ("NVIDIA A100-SXM4-80GB", "NVLink 3"),
        ("NVIDIA A100-PG509-200", "NVLink 3"),  # HGX's SXM4 board, as HTA's 2-rank trace names it
        ("NVIDIA A100-PCIE-40GB", "PCIe 4.0 x16"),
        ("NVIDIA H100 80GB HBM3", "NVLink 4"),
        ("NVIDIA H100 PCIe", "PCIe 5.0 x16"),
        ("NVIDIA H200", "NVLink 4"),
        ("Tesla V100-SXM2-32GB", "NVLink 2"),
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),
    ],
)
def test_the_link_table_names_a_nodes_link_by_its_gpu(name, link):
    found = node_link(name)
    assert (found.name if found else None) == link


def test_infiniband_rates_are_per_port_and_direction():
    assert {name: link.bandwidth for name, link in INFINIBAND.items()} == {
        "EDR": 12.5e9, "HDR": 25e9, "NDR": 50e9, "XDR": 100e9,
    }  # fmt: skip


def test_low_bus_bandwidth_judges_large_collectives_against_the_nodes_link():
    a100 = facts(GPU, world_size=2, device_name="NVIDIA A100-SXM4-80GB")
    slow = {W1: (slow_reduce(20 * 2**20, 6.56e9),)}
    f = run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=a100, collectives=slow))
    assert f.title == "Training's allreduce runs at 2% of NVLink 3's bandwidth" and f.window == W1
    assert (
        "allreduce (default_pg, 2 ranks): 20.0 MiB a call at a bus bandwidth of 6.56 GB/s, 2% of NVLink 3's 300 GB/s"
        " per direction" in f.evidence
    )
    assert "NCCL_DEBUG=INFO" in f.advice and "late rank" in f.advice
    fast = {W1: (slow_reduce(20 * 2**20, 200e9),)}
    assert run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=a100, collectives=fast)) is None
    small = {W1: (slow_reduce(2**20, 1e9),)}  # latency-bound: not judged
    assert run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=a100, collectives=small)) is None
    # Several nodes: the network's rate, which no trace names, must be given.
    nodes = facts(a100, num_nodes=2, world_size=16)
    assert run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=nodes, collectives=slow)) is None
    given = run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=nodes, collectives=slow), link_bandwidth=100e9)
    assert given.title == "Training's allreduce runs at 6% of the link's bandwidth"
    assert "6% of the link's 100 GB/s per direction" in given.evidence


def test_low_bus_bandwidth_on_the_real_two_rank_a100_trace(gpu_trace):
    path = gpu_trace("a100_nccl_2rank_rank0.json.gz")
    trace = load_trace(path)
    summary = step_summary.summarize_trace(trace, window="w")
    context = trace_context(summary, {}, collectives=collective_stats(trace))
    (f,) = [f for f in diagnose(context) if f.id == "low_bus_bandwidth"]
    assert "19.5 MiB a call at a bus bandwidth of 6.56 GB/s, 2% of NVLink 3's 300 GB/s" in f.evidence


def test_fsdp_all_gathers_in_the_open_get_prefetching_and_wrapping_advice():
    f = run("fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives={W1: fsdp(exposed=0.3)}))
    assert f.title == "Training waits for FSDP's all-gathers 30% of each step" and f.window == W1
    assert "FSDP's pattern: 24 all-gathers and 12 reduce-scatters a step" in f.evidence
    assert "64.0 MiB an all-gather on average" in f.evidence
    assert "forward_prefetch=True" in f.advice and "BackwardPrefetch.BACKWARD_PRE" in f.advice
    assert "limit_all_gathers=True" in f.advice and "SHARD_GRAD_OP" in f.advice
    assert "auto_wrap_policy" not in f.advice  # 64 MiB units are not small
    small = run(
        "fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives={W1: fsdp(exposed=0.3, gather_bytes=2**16)})
    )
    assert "auto_wrap_policy={YourBlock}" in small.advice
    # Hidden all-gathers, or DDP's all-reduces alone: nothing.
    assert run("fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives={W1: fsdp(exposed=0.05)})) is None
    ddp = {W1: (slow_reduce(32 * 2**20, 1e9),)}
    assert run("fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives=ddp)) is None


def test_rank_straggler_ignores_an_excess_too_small_to_cost_the_step():
    # 1.25x the median, but 2 ms of a 40 ms step: the ranks' own work is a small residual beside communication.
    quiet = ctx(epoch(step_time_p50=0.040), facts=facts(world_size=2), rank_step_times={0: 0.008, 1: 0.012})
    assert run("rank_straggler", quiet) is None
    costly = ctx(epoch(step_time_p50=0.012), facts=facts(world_size=2), rank_step_times={0: 0.008, 1: 0.012})
    assert run("rank_straggler", costly).title.startswith("Rank 1")
    assert run("rank_straggler", quiet, rank_straggler_cost=0.04) is not None


def test_rank_straggler_is_about_training_steps_only():
    validation = ctx(epoch(stage="validate"), facts=facts(world_size=2), rank_step_times={0: 0.01, 1: 0.03})
    assert run("rank_straggler", validation) is None


def test_rank_straggler_needs_several_ranks():
    assert run("rank_straggler", ctx(rank_step_times={0: 0.05})) is None
    assert run("rank_straggler", ctx(rank_step_times=None)) is None


# --- cpu_threads --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threads", "workers", "severity"),
    [(1, 0, "warning"), (3, 0, "warning"), (4, 0, "info"), (7, 0, "info"), (8, 0, None),
     (1, 2, "info"), (6, 2, None), (2, 8, None)],
)  # fmt: skip
def test_cpu_threads_severity_follows_the_share_of_cpus_and_the_workers(threads, workers, severity):
    f = run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=threads, num_workers=workers)))
    assert (f.severity if f else None) == severity


def test_cpu_threads_advice_and_distributed_share():
    f = run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=1, num_workers=0)))
    assert f.title == "torch computes on 1 of 8 CPUs" and "`torch.set_num_threads(8)`" in f.advice
    assert "OMP_NUM_THREADS" in f.advice
    # Two processes on 8 CPUs: each one's share is 4.
    f = run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=1, num_workers=0, world_size=2)))
    assert "`torch.set_num_threads(4)`" in f.advice and "8 shared by 2 processes" in f.evidence
    assert run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=4, num_workers=0, world_size=2))) is None


def test_cpu_threads_needs_the_counts():
    assert run("cpu_threads", ctx(facts=facts(torch_threads=None, num_workers=0))) is None
    assert run("cpu_threads", ctx(facts=facts(cpu_count=None, torch_threads=1, num_workers=0))) is None


# --- thresholds ---------------------------------------------------------------------------------------------


def test_a_custom_threshold_changes_what_fires():
    data_bound = ctx(epoch(data_wait_fraction=0.15, data_wait=0.15))
    assert run("dataloader_bound", data_bound) is not None
    assert run("dataloader_bound", data_bound, dataloader_warning=0.2) is None
    f = run("dataloader_bound", data_bound, dataloader_critical=0.15)
    assert f.severity == "critical" and "critical >= 15%" in f.evidence
    assert diagnose(data_bound, Thresholds(dataloader_warning=0.2)) == []


def test_overrides_from_the_class_start_at_the_defaults_and_from_an_instance_at_its_values():
    assert Thresholds.with_overrides({}) == Thresholds()
    custom = Thresholds(validation=0.5)
    assert custom.with_overrides({"h2d_copy": 0.2}) == Thresholds(validation=0.5, h2d_copy=0.2)
    assert Thresholds.with_overrides({"memory_growth_epochs": 4.0}).memory_growth_epochs == 4  # 4.0 from YAML


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dataloader_warn": 0.2}, r"dataloader_warn=0\.2: unknown threshold \(known: dataloader_warning, "),
        ({"dataloader_warning": 1.5}, r"dataloader_warning must be a fraction between 0 and 1, got 1\.5 \(number\)"),
        ({"h2d_copy": -0.1}, r"h2d_copy must be a fraction between 0 and 1, got -0\.1 \(number\)"),
        ({"validation": "30%"}, r"validation must be a fraction between 0 and 1, got '30%' \(string\)"),
        ({"framework_overhead": True}, r"framework_overhead must be a fraction between 0 and 1, got True \(boolean\)"),
        ({"communication": float("nan")}, r"communication must be a fraction between 0 and 1, got nan \(number\)"),
        ({"rank_straggler": 0.9}, r"rank_straggler must be a ratio >= 1, got 0\.9 \(number\)"),
        ({"launch_kernel_time": -1e-6}, r"launch_kernel_time must be a number of seconds >= 0, got -1e-06"),
        ({"step_spike_count": 2.5}, r"step_spike_count must be an integer >= 1, got 2\.5 \(number\)"),
        (
            {"memory_growth_bytes": -1},
            r"memory_growth_bytes must be a number of bytes, an integer >= 0, got -1 \(integer\)",
        ),
        ({"dataloader_warning": 0.5}, r"dataloader_warning=0\.5 > dataloader_critical=0\.3: dataloader_warning must"),
        ({"device_busy_critical": 0.9}, r"device_busy_critical=0\.9 > device_busy_warning=0\.8"),
    ],
)
def test_bad_overrides_are_named_with_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ValueError, match=message):
        Thresholds.with_overrides(overrides)


def test_all_bad_overrides_are_reported_in_one_message():
    with pytest.raises(ValueError, match=r"^Invalid threshold overrides: ") as info:
        Thresholds.with_overrides({"nope": 1, "dataloader_warning": 2, "rank_straggler": "x"})
    message = str(info.value)
    assert message.startswith("Invalid threshold overrides: ")
    parts = (
        "nope=1: unknown",
        "dataloader_warning must be a fraction between 0 and 1, got 2 (integer)",
        "rank_straggler must be a ratio >= 1, got 'x' (string)",
    )
    assert all(part in message for part in parts)
    assert "cpu_threads_warning" in message  # the known keys are listed


def test_the_constructor_checks_too():
    message = r"^Invalid thresholds: h2d_copy must be a fraction between 0 and 1, got 2 \(integer\)$"
    with pytest.raises(ValueError, match=message):
        Thresholds(h2d_copy=2)


def test_every_default_is_a_named_constant_with_a_comment():
    from lightning_perf.diagnose import thresholds

    source = (ROOT / "lightning_perf" / "diagnose" / "thresholds.py").read_text()
    for f in dataclasses.fields(Thresholds):
        constant = f.name.upper()
        assert getattr(thresholds, constant) == f.default, constant
        lines = source[: source.index(f"\n{constant} = ")].rstrip().splitlines()
        while re.match(r"[A-Z0-9_]+ = ", lines[-1]):  # constants of one rule share a comment
            lines.pop()
        assert lines[-1].startswith("#"), constant


# --- registry -----------------------------------------------------------------------------------------------


def test_diagnose_sorts_critical_first_then_by_catalogue_order():
    context = gpu_ctx(
        gpu_epoch(data_wait_fraction=0.15, data_wait=0.15, cuda_max_reserved=79 * GiB),
        gw(framework_time=0.2),
        step_times=spread(0.01, 0.02),
    )
    found = [(f.severity, f.id) for f in diagnose(context)]
    assert found == [
        ("critical", "memory_pressure"),
        ("warning", "dataloader_bound"),
        ("warning", "framework_overhead"),
        ("warning", "step_time_unstable"),
    ]


def test_info_findings_come_last():
    context = ctx(facts=facts(torch_threads=1, num_workers=2), step_times=spread(0.01, 0.02))
    found = [(f.severity, f.id) for f in diagnose(context)]
    assert found == [("warning", "step_time_unstable"), ("info", "cpu_threads")]


def test_a_rule_that_raises_is_skipped_and_reported(monkeypatch):
    def broken(ctx, t):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(RULES, "host_sync", broken)
    errors = []
    context = ctx(epoch(data_wait_fraction=0.5, data_wait=0.5))
    found = diagnose(context, on_error=lambda rule_id, err: errors.append((rule_id, err)))
    assert [f.id for f in found] == ["dataloader_bound"]
    [(rule_id, err)] = errors
    assert rule_id == "host_sync" and isinstance(err, ZeroDivisionError)
    assert [f.id for f in diagnose(context)] == ["dataloader_bound"]  # without on_error: skipped silently


def test_a_rule_may_return_several_findings(monkeypatch):
    def twice(ctx, t):
        return [
            Finding(id="host_sync", severity=s, title="t", evidence="e", advice="a", stage="train", epoch=0)
            for s in ("info", "critical")
        ]

    monkeypatch.setitem(RULES, "host_sync", twice)
    assert [f.severity for f in diagnose(ctx())] == ["critical", "info"]


def test_a_healthy_run_gets_no_warning():
    for context in (ctx(None, window()), gpu_ctx(), with_history(1000, 1001, 1002)):
        assert [f for f in diagnose(context) if f.severity != "info"] == []


# --- no torch, no lightning ---------------------------------------------------------------------------------

FORBIDDEN = {"torch", "lightning", "pytorch_lightning", "numpy"}
# The package's modules below every layer (records, number formatting, value checks) may be imported.
BELOW = [
    ROOT / "lightning_perf" / f"{name}.py"
    for name in ("records", "compile_records", "trial_records", "units", "validation", "docstrings")
]
PURE = [*sorted((ROOT / "lightning_perf" / "diagnose").glob("*.py")), *BELOW]


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_diagnosis_modules_import_neither_torch_nor_lightning(path):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
    roots = {name.split(".")[0] for name in imported}
    assert not roots & FORBIDDEN, sorted(imported)
    assert {name for name in imported if name.startswith("lightning_perf")} <= {
        *(f"lightning_perf.{p.stem}" for p in BELOW),
        *(f"lightning_perf.diagnose.{p.stem}" for p in PURE if p.parent.name == "diagnose"),
    }


def test_importing_the_diagnosis_loads_neither_torch_nor_lightning():
    assert heavy_modules_loaded_by("lightning_perf.diagnose.registry") == []


def test_validation_heavy_counts_the_runs_of_grouped_short_epochs_per_training_epoch():
    # A record of 95 one-batch training epochs and the validation records inside it (one run per epoch, measured
    # in groups of 12, 30, 45 and 8): 95 runs, one per epoch; no `val_check_interval` advice.
    groups = tuple(epoch(stage="validate", epochs=n, step_time=0.002 * n, batches=n) for n in (12, 30, 45, 8))
    f = run("validation_heavy", ctx(epoch(step_time=0.3, batches=95, epochs=95), validation=groups))
    assert "these 95 epochs 95 runs of 95 batches" in f.evidence
    assert "val_check_interval" not in f.advice
    # Two runs per epoch in groups: the advice says 2.
    twice = tuple(epoch(stage="validate", epochs=n, step_time=0.01 * n, batches=n) for n in (10, 10))
    f = run("validation_heavy", ctx(epoch(step_time=0.3, batches=10, epochs=10), validation=twice))
    assert "runs fewer than the 2 validations per epoch" in f.advice and "these 10 epochs 20 runs" in f.evidence
