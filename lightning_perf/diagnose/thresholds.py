"""
Thresholds
==========

Every number the bottleneck rules compare against, as one frozen record with a documented default each.

Fractions are shares of a step (or of an epoch, or of the device's memory) between 0 and 1; times are in
seconds, memory in bytes. Where a default follows a published tool or guide, the comment says which; where
it is our own judgment, the comment says that, and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lightning_perf.validation import (
    BYTES,
    COUNT,
    FRACTION,
    NON_NEGATIVE,
    RATIO,
    SECONDS,
    class_or_instance_method,
    declared,
    field_problems,
    kinds_of,
    number,
)

LINK_RATE = number(above=0).said("a number of bytes per second > 0")

# --- dataloader_bound -----------------------------------------------------------------------------------
# torch-tb-profiler's Overview recommends "set num_workers" when the DataLoader takes more than 5% of the
# step. We warn at 10% (a tenth of every step spent waiting) to stay quiet about the small, unavoidable wait
# of an in-memory dataset, and call 30% critical: the accelerator then idles about a third of the time, and
# fixing the input pipeline is worth more than any model-side change.
DATALOADER_WARNING = 0.10
DATALOADER_CRITICAL = 0.30
# Floor: the mean data wait per batch must reach 1 ms. Between two batches Lightning's loop itself and an
# in-memory DataLoader's `next` take 0.1-0.5 ms (measured on the before/after example: 0.05-0.15 ms in the
# DataLoader, ~0.3 ms in the loop); below 1 ms no DataLoader setting has anything to remove.
DATALOADER_MIN_WAIT = 1e-3
# A DataLoader setting tried on the run's data (issue 48) is advised where the step's wait was 1.1x as short and no
# repetition found it longer: our judgment (a few percent is within a shared machine's noise; not worth workers).
ADVICE_TRIAL_MIN_GAIN = 1.1

# --- host_sync ------------------------------------------------------------------------------------------
# One blocking sync per step (a `.item()` on the loss, a `print(loss)`) is enough to drain the CUDA queue:
# the host stops running ahead and every later launch latency shows as device idle time. Our judgment: one
# per step is the pattern worth naming, and 5% of the step idle inside syncs is where it costs more than
# run-to-run noise (HTA's idle-time breakdown calls this "host wait").
HOST_SYNC_PER_STEP = 1.0
HOST_SYNC_IDLE = 0.05
# Floor: and the GPU idles at least 0.1 ms per step inside those syncs: the 5% above, of a 2 ms step (our
# judgment). This idle time is read from the GPU's own clock, so it is exact even when small, but it is only
# each sync's tail (tens of microseconds: the real traces in ../shared/fixtures/gpu-traces show 0.03-0.4 ms
# per step for 8-11 syncs), not the refill of the queue after it; in GPU steps under 2 ms, Lightning's own
# loop (0.3-0.5 ms per step) costs more than the syncs' tails.
HOST_SYNC_MIN_IDLE = 0.1e-3

# --- device_idle ----------------------------------------------------------------------------------------
# torch-tb-profiler recommends a larger batch when GPU utilization is below 50%: our critical. 80% busy is
# our warning: NVIDIA's and PyTorch's tuning guides aim at keeping the GPU saturated, and a well-fed training
# step on a modern GPU shows 90%+ busy in HTA's temporal breakdown; below 80% a fifth of the device is
# wasted.
DEVICE_BUSY_WARNING = 0.80
DEVICE_BUSY_CRITICAL = 0.50
# Floor: and the GPU idles at least 0.5 ms per step. Lightning's own loop between two steps costs 0.3-0.5 ms
# of host time (measured on the CPU in examples/before_after, "What is left"); a step that synchronizes once
# (a logged loss read back) leaves the GPU idle for about that long, which no setting removes.
DEVICE_IDLE_MIN_TIME = 0.5e-3

# --- launch_bound ---------------------------------------------------------------------------------------
# A kernel launch costs the host about 5-10 us (cudaLaunchKernel plus PyTorch's dispatcher); kernels shorter
# than that finish before the host can queue the next one, which is what HTA's kernel-launch statistics look
# for ("GPU kernels shorter than their CPU launch"). Hence a median kernel under 10 us, together with the
# device below the 80% busy warning above, means the host's launch rate sets the pace.
LAUNCH_KERNEL_TIME = 10e-6
LAUNCH_DEVICE_BUSY = 0.80
# On CPU there is no launch, but each eager operator pays ~5-20 us of dispatch and Python, so operators
# shorter than 20 us (`lightning_perf.summarize.step_summary.TINY_OP_US`) are mostly that cost. The rule judges the
# step's own compute (the DataLoader's per-sample work is dataloader_bound's) by the share of the step in
# such tiny operators and the Python gaps that dispatch them (TraceSummary.tiny_op_time). Our judgment, from
# profiles on a 2-core CPU: compute-bound steps hold 1-10% in the operators alone (issue 12's programs: a VAE
# of convolutions 1%, Lightning's transformer and GAN examples 5% and 8%, a demo transformer 10%), up to about
# twice that with their gaps (examples/before_after's CNN 5%, Lightning's MNIST template MLP 16-19%, its DQN
# example 18-25%); a training_step looping over 1-element tensors holds 34-75% (48-75% on an idle machine: what
# another process takes of the CPU lengthens the step, not the tiny operators). 30% sits between the two:
# vectorizing the loop (or torch.compile fusing it) then wins back close to a third of the step.
LAUNCH_CPU_TINY_OPS = 0.30
# Floor: and at least 1 ms of it per step (50-200 dispatches): below that, vectorizing saves a fraction of a
# millisecond per step, whatever its share (the DQN example's steps of 2.5-3.5 ms hold 0.6-0.7 ms).
LAUNCH_CPU_MIN_TIME = 1e-3

# --- h2d_copy -------------------------------------------------------------------------------------------
# Copy time with no kernel running is pure device idle time. Our judgment, aligned with the DataLoader
# warning: 10% of the step. PyTorch's tuning guide and NVIDIA's CUDA best practices both name pinned memory
# (`pin_memory=True`) as the fix for slow, blocking host-to-device copies.
H2D_COPY = 0.10
# Floor: and the copies leave the GPU idle 0.5 ms per step, as device_idle's floor (the same idle time).
H2D_MIN_TIME = 0.5e-3

# --- precision ------------------------------------------------------------------------------------------
# torch-tb-profiler recommends AMP when tensor-core-eligible kernels run without tensor cores at all. We fire
# when fp32 GEMM/convolution kernels without tensor cores take 30% of the kernel time or more (our judgment):
# with TF32 or bf16 these run 2-8x faster (NVIDIA A100: 19.5 TFLOPS fp32 vs 156 TF32 vs 312 bf16), so 30% of
# the kernel time shrinks by at least a fifth of the step.
PRECISION_FP32_GEMM = 0.30
# Floor: and those kernels take 0.5 ms per step (our judgment: made 2x faster, they give back 0.25 ms a step,
# below which a precision change is not worth its numerical risk).
PRECISION_MIN_TIME = 0.5e-3

# --- memory_pressure ------------------------------------------------------------------------------------
# torch-tb-profiler warns when peak memory exceeds 90% of the device's. 97% is our critical: the caching
# allocator then has no room to round up a request and starts freeing its cache and retrying (slow), one
# larger batch or sequence away from an out-of-memory error.
MEMORY_PRESSURE_WARNING = 0.90
MEMORY_PRESSURE_CRITICAL = 0.97
# Advice only: when a fifth or more of the reserved memory is not allocated, the cache is fragmented and
# `expandable_segments` is the first thing to try (our judgment; PyTorch's CUDA memory notes describe it).
MEMORY_FRAGMENTATION = 0.20

# --- memory_breakdown ------------------------------------------------------------------------------------
# Issue 24: the breakdown's cures are a warning from 85% of the device reserved at the peak (one step of 15% more,
# a longer sequence or a larger batch, from the 97% where memory_pressure turns critical); below, information.
MEMORY_TIGHT = 0.85

# --- memory_growth --------------------------------------------------------------------------------------
# Our judgment: a leak shows as a peak that rises epoch after epoch. Three epochs (two rises) tell a trend
# from a one-time warm-up step; 10% and 100 MiB together keep allocator and RSS noise out while still
# catching the classic leak (losses or outputs kept with their graph), which grows by the epoch.
MEMORY_GROWTH_EPOCHS = 3
MEMORY_GROWTH_FRACTION = 0.10
MEMORY_GROWTH_BYTES = 100 * 2**20

# --- optimizer_heavy ------------------------------------------------------------------------------------
# Our judgment: an optimizer update is a few elementwise passes over the parameters, normally a few percent
# of a step; 20% means per-parameter launch overhead (single-tensor loops) or a model whose parameters
# dwarf its compute. PyTorch's optimizer docs: foreach (default where supported) < fused in speed.
OPTIMIZER_UPDATE = 0.20
# Floor: and the update takes at least 0.5 ms per step (our judgment: a fused update of a small model takes
# a few tenths of a millisecond on a GPU, and rewriting the optimizer for less than that wins too little; at
# 0.5 ms it is a tenth of a few-ms GPU step).
OPTIMIZER_MIN_TIME = 0.5e-3

# --- validation_heavy -----------------------------------------------------------------------------------
# Our judgment: validation that takes 30% of an epoch's step time (3/7 of the training time) costs more
# than most users meant to spend on monitoring; Lightning's `limit_val_batches` and `val_check_interval`
# exist for it.
VALIDATION = 0.30
# Floor: and validation takes at least 0.1 s of step time per training epoch (our judgment: validating less
# trades away the monitoring, and a tenth of a second per epoch, 10 s over 100 epochs, is not worth that;
# Lightning's own start and end of a validation run cost 1-2 ms, measured on this project's CPU tests).
VALIDATION_MIN_TIME = 0.1

# --- framework_overhead ---------------------------------------------------------------------------------
# Our judgment: Lightning's own loop is a few percent of a step of 10 ms or more; 15% of the step outside
# any torch operator is more than the loop: the user's hooks, callbacks, logging or the progress bar.
FRAMEWORK_OVERHEAD = 0.15
# Floor: and at least 1 ms per step outside torch operators. Lightning's own loop between steps takes
# ~0.3-0.5 ms per step on a CPU (examples/before_after, "What is left": 0.42-0.52 ms in a validation step
# with no logging), which no setting removes; 1 ms leaves at least half a millisecond that is the user's.
FRAMEWORK_MIN_TIME = 1e-3

# --- step_time_unstable ---------------------------------------------------------------------------------
# Our judgment: in a steady loop p90 stays within ~20% of the median; 1.5x means a tenth of the steps are
# markedly slow. Spikes of 3x the median, three times or more, are a recurring event (logging, checkpoints,
# garbage collection), not noise; their period usually names the cause.
STEP_P90_P50 = 1.5
STEP_SPIKE_FACTOR = 3.0
STEP_SPIKE_COUNT = 3
# A scheduler slice: what a thread preempted on a busy machine waits at least (Linux's EEVDF: a 3 ms base slice;
# CFS: 0.75-3 ms, up to 6 ms latency at load). Where steps are shorter, the preempted ones make the p90 while the
# mean wait per step stays below it (1 ms steps beside two CPU burners on 2 CPUs: p90 3.4x at a 0.9 ms wait).
SCHED_SLICE = 4e-3
# Floors, a slice: a step preempted once by any other thread is that much slower, whatever the program. With 1 ms,
# a clean compiled 4-ms step read "p90 1.57x the median" on CI (2 CPUs, its wait for a CPU under 10%).
STEP_MIN_SPREAD = SCHED_SLICE
STEP_MIN_SPIKE = SCHED_SLICE

# --- compile_graph_breaks -------------------------------------------------------------------------------
# One graph break is enough to name: each splits the compiled code into pieces that run apart, with Python
# between them and nothing fused across them, and the user rarely meant it (`torch._dynamo.explain` and
# `fullgraph=True` treat any break as worth fixing). Dynamo reports a break once per compile that meets it,
# so the count is found in the epochs that compile (usually the first), not once per batch.
COMPILE_BREAKS = 1

# --- compile_recompiles ---------------------------------------------------------------------------------
# A normal compiled Lightning run recompiles each compiled function up to twice in a stage's epoch: once
# when the last batch is smaller (automatic dynamic shapes then compile a graph for any size of that
# dimension; seen with torch 2.13 and a DataLoader with drop_last=False) and once when it switches
# between train and eval mode (a guard on `self.training`). Hence a warning from 3 recompiles of one
# function in an epoch (our judgment); reaching `torch._dynamo.config.recompile_limit` (8 by default) is
# critical whatever the count: the function then runs eager.
COMPILE_RECOMPILES = 3

# --- compile_time ---------------------------------------------------------------------------------------
# Our judgment: compiling a tenth of the epoch or more is what makes a first epoch visibly slower than the
# next (inductor takes seconds to minutes per graph); in the stage's first epoch that is info (a one-time
# cost, won back later if the compiled steps are faster), in a later epoch a warning: a run that keeps
# compiling loses a tenth of every epoch to it.
COMPILE_TIME = 0.10

# --- communication_bound --------------------------------------------------------------------------------
# torch-tb-profiler recommends gradient compression or accumulation when communication takes more than 10%
# of the step. We count only exposed communication (no compute kernel overlapping it), which is what the
# step actually waits for, and warn at 15% (our judgment: DDP's bucketing normally hides most of it).
COMMUNICATION = 0.15
# Floor: and at least 0.5 ms of exposed communication per step (our judgment: one small collective costs
# tens of microseconds with NCCL in a node and a few hundred with gloo on one host; below 0.5 ms the step
# waits for a latency, which bucket or accumulation settings barely change).
COMMUNICATION_MIN_TIME = 0.5e-3

# Who waits for whom (our judgment): a collective ends on every rank at once, so ranks whose shares of the step
# in it spread by half their median (and 5 points) are waiting for the one that spends least; else the transfer.
COMMUNICATION_WAIT_SPREAD = 0.5

# --- low_bus_bandwidth -----------------------------------------------------------------------------------
# Judged on calls of 16 MiB or more, where nccl-tests' bus bandwidth curves (doc/PERFORMANCE.md) reach their
# plateau; fires below a quarter of the link's peak per direction (our judgment: nccl-tests reach 70-90% of
# NVLink's and InfiniBand's peak at such sizes; PCIe or TCP sockets in their place run 5-20x slower). The
# link's peak: diagnose/links.py's table for one node's GPUs (LINK_BANDWIDTH None), else the user's.
LOW_BUS_BANDWIDTH = 0.25
LOW_BUS_BANDWIDTH_MIN_BYTES = 16 * 2**20
LINK_BANDWIDTH = None

# --- small_collectives ----------------------------------------------------------------------------------
# Small: under 1 MiB a call, where nccl-tests' bus bandwidth curves (doc/PERFORMANCE.md) are latency-bound and
# NCCL picks its low-latency protocols; without sizes (gloo), under 2 ms a call (our judgment: a scalar
# all-reduce took 0.5-0.8 ms between 2 gloo processes here, a 25 MiB DDP bucket tens of ms). Fires at 8 a step
# taking 5% of it (our judgment: DDP's 25 MiB buckets are not small; 8 small ones a step is a loop of them).
SMALL_COLLECTIVE_BYTES = 2**20
SMALL_COLLECTIVE_TIME = 2e-3
SMALL_COLLECTIVES_PER_STEP = 8
SMALL_COLLECTIVES_SHARE = 0.05

# --- rank_straggler -------------------------------------------------------------------------------------
# Every rank waits for the slowest at each gradient all-reduce, so one slow rank slows them all (HTA's
# straggler analysis looks for it in the communication kernels' waits). Our judgment: 1.2x the median over
# ranks is beyond the few percent that identical GPUs differ by, and costs every rank a sixth of its time.
RANK_STRAGGLER = 1.2
# Ours: and the slow rank's extra work must cost every rank at least a tenth of the step. With few ranks the
# median is close to the mean, and when communication fills most of the step the ranks' own work is a small
# residual of two noisy numbers: a 1.2x ratio of residuals can then be a few percent of the step.
RANK_STRAGGLER_COST = 0.10
# Floor: and the excess must reach 1 ms per step. Each rank's own work is a residual of two host-clock
# measurements that include Lightning's loop (0.3-0.5 ms per step, more on rank 0 with its progress bar and
# logging); ranks differing by less than 1 ms are within that loop's variation (our judgment).
RANK_STRAGGLER_MIN_TIME = 1e-3

# --- cpu_threads ----------------------------------------------------------------------------------------
# torch's default intra-op thread count is the number of physical cores, often half the logical CPUs; any
# count below this process's share of the CPUs fires as info. Below half the share (e.g. OMP_NUM_THREADS=1
# from a launcher) is a warning: a compute-bound CPU run then leaves most of its cores unused (our
# judgment).
CPU_THREADS_WARNING = 0.50
# Floor: only steps (median) of 1 ms or more. torch splits an operator over its intra-op threads only above
# its grain size (at::internal::GRAIN_SIZE, 32768 elements: ~10 us of elementwise work), and each parallel
# region costs microseconds to start; a step under 1 ms, of which Lightning's loop takes 0.3-0.5 ms, has
# too little such work for more threads to win anything measurable (our judgment).
CPU_THREADS_MIN_STEP = 1e-3

# --- evidence -------------------------------------------------------------------------------------------
# The time-share rules warn only from this many measured batches. A stage's epoch with fewer is judged together
# with its latest epochs (one-batch epochs: the stage's recent batches); below it even then (a smoke run,
# `Trainer(fast_dev_run=True)`), their findings are information. Our judgment: fast_dev_run's one batch waited
# 36% of its step for the DataLoader's start-up on Lightning's BoringModel; a p90 over fewer than about ten
# batches is the maximum, one batch's noise.
EVIDENCE_BATCHES = 8

# --- cpu_contention -------------------------------------------------------------------------------------
# The share of the epoch the training thread was ready to run but waited for a CPU (/proc/self/schedstat).
# On an idle machine it stays well under 1%; on this project's shared 2-CPU machine with other processes
# running it measured 20-90%, and at 10% or more other rules' time shares were off by as much as their
# thresholds (our measurements: issue 29). Warning at 10%; critical at 50%, when the thread waits for a CPU
# as long as it runs.
CPU_CONTENTION = 0.10
CPU_CONTENTION_CRITICAL = 0.50

# --- low_mfu --------------------------------------------------------------------------------------------
# Model FLOPs utilization (achieved FLOP/s over the device's dense peak) of large, well-tuned training runs:
# PaLM 540B 46.2% on TPU v4, and in the same paper's Table 3 GPT-3 21.3%, Gopher 32.5%, Megatron-Turing NLG
# 29.7% (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways"); Llama 3 405B 38-43% in
# bf16 on H100s (Dubey et al. 2024, "The Llama 3 Herd of Models"). Our judgment: under 30%, below what tuned
# large-model runs reach, a run leaves large gains; info, because a small model, or one of mostly
# elementwise or normalization work (which the FLOP counter does not count), cannot reach it however tuned.
LOW_MFU = 0.30

# (lower, higher): the first must not exceed the second.
_ORDERED = (
    ("dataloader_warning", "dataloader_critical"),
    ("device_busy_critical", "device_busy_warning"),
    ("memory_pressure_warning", "memory_pressure_critical"),
    ("cpu_contention", "cpu_contention_critical"),
)


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """The thresholds of every bottleneck rule; the defaults and their sources are in this module's comments.

    Fractions are between 0 and 1 (``0.1`` = 10% of the step), times in seconds, memory in bytes. A rule
    fires at its threshold (``>=``, or ``<`` for the "below" thresholds of ``device_idle`` and ``low_mfu``).

    Args:
        dataloader_warning, dataloader_critical: ``dataloader_bound``: data wait / step time.
        dataloader_min_wait: ``dataloader_bound``: and the mean data wait per batch reaches this (seconds).
        advice_trial_min_gain: ``dataloader_bound``: a setting tried on the run's data must shorten the wait this much.
        host_sync_per_step: ``host_sync``: host-device synchronizations per step.
        host_sync_idle: ``host_sync``: device idle time inside those syncs / step time.
        host_sync_min_idle: ``host_sync``: and that idle time reaches this per step (seconds).
        device_busy_warning, device_busy_critical: ``device_idle``: fires when device busy / step time is
            below these.
        device_idle_min_time: ``device_idle``: and the device idles at least this per step (seconds).
        launch_kernel_time: ``launch_bound`` (GPU): median kernel duration below this, in seconds...
        launch_device_busy: ...with device busy / step time below this.
        launch_cpu_tiny_ops: ``launch_bound`` (CPU): time in the step's own tiny operators (top level,
            under 20 us, outside the DataLoader, with the Python gaps that dispatch them) / step time...
        launch_cpu_min_time: ...and that time reaches this per step (seconds).
        h2d_copy: ``h2d_copy``: exposed host-to-device copy time / step time.
        h2d_min_time: ``h2d_copy``: and that exposed copy time per step reaches this (seconds).
        precision_fp32_gemm: ``precision``: fp32 GEMM/convolution kernel time without tensor cores / kernel
            time.
        precision_min_time: ``precision``: and those kernels' time per step reaches this (seconds).
        memory_pressure_warning, memory_pressure_critical: ``memory_pressure``: peak reserved / capacity.
        memory_fragmentation: ``memory_pressure`` advice: (reserved - allocated) / reserved from which the
            advice leads with the allocator's ``expandable_segments``.
        memory_tight: ``memory_breakdown``: peak reserved / capacity from which its cures are a warning.
        memory_growth_epochs: ``memory_growth``: epochs (this one included) the peak must not fall over.
        memory_growth_fraction, memory_growth_bytes: ``memory_growth``: total rise over those epochs,
            relative and absolute; both must be reached.
        optimizer_update: ``optimizer_heavy``: optimizer update time / step time.
        optimizer_min_time: ``optimizer_heavy``: and the update takes at least this per step (seconds).
        validation: ``validation_heavy``: validation step time / (training + validation step time).
        validation_min_time: ``validation_heavy``: and validation takes at least this per training epoch
            (seconds of step time).
        framework_overhead: ``framework_overhead``: time outside any torch operator / step time.
        framework_min_time: ``framework_overhead``: and that time reaches this per step (seconds).
        step_p90_p50: ``step_time_unstable``: p90 / p50 of the step time.
        step_spike_factor, step_spike_count: ``step_time_unstable``: steps at least this many times the
            median, at least this many of them.
        step_min_spread: ``step_time_unstable``: the spread fires only when p90 - p50 reaches this (seconds).
        step_min_spike: ``step_time_unstable``: a spike counts only when it exceeds the median by this
            (seconds).
        compile_breaks: ``compile_graph_breaks``: graph breaks found while compiling in the epoch.
        compile_recompiles: ``compile_recompiles``: recompiles of one compiled function in the epoch (the
            recompile limit reached is critical whatever the count).
        compile_time: ``compile_time``: compile seconds / the epoch's wall time (info in the stage's first
            epoch, warning after it).
        communication: ``communication_bound``: exposed communication time / step time.
        communication_min_time: ``communication_bound``: and that time reaches this per step (seconds).
        communication_wait_spread: ``communication_bound``, ``rank_straggler``: ranks' collective shares spread
            by this share of their median (and 5 points): a wait for a late rank, else the transfer.
        low_bus_bandwidth: ``low_bus_bandwidth``: a large collective's bus bandwidth / the link's peak below this.
        low_bus_bandwidth_min_bytes: ``low_bus_bandwidth``: large: at least this many bytes a call.
        link_bandwidth: ``low_bus_bandwidth``: the link's peak per direction (bytes/s); ``None``: the table's
            (:mod:`lightning_perf.diagnose.links`), which knows one node's GPUs, not a network.
        small_collective_bytes: ``small_collectives``: a collective whose mean message is under this is small.
        small_collective_time: ``small_collectives``: without sizes (gloo), a mean call under this is (seconds).
        small_collectives_per_step, small_collectives_share: ``small_collectives``: fires at this many small
            collectives per step taking this share of the step.
        rank_straggler: ``rank_straggler``: slowest rank's own work per step / median over ranks.
        rank_straggler_cost: ``rank_straggler``: and its excess over the median, as a share of the step.
        rank_straggler_min_time: ``rank_straggler``: and that excess reaches this per step (seconds).
        cpu_threads_warning: ``cpu_threads``: torch threads / this process's share of the CPUs below which
            the finding is a warning rather than info.
        cpu_threads_min_step: ``cpu_threads``: judged only when the median step reaches this (seconds).
        low_mfu: ``low_mfu``: fires when achieved FLOP/s / the GPU's dense peak (MFU) is below this.
        evidence_batches: The measured batches the time-share rules need for a warning; a stage's epoch with
            fewer is judged with its latest epochs.
        cpu_contention, cpu_contention_critical: ``cpu_contention``: the share of the epoch the training
            thread waited for a CPU (warning, critical); from ``cpu_contention`` on, the epoch's time-share
            findings that the waiting may explain are information only.

    Raises:
        ValueError: Naming every bad value and what is allowed, in one message (also from
            :meth:`with_overrides`).

    Example::

        Thresholds().with_overrides({"dataloader_warning": 0.2, "validation": 0.5})
    """

    dataloader_warning: float = declared(FRACTION, DATALOADER_WARNING)
    dataloader_critical: float = declared(FRACTION, DATALOADER_CRITICAL)
    dataloader_min_wait: float = declared(SECONDS, DATALOADER_MIN_WAIT)
    advice_trial_min_gain: float = declared(RATIO, ADVICE_TRIAL_MIN_GAIN)
    host_sync_per_step: float = declared(NON_NEGATIVE, HOST_SYNC_PER_STEP)
    host_sync_idle: float = declared(FRACTION, HOST_SYNC_IDLE)
    host_sync_min_idle: float = declared(SECONDS, HOST_SYNC_MIN_IDLE)
    device_busy_warning: float = declared(FRACTION, DEVICE_BUSY_WARNING)
    device_busy_critical: float = declared(FRACTION, DEVICE_BUSY_CRITICAL)
    device_idle_min_time: float = declared(SECONDS, DEVICE_IDLE_MIN_TIME)
    launch_kernel_time: float = declared(SECONDS, LAUNCH_KERNEL_TIME)
    launch_device_busy: float = declared(FRACTION, LAUNCH_DEVICE_BUSY)
    launch_cpu_tiny_ops: float = declared(FRACTION, LAUNCH_CPU_TINY_OPS)
    launch_cpu_min_time: float = declared(SECONDS, LAUNCH_CPU_MIN_TIME)
    h2d_copy: float = declared(FRACTION, H2D_COPY)
    h2d_min_time: float = declared(SECONDS, H2D_MIN_TIME)
    precision_fp32_gemm: float = declared(FRACTION, PRECISION_FP32_GEMM)
    precision_min_time: float = declared(SECONDS, PRECISION_MIN_TIME)
    memory_pressure_warning: float = declared(FRACTION, MEMORY_PRESSURE_WARNING)
    memory_pressure_critical: float = declared(FRACTION, MEMORY_PRESSURE_CRITICAL)
    memory_fragmentation: float = declared(FRACTION, MEMORY_FRAGMENTATION)
    memory_tight: float = declared(FRACTION, MEMORY_TIGHT)
    memory_growth_epochs: int = declared(COUNT, MEMORY_GROWTH_EPOCHS)
    memory_growth_fraction: float = declared(NON_NEGATIVE, MEMORY_GROWTH_FRACTION)
    memory_growth_bytes: int = declared(BYTES, MEMORY_GROWTH_BYTES)
    optimizer_update: float = declared(FRACTION, OPTIMIZER_UPDATE)
    optimizer_min_time: float = declared(SECONDS, OPTIMIZER_MIN_TIME)
    validation: float = declared(FRACTION, VALIDATION)
    validation_min_time: float = declared(SECONDS, VALIDATION_MIN_TIME)
    framework_overhead: float = declared(FRACTION, FRAMEWORK_OVERHEAD)
    framework_min_time: float = declared(SECONDS, FRAMEWORK_MIN_TIME)
    step_p90_p50: float = declared(RATIO, STEP_P90_P50)
    step_spike_factor: float = declared(RATIO, STEP_SPIKE_FACTOR)
    step_spike_count: int = declared(COUNT, STEP_SPIKE_COUNT)
    step_min_spread: float = declared(SECONDS, STEP_MIN_SPREAD)
    step_min_spike: float = declared(SECONDS, STEP_MIN_SPIKE)
    compile_breaks: int = declared(COUNT, COMPILE_BREAKS)
    compile_recompiles: int = declared(COUNT, COMPILE_RECOMPILES)
    compile_time: float = declared(FRACTION, COMPILE_TIME)
    communication: float = declared(FRACTION, COMMUNICATION)
    communication_min_time: float = declared(SECONDS, COMMUNICATION_MIN_TIME)
    communication_wait_spread: float = declared(FRACTION, COMMUNICATION_WAIT_SPREAD)
    low_bus_bandwidth: float = declared(FRACTION, LOW_BUS_BANDWIDTH)
    low_bus_bandwidth_min_bytes: int = declared(BYTES, LOW_BUS_BANDWIDTH_MIN_BYTES)
    link_bandwidth: float | None = declared(LINK_RATE.or_none("None (the table's)"), LINK_BANDWIDTH)
    small_collective_bytes: int = declared(BYTES, SMALL_COLLECTIVE_BYTES)
    small_collective_time: float = declared(SECONDS, SMALL_COLLECTIVE_TIME)
    small_collectives_per_step: int = declared(COUNT, SMALL_COLLECTIVES_PER_STEP)
    small_collectives_share: float = declared(FRACTION, SMALL_COLLECTIVES_SHARE)
    rank_straggler: float = declared(RATIO, RANK_STRAGGLER)
    rank_straggler_cost: float = declared(FRACTION, RANK_STRAGGLER_COST)
    rank_straggler_min_time: float = declared(SECONDS, RANK_STRAGGLER_MIN_TIME)
    cpu_threads_warning: float = declared(FRACTION, CPU_THREADS_WARNING)
    cpu_threads_min_step: float = declared(SECONDS, CPU_THREADS_MIN_STEP)
    low_mfu: float = declared(FRACTION, LOW_MFU)
    evidence_batches: int = declared(COUNT, EVIDENCE_BATCHES)
    cpu_contention: float = declared(FRACTION, CPU_CONTENTION)
    cpu_contention_critical: float = declared(FRACTION, CPU_CONTENTION_CRITICAL)

    def __post_init__(self) -> None:
        problems = _problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            raise ValueError("Invalid thresholds: " + "; ".join(problems))
        for name, kind in kinds_of(Thresholds).items():
            if kind in (COUNT, BYTES):  # a config file may give 3.0
                object.__setattr__(self, name, int(getattr(self, name)))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every threshold's name, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @class_or_instance_method
    def with_overrides(self, overrides: Mapping[str, Any]) -> Thresholds:
        """A copy with ``overrides`` applied, checked as a whole.

        Called on the class (``Thresholds.with_overrides({...})``) it starts from the defaults; called on an
        instance, from that instance's values.

        Raises:
            ValueError: Naming each unknown key (and listing the known ones), and each bad value with what
                is allowed, all in one message.
        """
        known = self.names()
        problems = [
            f"{key!s}={value!r}: unknown threshold (known: {', '.join(known)})"
            for key, value in overrides.items()
            if key not in known
        ]
        values = {name: getattr(self, name) for name in known}
        values.update({key: value for key, value in overrides.items() if key in known})
        problems += _problems(values, only=set(overrides))
        if problems:
            raise ValueError("Invalid threshold overrides: " + "; ".join(problems))
        return Thresholds(**values)


def _problems(values: Mapping[str, Any], only: set[str] | None = None) -> list[str]:
    """What is wrong with ``values``: each bad value (of the names in ``only``, if given), then bad orders."""
    problems = field_problems(Thresholds, values, only=only)
    kinds = kinds_of(Thresholds)
    for low, high in _ORDERED:
        a, b = values[low], values[high]
        if kinds[low].accepts(a) and kinds[high].accepts(b) and a > b:
            problems.append(f"{low}={a!r} > {high}={b!r}: {low} must not exceed {high}")
    return problems
