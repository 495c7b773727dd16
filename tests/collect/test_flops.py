"""Tests of lightning_perf.collect.flops: one batch's FLOPs, forward and backward, against hand counts."""

from __future__ import annotations

import dataclasses
import doctest
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.flop_counter import FlopCounterMode

import lightning_perf.collect.flops as flops_module
from lightning_perf.collect.flops import MAX_COUNTS, BatchFlopCounter, shape_key

B = 8


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


class ConvNet(nn.Module):
    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=bias)
        self.head = nn.Linear(8 * 14 * 14, 10, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


def count(model: nn.Module, x: torch.Tensor, counter: BatchFlopCounter | None = None):
    counter = counter or BatchFlopCounter()
    counter.start(x)
    model(x).sum().backward()
    return counter.stop()


def linear(n_in: int, n_out: int, b: int = B) -> int:
    """One matmul of a Linear: forward, its weight gradient and its input gradient each cost this."""
    return 2 * b * n_in * n_out


def test_doctests():
    assert doctest.testmod(flops_module, extraglobs={"torch": torch}).failed == 0


def test_mlp_equals_the_hand_count():
    record = count(mlp(), torch.randn(B, 32))
    forward = linear(32, 64) + linear(64, 10)
    weight_grads = linear(32, 64) + linear(64, 10)
    input_grads = linear(64, 10)  # the first Linear's input needs no gradient: autograd skips it
    assert record.total == forward + weight_grads + input_grads == 96_256
    assert record.batch_size == B
    assert record.shape_key == ((B, 32),)


def test_an_input_gradient_autograd_computes_is_counted():
    x = torch.randn(B, 32, requires_grad=True)
    assert count(mlp(), x).total == 96_256 + linear(32, 64)


def test_by_module_names_and_shares_of_the_forward():
    record = count(mlp(), torch.randn(B, 32))
    assert record.by_module == (("Sequential.0", linear(32, 64)), ("Sequential.2", linear(64, 10)))
    assert sum(flops for _, flops in record.by_module) == record.forward == linear(32, 64) + linear(64, 10)
    assert [round(f / record.forward, 3) for _, f in record.by_module] == [0.762, 0.238]
    assert record.total == 96_256 and record.uncounted == ()


class StaticContext(nn.Module):
    """The main path, then a block over an input that needs no gradient (static covariates): autograd runs the
    block's backward first, torch's ModuleTracker never leaves it and charges the main path's backward to it."""

    def __init__(self) -> None:
        super().__init__()
        self.static = nn.Linear(4, 32)
        self.main = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x) + self.static(torch.ones(x.shape[0], 4))


def test_a_block_whose_inputs_need_no_gradient_is_charged_its_own_forward_only():
    torch.manual_seed(0)
    record = count(StaticContext(), torch.randn(B, 32))
    shares = {name: flops / record.forward for name, flops in record.by_module}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["StaticContext.static"] == pytest.approx(linear(4, 32) / record.forward)
    assert shares["StaticContext.static"] < 0.02  # torch's own tracker gives it the main path's backward too
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, depth=2) as torchs:
        torch.manual_seed(0)
        StaticContext()(torch.randn(B, 32)).sum().backward()
    assert sum(torchs.get_flop_counts()["StaticContext.static"].values()) > 10 * linear(4, 32)


def test_an_lstm_is_named_as_uncounted_and_counts_zero():
    torch.manual_seed(0)
    lstm = nn.LSTM(16, 32, batch_first=True)
    counter = BatchFlopCounter()
    x = torch.randn(B, 5, 16)
    counter.start(x)
    lstm(x)[0].sum().backward()
    record = counter.stop()
    names = dict(record.uncounted)
    assert record.total == 0
    assert any("rnn" in name or "lstm" in name for name in names), record.uncounted


def test_interpolation_is_no_uncounted_matrix_work():
    counter = BatchFlopCounter()
    x = torch.randn(B, 4, 16, requires_grad=True)
    counter.start(x)
    torch.nn.functional.interpolate(x, size=32, mode="linear").sum().backward()
    assert counter.stop().uncounted == ()


@pytest.mark.parametrize("bias", [True, False])
def test_conv_net_equals_the_hand_count_and_biases_count_nothing(bias):
    b, c_in, c_out, k, h_out = 4, 3, 8, 3, 14
    record = count(ConvNet(bias), torch.randn(b, c_in, 16, 16))
    conv = 2 * b * c_out * h_out * h_out * c_in * k * k
    head = linear(c_out * h_out * h_out, 10, b)
    # Conv: forward and weight gradient (its input needs none); head: forward, weight and input gradients.
    assert record.total == 2 * conv + 3 * head
    assert dict(record.by_module) == {"ConvNet.conv": conv, "ConvNet.head": head}  # their forwards


def test_depth_and_top_choose_the_breakdown():
    model = nn.Sequential(nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64)), nn.Linear(64, 10))
    deep = count(model, torch.randn(B, 32), BatchFlopCounter(depth=3))
    assert [name for name, _ in deep.by_module] == ["Sequential.0.1", "Sequential.0.0", "Sequential.1"]
    shallow = count(model, torch.randn(B, 32), BatchFlopCounter(depth=2, top=1))
    assert [name for name, _ in shallow.by_module] == ["Sequential.0"]


def test_ops_outside_any_module_count_in_the_total_only():
    w = torch.randn(32, 16, requires_grad=True)
    counter = BatchFlopCounter()
    counter.start(None)
    (torch.randn(B, 32) @ w).sum().backward()
    record = counter.stop()
    assert record.total == 2 * linear(32, 16)
    assert record.by_module == ()


