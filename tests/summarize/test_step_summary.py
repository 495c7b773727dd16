"""The per-step trace summary the diagnosis rules read: synthetic traces with exact numbers, real CPU profiles
recorded here, and the real GPU traces of ../shared/fixtures/gpu-traces."""

import ast
import copy
import dataclasses
import itertools
import json
import pathlib
import re
import time

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from torch.profiler import ProfilerActivity, profile, record_function

from kineto import load
from lightning_perf import traces
from lightning_perf.summarize import intervals, step_summary
from lightning_perf.summarize.events import as_trace
from lightning_perf.summarize.index import HOST_CATEGORIES, TraceIndex
from lightning_perf.summarize.kernels import is_fp32_gemm
from lightning_perf.summarize.step_spans import Scan, Steps
from lightning_perf.summarize.step_summary import summarize_trace

US = 1e-6
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
DEVICE = {"pid": 0, "tid": 7}  # device events live on their own pid/tid (device, stream)


def _x(cat, name, ts, dur, *, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _op(name, ts, dur, **kw):
    return _x("cpu_op", name, ts, dur, **kw)


def _span(name, ts, dur, **kw):
    return _x("user_annotation", name, ts, dur, **kw)


def _kernel(name, ts, dur, stream=7):
    return _x("kernel", name, ts, dur, pid=0, tid=stream, device=0)


def _summary(*events, rewrite=False, **top):
    trace = {"traceEvents": list(events), **top}
    if rewrite:
        traces.tensorboard_compatible(trace)
    return summarize_trace(trace, window="w")


def _approx(value):
    return pytest.approx(value, rel=1e-9, abs=1e-12)


# --- Synthetic traces -------------------------------------------------------------------------------------

HOST_STEPS = [
    # Step 0, [0, 100): data, a forward op, then an optimizer step whose closure runs the backward (on the
    # autograd thread, tid 2), and the update: two top-level add_ (one with a child).
    _span("ProfilerStep#0", 0, 100),
    _span(DATALOADER, 0, 10),
    _op("aten::linear", 10, 20),
    _op("aten::addmm", 12, 16),
    _span("Optimizer.step#SGD.step", 40, 50),
    _op("aten::mul", 41, 4),
    _op("autograd::engine::evaluate_function: MulBackward0", 50, 10, tid=2),
    _op("aten::add_", 70, 5),
    _op("aten::result_type", 71, 1),
    _op("aten::add_", 76, 4),
    # Step 1, [100, 200): slow data, an op, an optimizer step without backward inside (all of it is update).
    _span("ProfilerStep#1", 100, 100),
    _span(DATALOADER, 100, 30),
    _op("aten::relu", 140, 10),
    _span("Optimizer.step#SGD.step", 150, 30),
    _op("aten::add_", 155, 5),
    # Outside the steps: not counted.
    _op("aten::add_", 250, 5),
    _op("aten::add_", 250, 5, tid=2),
]


@pytest.mark.parametrize("rewrite", [False, True], ids=["torch-categories", "tensorboard-categories"])
def test_host_side_of_the_steps(rewrite):
    s = _summary(*copy.deepcopy(HOST_STEPS), rewrite=rewrite)
    assert (s.window, s.steps) == ("w", 2)
    assert s.step_time == _approx(100 * US)
    assert s.dataloader_time == _approx((10 + 30) / 2 * US)
    assert s.optimizer_time == _approx((50 + 30) / 2 * US)
    # Step 0's update part starts where the last backward node ends (60), step 1's at the span's start.
    assert s.optimizer_update_time == _approx((30 + 30) / 2 * US)
    assert s.optimizer_update_ops == 1.5  # top-level: two add_, then one; result_type is inside an add_
    assert s.optimizer_foreach is False
    # Main-thread union: step 0 data 10 + linear 20 + optimizer 50; step 1 data 30 + relu 10 + optimizer 30.
    assert s.host_op_time == _approx((80 + 70) / 2 * US)
    assert s.framework_time == _approx((20 + 30) / 2 * US)
    # cpu_ops of every thread starting in a step: 7 + 2 (the DataLoader span is no operator even as cpu_op).
    assert s.ops_per_step == 4.5
    # Top-level main-thread ops: linear 20, mul 4, add_ 5, add_ 4, relu 10, add_ 5.
    assert s.median_op_time == _approx(5 * US)
    # Of those, tiny (under 20 us): all but linear; each with the gap before it where under 20 us (mul 11,
    # the second add_ 1, the last 5; not the first add_'s 25 or relu's 60).
    assert (s.tiny_ops_per_step, s.tiny_op_time) == (2.5, _approx((4 + 5 + 4 + 10 + 5 + 11 + 1 + 5) / 2 * US))
    for name in (
        "device_busy",
        "kernels_per_step",
        "kernel_time",
        "fp32_gemm_time",
        "h2d_time",
        "h2d_pageable",
        "syncs_per_step",
        "sync_idle_time",
        "communication_time",
        "device_name",
        "tensor_core_capable",
    ):
        assert getattr(s, name) is None, name


@pytest.mark.parametrize("rewrite", [False, True], ids=["torch-categories", "tensorboard-categories"])
def test_tiny_operators_are_the_steps_own_outside_the_dataloader(rewrite):
    s = _summary(
        _span("ProfilerStep#0", 0, 1000),
        _span("ProfilerStep#1", 1000, 1000),
        # Per-sample transforms inside the DataLoader's __next__ (num_workers=0): the DataLoader's, not counted.
        *(_span(DATALOADER, step, 100) for step in (0, 1000)),
        *(_op("aten::unsqueeze", step + 1 + 10 * i, 5) for step in (0, 1000) for i in range(9)),
        # The step's own: in step 0, 20 tiny operators of 6 us 4 us apart (the first 24 us after the DataLoader's
        # last); in step 1 one of 8 us (a child inside it is no other), one of 5 us and one of 2 us 3 us after it.
        *(_op("aten::mul", 110 + 10 * i, 6) for i in range(20)),
        _op("aten::add", 1300, 8),
        _op("aten::empty", 1301, 2),
        _op("aten::mm", 1400, 20),  # 20 us: not tiny
        _span("Optimizer.step#SGD.step", 1500, 100),  # annotations are no parents: the add_ in it is top level
        _op("aten::add_", 1510, 5),
        _op("aten::neg", 1518, 2),
        _op("aten::mul", 1700, 5, tid=2),  # another thread
        _op("aten::mul", 2100, 5),  # after the steps
        rewrite=rewrite,
    )
    assert s.tiny_ops_per_step == (20 + 3) / 2
    # Durations, and the gaps under 20 us before them: the Python that dispatched them.
    assert s.tiny_op_time == _approx((20 * 6 + 19 * 4 + 8 + 5 + 2 + 3) / 2 * US)
    assert s.ops_per_step == (18 + 20 + 2 + 1 + 1 + 1 + 1) / 2  # what launch_bound counted before: every operator


def test_a_real_cpu_profile_of_a_fused_optimizer_reads_fused(tmp_path):
    # `lightning-perf analyze` of an AdamW(fused=True) run's window advised `fused=True`: a trace alone knows no
    # configuration, and "multi-tensor" covered foreach and fused alike.
    s = summarize_trace(_record_cpu_trace(tmp_path / "fused.json", foreach=None, fused=True), window="fused")
    assert s.optimizer_foreach is True and s.optimizer_fused is True


@pytest.mark.parametrize(
    ("optimizer", "update_op", "expected"),
    [
        ("Optimizer.step#SGD.step", "aten::add_", False),
        ("Optimizer.step#SGD.step", "aten::_foreach_add_", True),
        ("Optimizer.step#Adam.step", "aten::_fused_adam_", True),
        ("Optimizer.step#FusedAdam.step", "aten::add_", True),  # apex / DeepSpeed / FBGEMM: fused by class
        (None, "aten::add_", None),
    ],
)
def test_multi_tensor_optimizer_detection(optimizer, update_op, expected):
    events = [_span("ProfilerStep#0", 0, 100), _op(update_op, 20, 5), _op("aten::mul_", 21, 2)]
    if optimizer:
        events.append(_span(optimizer, 10, 50))
    s = _summary(*events)
    assert s.optimizer_foreach is expected
    assert s.optimizer_update_ops == (1 if optimizer else 0)


def test_an_optimizer_step_without_operators_cannot_tell_foreach():
    assert _summary(_span("ProfilerStep#0", 0, 100), _span("Optimizer.step#SGD.step", 10, 5)).optimizer_foreach is None


DEVICE_STEP = [
    _span("ProfilerStep#0", 0, 100),
    # Kernels overlap on two streams; the last one runs past the step's end.
    _kernel("volta_sgemm_128x64_nn", 10, 20),
    _kernel("ampere_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", 20, 20, stream=8),
    _kernel("void at::native::vectorized_elementwise_kernel<4>", 90, 30),
    _x("gpu_memset", "Memset (Device)", 50, 5, **DEVICE),
    # One copy half hidden under a kernel, one exposed and from pageable memory, one the other way.
    _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 5, 10, pid=0, tid=9),
    _x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 60, 10, pid=0, tid=9),
    _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 72, 2, **DEVICE),
    # .item(): the synchronize inside it counts once; the device is idle for all but the DtoH copy.
    _op("aten::_local_scalar_dense", 70, 18),
    _x("cuda_runtime", "cudaStreamSynchronize", 71, 16),
    _x("cuda_runtime", "cudaMemcpyAsync", 1, 1),  # returns at once: no sync
    _x("cuda_runtime", "cudaDeviceSynchronize", 95, 4),  # a kernel runs all along: no idle time
    _x("cuda_runtime", "cudaDeviceSynchronize", 150, 10),  # after the step
]


