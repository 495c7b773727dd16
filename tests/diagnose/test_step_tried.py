"""The thread count's and the precision's advice once tried on one real step of the run
(lightning_perf.diagnose.step_tried): pure, on hand-made summaries."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.registry import RULES
from lightning_perf.diagnose.step_tried import (
    autocast_dtype,
    precision_setting,
    thread_setting,
    threads_of,
    without_sentence,
)
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.trial_records import AdviceTrial
from summaries import CPU, FP32_GPU, GiB, epoch, gpu_epoch, window

ONE_OF_EIGHT = dataclasses.replace(CPU, torch_threads=1, num_workers=0)  # cpu_threads: a warning
TWO = "torch.set_num_threads(8)"
BF16 = 'precision="bf16-mixed"'


def tried(rule: str, setting: str, ratio: float, **kw) -> AdviceTrial:
    values = dict(current=0.0280, advised=0.0280 / ratio, ratio=ratio, spread=(ratio * 0.9, ratio * 1.1))
    return AdviceTrial(rule=rule, setting=setting, epoch=0, batches=9, repetitions=3, seconds=0.61, **{**values, **kw})


def threads(trial: AdviceTrial | None, rule: str = "cpu_threads", **kw):
    context = StageEpoch(
        epoch=epoch(**kw), facts=ONE_OF_EIGHT, advice_trials={} if trial is None else {trial.rule: trial}
    )
    return RULES[rule](context, Thresholds())


def precision(trial: AdviceTrial | None):
    gemms = window(step_time=1.0, device_busy=0.95, kernel_time=1.0, fp32_gemm_time=0.6, tensor_core_capable=True)
    context = StageEpoch(
        epoch=gpu_epoch(),
        windows=(gemms,),
        facts=FP32_GPU,
        advice_trials={} if trial is None else {"precision": trial},
    )
    return RULES["precision"](context, Thresholds())


def test_the_settings_are_read_from_the_advice() -> None:
    assert thread_setting(threads(None).advice) == TWO and threads_of(TWO) == 8
    assert precision_setting(precision(None).advice) == BF16 and autocast_dtype(BF16) == "bfloat16"
    assert autocast_dtype('precision="16-mixed"') == "float16" and threads_of(BF16) is None
    assert thread_setting("Call `torch.set_num_threads(...)` one lower") is None


def test_a_thread_count_that_gained_leads_the_advice() -> None:
    f = threads(tried("cpu_threads", TWO, 3.5))
    assert f.severity == "warning"
    assert f.advice.startswith(
        "Tried on one batch of your data, 9 steps each on a copy of your module: with `torch.set_num_threads(8)` a"
        " step takes 8.00 ms against 28.00 ms now (3.50x, 3.15x-3.85x over 3 repetitions; the trial"
        " took 0.61 s). Call `torch.set_num_threads(8)` at the start of the script"
    ), f.advice


def test_a_thread_count_without_gain_is_withdrawn_and_the_finding_falls_to_info() -> None:
    f = threads(tried("cpu_threads", TWO, 0.6))
    assert f.severity == "info"
    assert f.advice == (
        "Tried `torch.set_num_threads(8)` on one batch of your data, 9 steps each on a copy of your module: 0.60x (a"
        " step takes 46.67 ms against 28.00 ms now, 0.54x-0.66x over 3 repetitions; the trial took"
        " 0.61 s), no gain; not advised."
    )


def test_a_gain_one_repetition_contradicts_is_no_gain() -> None:
    f = threads(tried("cpu_threads", TWO, 1.3, spread=(0.95, 1.6)))
    assert f.severity == "info" and "no gain; not advised." in f.advice


def test_an_untried_count_stays_a_prediction_and_says_why() -> None:
    why = "the module optimizes manually (`automatic_optimization=False`): its `training_step` steps the optimizers"
    f = threads(AdviceTrial(rule="cpu_threads", setting=TWO, epoch=0, untried=why))
    assert f.severity == "warning"
    assert f.advice.endswith(f"This is a prediction: `{TWO}` was not tried on this run ({why}).")


def test_a_trial_of_another_count_changes_nothing() -> None:
    assert threads(tried("cpu_threads", "torch.set_num_threads(4)", 3.0)).advice == threads(None).advice


def test_cpu_contentions_thread_advice_is_withdrawn_but_the_wait_keeps_its_severity() -> None:
    # 1 torch thread and 4 workers on 2 CPUs: the run oversubscribes them, and the advice names a thread count.
    busy = dataclasses.replace(CPU, cpu_count=2, torch_threads=2, num_workers=0)
    context = StageEpoch(epoch=epoch(cpu_wait_share=0.3, wall_time=2.0, other_cpu_load=0.05), facts=busy)
    before = RULES["cpu_contention"](context, Thresholds())
    setting = thread_setting(before.advice)
    assert setting == "torch.set_num_threads(1)", before.advice
    after = RULES["cpu_contention"](
        dataclasses.replace(context, advice_trials={"cpu_contention": tried("cpu_contention", setting, 0.9)}),
        Thresholds(),
    )
    assert after.severity == before.severity
    assert after.advice.startswith(f"Tried `{setting}` on one batch of your data") and setting not in after.advice[70:]


def test_bf16_that_gained_leads_with_time_and_memory() -> None:
    f = precision(tried("precision", BF16, 2.4, current_peak=6 * GiB, advised_peak=3 * GiB))
    assert f.severity == "warning"
    assert f.advice.startswith(
        'Tried on one batch of your data, 9 steps each on a copy of your module: with `precision="bf16-mixed"` a'
        " forward and backward take 11.67 ms against 28.00 ms now (2.40x, 2.16x-2.64x over 3 repetitions; its peak"
        " memory 3.0 GiB against 6.0 GiB; the trial took 0.61 s). Use `Trainer"
    ), f.advice


def test_bf16_without_gain_is_withdrawn_and_tf32_stays_advised() -> None:
    f = precision(tried("precision", BF16, 1.02))
    assert f.severity == "info"
    assert "peak memory not measured off CUDA" in f.advice and "no gain; not advised." in f.advice
    assert "Use `Trainer" not in f.advice and f.advice.endswith("message suggests).")
    assert "Or keep fp32 and let matmuls use TF32" in f.advice


@pytest.mark.parametrize(
    ("text", "left"),
    [
        ("Do A. Call `x(1)` now. Then B.", "Do A. Then B."),
        ("Call `x(1)` (e.g. here). `y` stays.", "`y` stays."),
        ("Nothing to drop.", "Nothing to drop."),
    ],
)
def test_a_withdrawn_settings_sentence_goes_and_the_others_stay(text, left) -> None:
    assert without_sentence(text, "`x(1)`") == left


def pressure(trial: AdviceTrial | None):
    """fp32 training with 76 of 80 GiB reserved: memory_pressure advises bf16 for the activations."""
    context = StageEpoch(
        epoch=gpu_epoch(cuda_max_reserved=76 * GiB, cuda_max_allocated=70 * GiB),
        facts=FP32_GPU,
        advice_trials={} if trial is None else {"memory_pressure": trial},
    )
    return RULES["memory_pressure"](context, Thresholds())


def test_memory_pressures_bf16_says_the_peak_its_trial_measured() -> None:
    assert pressure(None).advice.endswith('; `Trainer(precision="bf16-mixed")` halves activation memory.')
    assert precision_setting(pressure(None).advice) == BF16
    saved = pressure(tried("memory_pressure", BF16, 2.4, current_peak=6 * GiB, advised_peak=3 * GiB))
    assert saved.severity == "warning" and saved.advice.endswith(
        '; `Trainer(precision="bf16-mixed")` was tried on one batch of your data: a step\'s peak memory 3.0 GiB'
        " against 6.0 GiB now (2.00x lower; the step 2.40x as fast)."
    ), saved.advice
    same = pressure(tried("memory_pressure", BF16, 0.9, current_peak=6 * GiB, advised_peak=6 * GiB))
    assert same.severity == "warning" and same.advice.endswith("against 6.0 GiB now, no saving; not advised.")
    why = "the GPU has 1.0 GiB free, and a copy of the module with its gradients and a step's activations needs 9 GiB"
    untried = pressure(AdviceTrial(rule="memory_pressure", setting=BF16, epoch=0, untried=why))
    assert untried.advice.endswith(f"halves activation memory (a prediction: it was not tried on this run, {why}).")
