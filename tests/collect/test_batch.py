"""Tests of lightning_perf.collect.batch: batch sizes read from batches, and the user's batch_size_fn."""

from __future__ import annotations

import collections
import dataclasses
import doctest
import functools
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lightning.pytorch.utilities.data import extract_batch_size

import lightning_perf.collect.batch as batch_module
from lightning_perf.collect.batch import MAX_DEPTH, BatchSizer, infer_batch_size


def t(*shape: int) -> torch.Tensor:
    return torch.empty(shape)


Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Sample:
    name: str
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Outer:
    meta: dict
    inner: Sample


@dataclasses.dataclass
class Unset:
    """A dataclass with a field that no instance sets: reading it raises AttributeError."""

    late: torch.Tensor = dataclasses.field(init=False)
    x: torch.Tensor = dataclasses.field(default_factory=lambda: t(9))


class BrokenMapping(Mapping):
    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("cannot iterate")

    def __len__(self) -> int:
        return 1


class Graph:
    """Stands for a torch_geometric Batch: 4 graphs of 100 nodes in all (tests/collect/test_downstream_batches.py
    has the real one)."""

    def __init__(self, num_graphs: object = 4) -> None:
        self.x = t(100, 16)
        self.num_graphs = num_graphs

    def to_dict(self) -> dict[str, Any]:
        return {"x": self.x}


CASES = [
    ("tensor", t(32, 3), 32),
    ("tensor 1-d", t(7), 7),
    ("tensor first dim 0", t(0, 3), 0),
    ("tensor 0-d", torch.tensor(0.5), None),
    ("int tensor", torch.arange(5), 5),
    ("(x, y)", (t(16, 3), t(16)), 16),
    ("[x, y]", [t(12, 3), t(12)], 12),
    ('{"x", "y"}', {"x": t(10, 3), "y": t(10)}, 10),
    ("dict order decides", {"y": t(3), "x": t(10, 3)}, 3),
    ("nested dict of lists", {"meta": {"ids": [1, 2]}, "inputs": {"a": [[t(6, 2)], t(6)]}}, 6),
    ("namedtuple", Pair(t(5, 2), t(5)), 5),
    ("list of namedtuples", [Pair("a", 1), Pair(t(4), t(4))], 4),
    ("dataclass", Sample("s", t(8, 2), t(8)), 8),
    ("nested dataclass", Outer({"k": "v"}, Sample("s", t(2), t(2))), 2),
    ("dataclass with unset field", Unset(), 9),
    ("0-d first, then real", (torch.tensor(1.0), t(5, 2)), 5),
    ("0-d in dict first", {"loss_weight": torch.tensor(2.0), "x": t(3)}, 3),
    ("string label first", ("label", t(4)), 4),
    ("string label after", (t(4), "label"), 4),
    ("int after", {"x": t(4), "n": 3}, 4),
    ("string", "abc", None),
    ("bytes", b"abc", None),
    ("list of strings", ["a", "bc"], None),
    ("empty list", [], None),
    ("empty tuple", (), None),
    ("empty dict", {}, None),
    ("nested empties", [[], {}, ()], None),
    ("None", None, None),
    ("int", 3, None),
    ("float", 2.5, None),
    ("numpy array is a leaf", np.zeros((4, 2)), None),
    ("numpy then tensor", (np.zeros(4), t(6)), 6),
    ("set is a leaf", {1, 2}, None),
    ("graph batch: its graphs, not its nodes", Graph(), 4),
    ("graph batch first in a tuple", (Graph(), t(100)), 4),
    ("num_graphs not an int: a leaf", Graph(num_graphs="4"), None),
    ("num_graphs a bool: a leaf", Graph(num_graphs=True), None),
    ("dataclass type, not instance", Sample, None),
    ("broken mapping", BrokenMapping(), None),
    ("meta device (no data to read)", torch.empty(11, 2, device="meta"), 11),
    ("non-contiguous view", t(4, 6).t(), 6),
]