@pytest.mark.parametrize("rewrite", [False, True], ids=["torch-categories", "tensorboard-categories"])
def test_device_side_of_a_step(rewrite):
    props = [{"id": 0, "name": "Tesla V100-SXM2-16GB", "computeMajor": 7, "computeMinor": 0}]
    s = _summary(*copy.deepcopy(DEVICE_STEP), rewrite=rewrite, deviceProperties=props)
    # Union in [0, 100): copy+kernels [5, 40) 35, memset 5, pageable copy 10, DtoH 2, last kernel [90, 100) 10.
    assert s.device_busy == _approx(62 * US)
    assert s.kernels_per_step == 3
    assert s.kernel_time == _approx(70 * US)  # durations of the kernels starting in the step, summed
    assert s.median_kernel_time == _approx(20 * US)
    assert s.fp32_gemm_time == _approx(20 * US)  # the sgemm; the fp16 tensor-core GEMM is not
    assert s.h2d_time == _approx(20 * US)
    assert s.h2d_exposed_time == _approx((5 + 10) * US)
    assert s.h2d_pageable is True
    assert s.syncs_per_step == 2
    assert s.sync_idle_time == _approx((18 - 2) * US)
    assert s.communication_time is None and s.communication_exposed_time is None
    assert (s.device_name, s.tensor_core_capable) == ("Tesla V100-SXM2-16GB", True)


