"""
Step spans
==========

What the step summary (:mod:`lightning_perf.summarize.step_summary`) reads of a trace's host spans, sorted
out by kind in one pass over the event index (:class:`Scan`: the ``ProfilerStep#N`` spans, DataLoader,
optimizer, backward, synchronization and collective spans, ``torch.compile``'d code's calls and the guard
checks before them, device activity by start), and the steps' time ranges, which turn what happened in them
into means per step (:class:`Steps`).

This module imports neither torch nor lightning.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.summarize.events import Complete
from lightning_perf.summarize.index import TS_OF, Thread, TraceIndex
from lightning_perf.summarize.intervals import Interval, inside, length_within, union
from lightning_perf.traces import is_dataloader_next

OPTIMIZER_STEP_PREFIX = "Optimizer.step#"  # torch.optim's record_function around every optimizer.step()
BACKWARD_PREFIX = "autograd::engine::evaluate_function"  # one per backward node the autograd engine runs
# Host calls that wait for the device: ``.item()`` / ``bool(tensor)`` end in ``aten::_local_scalar_dense``;
# the rest are the runtime calls ``torch.cuda.synchronize()``, ``Stream/Event.synchronize()`` and blocking
# copies make (``cudaMemcpyAsync`` returns at once and is not one).
SYNC_NAMES = frozenset(
    {
        "aten::_local_scalar_dense",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
    }
)
# Host spans of collectives: the backend's own (``gloo:all_reduce``, ``nccl:all_reduce``, on the backend's
# worker threads for gloo) and c10d's dispatch and parameter-recording wrappers around them.
HOST_COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::")
HOST_COLLECTIVE_NAMES = frozenset({"record_param_comms"})
# Compiled code (torch.compile), as torch 2.x's profiler records it on the host: each call of a compiled frame
# is a ``Torch-Compiled Region: F/N`` span (frame F, its N-th compiled version) holding the AOTAutograd
# ``CompiledFunction`` of its forward; the backward is a ``CompiledFunctionBackward`` node (on the autograd
# thread, inside its ``autograd::engine::evaluate_function: ...``). Before each call, dynamo checks the
# cached versions' guards in a ``TorchDynamo Cache Lookup`` span.
COMPILED_REGION_PREFIX = "Torch-Compiled Region"
COMPILED_FUNCTION_NAMES = frozenset({"CompiledFunction", "CompiledFunctionBackward"})
GUARD_CHECK_NAME = "TorchDynamo Cache Lookup"
US = 1e-6  # trace times are microseconds; summaries are seconds

# Flags of a host span's name, worked out once per name (a trace has 10^5 spans of a few hundred names).
_DATALOADER, _OPTIMIZER, _BACKWARD, _SYNC, _COLLECTIVE, _COMPILED, _GUARD = 2, 4, 8, 16, 32, 64, 128
_NOT_OPS = _DATALOADER | _OPTIMIZER  # annotations by name, whatever their category (the rewrite makes them cpu_ops)


def _name_flags(name: str) -> int:
    flags = 0
    if is_dataloader_next(name):
        flags |= _DATALOADER
    elif name.startswith(OPTIMIZER_STEP_PREFIX):
        flags |= _OPTIMIZER
    elif name.startswith(BACKWARD_PREFIX):
        flags |= _BACKWARD
    elif name.startswith(COMPILED_REGION_PREFIX) or name in COMPILED_FUNCTION_NAMES:
        flags |= _COMPILED
    elif name == GUARD_CHECK_NAME:
        flags |= _GUARD
    if name in SYNC_NAMES:
        flags |= _SYNC
    elif name.startswith(HOST_COLLECTIVE_PREFIXES) or name in HOST_COLLECTIVE_NAMES:
        flags |= _COLLECTIVE
    return flags


@dataclass
class Scan:
    """What one pass over a trace's events keeps: intervals in microseconds, grouped by what they are."""

    index: TraceIndex
    step_spans: dict[Thread, list[Interval]] = field(default_factory=dict)
    dataloader: list[Interval] = field(default_factory=list)
    optimizer: list[tuple[float, float, str, Thread]] = field(default_factory=list)
    backward: list[Interval] = field(default_factory=list)
    syncs: dict[Thread, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    collectives: list[Interval] = field(default_factory=list)
    compiled: list[Interval] = field(default_factory=list)  # compiled code's calls, forward and backward
    guards: list[Interval] = field(default_factory=list)  # dynamo's guard checks
    not_ops: set[str] = field(default_factory=set)  # names of host spans that are no operators, any category
    device: list[Complete] = field(default_factory=list)  # kernels, copies, memsets, sorted by start
    device_id: Any = None

    @classmethod
    def of(cls, index: TraceIndex) -> Scan:
        scan = cls(index=index)
        for thread, spans in index.steps.items():
            scan.step_spans[thread] = [(e.ts, e.ts + e.dur) for e in spans]
        for thread, spans in index.host.items():
            flags = {name: f for name in index.columns[thread].names if (f := _name_flags(name))}
            not_ops = {name for name, f in flags.items() if f & _NOT_OPS}
            scan.not_ops |= not_ops
            if not flags:
                continue
            for e in map(spans.__getitem__, index.columns[thread].named(flags).nonzero()[0].tolist()):  # by name
                f, span = flags[e.name], (e.ts, e.ts + e.dur)
                if f & _DATALOADER:
                    scan.dataloader.append(span)
                elif f & _OPTIMIZER:
                    scan.optimizer.append((*span, e.name, thread))
                elif f & _BACKWARD and e.cat == "cpu_op":
                    scan.backward.append(span)
                elif f & _COMPILED:
                    scan.compiled.append(span)
                elif f & _GUARD:
                    scan.guards.append(span)
                if f & _SYNC:
                    scan.syncs[thread].append(span)
                elif f & _COLLECTIVE:
                    scan.collectives.append(span)
        scan.device = sorted(index.device, key=TS_OF)
        scan.device_id = next((e.args.device for e in index.device if e.cat == "kernel"), None)
        return scan

    def main_thread(self) -> tuple[Thread | None, list[Interval]]:
        """The main thread and its step spans (none: the thread of an optimizer step, else the busiest)."""
        if self.step_spans:
            main = max(self.step_spans, key=lambda thread: len(self.step_spans[thread]))
            return main, self.step_spans[main]
        marked = [thread for _, _, _, thread in self.optimizer]
        if marked:
            return marked[0], []
        if self.index.host:
            return max(self.index.host, key=lambda thread: len(self.index.host[thread])), []
        return None, []


@dataclass(frozen=True)
class Steps:
    """The steps' time ranges (merged) and how to turn what happened in them into means per step."""

    count: int
    ranges: list[Interval]
    total: float  # summed step spans, microseconds

    @classmethod
    def of(cls, spans: list[Interval]) -> Steps:
        return cls(count=len(spans), ranges=union(spans), total=sum(end - start for start, end in spans))

    @classmethod
    def whole(cls, scan: Scan) -> Steps:
        """The whole trace as one step: from its first host or device event to its last."""
        bounds = [(c.starts.min(), c.ends.max()) for c in scan.index.columns.values() if len(c.starts)]
        bounds += [(e.ts, e.ts + e.dur) for e in scan.device]
        if not bounds:
            return cls(count=1, ranges=[], total=0.0)
        whole = (float(min(start for start, _ in bounds)), float(max(end for _, end in bounds)))
        return cls(count=1, ranges=[whole], total=whole[1] - whole[0])

    def hold(self, point: float) -> bool:
        return inside(point, self.ranges)

    def time(self, merged: Sequence[Interval]) -> float:
        """Seconds per step of merged intervals within the steps."""
        return self.mean(length_within(merged, self.ranges))

    def mean(self, microseconds: float) -> float:
        """Seconds per step of a total in microseconds."""
        return microseconds * US / self.count

    def per_step(self, count: int) -> float:
        return count / self.count