@pytest.mark.parametrize(("batch", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_infer_batch_size(batch: Any, expected: int | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # never warns
        assert infer_batch_size(batch) == expected


def test_returns_plain_int() -> None:
    assert type(infer_batch_size(t(3, 2))) is int


def test_nested_tensor() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "nested tensors are a prototype" warning
        nested = torch.nested.nested_tensor([t(2, 3), t(4, 3)])
    assert infer_batch_size(nested) == 2  # nested tensors have size(0) but no .shape


def test_varying_sizes_across_calls() -> None:
    sizes = [32, 32, 7, 1, 0, 19]
    assert [infer_batch_size({"x": t(n, 3), "y": [t(n)]}) for n in sizes] == sizes


def nest(obj: Any, levels: int) -> Any:
    for _ in range(levels):
        obj = [obj]
    return obj


def test_depth_limit() -> None:
    assert infer_batch_size(nest(t(3), MAX_DEPTH)) == 3
    assert infer_batch_size(nest(t(3), MAX_DEPTH + 1)) is None
    assert infer_batch_size(nest(t(3), 2), max_depth=2) == 3
    assert infer_batch_size(nest(t(3), 3), max_depth=2) is None
    assert infer_batch_size(t(3), max_depth=0) == 3
    assert infer_batch_size([t(3)], max_depth=0) is None


def test_cycles() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    assert infer_batch_size(cycle) is None
    cycle.append(t(5))  # found after the cycle has been walked MAX_DEPTH deep
    assert infer_batch_size(cycle) == 5
    loop: dict[str, Any] = {}
    loop["self"] = loop
    assert infer_batch_size(loop) is None


def test_a_list_of_unpadded_samples_is_counted_by_its_length() -> None:
    # A collate_fn that keeps variable-length sequences unpadded: Lightning's extract_batch_size reads the
    # first sample's length (17), which made samples/s per token, not per sample.
    seqs = [t(17), t(23), t(5), t(9)]
    assert infer_batch_size(seqs) == 4 and extract_batch_size(seqs) == 17
    assert infer_batch_size((seqs, t(4))) == 4  # (samples, labels)
    assert infer_batch_size([t(4, 3), t(4)]) == 4  # a batch's fields share their first dimension


@pytest.mark.parametrize(
    "batch",
    [
        (t(5, 2), t(5)),
        [t(5, 2), t(5), t(5, 1, 1), t(5)],
        [t(5, 2), t(7)],  # two unpadded samples
        (t(), t(4)),  # a 0-d first: skipped by the walk
        [t(3), t(3), t(3), t(3), t(9)],  # longer than the fast path's
        [t(6), "label"],
        [torch.nn.Parameter(t(4)), t(4)],  # a tensor subclass
        [torch.nested.nested_tensor([t(2), t(3)]), t(2)],
        [],
    ],
    ids=["pair", "four", "samples", "0-d first", "five", "with a string", "subclass", "nested", "empty"],
)
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_the_usual_batch_read_at_once_is_what_the_walk_finds(batch: Any) -> None:
    assert infer_batch_size(batch) == batch_module._first_dim(batch, MAX_DEPTH)


def test_stops_at_first_tensor() -> None:
    def never() -> Iterator[Any]:
        raise AssertionError("walked past the first tensor")
        yield

    class Tripwire(Mapping):
        def __getitem__(self, key: Any) -> Any:
            raise AssertionError("walked past the first tensor")

        __iter__ = never  # type: ignore[assignment]

        def __len__(self) -> int:
            return 1

    assert infer_batch_size([t(2), Tripwire()]) == 2
    assert infer_batch_size({"x": t(2), "rest": Tripwire()}) == 2


# Lightning's extract_batch_size, on the batches where it returns a value.


def lightning(batch: Any) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its "ambiguous collection" warning; see test_lightning_warns_...
        return extract_batch_size(batch)


# Where Lightning differs: it counts a 0-d tensor as a batch of 1, raises on a dataclass field never set, and
# does not know graph batches (it raises on one, or reads the next tensor's first dimension).
DIVERGENT = {
    "tensor 0-d",
    "0-d first, then real",
    "0-d in dict first",
    "dataclass with unset field",
    "graph batch: its graphs, not its nodes",
    "graph batch first in a tuple",
}
LIGHTNING_CASES = [c for c in CASES if c[2] is not None and c[0] not in DIVERGENT]


@pytest.mark.parametrize(("batch", "expected"), [c[1:] for c in LIGHTNING_CASES], ids=[c[0] for c in LIGHTNING_CASES])
def test_same_as_lightning(batch: Any, expected: int) -> None:
    assert lightning(batch) == infer_batch_size(batch) == expected


def test_lightning_differs_on_0d_tensors() -> None:
    assert lightning(torch.tensor(0.5)) == 1
    assert infer_batch_size(torch.tensor(0.5)) is None
    assert lightning((torch.tensor(1.0), t(5))) == 1
    assert infer_batch_size((torch.tensor(1.0), t(5))) == 5


def test_lightning_raises_on_unset_dataclass_field() -> None:
    with pytest.raises(AttributeError, match="late"):
        extract_batch_size(Unset())
    assert infer_batch_size(Unset()) == 9


@pytest.mark.parametrize("batch", [[], {}, "abc", None, 3, ["a", "b"], np.zeros(3)], ids=repr)
def test_lightning_raises_where_we_return_none(batch: Any) -> None:
    with pytest.raises(Exception, match="could not infer the batch_size"):
        extract_batch_size(batch)
    assert infer_batch_size(batch) is None


def test_lightning_warns_on_unambiguous_batches() -> None:
    """Lightning's "ambiguous collection" warning fires when any leaf after the first tensor is not one."""
    from lightning.pytorch.utilities import data

    data.warning_cache.clear()
    with pytest.warns(UserWarning, match="ambiguous collection"):
        assert extract_batch_size((t(4), "label")) == 4
    data.warning_cache.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert infer_batch_size((t(4), "label")) == 4


# Random nested batches.

shapes = st.one_of(
    st.just(()),
    st.tuples(st.integers(0, 64)),
    st.tuples(st.integers(0, 64), st.integers(1, 3)),
)
tensors = shapes.map(lambda shape: torch.empty(shape))
others = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.binary(max_size=3))
batches = st.recursive(
    st.one_of(tensors, others),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=3), children, max_size=4),
    ),
    max_leaves=12,
)


