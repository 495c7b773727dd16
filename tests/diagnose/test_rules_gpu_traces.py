"""The GPU-only rules on real GPU traces (../shared/fixtures/gpu-traces, recorded on V100 and A100 GPUs):
each trace goes through the same summarize -> diagnose path as a window of ours, and must yield the findings
its numbers call for, and no others."""

import pytest

from kineto import load
from lightning_perf import traces
from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnosis_context import trace_context
from lightning_perf.summarize.events import distributed_info
from lightning_perf.summarize.step_summary import summarize_trace

# file: (what it shows, the finding ids (severity) it must yield). Shares are of the mean step.
CASES = {
    # V100, 1 rank: device 97% busy, but 56% of kernel time in fp32 SIMT GEMMs on a tensor-core GPU.
    "v100_single_rank.json.gz": {("precision", "warning")},
    # A100, rank 0 of 2: host-bound, the device busy 24% of the step (the forward takes ~100 ms on the host).
    "a100_nccl_2rank_rank0.json.gz": {("device_idle", "critical")},
    # A100, rank 3 of 8: device 84% busy; NCCL 35% of the step, 19% of it exposed (no compute overlapping).
    "a100_8rank_rank3.json.gz": {("communication_bound", "warning")},
    # V100, rank 1 of 2: device 96% busy, 27% fp32 GEMM (below the 30% threshold), 10% exposed NCCL: healthy.
    "v100_2rank_rank1.json.gz": set(),
    # 128 ranks: device 45% busy, 27% of the step exposed communication, the optimizer's update 34% of it.
    "sampled_128rank_rank0.json.gz": {
        ("device_idle", "critical"),
        ("communication_bound", "warning"),
        ("optimizer_heavy", "warning"),
    },
}


def _context(trace: dict, name: str) -> StageEpoch:
    """The same context `lightning-perf analyze` builds from a trace (one code path), for a "32-true" run."""
    return trace_context(summarize_trace(trace, window=name), distributed_info(trace), precision="32-true")


@pytest.mark.parametrize(("name", "expected"), list(CASES.items()))
def test_real_gpu_trace_yields_the_findings_it_shows(name, expected, gpu_trace):
    trace = load(gpu_trace(name))
    findings = diagnose(_context(trace, name))
    assert {(f.id, f.severity) for f in findings} == expected
    assert all(f.window == name for f in findings if f.id != "memory_pressure")
    # The same findings from the trace as we write it (categories renamed for TensorBoard).
    assert diagnose(_context(traces.tensorboard_compatible(trace), name)) == findings


def test_precision_advice_names_the_trainer_argument(gpu_trace):
    trace = load(gpu_trace("v100_single_rank.json.gz"))
    [finding] = diagnose(_context(trace, "v100"))
    assert 'precision="16-mixed"' in finding.advice  # V100: fp16 tensor cores (no bf16)
    assert "fp32" in finding.evidence and "30%" in finding.evidence
