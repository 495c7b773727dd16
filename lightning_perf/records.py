"""
Records
=======

Plain, frozen records that flow from the collectors to the summaries and the reports: numbers and
strings only, so every layer after ``collect`` can be tested without torch or a trainer.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

# The compile records live apart, and are imported from here like the others.
from lightning_perf.compile_records import CompileStats as CompileStats
from lightning_perf.compile_records import GraphBreak as GraphBreak
from lightning_perf.compile_records import Recompile as Recompile

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True, kw_only=True)
class OperatorStat:
    """One operator (or one operator and input shape) aggregated over a window.

    Times are in microseconds, memory in bytes; a field is ``None`` where the window did not record it.

    Attributes:
        name: The operator's name as recorded (``aten::addmm``, ``Optimizer.step#Adam.step``).
        calls: How many times it ran in the window.
        self_cpu_time, cpu_time: Host time in the operator, without and with its children.
        self_device_time, device_time: Device time of its kernels, without and with its children's.
        self_cpu_memory, self_device_memory: Memory it allocated less what it freed (``profile_memory``).
        input_shapes: Its inputs' shapes (``record_shapes``: one row per operator and shapes).
        flops: The FLOPs the profiler estimated for it (``with_flops``).
    """

    name: str
    calls: int
    self_cpu_time: float
    cpu_time: float
    self_device_time: float | None = None
    device_time: float | None = None
    self_cpu_memory: int | None = None
    self_device_memory: int | None = None
    input_shapes: str | None = None
    flops: int | None = None


@dataclass(frozen=True, kw_only=True)
class CollectiveStats:
    """One kind of collective in one process group, over a window (:mod:`lightning_perf.summarize.collectives`).

    Attributes:
        kind: The ``Collective name`` as Kineto writes it (``allreduce``, ``_allgather_base``...).
        group: The process group's description (``default_pg``), else its name, else ``""``.
        ranks: Its ``Group size``.
        calls: Calls in the window.
        per_step: Calls per recorded step.
        bytes: Bytes moved in all (each call's larger of input and output); ``None`` where a dtype is unknown.
        seconds: Their time in all.
        exposed_seconds: Of ``seconds``, the time no compute overlapped.
        on_device: Timed on the device (NCCL kernels), not on the host (gloo).
        algorithm_bandwidth: ``bytes / seconds``, in bytes per second (``None`` without bytes or time).
        bus_bandwidth: The algorithm bandwidth times nccl-tests' factor for the kind and ``ranks`` (``None`` for a
            kind nccl-tests does not define).
    """

    kind: str
    group: str
    ranks: int
    calls: int
    per_step: float
    bytes: int | None
    seconds: float
    exposed_seconds: float
    on_device: bool
    algorithm_bandwidth: float | None = None
    bus_bandwidth: float | None = None


@dataclass(frozen=True, kw_only=True)
class WindowRecord:
    """One saved profiler window: which batches it recorded, where its trace is, and its operators.

    Attributes:
        stage: ``"train"``, ``"validate"``, ``"test"`` or ``"predict"``.
        epoch: The stage's epoch (for validation: the number of validation runs before this one).
        first_batch: First recorded batch index within the epoch.
        last_batch: Last recorded batch index within the epoch.
        name: The window's directory name, also its run name in TensorBoard's PyTorch Profiler tab.
        trace_path: The Kineto trace this rank wrote.
        step: The TensorBoard step its operator table is logged at (see docs/output.md).
        device: ``"cuda"`` when device activity was profiled, else ``"cpu"``.
        shortened: The stage's epoch ended before the window recorded all its planned batches.
        close_seconds: The training thread's stall when the window closed: stopping the profiler and torch's
            trace export. Writing the trace file, the tables and this record happen on a background thread.
        cuda_max_allocated, cuda_max_reserved: Peaks of the CUDA caching allocator while the window
            recorded, in bytes (``None`` without CUDA).
        cpu_wait: Seconds the training thread waited for a CPU while the window recorded (a busy machine);
            ``None`` where not measured (not Linux, reports written before it was).
        cost_seconds: What the window cost the run, measured at its epoch's end (:mod:`lightning_perf.budget`):
            ``close_seconds``, its warm-up and recorded batches and those while its trace was processed beyond
            the stage's median step, and any wait for its processing at the epoch's end; ``None`` until then.
        operators: The window's operators, in no particular order.
        summary: What the window's trace shows, per step (the input of the trace-level rules).
        collectives: Its collective communication per kind and process group, the most time first.
    """

    stage: str
    epoch: int
    first_batch: int
    last_batch: int
    name: str
    trace_path: str
    step: int
    device: str
    shortened: bool = False
    close_seconds: float = 0.0
    cuda_max_allocated: int | None = None
    cuda_max_reserved: int | None = None
    cpu_wait: float | None = None
    cost_seconds: float | None = None
    operators: tuple[OperatorStat, ...] = field(default=(), repr=False)
    summary: TraceSummary | None = field(default=None, repr=False)
    collectives: tuple[CollectiveStats, ...] = field(default=(), repr=False)

    @property
    def num_batches(self) -> int:
        return self.last_batch - self.first_batch + 1


PHASES = ("forward", "backward", "optimizer", "other")
"""The phases of a training batch's compute (:mod:`lightning_perf.collect.phases`), as :class:`EpochSummary`'s
``<phase>_time``, ``<phase>_p50`` and ``<phase>_p90`` fields name them."""

MANUAL_NOTE = (
    "manual optimization: forward is `training_step`'s code before its first backward; its code between the"
    " optimizer calls is other"
)
"""What the phases cannot split under manual optimization (:mod:`lightning_perf.collect.phases`, Notes 6), said
beside them (``run.manual_optimization``)."""


@dataclass(frozen=True, kw_only=True)
class EpochSummary:
    """What one epoch of one stage looked like, from the always-on measurements (no profiler).

    Times are in seconds, memory in bytes; a field is ``None`` where it could not be measured (batch sizes
    not inferable, no loss returned, no ``/proc``, no CUDA).

    Attributes:
        stage: ``"train"``, ``"validate"``, ``"test"`` or ``"predict"``.
        epoch: The stage's epoch (for validation: the number of validation runs before this one); the last of
            :attr:`epochs`.
        epochs: The consecutive epochs measured together, ending at :attr:`epoch`: 1, or more in a run of short
            epochs, where each stage epoch's own summary, scalars and report would cost more than the
            measurement share allows (:mod:`~lightning_perf.hooks.epoch_report`, Notes 2). The times, batches
            and peaks below are the group's; ``first_data_wait`` sums its epochs' first waits.
        batches: Batches measured.
        profiled_batches: Of those, batches left out of the times, percentiles and throughput below: those
            that ran inside a profiler window (the profiler slows them down), the one right after each window's
            close (which holds what the close left behind), the one whose FLOPs were counted, and those during
            which ``torch.compile`` compiled (seconds of a one-off cost). Not only profiled ones, despite the
            name: a training epoch without any window has one where it counted a new batch shape's FLOPs
            (the run's first epoch, usually its batch 1).
        samples: Samples in the batches not profiled.
        step_time: Sum of the batches' step times (data wait + compute).
        data_wait: Sum of the batches' data-wait times.
        step_time_p50, step_time_p90, step_time_max: Step-time percentiles.
        data_wait_fraction: ``data_wait / step_time``.
        throughput: ``samples / step_time``, samples per second.
        loss: Mean of the losses the stage's ``*_step`` returned.
        host_rss: The process's resident memory at the epoch's end.
        host_rss_peak: The highest resident memory sampled during the epoch (at the logging cadence and at
            its end).
        cuda_max_allocated, cuda_max_reserved: Peaks of the CUDA caching allocator during the epoch.
        cuda_capacity: The device's total memory.
        cuda_utilization: ``torch.cuda.utilization()`` at the epoch's end, in %, where NVML is available.
        interrupted: The epoch did not end: an exception or Ctrl-C stopped it; what it had run is summarized.
        first_data_wait: The first batch's data wait, profiled or not: it holds the DataLoader's start-up
            (its worker processes, or an iterable dataset's first fetch), also where Lightning starts it
            before the epoch-start hook.
        loading_cpu_share: The median, over the data waits of batches 1, 5, 9, ... (sampled), of the training
            process's CPU seconds over the wait's wall seconds less its main thread's time queued for a CPU (at most
            1): near 1 when it loads batches with its own CPU, near 0 when it sleeps or waits for workers, a
            disk or the network, on a busy machine too.
        loading_queue_share: The share of those sampled waits its main thread waited for a CPU: a busy machine's
            part of the wait, however the loading uses the CPU (a sleeping dataset's thread queues after each
            wake).
        worker_cpu: CPU seconds of the process's children (its DataLoader workers) during the epoch.
        wall_time: Seconds from the epoch's start (the DataLoader's start-up included) to its end hook.
        cpu_wait_share: The share of ``wall_time`` the training process's main thread was ready to run but
            waited for a CPU: other threads or processes held the CPUs (a busy machine).
        other_cpu_load: The CPUs' worth the machine's other processes used during ``wall_time`` (all CPU time
            on the machine less this process's and its children's): near 0 on an idle machine, where a
            ``cpu_wait_share`` is the run's own threads' doing.
        cpu_steal_share: The share of the CPUs' time (those this process may use) during ``wall_time`` that a
            virtual machine's host ran something else while they had work (``/proc/stat``'s ``steal``, in 10 ms
            ticks): a wait for a CPU that the run queue cannot see. 0 on a machine of its own.
        flops_per_batch: The FLOPs of one of the stage's batches, forward and backward, as counted on a batch
            of the run (``torch.utils.flop_counter``), per sample times the epoch's mean batch size; ``None``
            until a batch is counted (training only).
        flops_per_second: The FLOPs of the epoch's measured batches (per sample, times their samples) over
            their wall time (step times, data wait included).
        mfu: ``flops_per_second`` over the device's dense peak for the run's dtype, where that peak is known.
        forward_time: Of ``step_time``, the batches' forward (``training_step``), from the marks of Lightning's
            hooks in every training batch (:mod:`lightning_perf.collect.phases`); ``None`` for the other stages.
        backward_time: The same for backward.
        optimizer_time: The same for the optimizer step (``zero_grad``, the closure's bookkeeping, gradient
            clipping and the update).
        other_time: The same for the rest of the compute (Lightning's bookkeeping and the other callbacks' hooks).
        forward_p50: The median batch's forward, in seconds; ``None`` as ``forward_time``.
        forward_p90: Its 90th percentile.
        backward_p50: The median batch's backward.
        backward_p90: Its 90th percentile.
        optimizer_p50: The median batch's optimizer step.
        optimizer_p90: Its 90th percentile.
        other_p50: The median batch's other compute.
        other_p90: Its 90th percentile.
    """

    stage: str
    epoch: int
    batches: int
    samples: int | None
    step_time: float
    data_wait: float
    step_time_p50: float
    step_time_p90: float
    step_time_max: float
    data_wait_fraction: float
    throughput: float | None
    profiled_batches: int = 0
    loss: float | None = None
    host_rss: int | None = None
    host_rss_peak: int | None = None
    cuda_max_allocated: int | None = None
    cuda_max_reserved: int | None = None
    cuda_capacity: int | None = None
    cuda_utilization: int | None = None
    interrupted: bool = False
    first_data_wait: float | None = None
    epochs: int = 1
    loading_cpu_share: float | None = None
    loading_queue_share: float | None = None
    worker_cpu: float | None = None
    wall_time: float | None = None
    cpu_wait_share: float | None = None
    other_cpu_load: float | None = None
    cpu_steal_share: float | None = None
    flops_per_batch: float | None = None
    flops_per_second: float | None = None
    mfu: float | None = None
    forward_time: float | None = None
    backward_time: float | None = None
    optimizer_time: float | None = None
    other_time: float | None = None
    forward_p50: float | None = None
    forward_p90: float | None = None
    backward_p50: float | None = None
    backward_p90: float | None = None
    optimizer_p50: float | None = None
    optimizer_p90: float | None = None
    other_p50: float | None = None
    other_p90: float | None = None

    @property
    def measured_batches(self) -> int:
        """The batches the times, percentiles and throughput are over: those not profiled."""
        return self.batches - self.profiled_batches


@dataclass(frozen=True, kw_only=True)
class TraceSummary:
    """What one window's trace shows, as means per recorded step, in seconds (counts per step as floats).

    Computed in one pass over the trace by :func:`lightning_perf.summarize.step_summary.summarize_trace`. Device
    fields are ``None`` when the trace holds no device activity (a CPU run).

    Attributes:
        window: The window's name (its run directory), to tie findings to the trace that shows them.
        steps: ``ProfilerStep#N`` spans in the trace.
        step_time: Mean step span.
        dataloader_time: DataLoader ``__next__`` spans.
        dataloader_ops_per_step: Top-level host operators inside those spans (the main thread's: a dataset's
            own torch calls with ``num_workers=0``, one or more per sample where it transforms samples one by
            one). ``None`` in reports written before it was measured.
        optimizer_time: ``Optimizer.step#...`` spans (under Lightning's automatic optimization they hold
            the closure's forward and backward too).
        optimizer_update_time: The optimizer's own update: the part of its span after the last forward or
            backward operator inside it.
        optimizer_update_ops: Host operators in that update part, per step.
        optimizer_foreach: Whether the update used multi-tensor (``_foreach_``) or fused kernels; ``None``
            without an optimizer step.
        optimizer_fused: Whether those were fused ones (``aten::_fused_adamw_``: ``fused=True``).
        host_op_time: Main-thread time covered by torch operators or annotations (top level).
        framework_time: Main-thread step time covered by none: the Python of the training loop, hooks,
            callbacks, logging, progress bar.
        ops_per_step: Host (``cpu_op``) operators.
        median_op_time: Median duration of top-level host operators.
        tiny_op_time: The step's own tiny operators: main-thread top-level host operators shorter than
            :data:`lightning_perf.summarize.step_summary.TINY_OP_US` (20 us, about an eager operator's dispatch
            cost) that start in the steps outside the DataLoader's ``__next__`` spans; their durations and,
            for each, the gap before it where shorter than that cutoff (the Python that dispatched it).
            ``None`` in reports written before it was measured.
        tiny_ops_per_step: Those operators.
        device_busy: Time at least one kernel, copy or memset ran on the device, within step spans.
        kernels_per_step: Kernels.
        median_kernel_time: Median kernel duration.
        kernel_time: Sum of kernel durations.
        fp32_gemm_time: Kernel time of fp32 matmul/convolution kernels that do not use tensor cores.
        h2d_time: Host-to-device copies.
        h2d_exposed_time: Host-to-device copy time during which no kernel ran.
        h2d_pageable: Some host-to-device copies came from pageable (not pinned) memory.
        syncs_per_step: Host-device synchronizations (``aten::_local_scalar_dense`` from ``.item()``,
            ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, blocking
            ``cudaMemcpy``).
        sync_idle_time: Device idle time while the host was inside those synchronizations.
        communication_time: Collective kernels (NCCL) or, without them, collective host calls (gloo).
        communication_exposed_time: Communication time during which no compute kernel ran (for host
            collectives: all of it).
        device_name: From the trace's ``deviceProperties``.
        tensor_core_capable: The device has tensor cores (compute capability >= 7.0).
        compiled_time: Host time inside ``torch.compile``'d code: the union, on any thread, of the
            ``Torch-Compiled Region: F/N`` spans (a compiled frame's call, with the ``CompiledFunction`` of
            its forward inside) and the ``CompiledFunctionBackward`` spans (its backward, on the autograd
            thread). ``None`` when the trace holds no such span (nothing compiled, or a report written before
            it was measured).
        guard_time: Time in dynamo's guard checks before each compiled call (``TorchDynamo Cache Lookup``
            spans, any thread). ``None`` when the trace holds no such span.
        cpu_wait_time: Time the training thread waited for a CPU while the window recorded, per step (not from
            the trace: the window's ``WindowRecord.cpu_wait``); ``None`` for a trace alone.
        cpu_forward_peak: Bytes: the most CPU memory a step's forward (up to its backward's first node) allocated
            above the lowest it had held since the step began, the largest over the steps: its activations and
            the forward's temporaries. ``None`` without the CPU memory events of ``profile_memory=True``.
    """

    window: str
    steps: int
    step_time: float
    dataloader_time: float
    optimizer_time: float
    optimizer_update_time: float
    optimizer_update_ops: float
    optimizer_foreach: bool | None
    host_op_time: float
    framework_time: float
    ops_per_step: float
    median_op_time: float
    tiny_op_time: float | None = None
    tiny_ops_per_step: float | None = None
    dataloader_ops_per_step: float | None = None
    device_busy: float | None = None
    kernels_per_step: float | None = None
    median_kernel_time: float | None = None
    kernel_time: float | None = None
    fp32_gemm_time: float | None = None
    h2d_time: float | None = None
    h2d_exposed_time: float | None = None
    h2d_pageable: bool | None = None
    syncs_per_step: float | None = None
    sync_idle_time: float | None = None
    communication_time: float | None = None
    communication_exposed_time: float | None = None
    device_name: str | None = None
    tensor_core_capable: bool | None = None
    compiled_time: float | None = None
    guard_time: float | None = None
    cpu_wait_time: float | None = None
    cpu_forward_peak: int | None = None
    optimizer_fused: bool | None = None


def share(part: float | None, window: TraceSummary) -> float | None:
    """``part / window.step_time``; ``None`` when ``part`` was not measured or the window has no steps."""
    if part is None or window.step_time <= 0:
        return None
    return part / window.step_time


@dataclass(frozen=True, kw_only=True)
class RankSummary:
    """One rank's view of a stage's epoch, as gathered to rank zero (seconds, bytes; ``None``: unknown).

    Attributes:
        rank: The global rank.
        step_time_p50, step_time_p90, step_time_max: Its step-time percentiles.
        data_wait_fraction: Its data wait over its step time.
        throughput: Its samples per second.
        host_rss_peak: Its process's resident memory peak.
        cuda_max_allocated, cuda_max_reserved: Its CUDA allocator peaks.
        communication_share: Exposed collective time over step time, in its windows of the epoch.
        flops_per_second: Its achieved FLOP/s (see :attr:`EpochSummary.flops_per_second`).
        cpu_wait_share: The share of its epoch its training thread waited for a CPU (see
            :attr:`EpochSummary.cpu_wait_share`).
    """

    rank: int
    step_time_p50: float | None
    step_time_p90: float | None
    step_time_max: float | None
    data_wait_fraction: float | None
    throughput: float | None
    host_rss_peak: float | None
    cuda_max_allocated: float | None
    cuda_max_reserved: float | None
    communication_share: float | None
    flops_per_second: float | None = None
    cpu_wait_share: float | None = None


@dataclass(frozen=True, kw_only=True)
class ModelMemory:
    """What a module's parameters, gradients and optimizer state hold, in bytes, each storage counted once.

    Built by :func:`lightning_perf.collect.model_memory.model_memory`.

    Attributes:
        device: The parameters' device type (``"cuda"``, ``"cpu"``; ``"mixed"``; ``None`` without parameters).
        parameters: Parameter bytes by dtype name (``"float32"``, ``"bfloat16"``).
        trainable: Bytes of parameters that require gradients.
        frozen: Bytes of parameters that do not.
        gradients: Bytes of the ``.grad`` tensors that exist.
        optimizer_state: Optimizer state bytes by entry name (``"exp_avg"``, ``"momentum_buffer"``, ``"step"``).
        master_copies: Bytes of parameters an optimizer steps that are not the module's (fp32 master weights).
        optimizers: The optimizers' class names.
    """

    device: str | None
    parameters: Mapping[str, int]
    trainable: int
    frozen: int
    gradients: int
    optimizer_state: Mapping[str, int]
    master_copies: int
    optimizers: tuple[str, ...]

    @property
    def held(self) -> int:
        """Everything counted: parameters, gradients, optimizer state and master copies."""
        return self.trainable + self.frozen + self.gradients + sum(self.optimizer_state.values()) + self.master_copies


@dataclass(frozen=True)
class StepSplit:
    """An epoch's step time per batch, split into data wait and compute, as the report keeps it for its chart.

    Built by :func:`lightning_perf.summarize.steps.step_split` from the epoch's per-batch measurements.

    Attributes:
        data_wait: Seconds waiting for data, per bar.
        compute: Seconds of the rest of the step, per bar.
        per_bar: Consecutive batches merged into one bar (the mean of each part): 1, unless the epoch had more
            batches than a chart shows bars.
        profiled: The ``(first, last)`` batch indices (inclusive) of each stretch that ran inside a profiler
            window.
        compiled: The batches during which ``torch.compile`` compiled.
    """

    data_wait: tuple[float, ...]
    compute: tuple[float, ...]
    per_bar: int = 1
    profiled: tuple[tuple[int, int], ...] = ()
    compiled: tuple[int, ...] = ()


_Record = TypeVar("_Record", bound="DataclassInstance")


def plain(record: DataclassInstance) -> dict[str, Any]:
    """A flat record's fields as a dict: what ``dataclasses.asdict`` gives for the records here whose fields are
    numbers and strings (every one but :class:`WindowRecord`), ten times faster (no deep copy)."""
    return {name: getattr(record, name) for name in _field_names(type(record))}


@functools.cache
def _field_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def from_values(cls: type[_Record], values: Mapping[str, Any]) -> _Record:
    """A record (one of the dataclasses here, or :class:`~lightning_perf.diagnose.model.Finding`) from plain
    values (a checkpoint's, a report's), leaving out the keys it has no field for: a newer writer's."""
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})
