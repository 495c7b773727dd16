"""
FLOPs per batch
===============

One training batch's floating-point operations, forward and backward, counted by PyTorch's own
:class:`torch.utils.flop_counter.FlopCounterMode` (a dispatch mode that sees every ATen op and knows
formulas for matmuls, convolutions and attention). :class:`BatchFlopCounter` enters the mode at a batch's
start and leaves it at the batch's end, across two calls (``on_train_batch_start`` and
``on_train_batch_end``), and returns a :class:`BatchFlops` record. Of torch's counter only its dispatch step is
shortened: an op it would only run and count is run and counted without torch's attempt to decompose it, which
it makes on every op (half of the counted batch's extra time); the counts are torch's (a test holds them equal).

Notes:
    1. **When.** The first batch is counted, and again each batch whose inputs' shapes (its
       :func:`shape_key`) have not been counted yet, until :data:`MAX_COUNTS` shapes are counted.
       :meth:`BatchFlopCounter.wants` says whether a batch is to be counted; a counted batch runs slower
       (every op goes through Python) and is to be left out of step times.
    2. **torch.compile.** Measured on torch 2.13, CPU, ``backend="aot_eager"``: a dispatch mode active
       when a compiled frame is entered makes Dynamo skip that frame (``convert_frame``: "non-infra
       torch dispatch mode present") *and every later call of the same code*, so counting a compiled
       model naively leaves it eager for the rest of the run (0 compiled-graph calls after the count),
       whether it was compiled before the count or not; ``torch._dynamo.config.patch(disable=True)``
       does the same. The counted batch therefore runs under ``torch.compiler.set_stance("force_eager")``
       (torch >= 2.6): the model runs as written, its FLOPs are counted (equal to the eager count, with
       per-module names), nothing is compiled or marked skipped, and its later calls run the compiled
       graph again with no recompile. The count is the model's eager ops: a compiler may fuse or
       decompose ops, but it does not change the matmul and convolution work. On torch < 2.6 (no
       stances) the count runs as is, and a compiled model may stay eager after it.
    3. **Manual optimization, gradient accumulation.** Everything between the two calls is counted: the
       whole ``training_step`` with each ``manual_backward``, and every forward and backward of an
       accumulating batch. An optimizer step adds no matmul or convolution FLOPs, so batches with and
       without one count the same. Under automatic optimization the callback stops the count where the
       optimizer step starts (``on_before_optimizer_step``): Adam's step is 2,138 of the 3,603 ops of a
       ``benchmarks/forecaster.py`` batch, each through Python for nothing; an optimizer that multiplies
       matrices (Shampoo, Muon) is left out, as MFU's definition (the model's FLOPs) leaves it out.
    4. **Activation checkpointing.** The recomputed forward runs inside the backward and is counted:
       the figure is the FLOPs the hardware executed, not the model's (6 x params x tokens-style)
       FLOPs. Measured: a checkpointed MLP (``use_reentrant=False``) counts 96,256 + 32,768, its first
       Linear's forward again (non-reentrant recomputation stops once the saved tensors are back). The
       recomputation runs inside the backward, so it is in the total but not in :attr:`BatchFlops.by_module`.
    5. **Variable-length batches.** Each new shape is counted until :data:`MAX_COUNTS`; beyond it,
       :meth:`BatchFlopCounter.estimate` scales the count whose batch held the nearest number of
       input elements (samples x tokens) linearly to the batch's elements: exact for matmul-bound
       models in the sequence length, an underestimate of attention's quadratic term.
    6. **Ops the counter does not know** (custom kernels, ``torch.ops`` of extensions, Triton kernels,
       and every pointwise op, norm and reduction by design) count 0; biases are not counted either
       (a Linear's forward is ``2 * B * in * out``, a convolution's ``2 * B * Cout * Hout * Wout * Cin
       * k * k``, grouped convolutions counted as if ungrouped, as PyTorch's formulas do). Those of them
       whose name says they do matrix work (:data:`MATRIX_WORK`: on torch 2.13's CPU, ``nn.LSTM`` and
       ``nn.GRU`` run ``aten.mkldnn_rnn_layer``, which has no formula, so an LSTM counts 0) are kept in
       :attr:`BatchFlops.uncounted`: the count is a lower bound, and the callback says so.
    7. **Modules are charged their forward.** torch's ``ModuleTracker`` enters a module's backward when its
       outputs' gradients arrive and leaves it when its inputs' gradients are computed; a module none of whose
       inputs needs a gradient (a block over static covariates, an embedding's consumer) is never left, and
       every later backward op is charged to it too (pytorch-forecasting's TemporalFusionTransformer: module
       shares adding up to 2.24x the batch's FLOPs). :attr:`BatchFlops.by_module` therefore holds each
       module's forward FLOPs, which hooks around ``forward`` attribute exactly, and
       :attr:`BatchFlops.forward` their total: a module's share is of the forward pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from lightning_perf.collect.batch import MAX_DEPTH, infer_batch_size

MAX_COUNTS = 4
"""Distinct batch shapes counted per run. A counted batch runs several times slower (each op goes through
Python and a module tracker), so a run with a new length each batch must not pay that each batch; four
covers fixed-size training plus a last partial batch and a few buckets of a bucketed sampler."""

DEPTH = 3
"""Module depth of the breakdown: ``Model.backbone.layer1`` is depth 3. The root is the first module
called (the LightningModule's child when ``training_step`` calls ``self.model``), so depth 3 reaches
the blocks of a wrapped network."""

TOP_MODULES = 10
"""How many modules :attr:`BatchFlops.by_module` keeps, largest first."""

MATRIX_WORK = re.compile(r"rnn|lstm|gru|conv|mm|matmul|linear|gemm|einsum|attention|attn", re.IGNORECASE)
"""An op without a FLOP formula whose name matches does matrix work that the count leaves out (Notes 6), unless
its name matches :data:`NOT_MATRIX_WORK`."""

NOT_MATRIX_WORK = re.compile(r"upsample|interp|grid_sampler", re.IGNORECASE)
"""Ops whose names hold a :data:`MATRIX_WORK` word but that interpolate, a few FLOPs per output element
(``aten.upsample_linear1d``, used by pytorch-forecasting's TemporalFusionTransformer)."""

MAX_KEY_NODES = 1024
"""Objects :func:`shape_key` visits at most: a batch that carries a long Python list (token ids, file
names) costs one bounded walk per batch, not one per element."""

ShapeKey = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, kw_only=True)
class BatchFlops:
    """One counted training batch.

    Attributes:
        total: FLOPs of the batch, forward and backward (multiply-adds count 2).
        by_module: ``(module name, forward FLOPs)`` of the largest modules at the counter's depth, largest
            first; names as ``FlopCounterMode`` gives them (``"Model.encoder.0"``); Notes 7.
        shape_key: The shapes of the batch's tensors, in walk order (:func:`shape_key`).
        batch_size: Samples in the batch (the first dimension of its first tensor), or ``None``.
        elements: Elements in all the batch's tensors, what :meth:`BatchFlopCounter.estimate` scales by.
        forward: FLOPs of the forward passes (outside any backward): what :attr:`by_module` is a share of.
        uncounted: ``(op, calls)`` of the ops that do matrix work but have no FLOP formula, most calls first:
            they count 0 (Notes 6).
    """

    total: int
    by_module: tuple[tuple[str, int], ...]
    shape_key: ShapeKey
    batch_size: int | None
    elements: int
    forward: int = 0
    uncounted: tuple[tuple[str, int], ...] = ()


_TorchDispatch: Any = getattr(flop_counter, "_FlopCounterMode", None)  # torch's dispatch mode of the counter
_DECOMPOSED = torch._C.DispatchKey.CompositeImplicitAutograd


def _runs_as_is(func: Any) -> bool:
    """Whether torch's counter runs ``func`` as it is and only counts it: an ATen op that returns tensors and
    has no decomposition (torch's counter tries one on every op, each time: most of its cost)."""
    if not isinstance(func, torch._ops.OpOverload) or not any("Tensor" in str(r.type) for r in func._schema.returns):
        return False  # higher-order ops and metadata queries (sizes, strides): torch's own handling
    return _DECOMPOSED not in func.py_kernels and not torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), _DECOMPOSED
    )


