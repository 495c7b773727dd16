"""Every rule on hand-built summaries: each fires at its threshold with the right severity, stays silent just
below it and under its absolute floor, shows its numbers, and fits its advice to the device and the stage.
Each rule's own behaviour is in the file named for its module (test_rules_memory.py, ...); the thresholds,
the registry and the package's purity in test_registry.py."""

import dataclasses
import re

import pytest
from contexts import (
    DDP2,
    GiB,
    ctx,
    cw,
    facts,
    fsdp,
    gpu_ctx,
    gpu_window,
    gw,
    ids,
    run,
    scalar_reduces,
    slow_reduce,
    spread,
    tiny_ops,
    with_history,
)

from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.registry import RULES, diagnose
from lightning_perf.records import GraphBreak, Recompile, TraceSummary
from summaries import ADAM_MEMORY, CPU, FP32_GPU, GPU, W1, compile_stats, epoch, gpu_epoch, window

# --- every rule: (context, expected warning/critical finding ids) -------------------------------------------


SHORT_STEP = {"step_time": 0.003, "framework_time": 0.0001}  # 3 ms steps, 33% tiny operators under 1 ms


def fp32_gemms(share: float, name: str = W1, **kw) -> TraceSummary:
    """A busy tensor-core GPU window whose fp32 GEMMs without tensor cores take ``share`` of kernel time."""
    return gw(name, **{"device_busy": 0.95, "kernel_time": 1.0, "fp32_gemm_time": share, **kw})


def spiky(*indices: int, spike: float = 0.03, n: int = 100, base: float = 0.01) -> tuple[float, ...]:
    """``base`` (10 ms) steps, with ``spike`` seconds at ``indices``."""
    return tuple(spike if i in indices else base for i in range(n))


def validated(train: float, val: float) -> StageEpoch:
    return ctx(epoch(step_time=train), validation=(epoch(stage="validate", step_time=val),))


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
