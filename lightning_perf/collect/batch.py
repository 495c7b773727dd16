"""
Batch sizes
===========

How many samples a training batch holds, read from the batch itself, so that step times can be turned
into samples per second.

:func:`infer_batch_size` follows the rule of Lightning's own
``lightning.pytorch.utilities.data.extract_batch_size`` (the one ``self.log`` uses): walk the batch
depth-first, in order, and take the first dimension of the first tensor found. It walks

- tensors: ``tensor.size(0)``, a read of metadata that never synchronises with the device;
- mappings (``dict`` and any :class:`~collections.abc.Mapping`): their values, in iteration order;
- lists and tuples, namedtuples included;
- dataclass instances: their fields, in declaration order;
- graph batches (torch_geometric's ``Batch``, ``HeteroData`` batches, any object with an integer
  ``num_graphs``): their ``num_graphs``, the samples of a graph-level task, where the first dimension of the
  first tensor would count nodes.

It differs from Lightning's function where that one is a poor fit for a profiler that runs on every batch:

1. It never raises and never warns: where no tensor is found it returns ``None``. Lightning raises
   ``MisconfigurationException``, and warns of an "ambiguous collection" whenever anything after the
   first tensor, even a string label or an ``int``, does not give the same size.
2. A 0-d tensor has no batch dimension and is skipped; Lightning counts it as a batch of 1, so that
   ``(torch.tensor(0.5), x)`` is a batch of 1 to Lightning and of ``len(x)`` here.
3. It stops at the first tensor; Lightning reads every leaf of the batch to check that they agree.
4. It opens only the containers listed above. Lightning iterates any iterable, so it walks a numpy
   array element by element (most of a second for a million elements), drains a generator, and
   recurses without end on a list that contains itself. Here strings, bytes, numpy arrays, sets,
   generators and other custom objects are leaves, and nesting deeper than :data:`MAX_DEPTH` containers is
   not opened.
5. A graph batch counts its graphs. Lightning reads the first dimension of ``batch.x`` and the rest, so a
   torch_geometric batch of 32 graphs of 20 nodes is 640 "samples" to ``self.log``, and samples/s and FLOPs
   per sample would be per node.

Where a batch holds no tensor in reach, or its size is not the first dimension of its first tensor, give
:class:`BatchSizer` a function of your own.

It runs on every batch. The usual batch, a list or tuple of a few tensors of the same first dimension
(``(inputs, targets)``), is read in one frame, with no walk: in a fit of 1-ms steps, whose own work leaves the
caches cold for ours, each Python call costs about 1 us, and the walk's five cost 4-5 us a batch where they cost
1.2 us repeated in a loop.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

MAX_DEPTH = 8
"""How many containers deep :func:`infer_batch_size` looks; a tensor inside more is not found."""


def infer_batch_size(batch: Any, *, max_depth: int = MAX_DEPTH) -> int | None:
    """Returns the number of samples in ``batch``: the first dimension of its first tensor, or the length of a
    list or tuple of tensors whose first dimensions differ (samples of variable length, unpadded).

    The walk is depth-first and in order (mapping values in iteration order, list and tuple items by
    index, dataclass fields in declaration order) and ends at the first tensor with at least one
    dimension. 0-d tensors are skipped. Strings, bytes and objects of any other type are leaves that
    hold no tensor.

    Args:
        batch: A batch as a ``DataLoader`` yields it, or as ``transfer_batch_to_device`` returns it.
        max_depth: How many nested containers to open; a tensor inside ``max_depth`` containers is
            found, one inside ``max_depth + 1`` is not. Guards against cycles and pathological nesting.

    Returns:
        The first dimension of the first tensor found, or ``None`` where there is none (or where
        reading the batch raised).

    Examples:
        >>> import torch
        >>> infer_batch_size((torch.zeros(32, 3), torch.zeros(32)))
        32
        >>> infer_batch_size({"meta": "x", "inputs": [torch.tensor(1.0), torch.zeros(8, 4)]})
        8
        >>> infer_batch_size(["a", "b"]) is None
        True
        >>> infer_batch_size([torch.zeros(17), torch.zeros(23), torch.zeros(5)])  # three samples, unpadded
        3
    """
    try:
        kind = type(batch)
        if (kind is tuple or kind is list) and 0 < len(batch) <= FIELDS_AT_ONCE and max_depth > 0:
            # (inputs, targets, ...) of plain tensors of one first dimension: what the walk would find, read in
            # this frame (module docstring); anything else, a strided nested tensor (no shape) included, is walked.
            size = -1
            for item in batch:
                if type(item) is not Tensor:
                    break
                try:
                    shape = item.shape
                except RuntimeError:
                    break
                if not shape or (size >= 0 and shape[0] != size):
                    break
                size = shape[0]
            else:
                return size
        return _first_dim(batch, max_depth)
    except Exception:  # a custom Mapping or tensor subclass that fails to be read: no size, no error
        return None


FIELDS_AT_ONCE = 4
"""The longest list or tuple of tensors :func:`infer_batch_size` reads without its walk."""

SAMPLES_LOOKED_AT = 8
"""Items of a list or tuple :func:`_fields_or_samples` compares: a bounded look, whatever the batch's length."""


def _rows(tensor: Tensor) -> int | None:
    """A tensor's first dimension (``None`` for a 0-d one), read from its ``shape``, an attribute: ``dim()`` and
    ``size(0)`` each go through torch's argument parser, and reading both of a batch's inputs and targets took
    7-9 us a batch between a fit's steps. A nested tensor has no ``shape``, but a ``size(0)``."""
    try:
        shape = tensor.shape
    except RuntimeError:
        return tensor.size(0) if tensor.dim() else None
    return shape[0] if shape else None