if _TorchDispatch is not None:

    class _ShortDispatch(_TorchDispatch):
        """torch's dispatch mode of the counter with its common case short: an op that torch's mode would only run
        and count (:func:`_runs_as_is`, decided once per op) is run and counted at once; every other op goes
        through torch's mode. The same counts; a counted batch of ``benchmarks/forecaster.py`` (3,069 ops) takes
        about half the extra time."""

        _as_is: ClassVar[dict[Any, bool]] = {}  # per op, for every count: ops are process-wide

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            as_is = self._as_is.get(func)
            if as_is is None:
                as_is = self._as_is[func] = _runs_as_is(func)
            if not as_is:
                return super().__torch_dispatch__(func, types, args, kwargs)
            kwargs = kwargs or {}
            return self.counter._count_flops(func._overloadpacket, func(*args, **kwargs), args, kwargs)


class _ForwardChargedCounter(FlopCounterMode):
    """torch's counter, charging backward ops to the batch's total only (Notes 7) and keeping the ops that do
    matrix work with no formula (Notes 6). Overrides ``FlopCounterMode._count_flops`` (torch 2.1-2.13: called
    with every op the mode did not decompose)."""

    _matrix_work: ClassVar[dict[Any, bool]] = {}  # per op with no formula: whether its name says matrix work

    def __init__(self, depth: int) -> None:
        super().__init__(display=False, depth=depth)
        self.forward = 0
        self.uncounted: Counter[str] = Counter()

    def __enter__(self) -> _ForwardChargedCounter:
        if _TorchDispatch is None:  # a torch whose counter has no dispatch mode of its own: torch's as it is
            super().__enter__()
            return self
        self.flop_counts.clear()  # FlopCounterMode.__enter__ (torch 2.4-2.13), with the shorter dispatch mode
        self.mod_tracker.__enter__()
        self.mode = _ShortDispatch(self)
        self.mode.__enter__()
        return self

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        formula = self.flop_registry.get(func_packet)
        if formula is None:
            matrix_work = self._matrix_work.get(func_packet)
            if matrix_work is None:
                name = str(func_packet)
                matrix_work = self._matrix_work[func_packet] = bool(
                    MATRIX_WORK.search(name) and not NOT_MATRIX_WORK.search(name)
                )
            if matrix_work:
                self.uncounted[str(func_packet)] += 1
            return out
        flops = formula(*args, **kwargs, out_val=out)
        if torch._C._current_graph_task_id() != -1:  # inside autograd's backward
            self.flop_counts["Global"][func_packet] += flops
            return out
        self.forward += flops
        for parent in set(self.mod_tracker.parents):
            self.flop_counts[parent][func_packet] += flops
        return out