def test_device_properties_of_the_device_the_kernels_ran_on():
    props = [{"id": 0, "name": "Tesla P100", "computeMajor": 6}, {"id": 1, "name": "A100", "computeMajor": 8}]
    kernel = {**_kernel("k", 10, 5), "args": {"device": 1}}
    s = _summary(_span("ProfilerStep#0", 0, 100), kernel, deviceProperties=props)
    assert (s.device_name, s.tensor_core_capable) == ("A100", True)
    s = _summary(_span("ProfilerStep#0", 0, 100), _kernel("k", 10, 5), deviceProperties=props[:1])
    assert (s.device_name, s.tensor_core_capable) == ("Tesla P100", False)


def test_nccl_kernels_are_exposed_where_no_compute_kernel_runs():
    s = _summary(
        _span("ProfilerStep#0", 0, 100),
        _op("nccl:all_reduce", 5, 3),  # the host side: ignored when the kernels are there
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 10, 40, stream=20),
        _kernel("volta_h884gemm_64x64_ldg8_nn", 20, 10),
        _kernel("volta_h884gemm_64x64_ldg8_nn", 40, 20),
    )
    assert s.communication_time == _approx(40 * US)
    assert s.communication_exposed_time == _approx((40 - 10 - 10) * US)
    assert s.fp32_gemm_time == 0


def test_host_collectives_count_without_nccl_kernels():
    # gloo runs the collective on a worker thread; c10d's call on the main thread overlaps it.
    s = _summary(
        _span("ProfilerStep#0", 0, 100),
        _op("c10d::allreduce_", 10, 10),
        _span("gloo:all_reduce", 15, 25, tid=9),
    )
    assert s.communication_time == _approx(30 * US)
    assert s.communication_exposed_time == _approx(30 * US)
    assert s.device_busy is None and s.syncs_per_step is None