def test_wants_each_new_shape_until_the_cap():
    model, counter = mlp(), BatchFlopCounter()
    assert counter.wants(torch.randn(B, 32))
    count(model, torch.randn(B, 32), counter)
    assert not counter.wants(torch.randn(B, 32))
    for b in range(1, MAX_COUNTS):
        assert counter.wants(torch.randn(b, 32))
        count(model, torch.randn(b, 32), counter)
    assert len(counter.records) == MAX_COUNTS
    assert not counter.wants(torch.randn(99, 32))


def test_estimate_scales_the_nearest_count_per_element():
    model, counter = mlp(), BatchFlopCounter(max_counts=2)
    assert counter.estimate(torch.randn(B, 32)) is None
    count(model, torch.randn(B, 32), counter)
    count(model, torch.randn(64, 32), counter)
    assert counter.estimate(torch.randn(B, 32)) == 96_256
    assert counter.estimate(torch.randn(16, 32)) == 2 * 96_256  # nearest is B=8, scaled by 16/8


@dataclasses.dataclass
class Batch:
    ids: torch.Tensor
    names: list[str]


def test_shape_key_walks_containers():
    batch = {"a": [torch.zeros(2, 3), (torch.zeros(4),)], "b": Batch(torch.zeros(2, 5), ["x"] * 5000), "c": 1}
    assert shape_key(batch) == ((2, 3), (4,), (2, 5))
    assert shape_key([torch.zeros(1)] * 5000)[-1] == (1,)  # bounded walk, still a key
    assert len(shape_key([torch.zeros(1)] * 5000)) < 5000
    assert shape_key("text") == ()


def test_cancel_leaves_no_mode_and_counts_nothing_after():
    counter = BatchFlopCounter()
    counter.start(None)
    assert _get_current_dispatch_mode() is not None
    counter.cancel()
    assert _get_current_dispatch_mode() is None
    assert not counter.active
    assert counter.records == ()
    counter.cancel()  # a second cancel does nothing


def test_an_exception_mid_batch_then_cancel_leaves_no_mode():
    counter = BatchFlopCounter()

    def failing_batch():
        counter.start(torch.randn(B, 32))
        try:
            mlp()(torch.randn(B, 31))  # wrong width: the forward raises
        finally:
            counter.cancel()

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        failing_batch()
    assert _get_current_dispatch_mode() is None
    assert counter.wants(torch.randn(B, 32))  # not recorded: counted again later


def test_a_missing_stop_is_cancelled_by_the_next_start():
    model, counter = mlp(), BatchFlopCounter()
    counter.start(torch.randn(B, 32))
    model(torch.randn(B, 32))  # forward only, and no stop(): a skipped batch end
    assert count(model, torch.randn(B, 32), counter).total == 96_256
    assert _get_current_dispatch_mode() is None


def test_warning_filters_are_restored():
    before = list(warnings.filters)
    count(mlp(), torch.randn(B, 32))
    assert warnings.filters == before


def test_stop_without_start_and_bad_arguments_raise():
    with pytest.raises(RuntimeError, match=r"no count under way"):
        BatchFlopCounter().stop()
    with pytest.raises(ValueError, match=r"max_counts=0, top=-1"):
        BatchFlopCounter(max_counts=0, top=-1)


@pytest.mark.parametrize("compiled_first", [True, False], ids=["warm", "cold"])
def test_a_compiled_model_counts_as_eager_and_stays_compiled(compiled_first):
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._dynamo.utils import counters

    graph_calls = [0]

    def nop_counting(gm, example_inputs):  # aot_eager, counting the compiled graphs' calls
        run = boxed_nop(gm, example_inputs)

        def call(args):
            graph_calls[0] += 1
            return run(args)

        call._boxed_call = True  # type: ignore[attr-defined]
        return call

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(mlp(), backend=aot_autograd(fw_compiler=nop_counting, bw_compiler=nop_counting))
    x = torch.randn(B, 32)

    def step():
        compiled(x).sum().backward()

    if compiled_first:
        step()
    record = count(compiled, x)
    assert record.total == 96_256
    assert dict(record.by_module) == {
        "OptimizedModule._orig_mod.0": linear(32, 64),
        "OptimizedModule._orig_mod.2": linear(64, 10),
    }
    before, frames = graph_calls[0], dict(counters["frames"])
    for _ in range(3):
        step()
    # Each later step runs the compiled forward and backward graphs; without the force_eager stance the
    # count makes Dynamo skip the model's code for good, and this is 0.
    assert graph_calls[0] - before == 2 * 3
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]
    if compiled_first:
        assert dict(counters["frames"]) == frames  # nothing compiled again
    torch._dynamo.reset()


@pytest.mark.parametrize("inference", [False, True], ids=["training", "inference_mode"])
def test_counts_equal_torchs_own_counter_with_attention_convolutions_and_decompositions(inference):
    # The counter runs most ops straight through (collect.flops._ShortDispatch); what it counts must not move.
    # Under inference_mode composite ops (linear, scaled_dot_product_attention) reach the mode and decompose.
    torch.manual_seed(0)
    cases = {
        "attention": (nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2), (4, 16, 32)),
        "conv": (nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, groups=2)), (2, 3, 12, 12)),
        "embedding": (nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(80, 2)), None),
    }
    for name, (model, shape) in cases.items():
        x = torch.randint(0, 50, (4, 10)) if shape is None else torch.randn(shape)
        with torch.inference_mode(inference):
            with FlopCounterMode(display=False) as theirs:
                out = model(x)
                if not inference:
                    out.sum().backward()
            counter = BatchFlopCounter()
            counter.start(x)
            out = model(x)
            if not inference:
                out.sum().backward()
            ours = counter.stop()
        assert ours.total == theirs.get_total_flops() > 0, name