def shape_key(batch: Any, *, max_depth: int = MAX_DEPTH) -> ShapeKey:
    """The shapes of the tensors in ``batch``, depth-first, through the containers that
    :func:`~lightning_perf.collect.batch.infer_batch_size` opens (mappings, lists, tuples, dataclasses) and
    graph batches' tensors (``to_dict()`` of an object with ``num_graphs``: torch_geometric's ``Batch``).

    Reads metadata only (no device sync); never raises; visits at most :data:`MAX_KEY_NODES` objects.

    Examples:
        >>> shape_key({"x": torch.zeros(8, 3), "meta": ["a"], "y": (torch.zeros(8),)})
        ((8, 3), (8,))
    """
    shapes: list[tuple[int, ...]] = []
    budget = [MAX_KEY_NODES]

    def walk(obj: Any, depth_left: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            return
        if isinstance(obj, Tensor):
            shapes.append((-1,) if obj.is_nested else tuple(obj.shape))
            return
        if isinstance(obj, (str, bytes, bytearray)) or depth_left <= 0:
            return
        if isinstance(obj, (list, tuple)):
            children: Any = obj
        elif isinstance(obj, Mapping):
            children = obj.values()
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            children = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
        elif hasattr(obj, "num_graphs") and callable(getattr(obj, "to_dict", None)):
            children = obj.to_dict().values()  # a graph batch (torch_geometric): its node and edge tensors
        else:
            return
        for child in children:
            walk(child, depth_left - 1)
            if budget[0] < 0:
                return

    with contextlib.suppress(Exception):  # an odd container that fails to be read: the shapes so far
        walk(batch, max_depth)
    return tuple(shapes)


class BatchFlopCounter:
    """Counts the FLOPs of a few training batches, each between :meth:`start` and :meth:`stop`.

    Args:
        max_counts: Distinct batch shapes to count at most (:data:`MAX_COUNTS`).
        depth: Module depth of :attr:`BatchFlops.by_module` (:data:`DEPTH`).
        top: Modules kept in :attr:`BatchFlops.by_module` (:data:`TOP_MODULES`).
        batch_size: What counts a batch's samples (the epoch's own: the user's ``batch_size_fn``), so that FLOPs
            per sample are per the same samples the epoch's throughput counts; :func:`infer_batch_size` when
            ``None``.

    Raises:
        ValueError: ``max_counts``, ``depth`` or ``top`` is below 1.

    Example::

        counter = BatchFlopCounter()
        if counter.wants(batch):
            counter.start(batch)
            try:
                loss = model(batch).sum()
                loss.backward()
            except BaseException:
                counter.cancel()
                raise
            record = counter.stop()
    """

    def __init__(
        self,
        *,
        max_counts: int = MAX_COUNTS,
        depth: int = DEPTH,
        top: int = TOP_MODULES,
        batch_size: Callable[[Any], int | None] | None = None,
    ) -> None:
        given = {"max_counts": max_counts, "depth": depth, "top": top}
        bad = [f"{name}={value!r}" for name, value in given.items() if value < 1]
        if bad:
            raise ValueError(f"BatchFlopCounter needs positive integers; got {', '.join(bad)}")
        self.max_counts, self.depth, self.top = max_counts, depth, top
        self._batch_size = batch_size or infer_batch_size
        self._counted: dict[ShapeKey, BatchFlops] = {}
        self._mode: _ForwardChargedCounter | None = None
        self._exits: contextlib.ExitStack | None = None
        self._batch: tuple[ShapeKey, int | None, int] | None = None

    @property
    def active(self) -> bool:
        """Whether a count is under way (between :meth:`start` and :meth:`stop` or :meth:`cancel`)."""
        return self._mode is not None

    @property
    def records(self) -> tuple[BatchFlops, ...]:
        """The counts made so far, in order."""
        return tuple(self._counted.values())

    def wants(self, batch: Any) -> bool:
        """Whether ``batch`` is to be counted: its shapes are new and fewer than ``max_counts`` were."""
        return not self.active and len(self._counted) < self.max_counts and shape_key(batch) not in self._counted

    def start(self, batch: Any) -> None:
        """Starts counting: every op until :meth:`stop` is counted. A count left open is cancelled first."""
        self.cancel()
        key = shape_key(batch)
        self._batch = (key, self._batch_size(batch), sum(_numel(shape) for shape in key))
        mode = _ForwardChargedCounter(self.depth)
        with contextlib.ExitStack() as exits:
            set_stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6; see Notes 2
            if set_stance is not None:
                exits.enter_context(set_stance("force_eager"))
            # The module tracker's global hooks make OptimizedModule warn once per count; not the user's.
            exits.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
            exits.enter_context(mode)
            self._exits, self._mode = exits.pop_all(), mode

    def stop(self) -> BatchFlops:
        """Stops counting and returns the batch's record.

        Raises:
            RuntimeError: No count is under way.
        """
        mode, batch = self._mode, self._batch
        if mode is None or batch is None:
            raise RuntimeError("BatchFlopCounter.stop() called with no count under way; call start() first")
        self.cancel()
        counts = {name: sum(ops.values()) for name, ops in mode.get_flop_counts().items()}
        key, batch_size, elements = batch
        record = BatchFlops(
            total=mode.get_total_flops(),
            by_module=_top_modules(counts, self.depth, self.top),
            shape_key=key,
            batch_size=batch_size,
            elements=elements,
            forward=mode.forward,
            uncounted=tuple(mode.uncounted.most_common()),
        )
        self._counted[key] = record
        return record

    def cancel(self) -> None:
        """Leaves the count under way, if any, and records nothing: safe to call at any time."""
        exits, self._exits, self._mode = self._exits, None, None
        if exits is not None:
            with contextlib.suppress(Exception):  # leave what can be left; a count failing must not fail training
                exits.close()

    def estimate(self, batch: Any) -> int | None:
        """FLOPs of ``batch``: its count where its shapes were counted, else the count with the nearest
        number of elements scaled to the batch's (Notes 5); ``None`` before any count."""
        key = shape_key(batch)
        if key in self._counted:
            return self._counted[key].total
        if not self._counted:
            return None
        elements = sum(_numel(shape) for shape in key)
        nearest = min(self._counted.values(), key=lambda r: abs(r.elements - elements))
        return round(nearest.total * elements / nearest.elements) if nearest.elements else nearest.total


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= max(d, 0)
    return n


def _top_modules(counts: dict[str, int], depth: int, top: int) -> tuple[tuple[str, int], ...]:
    """The deepest counted modules at most ``depth`` deep (those with no counted child that deep), largest
    first; a parent whose children are listed is left out, so that the forward shares add up to at most 1."""
    names = [n for n in counts if n != "Global" and n.count(".") < depth and counts[n] > 0]
    leaves = [n for n in names if not any(o.startswith(n + ".") for o in names)]
    return tuple(sorted(((n, counts[n]) for n in leaves), key=lambda item: (-item[1], item[0]))[:top])
