"""``host_sync``, ``device_idle``, ``launch_bound``, ``h2d_copy`` and ``precision`` on hand-built summaries
(lightning_perf.diagnose.rules_device)."""

import pytest
from contexts import ctx, cw, facts, gpu_ctx, gpu_window, gw, run, tiny_ops

from lightning_perf.diagnose import rules_device
from lightning_perf.summarize import step_summary
from summaries import GPU, W1, W2, gpu_epoch

# --- host_sync ----------------------------------------------------------------------------------------------


def test_host_sync_names_the_window_with_the_most_idle_time_and_what_causes_syncs():
    context = gpu_ctx(
        None,
        gw(W1, syncs_per_step=4.0, sync_idle_time=0.06),
        gw(W2, syncs_per_step=2.0, sync_idle_time=0.12),
    )
    f = run("host_sync", context)
    assert f.severity == "warning" and f.window == W2
    assert "2 host-device syncs per step leave the GPU idle 12% of the step" in f.evidence
    assert "(warning: >= 1 per step with >= 5% of the step idle and >= 0.10 ms per step)" in f.evidence
    for pattern in (".item()", "sync_dist=True", "torch.nonzero", "log_every_n_steps"):
        assert pattern in f.advice


# --- device_idle --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("busy", "severity"), [(0.7999, "warning"), (0.50, "warning"), (0.4999, "critical")])
def test_device_idle_severity(busy, severity):
    f = run("device_idle", gpu_ctx(None, gw(device_busy=busy)))
    assert f.severity == severity


def test_device_idle_names_the_least_busy_window_and_its_explanation():
    context = gpu_ctx(
        gpu_epoch(data_wait_fraction=0.4),
        gw(W1, device_busy=0.7),
        gw(W2, device_busy=0.3, dataloader_time=0.5),
    )
    f = run("device_idle", context)
    assert f.window == W2 and f.title == "GPU busy only 30% of each training step"
    assert "(warning < 80%, critical < 50%, with >= 0.50 ms idle per step)" in f.evidence
    assert "dataloader_bound" in f.advice and "No other signal" not in f.advice


def test_device_idle_advice_names_syncs_or_short_kernels_when_they_explain_it():
    syncs = gw(device_busy=0.6, syncs_per_step=2.0, sync_idle_time=0.2)
    assert "host_sync" in run("device_idle", gpu_ctx(None, syncs)).advice
    short = gw(device_busy=0.6, median_kernel_time=3e-6)
    assert "launch_bound" in run("device_idle", gpu_ctx(None, short)).advice
    unexplained = run("device_idle", gpu_ctx(None, gw(device_busy=0.6)))
    assert "No other signal explains it" in unexplained.advice and "batch_size" in unexplained.advice


# --- launch_bound -------------------------------------------------------------------------------------------


def test_launch_bound_on_gpu_names_the_least_busy_window_and_suggests_compile():
    context = gpu_ctx(
        None,
        gw(W1, device_busy=0.7, median_kernel_time=4e-6),
        gw(W2, device_busy=0.4, median_kernel_time=4e-6),
    )
    f = run("launch_bound", context)
    assert f.severity == "warning" and f.window == W2
    assert "median kernel 4.0 us (threshold < 10.0 us)" in f.evidence and "GPU busy 40%" in f.evidence
    assert "torch.compile(model)" in f.advice and "trainer.fit" in f.advice and "CUDA graph" in f.advice


def test_launch_bound_on_cpu_names_the_window_with_the_largest_tiny_op_share_and_suggests_vectorizing():
    context = ctx(None, tiny_ops(W1, tiny_op_time=0.4, tiny_ops_per_step=3000.0), tiny_ops(W2, tiny_op_time=0.629))
    f = run("launch_bound", context)
    assert f.window == W2 and f.title == "Training spends 62% of each step in 1,500 tiny operators"
    assert f.evidence == (
        "62% of the step (629.00 ms of 1000.00 ms) in 1,500 operators shorter than 20.0 us each and the Python"
        f" calling them, outside the DataLoader in window {W2} (the strongest of 2 windows) (warning >= 30% and"
        " >= 1.00 ms per step)"
    )
    assert "Vectorize" in f.advice and "torch.compile" in f.advice and "CUDA" not in f.advice
    # The GPU rule reads kernels, not host operators: the same window on CUDA is not launch-bound.
    assert run("launch_bound", ctx(None, tiny_ops(tiny_op_time=0.9), facts=GPU)) is None


