"""``memory_breakdown``, ``memory_pressure`` and ``memory_growth`` on hand-built summaries
(lightning_perf.diagnose.rules_memory)."""

import dataclasses

import pytest
from contexts import GiB, ctx, facts, gpu_ctx, run, with_history

from summaries import ADAM_MEMORY, CPU, FP32_GPU, GPU, epoch, gpu_epoch

# --- memory_breakdown ---------------------------------------------------------------------------------------


def test_memory_breakdown_names_the_largest_part_and_its_cures_first_and_warns_when_memory_is_tight():
    info = run("memory_breakdown", ctx(facts=facts(CPU, memory=ADAM_MEMORY)))
    assert (
        info.severity == "info" and info.title == "The largest part of training memory: optimizer state, 50% (8.0 GiB)"
    )
    assert info.advice.startswith("What would shrink it, with the predicted savings: an optimizer with one state")
    assert "activations are measured on CUDA, or in a training window with profile_memory=True" in info.evidence
    tight = gpu_ctx(
        gpu_epoch(cuda_max_reserved=70 * GiB, cuda_max_allocated=60 * GiB),
        facts=facts(FP32_GPU, memory={**ADAM_MEMORY, "activations": 40 * GiB, "allocator_overhead": 10 * GiB}),
    )
    f = run("memory_breakdown", tight)
    assert f.severity == "warning" and "activations and temporaries, 60%" in f.title  # 40 of 66 GiB
    # Half the batch saves half the activations (20 GiB); bf16-mixed as much less autocast's bf16 weights (18 GiB).
    assert f.advice.startswith("What would shrink it, with the predicted savings: half the `batch_size`")
    bf16 = '`Trainer(precision="bf16-mixed")`: activations in bf16, less the bf16 copies of the weights: about 18.0'
    assert bf16 in f.advice
    assert "peak reserved 70.0 GiB of 80.0 GiB (warning >= 85%)" in f.evidence
    assert run("memory_breakdown", ctx(facts=CPU)) is None  # not counted (validate, test, predict; no training)


def test_a_module_that_optimizes_manually_is_told_to_accumulate_in_its_training_step():
    # Lightning refuses `Trainer(accumulate_grad_batches)` with manual optimization (a MisconfigurationException).
    memory = {**ADAM_MEMORY, "activations": 40 * GiB, "allocator_overhead": 10 * GiB}
    context = gpu_ctx(
        gpu_epoch(cuda_max_reserved=70 * GiB, cuda_max_allocated=60 * GiB),
        facts=facts(FP32_GPU, memory=memory, manual_optimization=True),
    )
    f = run("memory_breakdown", context)
    assert "half the `batch_size` with accumulation in `training_step` (step the optimizers every 2 batches" in f.advice
    assert "`Trainer(accumulate_grad_batches=2)`" not in f.advice


# --- memory_pressure ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reserved", "severity"), [(0.90, "warning"), (0.9699, "warning"), (0.97, "critical")])
def test_memory_pressure_severity(reserved, severity):
    capacity = 100 * GiB
    e = gpu_epoch(
        cuda_capacity=capacity, cuda_max_reserved=int(reserved * capacity), cuda_max_allocated=int(0.89 * capacity)
    )
    f = run("memory_pressure", gpu_ctx(e))
    assert f.severity == severity and f.window is None
    assert "(warning >= 90%, critical >= 97%)" in f.evidence


def test_memory_pressure_advice_leads_with_expandable_segments_when_fragmented():
    fragmented = gpu_epoch(cuda_capacity=80 * GiB, cuda_max_reserved=76 * GiB, cuda_max_allocated=50 * GiB)
    f = run("memory_pressure", gpu_ctx(fragmented))
    assert f.title == "GPU memory 95% full during training"
    assert "26.0 GiB (34%) reserved but unused" in f.evidence
    assert f.advice.startswith("The cache is fragmented") and "expandable_segments:True" in f.advice
    assert "accumulate_grad_batches" in f.advice
    tight = gpu_epoch(cuda_capacity=80 * GiB, cuda_max_reserved=76 * GiB, cuda_max_allocated=75 * GiB)
    assert "expandable_segments" not in run("memory_pressure", gpu_ctx(tight)).advice


def test_memory_pressure_suggests_bf16_only_in_fp32():
    full = gpu_epoch(cuda_capacity=80 * GiB, cuda_max_reserved=76 * GiB, cuda_max_allocated=75 * GiB)
    assert "bf16-mixed" not in run("memory_pressure", gpu_ctx(full)).advice  # already bf16-mixed
    assert "bf16-mixed" in run("memory_pressure", gpu_ctx(full, facts=facts(GPU, precision="32-true"))).advice


def test_memory_pressure_needs_cuda_numbers():
    assert run("memory_pressure", ctx(epoch())) is None


# --- memory_growth ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peaks", "fires"),
    [
        ((1000, 1100, 1200), True),
        ((1000, 1200), False),  # two epochs are no trend
        ((900, 1000, 1000, 1100), True),  # flat epochs are allowed inside the run
        ((1000, 1100, 1100), False),  # not rising in this epoch
        ((1000, 1300, 1200, 1250, 1300), False),  # fell two epochs ago: the run is 1200 -> 1300, +8%
        ((2000, 2050, 2150), False),  # +150 MiB but only +7.5%
        ((500, 530, 560), False),  # +12% but only +60 MiB
    ],
)  # fmt: skip
def test_memory_growth_needs_a_sustained_rise(peaks, fires):
    assert (run("memory_growth", with_history(*peaks)) is not None) == fires


def test_memory_growth_evidence_and_advice():
    f = run("memory_growth", with_history(1024, 1100, 1200, 1300))
    assert f.severity == "warning" and f.title == "Host memory grows every training epoch: +276 MiB over 4 epochs"
    assert "host memory (RSS peak) rose over 4 epochs: 1.0 GiB -> 1.3 GiB (+276 MiB, +26%)" in f.evidence
    assert ">= 3 epochs" in f.evidence and ">= 10%" in f.evidence and ">= 100 MiB" in f.evidence
    assert "loss.detach()" in f.advice


def test_memory_growth_counts_the_epochs_of_records_measured_together():
    # Short epochs measured in groups (epoch_report, Notes 2): four records of 1, 5, 5 and 5 epochs.
    context = with_history(1024, 1100, 1200, 1300)
    grouped = [
        dataclasses.replace(e, epochs=1 if i == 0 else 5) for i, e in enumerate((*context.history, context.epoch))
    ]
    f = run("memory_growth", ctx(grouped[-1], facts=CPU, history=grouped[:-1]))
    assert f.title == "Host memory grows every training epoch: +276 MiB over 16 epochs"
    assert "rose over 16 epochs" in f.evidence


def test_memory_growth_on_the_gpu():
    f = run("memory_growth", with_history(1000, 1100, 1200, field="cuda_max_allocated", facts=GPU))
    assert f.title.startswith("GPU memory grows") and "GPU allocated memory" in f.evidence


def test_memory_growth_epochs_is_a_threshold():
    assert run("memory_growth", with_history(1000, 1100, 1200), memory_growth_epochs=4) is None
    assert run("memory_growth", with_history(1000, 1200), memory_growth_epochs=2) is not None