COMPILED_STEPS = [
    # torch.compile's spans as torch 2.x records them: dynamo's guard checks, then the compiled frame's region
    # holding its forward's CompiledFunction; the backward's CompiledFunctionBackward on the autograd thread.
    # Step 0, [0, 1000): guards 50 us; region 300 us (its CompiledFunction inside counts once); backward 200 us.
    _span("ProfilerStep#0", 0, 1000),
    _op("TorchDynamo Cache Lookup", 10, 50),
    _op("Torch-Compiled Region: 0/0", 70, 300),
    _op("Pregraph bytecode", 75, 5),
    _op("CompiledFunction", 100, 250),
    _op("aten::addmm", 110, 20),
    _op("autograd::engine::evaluate_function: CompiledFunctionBackward", 400, 210, tid=2),
    _op("CompiledFunctionBackward", 405, 200, tid=2),
    _op("aten::mm", 420, 30, tid=2),
    # Step 1, [1000, 2000): guards 30 us; a region [1050, 1250) overlapped by the backward [1200, 1400) on
    # the other thread: 350 us; after a graph break, a second frame's region runs past the step's end: 100 us.
    _span("ProfilerStep#1", 1000, 1000),
    _op("TorchDynamo Cache Lookup", 1010, 30),
    _op("Torch-Compiled Region: 0/0", 1050, 200),
    _op("CompiledFunction", 1060, 180),
    _op("CompiledFunctionBackward", 1200, 200, tid=2),
    _op("Torch-Compiled Region: 1/0", 1900, 200),
    # Outside the steps: not counted.
    _op("TorchDynamo Cache Lookup", 2450, 40),
    _op("Torch-Compiled Region: 0/0", 2500, 100),
]


@pytest.mark.parametrize("rewrite", [False, True], ids=["torch-categories", "tensorboard-categories"])
def test_compiled_code_and_guard_checks_of_the_steps(rewrite):
    s = _summary(*copy.deepcopy(COMPILED_STEPS), rewrite=rewrite)
    assert s.steps == 2
    assert s.compiled_time == _approx((300 + 200 + 350 + 100) / 2 * US)
    assert s.guard_time == _approx((50 + 30) / 2 * US)
    # Compiled code is operators' time, not the framework's; the operators inside it are no tiny top-level ones.
    assert s.host_op_time == _approx((50 + 300 + 30 + 200 + 100) / 2 * US)
    assert s.tiny_ops_per_step == 0


def test_compiled_code_and_guard_checks_are_none_without_their_spans_and_zero_outside_the_steps():
    s = _summary(*copy.deepcopy(HOST_STEPS))
    assert (s.compiled_time, s.guard_time) == (None, None)
    step = _span("ProfilerStep#0", 0, 100)
    s = _summary(step, _op("Torch-Compiled Region: 0/0", 200, 50), _op("TorchDynamo Cache Lookup", 150, 40))
    assert (s.compiled_time, s.guard_time) == (0.0, 0.0)
    # Guard checks that find no compiled code to run (a frame dynamo skips), and a backward alone.
    s = _summary(step, _op("TorchDynamo Cache Lookup", 10, 40))
    assert (s.compiled_time, s.guard_time) == (None, _approx(40 * US))
    s = _summary(step, _op("CompiledFunctionBackward", 10, 40, tid=2))
    assert (s.compiled_time, s.guard_time) == (_approx(40 * US), None)


def test_a_trace_without_profiler_steps_is_one_step():
    s = _summary(_op("aten::add", 10, 10), _op("aten::mul", 30, 5), _kernel("k", 40, 20))
    assert s.steps == 1
    assert s.step_time == _approx(50 * US)
    assert s.host_op_time == _approx(15 * US)
    assert s.framework_time == _approx(35 * US)
    assert s.ops_per_step == 2
    assert s.device_busy == _approx(20 * US)
    assert s.optimizer_foreach is None