def test_launch_bound_on_cpu_counts_no_operators_a_report_did_not_measure():
    # A report from before tiny operators were measured: thousands of short operators covering the step.
    old = cw(ops_per_step=5000.0, median_op_time=4e-6, host_op_time=0.95, framework_time=0.01)
    assert old.tiny_op_time is None and run("launch_bound", ctx(None, old)) is None


def test_launch_bound_thresholds_override_and_its_cutoff_is_the_summarys():
    assert run("launch_bound", ctx(None, tiny_ops(tiny_op_time=0.2)), launch_cpu_tiny_ops=0.2) is not None
    floor = tiny_ops(step_time=0.01, tiny_op_time=0.005, framework_time=0.001)
    assert run("launch_bound", ctx(None, floor)) is not None
    assert run("launch_bound", ctx(None, floor), launch_cpu_min_time=0.0051) is None
    assert pytest.approx(step_summary.TINY_OP_US * 1e-6) == rules_device.TINY_OP_TIME


# --- h2d_copy -----------------------------------------------------------------------------------------------


def test_h2d_copy_from_pageable_memory_advises_pinning():
    pageable = gw(W2, h2d_time=0.3, h2d_exposed_time=0.2, h2d_pageable=True)
    f = run("h2d_copy", gpu_ctx(None, gpu_window(W1), pageable, facts=facts(GPU, pin_memory=False)))
    assert f.window == W2 and f.severity == "warning"
    assert (
        "take 20% of the step" in f.evidence
        and "(warning >= 10% and >= 0.50 ms per step)" in f.evidence
        and "pageable" in f.evidence
    )
    assert "`DataLoader(pin_memory=True)`" in f.advice and "non_blocking=True" in f.advice


def test_h2d_copy_already_pinned_advises_fewer_bytes():
    pinned = gw(h2d_time=0.3, h2d_exposed_time=0.2, h2d_pageable=False)
    f = run("h2d_copy", gpu_ctx(None, pinned))
    assert "pin_memory=True" not in f.advice and "smaller dtypes" in f.advice


def test_h2d_copy_is_cuda_only():
    copies = gw(h2d_exposed_time=0.5)
    assert run("h2d_copy", ctx(None, copies)) is None


# --- precision ----------------------------------------------------------------------------------------------


def _fp32_gemms(name=W1, **kw):
    return gpu_window(name, **{"step_time": 1.0, "device_busy": 0.95, "kernel_time": 1.0, "fp32_gemm_time": 0.6, **kw})


@pytest.mark.parametrize(
    ("precision", "tensor_cores", "fires"),
    [("32-true", True, True), ("32", True, True), ("bf16-mixed", True, False), ("16-mixed", True, False),
     ("32-true", False, False), (None, True, False)],
)  # fmt: skip
def test_precision_only_for_fp32_on_a_tensor_core_gpu(precision, tensor_cores, fires):
    context = gpu_ctx(None, _fp32_gemms(tensor_core_capable=tensor_cores), facts=facts(GPU, precision=precision))
    assert (run("precision", context) is not None) == fires


def test_precision_is_cuda_only():
    assert run("precision", ctx(None, _fp32_gemms(), facts=facts(precision="32-true"))) is None


def test_precision_advice_on_ampere_is_bf16_or_tf32_and_on_volta_fp16():
    a100 = run("precision", gpu_ctx(None, _fp32_gemms(W2), facts=facts(GPU, precision="32-true")))
    assert a100.window == W2 and a100.title == "60% of GPU time in fp32 matmuls without tensor cores"
    assert '`Trainer(precision="bf16-mixed")`' in a100.advice
    assert 'torch.set_float32_matmul_precision("high")' in a100.advice and "2-8x" in a100.advice
    v100 = _fp32_gemms(device_name="Tesla V100-SXM2-16GB")
    f = run("precision", gpu_ctx(None, v100, facts=facts(GPU, precision="32-true", device_name="Tesla V100-SXM2-16GB")))
    assert '`Trainer(precision="16-mixed")`' in f.advice and "bf16-mixed" not in f.advice
