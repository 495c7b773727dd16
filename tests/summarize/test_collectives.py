"""A window's collectives per kind and process group: bytes, bandwidths (nccl-tests' definitions) and exposure,
on the real 2-rank A100 NCCL trace against a hand count, and on synthetic events for each kind."""

from __future__ import annotations

import pytest

from lightning_perf.readers import load_trace
from lightning_perf.summarize.collectives import bus_factor, collective_stats
from lightning_perf.summarize.events import as_trace


def _trace(*events):
    return as_trace({"traceEvents": list(events)})


def _step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "tid": 1}


def _kernel(name, ts, dur, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": 7, "args": args}


def _described(kind, nelems, dtype="Float", ranks=4, out=None):
    return {
        "Collective name": kind,
        "In msg nelems": nelems,
        "Out msg nelems": nelems if out is None else out,
        "Group size": ranks,
        "dtype": dtype,
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
    }


def test_the_real_two_rank_a100_trace_against_a_hand_count(gpu_trace):
    stats = {s.kind: s for s in collective_stats(load_trace(gpu_trace("a100_nccl_2rank_rank0.json.gz")))}
    assert set(stats) == {"allreduce", "broadcast"}  # its six `wait` records are no collectives
    allreduce = stats["allreduce"]
    # Its record_param_comms events, per step: 5 all-reduces of float32 buckets; 3 steps.
    buckets = [2_049_000, 7_875_584, 6_563_840, 6_637_568, 2_431_040]
    assert (allreduce.calls, allreduce.per_step, allreduce.ranks) == (15, 5.0, 2)
    assert allreduce.bytes == 3 * 4 * sum(buckets) == 306_684_384
    assert allreduce.group == "default_pg" and allreduce.on_device
    assert allreduce.seconds == pytest.approx(0.04676, abs=1e-5)  # the 15 NCCL kernels' durations
    assert allreduce.algorithm_bandwidth == pytest.approx(allreduce.bytes / allreduce.seconds)
    assert allreduce.bus_bandwidth == pytest.approx(allreduce.algorithm_bandwidth * 2 * (2 - 1) / 2)
    assert 0 < allreduce.exposed_seconds < allreduce.seconds
    broadcast = stats["broadcast"]  # one float32 and one int64 broadcast per step, in one row
    assert (broadcast.calls, broadcast.bytes) == (6, 3 * (53_120 * 4 + 53 * 8))


@pytest.mark.parametrize(
    ("kind", "factor"),
    [
        ("allreduce", 2 * 3 / 4),
        ("allreduce_coalesced", 2 * 3 / 4),
        ("_allgather_base", 3 / 4),
        ("all_gather_into_tensor_coalesced", 3 / 4),
        ("reduce_scatter_tensor", 3 / 4),
        ("_reduce_scatter_base", 3 / 4),
        ("all_to_all", 3 / 4),
        ("alltoall_base", 3 / 4),
        ("broadcast", 1.0),
        ("reduce", 1.0),
        ("send", 1.0),
        ("barrier", None),
        ("gather", None),
    ],
)
def test_bus_factors_are_nccl_tests_for_each_kind(kind, factor):
    assert bus_factor(kind, 4) == factor


def test_sizes_timing_and_exposure_of_each_kind_on_synthetic_kernels():
    trace = _trace(
        _step(0, 0, 1000),
        _step(1, 1000, 1000),
        _kernel("sm80_gemm", 0, 100),  # compute overlapping the first all-gather by 50 us
        # An all-gather's S is its output (4 ranks x 1000 elements), a reduce-scatter's its input.
        _kernel("ncclKernel_AllGather", 50, 100, **_described("_allgather_base", 1000, out=4000)),
        _kernel("ncclKernel_AllGather", 1050, 100, **_described("_allgather_base", 1000, out=4000)),
        _kernel(
            "ncclKernel_ReduceScatter", 300, 250, **_described("reduce_scatter_tensor", 4000, "BFloat16", out=1000)
        ),
        _kernel("ncclKernel_AllReduce", 600, 50, **_described("allreduce", 10, "Float8_e4m3fn")),
        _kernel("ncclKernel_AllReduce", 700, 50, **_described("allreduce", 10, "NewType")),  # unknown dtype
        _kernel("ncclKernel_Wait", 800, 5, **_described("wait", 0)),
    )
    stats = {s.kind: s for s in collective_stats(trace)}
    assert set(stats) == {"_allgather_base", "reduce_scatter_tensor", "allreduce"}
    gather = stats["_allgather_base"]
    assert (gather.calls, gather.per_step, gather.bytes) == (2, 1.0, 2 * 4000 * 4)
    assert gather.seconds == pytest.approx(200e-6)
    assert gather.exposed_seconds == pytest.approx(150e-6)  # 50 us under the GEMM
    assert gather.bus_bandwidth == pytest.approx(32_000 / 200e-6 * 3 / 4)
    scatter = stats["reduce_scatter_tensor"]
    assert (scatter.bytes, scatter.exposed_seconds) == (4000 * 2, scatter.seconds)
    assert stats["allreduce"].bytes is None and stats["allreduce"].bus_bandwidth is None  # a dtype we do not know
    assert collective_stats(trace)[0].kind == "reduce_scatter_tensor"  # the most time first


def test_gloos_collectives_are_its_worker_threads_spans_in_a_group_of_the_whole_world():
    trace = as_trace(
        {
            "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
            "traceEvents": [
                _step(0, 0, 1000),
                _step(1, 1000, 1000),
                {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 10, "dur": 2, "tid": 1},
                {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 15, "dur": 300, "tid": 9},
                {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 1015, "dur": 100, "tid": 8},
            ],
        }
    )
    (stats,) = collective_stats(trace)
    assert (stats.kind, stats.ranks, stats.calls, stats.per_step, stats.on_device) == ("all_reduce", 2, 2, 1.0, False)
    assert stats.seconds == stats.exposed_seconds == pytest.approx(400e-6)
    assert stats.bytes is None and stats.bus_bandwidth is None  # gloo's traces carry no sizes


def test_an_older_traces_nccl_kernels_are_told_apart_by_their_names(gpu_trace):
    stats = {s.kind: s for s in collective_stats(load_trace(gpu_trace("a100_8rank_rank3.json.gz")))}
    assert {"allreduce", "sendrecv"} <= set(stats)
    assert all(s.on_device and s.bytes is None and s.seconds > 0 and s.ranks == 8 for s in stats.values())


def test_a_trace_without_collectives_has_none():
    assert collective_stats(_trace(_step(0, 0, 10), _kernel("sm80_gemm", 0, 5))) == ()