def test_an_empty_trace():
    s = summarize_trace({"traceEvents": []}, window="empty")
    assert (s.steps, s.step_time, s.ops_per_step, s.device_busy) == (1, 0.0, 0.0, None)
    assert (s.tiny_ops_per_step, s.tiny_op_time) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("name", "fp32"),
    [
        # From the fixtures: cuBLAS / CUTLASS SIMT / MAGMA fp32 GEMMs and cuDNN fp32 convolutions.
        ("volta_sgemm_128x64_nn", True),
        ("volta_sgemm_32x32_sliced1x4_tn", True),
        ("ampere_sgemm_32x128_tn", True),
        (
            "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)",  # noqa: E501 - a kernel's name, verbatim
            True,
        ),
        ("void magma_sgemmEx_kernel<float, float, float, true, false, 6, 4, 6, 3, 4>(int, int, int, Tensor)", True),
        ("void sgemm_largek_lds64<true, true, 6, 3, 4, 5, 2, 66>(float*, float const*, float const*, int)", True),
        ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", True),
        ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1", True),
        (
            "void gemmk1_kernel<float, 256, 5, false, false, false, false, cublasGemvTensorStridedBatched<float const>>()",  # noqa: E501 - a kernel's name, verbatim
            True,
        ),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int)", True),
        # fp32 xmma (cuBLAS/cuDNN on sm80+ with TF32 off).
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
            True,
        ),
        # From the fixtures: TF32 tensor cores.
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4::Params)",  # noqa: E501 - a kernel's name, verbatim
            False,
        ),
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer",
            False,
        ),
        (
            "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_128x128_32x4_nhwc_align4>(cutlass_tensorop_s1688fprop_optimized_tf32_128x128_32x4_nhwc_align4::Params)",  # noqa: E501 - a kernel's name, verbatim
            False,
        ),
        # Half precision tensor cores.
        ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize96x64x32_stage3_warpsize2x2x1_tensor16x8x16_kernel", False),
        ("volta_h884gemm_64x64_ldg8_nn", False),
        ("ampere_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", False),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", False),
        # Not GEMMs (from the fixtures).
        (
            "void fbgemm_gpu::permute_indices_weights_kernel<true, int, float>(int, int, int, int const*, float const*)",  # noqa: E501 - a kernel's name, verbatim
            False,
        ),
        ("void splitKreduce_kernel<float, float, float, float, true, false, false>(cublasSplitKParams<float>)", False),
        (
            "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",  # noqa: E501 - a kernel's name, verbatim
            False,
        ),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", False),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int)",  # noqa: E501 - a kernel's name, verbatim
            False,
        ),
    ],
)
def test_fp32_gemm_classifier(name, fp32):
    assert is_fp32_gemm(name) is fp32


SUMMARIZE = sorted((pathlib.Path(step_summary.__file__).parent).glob("*.py"))


@pytest.mark.parametrize("path", SUMMARIZE, ids=lambda p: p.name)
def test_the_summarize_modules_import_neither_torch_nor_lightning(path):
    tree = ast.parse(path.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m.split(".")[0] in {"torch", "lightning", "pytorch_lightning"}}


# Interval algebra against sets of whole microseconds.
_intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1])), max_size=8)


def _points(intervals):
    return {t for start, end in intervals for t in range(start, end)}


@given(_intervals, _intervals)
def test_interval_union_intersection_and_difference(a, b):
    ua, ub = intervals.union(a), intervals.union(b)
    assert _points(ua) == _points(a)
    assert all(end1 < start2 for (_, end1), (start2, _) in itertools.pairwise(ua))  # sorted, disjoint, not touching
    assert intervals.length_within(ua, ub) == len(_points(a) & _points(b))
    assert _points(intervals.subtract(ua, ub)) == _points(a) - _points(b)
    assert sum(end - start for start, end in intervals.subtract(ua, ub)) == len(_points(a) - _points(b))
    spans = sorted(((start, end, "", False) for start, end in a), key=lambda span: (span[0], -span[1]))
    starts = np.array([span[0] for span in spans], dtype=float)
    ends = np.array([span[1] for span in spans], dtype=float)
    assert intervals.merge_arrays(starts, ends) == ua
    points = np.arange(-1.0, 82.0, 0.5)
    assert intervals.starts_in(points, ua).tolist() == [intervals.inside(p, ua) for p in points.tolist()]


# The arrays' ways of sorting out a thread's host spans and device activity, against plain Python.
_HOST = st.lists(
    st.tuples(
        st.sampled_from(["aten::add", "aten::mm", "ProfilerStep#1", "Optimizer.step#SGD.step", "aten::copy_"]),
        st.sampled_from(["cpu_op", "cpu_op", "user_annotation", "cuda_runtime"]),
        st.integers(0, 12),  # a small grid: spans often start together, or where others end
        st.integers(0, 5) | st.just(0.25),
    ),
    max_size=20,
)


