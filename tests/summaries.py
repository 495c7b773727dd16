"""Plain summaries for the rules' tests (no trace, no trainer)."""

from __future__ import annotations

import dataclasses

from lightning_perf.diagnose.model import RunFacts
from lightning_perf.records import CompileStats, EpochSummary, TraceSummary

GiB = 2**30

W1, W2 = "train-epoch000-batches0006-0008", "train-epoch000-batches0106-0108"


def window(name: str = W1, **kw) -> TraceSummary:
    """A healthy CPU window: 10 ms steps, almost all of it in a few hundred torch operators."""
    values = dict(
        window=name,
        steps=3,
        step_time=0.010,
        dataloader_time=0.0002,
        optimizer_time=0.004,
        optimizer_update_time=0.0005,
        optimizer_update_ops=12.0,
        optimizer_foreach=True,
        host_op_time=0.009,
        framework_time=0.0005,
        ops_per_step=150.0,
        median_op_time=30e-6,
    )
    values.update(kw)
    return TraceSummary(**values)


CPU = RunFacts(
    device="cpu",
    device_name="x86_64",
    precision="32-true",
    cpu_count=8,
    torch_threads=8,
    num_workers=4,
    pin_memory=False,
    persistent_workers=True,
    batch_size=32,
)
GPU = RunFacts(
    device="cuda",
    device_name="NVIDIA A100-SXM4-80GB",
    precision="bf16-mixed",
    cpu_count=16,
    torch_threads=8,
    num_workers=8,
    pin_memory=True,
    persistent_workers=True,
    batch_size=64,
)
FP32_GPU = dataclasses.replace(GPU, precision="32-true")


# --- builders: a healthy run unless told otherwise ---------------------------------------------------------


def epoch(**kw) -> EpochSummary:
    """A healthy 100-batch epoch of 10 ms steps, 1% data wait."""
    values = dict(
        stage="train",
        epoch=0,
        batches=100,
        samples=3200,
        step_time=1.0,
        data_wait=0.01,
        step_time_p50=0.010,
        step_time_p90=0.011,
        step_time_max=0.012,
        data_wait_fraction=0.01,
        throughput=3200.0,
        host_rss=1 * GiB,
        host_rss_peak=1 * GiB,
    )
    values.update(kw)
    return EpochSummary(**values)


def gpu_epoch(**kw) -> EpochSummary:
    return epoch(**{"cuda_max_allocated": 20 * GiB, "cuda_max_reserved": 24 * GiB, "cuda_capacity": 80 * GiB, **kw})


def compile_stats(**kw) -> CompileStats:
    """A clean compiled epoch: one graph compiled in 2 s during batch 0, no break, no recompile."""
    values = dict(graphs=1, breaks=0, recompiles=0, limit_reached=False, seconds=2.0, steps=(0,))
    values.update(kw)
    return CompileStats(**values)


# run.memory (summarize.memory.memory_report's shape) of a 1B-parameter fp32 model with Adam: 4 GiB of parameters,
# 4 of gradients, 8 of optimizer state; activations and the allocator's overhead not measured (off CUDA).
ADAM_MEMORY = {
    "parameters": {"total": 4 * GiB, "trainable": 4 * GiB, "frozen": 0, "by_dtype": {"float32": 4 * GiB}},
    "gradients": 4 * GiB,
    "optimizer_state": {"total": 8 * GiB, "by_entry": {"exp_avg": 4 * GiB, "exp_avg_sq": 4 * GiB}},
    "master_copies": 0,
    "optimizers": ["Adam"],
    "activations": None,
    "allocator_overhead": None,
}
