"""Operator statistics from a trace: synthetic cases, torch's own key_averages() on a real profile, and
torch-tb-profiler's operator table on real GPU traces."""

import random
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile, record_function
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator

from kineto import load
from lightning_perf import traces
from lightning_perf.readers import load_trace
from lightning_perf.summarize import operators
from lightning_perf.summarize.events import as_trace
from lightning_perf.summarize.index import TraceIndex
from lightning_perf.summarize.operators import operator_stats


def _nest_on(mode):
    """Operators nested one by one on a stack, or on arrays (what _nest_arrays does for large threads,
    falling back to the stack for spans that do not nest), whatever the thread's size."""
    operators.ARRAY_MIN_OPERATORS = 10**12 if mode == "stack" else 0


@pytest.fixture(autouse=True, params=["stack", "arrays"])
def nesting(request):
    """Every test here twice: on the stack and on arrays."""
    saved = operators.ARRAY_MIN_OPERATORS
    _nest_on(request.param)
    yield request.param
    operators.ARRAY_MIN_OPERATORS = saved


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _stats(*events, **kwargs):
    return {s.name: s for s in operator_stats({"traceEvents": list(events)}, **kwargs)}


def test_self_time_subtracts_direct_children_and_runtime_calls():
    stats = _stats(
        _x("user_annotation", "ProfilerStep#0", 0, 100),
        _x("cpu_op", "aten::linear", 0, 50, **{"External id": 1}),
        _x("cpu_op", "aten::addmm", 10, 30, **{"External id": 2}),
        _x("cuda_runtime", "cudaLaunchKernel", 20, 5, **{"External id": 2}),
        _x("cpu_op", "aten::relu", 60, 10, **{"External id": 3}),
    )
    assert "ProfilerStep#0" not in stats
    assert (stats["aten::linear"].self_cpu_time, stats["aten::linear"].cpu_time) == (20, 50)
    assert stats["aten::addmm"].self_cpu_time == 25
    assert stats["cudaLaunchKernel"].calls == 1
    assert stats["aten::relu"].self_device_time is None  # no device activity in this trace


def test_device_time_goes_to_the_launching_operator_and_adds_up_to_its_ancestors():
    stats = _stats(
        _x("cpu_op", "aten::linear", 0, 50, **{"External id": 1}),
        _x("cpu_op", "aten::addmm", 10, 30, **{"External id": 2}),
        _x("cuda_runtime", "cudaLaunchKernel", 20, 5, **{"External id": 2}),
        _x("kernel", "sgemm", 30, 400, tid=7, **{"External id": 2}),
        _x("gpu_memset", "Memset", 500, 6, tid=7, **{"External id": 1}),
    )
    assert (stats["aten::addmm"].self_device_time, stats["aten::addmm"].device_time) == (400, 400)
    assert (stats["aten::linear"].self_device_time, stats["aten::linear"].device_time) == (6, 406)
    assert stats["cudaLaunchKernel"].self_device_time == 0


def test_memory_goes_to_the_innermost_running_operator():
    memory = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "s": "t"}
    stats = _stats(
        _x("cpu_op", "aten::zeros", 0, 10),
        _x("cpu_op", "aten::empty", 1, 2),
        {**memory, "ts": 2, "args": {"Bytes": 4096, "Device Type": 0}},
        {**memory, "ts": 5, "args": {"Bytes": -1024, "Device Type": 0}},
    )
    assert (stats["aten::empty"].self_cpu_memory, stats["aten::zeros"].self_cpu_memory) == (4096, -1024)


def test_an_operator_calling_its_namesake_counts_once_as_in_key_averages():
    stats = _stats(_x("cpu_op", "aten::sum", 0, 10), _x("cpu_op", "aten::sum", 2, 6), _x("cpu_op", "aten::fill_", 3, 2))
    assert (stats["aten::sum"].calls, stats["aten::sum"].self_cpu_time, stats["aten::sum"].cpu_time) == (1, 8, 10)