def leaves(obj: Any, depth_left: int) -> Iterator[Any]:
    """Every leaf in depth-first order, not opening containers below depth_left == 0."""
    if isinstance(obj, (list, tuple, dict)):
        if depth_left > 0:
            for child in obj.values() if isinstance(obj, dict) else obj:
                yield from leaves(child, depth_left - 1)
    else:
        yield obj


def unpadded(obj: Any) -> bool:
    """A list or tuple of variable-length samples: at least 2 items, its first 8 all tensors of 1 dimension or
    more, whose first dimensions differ."""
    if not isinstance(obj, (list, tuple)) or len(obj) < 2:
        return False
    head = obj[:8]
    return all(isinstance(x, torch.Tensor) and x.dim() > 0 for x in head) and len({x.shape[0] for x in head}) > 1


def expected_size(batch: Any, max_depth: int) -> int | None:
    """The first dimension of the first tensor, depth-first; the length of the first unpadded list on the way."""
    if isinstance(batch, (list, tuple, dict)):
        if max_depth <= 0:
            return None
        if unpadded(batch):
            return len(batch)
        for child in batch.values() if isinstance(batch, dict) else batch:
            size = expected_size(child, max_depth - 1)
            if size is not None:
                return size
        return None
    return batch.shape[0] if isinstance(batch, torch.Tensor) and batch.dim() > 0 else None


def has_unpadded(obj: Any) -> bool:
    children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return unpadded(obj) or any(has_unpadded(c) for c in children)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches, st.integers(0, MAX_DEPTH))
