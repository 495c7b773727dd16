"""
Records
=======

Plain, frozen records that flow from the collectors to the summaries and the reports: numbers and
strings only, so every layer after ``collect`` can be tested without torch or a trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class OperatorStat:
    """One operator (or one operator and input shape) aggregated over a window.

    Times are in microseconds, memory in bytes. Device fields are ``None`` when no device activity was
    recorded, memory fields when ``profile_memory`` was off, ``input_shapes`` when ``record_shapes`` was.
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
class WindowRecord:
    """One saved profiler window: which batches it recorded, where its trace is, and its operators.

    Attributes:
        stage: ``"train"``, ``"validate"``, ``"test"`` or ``"predict"``.
        epoch: The stage's epoch (for validation: the number of validation runs before this one).
        first_batch: First recorded batch index within the epoch.
        last_batch: Last recorded batch index within the epoch.
        name: The window's directory name, also its run name in TensorBoard's PyTorch Profiler tab.
        trace_path: The Kineto trace this rank wrote.
        step: The TensorBoard step its operator table is logged at (see README, "Output").
        device: ``"cuda"`` when device activity was profiled, else ``"cpu"``.
        shortened: The stage's epoch ended before the window recorded all its planned batches.
        close_seconds: Time the training thread spent closing the window (trace export, tables).
        operators: The window's operators, in no particular order.
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
    operators: tuple[OperatorStat, ...] = field(default=(), repr=False)

    @property
    def num_batches(self) -> int:
        return self.last_batch - self.first_batch + 1