def test_matches_torch_key_averages_on_a_real_profile(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        for step in range(3):
            with record_function(f"ProfilerStep#{step}"):
                model(torch.randn(16, 32)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ours = {s.name: s for s in operator_stats(load(tmp_path / "trace.json"))}
    theirs = {a.key: a for a in prof.key_averages() if not a.key.startswith("ProfilerStep")}
    assert set(ours) == set(theirs)
    for name, avg in theirs.items():
        op = ours[name]
        assert op.calls == avg.count, name
        assert op.self_cpu_time == pytest.approx(avg.self_cpu_time_total, rel=0.01, abs=2), name
        assert op.cpu_time == pytest.approx(avg.cpu_time_total, rel=0.01, abs=2), name
        assert op.self_cpu_memory == avg.self_cpu_memory_usage, name
    by_shape = operator_stats(load(tmp_path / "trace.json"), group_by_input_shape=True)
    assert {s.input_shapes for s in by_shape if s.name == "aten::addmm"} == {
        "[[1], [16, 64], [64, 1], [], []]",
        "[[64], [16, 32], [32, 64], [], []]",
    }


@pytest.mark.parametrize("name", ["v100_single_rank.json.gz", "a100_nccl_2rank_rank0.json.gz"])
def test_matches_torch_tb_profilers_operator_table_on_real_gpu_traces(name, gpu_trace):
    trace = load(gpu_trace(name))
    ours = {s.name: s for s in operator_stats(trace)}
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/rank0.pt.trace.json.gz"
        traces.write_trace(traces.tensorboard_compatible(trace), path)
        plugin = RunGenerator("rank0", None, RunProfileData.parse("rank0", None, path, tmp)).generate_run_profile()
    rows = sorted(plugin.operation_table_by_name["data"], key=lambda r: -r["device_self_duration"])[:10]
    assert rows[0]["device_self_duration"] > 0
    for row in rows:
        op = ours[row["name"]]
        assert op.calls == row["calls"], row["name"]
        # The plugin rounds each event to whole microseconds before adding up. (Host self time is checked
        # against key_averages() above: the plugin leaves some runtime calls out of an operator's children.)
        assert op.self_device_time == pytest.approx(row["device_self_duration"], rel=0.01, abs=10), row["name"]


def test_older_traces_give_device_time_to_the_operator_each_runtime_call_runs_in(gpu_trace):
    # In older traces (torch 1.x) a kernel's External id is its runtime call's correlation id, not its
    # operator's; torch-tb-profiler 0.4.3 then attributes no device time at all ("Runtime ... don't
    # correlate to any operator"). The reference here: the innermost operator open when each call starts, by
    # brute force.
    trace = load(gpu_trace("sampled_128rank_rank0.json.gz"))
    events = trace["traceEvents"]
    device = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            assert e["args"]["External id"] == e["args"]["correlation"]  # the older kind indeed
            device[e["args"]["External id"]] = device.get(e["args"]["External id"], 0) + e["dur"]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime")]
    host = [e for e in host if not e["name"].startswith("ProfilerStep#")]
    order = {id(e): i for i, e in enumerate(host)}
    expected = {}
    for call in (e for e in host if e["cat"] == "cuda_runtime" and e["args"].get("External id") in device):
        around = [
            e
            for e in host
            if e is not call
            and (e["pid"], e["tid"]) == (call["pid"], call["tid"])
            and e["ts"] <= call["ts"] < e["ts"] + e["dur"]
        ]  # fmt: skip (open when the call starts: its end may be rounded to just before the call's)
        if around:
            innermost = max(around, key=lambda e: (e["ts"], -e["dur"], order[id(e)]))  # ties: the later one
            expected[innermost["name"]] = expected.get(innermost["name"], 0) + device[call["args"]["External id"]]
    ours = {s.name: s.self_device_time for s in operator_stats(trace) if s.self_device_time}
    assert expected and ours.keys() == expected.keys()
    for name, time in expected.items():
        assert ours[name] == pytest.approx(time), name


# --- The two ways of nesting agree ---------------------------------------------------------------------------

NAMES = ["aten::add", "aten::mm", "aten::copy_"]  # few names: operators calling their namesake are common


@st.composite
def _nested_spans(draw, lo=0, hi=40, depth=0):
    """Spans on a small integer grid, each child inside its parent (or a quarter over its end), siblings one
    after the other (touching or not), zero-length ones included."""
    spans, cursor = [], lo
    while cursor <= hi and len(spans) < 4 and draw(st.booleans()):
        start = draw(st.integers(cursor, hi))
        end = draw(st.integers(start, hi))
        # Now and then a quarter microsecond more: ending just after its parent, as rounded absolute
        # timestamps make spans do (with or without a sibling of the parent starting in between).
        overhang = 0.25 if depth and end == hi and draw(st.integers(0, 3)) == 0 else 0.0
        spans.append((draw(st.sampled_from(NAMES)), start, end - start + overhang))
        if depth < 3:
            spans += draw(_nested_spans(start, end, depth + 1))
        cursor = end
    return spans


def _events(spans, seed, cross=()):
    """Host events of the spans in a shuffled trace order, each launching a kernel now and then; the kernels
    carry their correlation id as External id (older traces) for odd seeds."""
    rng = random.Random(seed)
    events = []
    for i, (name, start, dur) in enumerate([*spans, *cross]):
        category = rng.choice(["cpu_op", "cpu_op", "user_annotation", "cuda_runtime"])
        args = {"External id": i, **({"flops": rng.randint(1, 9)} if rng.random() < 0.2 else {})}
        events.append(_x(category, name, start, dur, **args))
        if rng.random() < 0.3:
            ids = {"External id": i, "correlation": i if seed % 2 else 10_000 + i}
            events.append(_x("kernel", "k", 100 + i, rng.randint(1, 5), tid=7, **ids))
    rng.shuffle(events)
    return events


# The fixture only restores the thresholds after the test: each example sets them itself (and compares both
# ways, so the test runs once).
@pytest.mark.parametrize("nesting", ["arrays"], indirect=True)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=_nested_spans(), seed=st.integers(0, 2**16), shapes=st.booleans())
# A span starting at its grandparent's end, inside its overhanging parent: the stack makes it that parent's
# child; the arrays would make it its grandparent's (found by hypothesis).
@example(
    spans=[("aten::add", 0, 39.0), ("aten::add", 1, 38.25), ("aten::mm", 1, 38.25), ("aten::add", 39, 0.0)],
    seed=0,
    shapes=False,
)
def test_arrays_and_stack_nest_operators_alike(spans, seed, shapes, nesting):
    events = _events(spans, seed)
    for event in events:
        event["args"]["Input Dims"] = [[len(event["name"]) % 2]]
    trace = {"traceEvents": events}
    _nest_on("arrays")  # (the fixture restores the thresholds)
    arrays = operator_stats(trace, group_by_input_shape=shapes)
    _nest_on("stack")
    stack = operator_stats(trace, group_by_input_shape=shapes)
    assert _same(arrays, stack)
    if spans and all(dur == int(dur) for _, _, dur in spans):  # spans that nest: the arrays took them
        index = TraceIndex.of(as_trace(trace))
        [(thread, ops)] = index.host.items()
        launches = operators._Launches.of(index.device)
        assert operators._nest_arrays(ops, index.columns[thread], launches, shapes, {})


_ANY_SPANS = st.lists(
    st.tuples(st.sampled_from(NAMES), st.integers(0, 30), st.integers(0, 15).map(float) | st.just(0.25)), max_size=25
)


@pytest.mark.parametrize("nesting", ["arrays"], indirect=True)  # (compares both ways: runs once)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=_ANY_SPANS, seed=st.integers(0, 2**16))
def test_on_any_spans_the_arrays_agree_with_the_stack_or_give_way(spans, seed, nesting):
    trace = {"traceEvents": _events(spans, seed)}
    _nest_on("arrays")  # (the fixture restores the thresholds)
    arrays = operator_stats(trace)
    _nest_on("stack")
    assert _same(arrays, operator_stats(trace))


def _same(a, b):
    key = lambda s: (s.name, s.input_shapes or "")  # noqa: E731
    a, b = sorted(a, key=key), sorted(b, key=key)
    assert [key(s) for s in a] == [key(s) for s in b]
    for x, y in zip(a, b, strict=True):
        assert (x.calls, x.flops, x.self_cpu_memory) == (y.calls, y.flops, y.self_cpu_memory), x.name
        for field in ("self_cpu_time", "cpu_time", "self_device_time", "device_time"):
            assert getattr(x, field) == pytest.approx(getattr(y, field), abs=1e-9), (x.name, field)
    return True


def test_spans_that_do_not_nest_go_to_the_stack(nesting):
    # aten::mm starts inside aten::add and ends after it, and aten::relu starts in between: the stack makes
    # it aten::mm's child, which the arrays cannot, so they give up (and add nothing).
    events = [_x("cpu_op", "aten::add", 0, 10), _x("cpu_op", "aten::mm", 5, 10), _x("cpu_op", "aten::relu", 12, 1)]
    index = TraceIndex.of(as_trace({"traceEvents": events}))
    [(thread, spans)] = index.host.items()
    totals = {}
    launches = operators._Launches.of([])
    assert not operators._nest_arrays(spans, index.columns[thread], launches, False, totals) and totals == {}
    stats = _stats(*events)
    assert [stats[name].self_cpu_time for name in ("aten::add", "aten::mm", "aten::relu")] == [0, 9, 1]


def test_spans_whose_end_rounds_to_their_start_nest_on_arrays(nesting):
    # Absolute timestamps (1.7e15 us, as in the V100 fixture) keep a quarter of a microsecond: a 0.121 us
    # span ends where it starts, and the stack finishes it when the next span starts at that time. The arrays
    # count it as the zero-length span it has become, so the thread nests on arrays, as the stack does.
    base = 1712195495536774.75
    events = [
        _x("cpu_op", "aten::to", base, 2.0),
        _x("cpu_op", "aten::result_type", base, 0.121),
        _x("cpu_op", "aten::result_type", base + 0.25, 0.211),
        _x("cpu_op", "aten::empty", base + 0.5, 0.5),
    ]
    index = TraceIndex.of(as_trace({"traceEvents": events}))
    [(thread, spans)] = index.host.items()
    assert index.columns[thread].ends[1] == index.columns[thread].starts[1]  # 0.121 us rounded away
    totals = {}
    assert operators._nest_arrays(spans, index.columns[thread], operators._Launches.of([]), False, totals)
    stats = _stats(*events)
    assert stats["aten::to"].self_cpu_time == pytest.approx(2.0 - 0.121 - 0.211 - 0.5)
    assert stats["aten::result_type"].calls == 2


def test_every_large_thread_of_the_gpu_traces_nests_on_arrays(gpu_trace):
    # Including the V100 trace's main thread, whose sub-microsecond spans end where they start once rounded.
    for name in ("v100_single_rank", "a100_nccl_2rank_rank0", "v100_2rank_rank1"):
        trace = load_trace(gpu_trace(f"{name}.json.gz"))
        index = TraceIndex.of(trace)
        launches = operators._Launches.of(index.device)
        large = [(thread, spans) for thread, spans in index.host.items() if len(spans) >= 1000]
        assert len(large) == 2, name  # the main thread and the autograd one
        for thread, spans in large:
            assert operators._nest_arrays(spans, index.columns[thread], launches, False, {}), (name, thread)