def test_first_dim_of_first_tensor(batch: Any, max_depth: int) -> None:
    assert infer_batch_size(batch) == expected_size(batch, MAX_DEPTH)
    assert infer_batch_size(batch, max_depth=max_depth) == expected_size(batch, max_depth)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_random_batches_same_as_lightning(batch: Any) -> None:
    found = list(leaves(batch, 10**6))
    if any(isinstance(x, torch.Tensor) and x.dim() == 0 for x in found):
        return  # Lightning's batch of 1; see test_lightning_differs_on_0d_tensors
    if has_unpadded(batch):
        return  # Lightning's first dimension of the first sample; see test_a_list_of_unpadded_samples_is_...
    if not any(isinstance(x, torch.Tensor) for x in found):
        assert infer_batch_size(batch) is None
        return
    assert infer_batch_size(batch, max_depth=10**6) == lightning(batch)


# BatchSizer.


def by_ids(batch: dict) -> int:
    return len(batch["ids"])


def test_sizer_without_fn_infers() -> None:
    sizer = BatchSizer()
    assert sizer((t(3, 2), t(3))) == 3
    assert sizer("no tensor") is None
    assert sizer.failed is None  # nothing found is not a failure


def test_sizer_with_fn() -> None:
    sizer = BatchSizer(by_ids)
    assert sizer({"ids": [1, 2, 3, 4], "x": t(99)}) == 4
    assert sizer({"ids": [], "x": t(99)}) == 0
    assert sizer.failed is None


def test_sizer_accepts_numpy_integers() -> None:
    size = BatchSizer(lambda batch: np.int64(6))(None)
    assert size == 6 and type(size) is int


def test_sizer_with_raising_fn() -> None:
    sizer = BatchSizer(by_ids)
    assert sizer({"x": t(3)}) is None
    assert sizer.failed is not None
    assert "by_ids" in sizer.failed and "KeyError" in sizer.failed and "'ids'" in sizer.failed
    assert sizer({"ids": [1, 2]}) == 2  # still tried on later batches
    first = sizer.failed
    assert sizer(None) is None
    assert sizer.failed == first  # the first failure is kept


def minus_one(batch: Any) -> Any:
    return -1


def a_float(batch: Any) -> Any:
    return 4.0


def a_bool(batch: Any) -> Any:
    return True


def a_tensor(batch: Any) -> Any:
    return torch.tensor(4)


def nothing(batch: Any) -> Any:
    return None


@pytest.mark.parametrize(
    ("fn", "shown"),
    [(minus_one, "-1"), (a_float, "4.0"), (a_bool, "True"), (a_tensor, "tensor of shape ()"), (nothing, "None")],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_sizer_refuses_bad_values(fn: Any, shown: str) -> None:
    sizer = BatchSizer(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sizer(t(3)) is None
    assert sizer.failed is not None
    assert fn.__name__ in sizer.failed
    assert shown in sizer.failed
    assert "not a non-negative int" in sizer.failed


def test_sizer_names_lambdas_and_partials() -> None:
    sizer = BatchSizer(lambda batch: 1 / 0)
    assert sizer(None) is None
    assert "<lambda>" in sizer.failed and "ZeroDivisionError" in sizer.failed

    partial = functools.partial(lambda batch, k: -k, k=2)
    sizer = BatchSizer(partial)
    assert sizer(None) is None
    assert "functools.partial(" in sizer.failed and "<lambda>" in sizer.failed and "-2" in sizer.failed

    class Counter:
        def __call__(self, batch: Any) -> int:
            raise ValueError("no count")

    sizer = BatchSizer(Counter())
    assert sizer(None) is None
    assert "Counter instance" in sizer.failed and "ValueError: no count" in sizer.failed


def test_sizer_rejects_non_callable_at_setup() -> None:
    with pytest.raises(TypeError, match="callable"):
        BatchSizer(32)  # type: ignore[arg-type]


def test_sizer_repr() -> None:
    assert repr(BatchSizer()) == "BatchSizer(infer_batch_size)"
    assert "by_ids" in repr(BatchSizer(by_ids))


def test_doctests() -> None:
    result = doctest.testmod(batch_module, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0