def _fields_or_samples(items: list[Any] | tuple[Any, ...], size: int) -> int:
    """The size of a list or tuple whose first item is a tensor of ``size`` samples: ``len(items)`` where its
    items are tensors of different first dimensions (among its first :data:`SAMPLES_LOOKED_AT`), samples of
    variable length, one tensor each (a ``collate_fn`` that keeps sequences unpadded); else ``size``: a batch's
    fields, which share their first dimension, or any list whose other items are no tensors."""
    # Runs on every batch, in one pass over (inputs, targets, ...): no slice, no iterator, no set (small ints are
    # CPython's cached objects: no allocation).
    differs = False
    i, n = 1, min(len(items), SAMPLES_LOOKED_AT)
    while i < n:
        item = items[i]
        rows = _rows(item) if isinstance(item, Tensor) else None
        if rows is None:
            return size
        differs = differs or rows != size
        i += 1
    return len(items) if differs else size


def _first_dim(obj: Any, depth_left: int) -> int | None:
    # Most frequent types first; each check is a single isinstance on the hot path.
    if isinstance(obj, Tensor):
        return _rows(obj)
    if isinstance(obj, (list, tuple)):
        if depth_left <= 0 or not obj:
            return None
        head = obj[0]
        size = _rows(head) if isinstance(head, Tensor) else None
        if size is not None:  # the usual batch, (inputs, targets, ...)
            return _fields_or_samples(obj, size)
        children: Any = obj
    elif isinstance(obj, (str, bytes, bytearray)):
        return None
    elif isinstance(obj, Mapping):
        children = obj.values()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if depth_left <= 0:
            return None
        for field in dataclasses.fields(obj):
            size = _first_dim(getattr(obj, field.name, None), depth_left - 1)
            if size is not None:
                return size
        return None
    else:
        return _graphs(obj)
    if depth_left <= 0:
        return None
    for child in children:
        size = _first_dim(child, depth_left - 1)
        if size is not None:
            return size
    return None


def _graphs(obj: Any) -> int | None:
    """A graph batch's ``num_graphs`` (torch_geometric: a ``Batch`` has it, a single ``Data`` does not);
    ``None`` for any other object."""
    graphs = getattr(obj, "num_graphs", None)
    return graphs if isinstance(graphs, int) and not isinstance(graphs, bool) and graphs >= 0 else None


class BatchSizer:
    """Gives the size of each batch, with the user's function where one was given.

    Calling it never raises. When ``batch_size_fn`` raises, or returns anything other than a
    non-negative integer (``bool`` is refused; numpy integers are accepted), the call returns ``None``
    and the first such failure is described in :attr:`failed`, so that the caller can warn once. Later
    calls still try the function: a failure on one batch does not decide the others.

    Args:
        batch_size_fn: ``batch -> number of samples``; ``None`` to use :func:`infer_batch_size`.

    Raises:
        TypeError: ``batch_size_fn`` is neither ``None`` nor callable (raised here, at setup, never
            when called).

    Attributes:
        batch_size_fn: The user's function, or ``None``.
        failed: ``None``, or a message naming the function and what went wrong the first time it failed.

    Examples:
        >>> sizer = BatchSizer(lambda batch: len(batch["ids"]))
        >>> sizer({"ids": [4, 8, 15]})
        3
        >>> sizer({}) is None, sizer.failed is not None
        (True, True)
    """

    def __init__(self, batch_size_fn: Callable[[Any], int] | None = None) -> None:
        if batch_size_fn is not None and not callable(batch_size_fn):
            raise TypeError(f"batch_size_fn must be callable or None, not {type(batch_size_fn).__name__}")
        self._fn = batch_size_fn
        self.failed: str | None = None
        #: What :meth:`__call__` calls: :func:`infer_batch_size` itself where no function was given (for a caller
        #: on every batch, one call less), else the user's function, checked.
        self.size: Callable[[Any], int | None] = (
            infer_batch_size if batch_size_fn is None else functools.partial(self._checked, batch_size_fn)
        )

    @property
    def batch_size_fn(self) -> Callable[[Any], int] | None:
        """The user's function, or ``None`` (set at construction: :attr:`size` follows from it)."""
        return self._fn

    def __call__(self, batch: Any) -> int | None:
        """Returns the number of samples in ``batch``, or ``None`` where it cannot be told."""
        return self.size(batch)

    def _checked(self, fn: Callable[[Any], int], batch: Any) -> int | None:
        try:
            size = fn(batch)
        except Exception as exc:
            self._fail(f"raised {type(exc).__name__}: {exc}")
            return None
        try:
            if isinstance(size, numbers.Integral) and not isinstance(size, bool) and size >= 0:
                return int(size)
        except Exception:  # an odd Integral whose comparison or int() fails: refused like any bad value
            pass
        self._fail(f"returned {_describe(size)}, not a non-negative int")
        return None

    def _fail(self, what: str) -> None:
        if self.failed is None:
            try:
                name = _name(self.batch_size_fn)
            except Exception:
                name = type(self.batch_size_fn).__name__
            self.failed = f"batch_size_fn {name} {what}"

    def __repr__(self) -> str:
        fn = "infer_batch_size" if self.batch_size_fn is None else _name(self.batch_size_fn)
        return f"{type(self).__name__}({fn})"


def _name(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        return f"functools.partial({_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):  # a callable object: name its class
        cls = type(fn)
        return f"{cls.__module__}.{cls.__qualname__} instance"
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if isinstance(module, str) and module != "builtins" else name


def _describe(value: Any) -> str:
    # A tensor's repr reads its values (a device sync on GPU, and long); its type and shape say enough.
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape) if not value.is_nested else 'nested'}"
    return f"{reprlib.repr(value)} ({type(value).__name__})"