@given(_HOST)
@example([("aten::add", "cpu_op", 0, 5), ("aten::mm", "cpu_op", 5, 5)])  # the second starts as the first ends
@example([("aten::add", "cpu_op", 3, 1), ("aten::mm", "cpu_op", 3, 4), ("aten::add", "cpu_op", 3, 4)])  # ties
def test_a_thread_s_spans_sort_by_start_longest_first_then_in_trace_order(spans):
    events = [_x(cat, name, ts, dur, flops=i) for i, (name, cat, ts, dur) in enumerate(spans)]  # flops: identity
    index = TraceIndex.of(as_trace({"traceEvents": events}))
    typed = as_trace({"traceEvents": events}).traceEvents
    ordered = sorted(typed, key=lambda e: (e.ts, -e.dur))  # stable: ties in trace order
    host = [e for e in ordered if not e.name.startswith("ProfilerStep#")]
    steps = [e for e in ordered if e.name.startswith("ProfilerStep#")]
    assert [e.args.flops for e in index.host.get((1, 1), [])] == [e.args.flops for e in host]
    assert [e.args.flops for e in index.steps.get((1, 1), [])] == [e.args.flops for e in steps]
    if host:
        columns = index.columns[(1, 1)]
        assert [columns.names[code] for code in columns.name_code] == [e.name for e in host]
        assert columns.names == list(dict.fromkeys(e.name for e in host))  # in order of first appearance
        assert [HOST_CATEGORIES[code] for code in columns.category_code] == [e.cat for e in host]
        assert columns.starts.tolist() == [e.ts for e in host]
        assert columns.ends.tolist() == [e.ts + e.dur for e in host]
        # Top-level operators: cpu_ops inside no other cpu_op (annotations are no parents).
        main = step_summary._MainThread.of(Scan.of(index), (1, 1))
        ops = [(e.ts, e.ts + e.dur) for e in host if e.cat == "cpu_op" and not e.name.startswith("Optimizer.step#")]
        assert list(zip(*(column.tolist() for column in main.top_level()), strict=True)) == intervals.outermost(ops)


_DEVICE = st.lists(
    st.tuples(
        st.sampled_from(["kernel", "kernel", "gpu_memcpy", "gpu_memset"]),
        st.sampled_from(
            [
                "volta_sgemm_128x64_nn",
                "ncclKernel_AllReduce",
                "elementwise",
                "Memcpy HtoD (Pageable -> Device)",
                "Memcpy HtoD (Pinned -> Device)",
                "Memcpy DtoH (Device -> Pageable)",
            ]
        ),
        st.integers(0, 20),
        st.integers(0, 6),
    ),
    max_size=25,
)


def _device_sets_one_by_one(device, steps):
    """What _DeviceSets.of works out on arrays, one event at a time (the reference)."""
    spans = [(e.ts, e.ts + e.dur, e) for e in device]
    kernels = [span for span in spans if span[2].cat == "kernel"]
    h2d = [span for span in spans if span[2].cat == "gpu_memcpy" and "HtoD" in span[2].name]
    in_steps = [span for span in kernels if steps.hold(span[0])]
    union = lambda spans: intervals.union([(start, end) for start, end, _ in spans])  # noqa: E731
    return step_summary._DeviceSets(
        busy=union(spans),
        kernels=union(kernels),
        h2d=union(h2d),
        nccl=union([span for span in kernels if "nccl" in span[2].name]),
        compute=union([span for span in kernels if "nccl" not in span[2].name]),
        step_kernel_times=[end - start for start, end, _ in in_steps],
        step_fp32_gemm_time=sum(end - start for start, end, e in in_steps if is_fp32_gemm(e.name)),
        h2d_pageable=any("Pageable" in e.name for start, _, e in h2d if steps.hold(start)),
    )


@given(_DEVICE, st.lists(st.tuples(st.integers(0, 18), st.integers(1, 6)), min_size=1, max_size=3))
@example([("kernel", "elementwise", 10, 2), ("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 1, 2)], [(0, 10)])
def test_device_activity_sorts_out_alike_on_arrays_and_one_by_one(device, step_spans):
    events = as_trace({"traceEvents": [_x(cat, name, ts, dur) for cat, name, ts, dur in device]}).traceEvents
    events = sorted(events, key=lambda e: e.ts)
    steps = Steps.of([(start, start + length) for start, length in step_spans])
    python, arrays = _device_sets_one_by_one(events, steps), step_summary._DeviceSets.of(events, steps)
    for field in dataclasses.fields(python):
        a, b = getattr(python, field.name), getattr(arrays, field.name)
        if field.name == "step_kernel_times":
            a, b = sorted(a), sorted(b)  # (the same kernels, in another order for equal starts)
        assert a == b, field.name  # (whole microseconds: exact)


# --- Real CPU profiles ------------------------------------------------------------------------------------


def _record_cpu_trace(path, *, foreach, fused=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = (
        torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        if fused
        else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=foreach)
    )
    dataset = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        batches = iter(torch.utils.data.DataLoader(dataset, batch_size=16))
        for step in range(3):
            with record_function(f"ProfilerStep#{step}"):
                x, y = next(batches)

                def closure(x=x, y=y):  # as under Lightning's automatic optimization: forward and backward in step()
                    optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    return loss

                optimizer.step(closure)
    prof.export_chrome_trace(str(path))
    return load(path)


def test_real_cpu_profiles_tell_foreach_from_per_parameter_updates(tmp_path):
    summaries = {}
    for foreach in (False, True):
        trace = _record_cpu_trace(tmp_path / f"foreach-{foreach}.json", foreach=foreach)
        s = summarize_trace(trace, window=f"foreach-{foreach}")
        assert summarize_trace(traces.tensorboard_compatible(trace), window=s.window) == s
        summaries[foreach] = s
    for foreach, s in summaries.items():
        assert s.optimizer_foreach is foreach and s.optimizer_fused is False
        assert s.steps == 3
        assert s.ops_per_step > 0 and s.median_op_time > 0
        assert 0 < s.dataloader_time < s.step_time
        # The closure's forward and backward run inside the optimizer's span, before its update part.
        assert 0 < s.optimizer_update_time < s.optimizer_time < s.step_time
        assert 0 < s.host_op_time <= s.step_time
        # The DataLoader's per-sample indexing is no tiny operator of the step's.
        assert 0 < s.tiny_ops_per_step < s.ops_per_step and 0 < s.tiny_op_time < s.host_op_time
        assert s.framework_time == pytest.approx(s.step_time - s.host_op_time)
        assert (s.device_busy, s.kernels_per_step, s.syncs_per_step, s.h2d_time, s.communication_time) == (None,) * 5
        assert s.tensor_core_capable is None
    # 4 parameters: per parameter a few operators in a loop, against a few multi-tensor operators in all.
    assert summaries[False].optimizer_update_ops > summaries[True].optimizer_update_ops


class _Compiled(torch.nn.Module):
    """A module of its own (its own ``forward`` code object: dynamo's cache of no other test's module)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


def test_a_real_compiled_model_s_trace_shows_its_compiled_code_and_guard_checks(tmp_path, one_thread, capsys):
    from lightning_perf.cli import main

    torch.manual_seed(0)
    model = _Compiled()
    compiled = torch.compile(model, backend="aot_eager")  # inductor's C++ build would take far longer
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    path = tmp_path / "rank0.pt.trace.json"
    # The first step compiles, unrecorded; the next warms the profiler up; then two recorded ProfilerStep#N.
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    try:
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule,
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        ) as prof:
            for _ in range(4):
                compiled(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                prof.step()
    finally:
        torch._dynamo.reset()
    trace = load(path)
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"TorchDynamo Cache Lookup", "CompiledFunctionBackward"} <= names
    # "Torch-Compiled Region: F/N": frame F's N-th compiled version, numbered on from the process's earlier compiles
    assert any(re.fullmatch(r"Torch-Compiled Region: \d+/\d+", name) for name in names), sorted(names)
    s = summarize_trace(trace, window="compiled")
    assert s.steps == 2
    assert 0 < s.guard_time < s.compiled_time < s.host_op_time <= s.step_time
    assert summarize_trace(traces.tensorboard_compatible(trace), window=s.window) == s
    assert main(["analyze", str(path)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert ", compiled regions " in line and "% of the step, guard checks " in line
    assert main(["analyze", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)[str(path)]["summary"]
    assert shown["compiled_time"] > 0 and shown["guard_time"] > 0


# --- Real GPU traces --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shows:
    """What a fixture shows, as shares of its mean step time (and syncs per step)."""

    steps: int
    device_busy: float
    syncs_per_step: float
    h2d: float
    communication: float
    fp32_gemm: float
    tensor_cores: bool | None


GPU_FIXTURES = {
    # ResNet-like CNN in fp32 on one V100 (DDP of 1): the device is busy nearly all the step; more than half
    # of it runs fp32 SIMT GEMMs/convolutions (volta_sgemm, scudnn) on a device with tensor cores: the case
    # for AMP. No host-device syncs; no copies from the host; no NCCL kernels (world size 1), so the
    # communication is the host's c10d/nccl calls, well under 1%.
    "v100_single_rank.json.gz": Shows(5, 0.974, 0, 0, 0.004, 0.561, True),
    # Same model on 2 A100s: host-bound (222 ms steps, ~4800 operators each, the device busy under a
    # quarter of it); 8 cudaEventSynchronize per step that leave the device nearly no idle time; NCCL
    # all-reduce 7% of the step; convolutions and GEMMs on TF32 tensor cores, so fp32 SIMT GEMMs are 0.2%.
    "a100_nccl_2rank_rank0.json.gz": Shows(3, 0.236, 8, 0, 0.070, 0.002, True),
    # Recommendation model (FBGEMM embeddings, FusedAdam) on 8 A100s: device busy 84%; 11 syncs per step
    # (.item() and stream syncs); pinned host-to-device copies 11% of the step (3% exposed); NCCL all-to-all
    # and all-reduce 35% of the step; TF32 GEMMs mostly, fp32 SIMT sgemm 2%.
    "a100_8rank_rank3.json.gz": Shows(6, 0.836, 11, 0.109, 0.352, 0.023, True),
    # The same model on 2 V100s: device busy 96%; a quarter of the step in fp32 volta_sgemm kernels on a
    # tensor-core device; same syncs; copies 9%; communication 34%.
    "v100_2rank_rank1.json.gz": Shows(6, 0.963, 11, 0.090, 0.338, 0.268, True),
    # Two ranks of a 128-rank job (Shampoo + EMA optimizers), no deviceProperties: device busy under half;
    # 1.5 and 2 syncs per step; pageable host-to-device copies; NCCL 30% of the step; fp32 sgemm 1%.
    "sampled_128rank_rank0.json.gz": Shows(2, 0.445, 1.5, 0.001, 0.322, 0.010, None),
    "sampled_128rank_rank1.json.gz": Shows(2, 0.468, 2, 0.010, 0.306, 0.010, None),
}


@pytest.mark.parametrize("name", list(GPU_FIXTURES))
def test_real_gpu_traces_show_what_they_hold(name, gpu_trace):
    trace = load(gpu_trace(name))
    s = summarize_trace(trace, window=name)
    shows = GPU_FIXTURES[name]

    def share(value):
        return pytest.approx(value, abs=0.005)

    assert s.steps == shows.steps
    assert s.device_busy / s.step_time == share(shows.device_busy)
    assert s.syncs_per_step == shows.syncs_per_step
    assert s.h2d_time / s.step_time == share(shows.h2d)
    assert s.communication_time / s.step_time == share(shows.communication)
    assert s.fp32_gemm_time / s.step_time == share(shows.fp32_gemm)
    assert s.tensor_core_capable is shows.tensor_cores
    # Facts every one of them holds.
    assert 0 < s.device_busy <= s.step_time
    assert s.kernels_per_step > 100 and 0 < s.median_kernel_time < s.kernel_time
    assert 0 <= s.h2d_exposed_time <= s.h2d_time
    assert 0 <= s.sync_idle_time < 0.01 * s.step_time  # the syncs wait on busy devices
    assert 0 < s.communication_exposed_time <= s.communication_time
    assert s.optimizer_foreach is True  # foreach SGD, FusedAdam, EMA's _foreach_ ops
    assert s.framework_time < 0.02 * s.step_time  # plain training loops, no Lightning around them
    assert s.h2d_pageable is name.startswith("sampled_")
    # The same summary from the trace rewritten for TensorBoard.
    assert summarize_trace(traces.tensorboard_compatible(trace), window=name) == s


def test_summarizes_the_largest_gpu_trace_in_well_under_a_second(gpu_trace):
    trace = load(gpu_trace("a100_8rank_rank3.json.gz"))  # 109k events
    start = time.perf_counter()
    summarize_trace(trace, window="a100_8rank_rank3")
    elapsed = time.perf_counter() - start
    print(f"summarize_trace on 109k events: {elapsed * 1000:.0f} ms")
    assert elapsed < 2.0  # about 0.1 s measured; slack for a loaded machine
