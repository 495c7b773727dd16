"""Rules that judge every batch's phases (lightning_perf.collect.phases), not one window's steps: pure, on
hand-made summaries."""

from __future__ import annotations

import dataclasses

from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.registry import RULES
from lightning_perf.diagnose.thresholds import Thresholds
from summaries import CPU, epoch, window

FACTS = dataclasses.replace(CPU, optimizer="Adam", optimizer_fused=False, optimizer_fusable=True)


def phases(optimizer: float, **kw):
    """100 batches of 10 ms whose optimizer phase takes ``optimizer`` of the epoch's second."""
    return epoch(optimizer_time=optimizer, optimizer_p50=optimizer / 100, optimizer_p90=optimizer / 90, **kw)


def judge(summary, windows=()):
    return RULES["optimizer_heavy"](StageEpoch(epoch=summary, windows=tuple(windows), facts=FACTS), Thresholds())


def test_every_batch_judges_the_optimizer_without_a_window() -> None:
    f = judge(phases(0.30))
    assert f is not None and f.severity == "warning" and f.window is None
    assert f.title == "Optimizer update takes 30% of each training step"
    assert "over 100 batches (3.00 ms of 10.00 ms a batch" in f.evidence
    assert "`torch.optim.Adam(..., fused=True)`" in f.advice
    assert judge(phases(0.15)) is None  # under the 20% share
    assert judge(phases(0.03, step_time=0.1)) is None  # 30% but 0.3 ms a batch: under the floor


def test_a_window_adds_its_operators_and_cannot_overrule_every_batch() -> None:
    loop = window(step_time=0.010, optimizer_update_time=0.003, optimizer_foreach=False)
    f = judge(phases(0.30), [loop])
    assert f is not None and f.window == loop.window
    assert "a loop over the parameters (no foreach)" in f.evidence
    # A window whose steps happened to update quickly does not hide what every batch measured, nor the reverse.
    quick = window(step_time=0.010, optimizer_update_time=0.0001, optimizer_foreach=False)
    assert judge(phases(0.30), [quick]) is not None
    assert judge(phases(0.05), [loop]) is None


def test_without_a_split_a_window_still_judges() -> None:
    loop = window(step_time=0.010, optimizer_update_time=0.003, optimizer_foreach=False)
    f = judge(epoch(), [loop])
    assert f is not None and "optimizer update 30% of the step" in f.evidence


def overhead(summary, windows=()):
    return RULES["framework_overhead"](StageEpoch(epoch=summary, windows=tuple(windows), facts=FACTS), Thresholds())


def test_the_other_phase_of_every_batch_is_framework_time_a_window_need_not_see() -> None:
    f = overhead(epoch(other_time=0.25, other_p50=0.0025, other_p90=0.003))
    assert f is not None and f.window is None and f.title == "Training spends 25% of each step outside torch operators"
    assert "Lightning's bookkeeping and the callbacks' hooks take 25% of each step over 100 batches" in f.evidence
    assert "this window's trace" not in f.advice
    assert overhead(epoch(other_time=0.05)) is None
    # Beside a window that shows more: the window's share leads, every batch's is evidence too.
    gaps = window(step_time=0.010, framework_time=0.005)
    f = overhead(epoch(other_time=0.25), [gaps])
    assert f.title.endswith("50% of each step outside torch operators") and "over 100 batches" in f.evidence


def test_every_batch_judgment_from_two_batches_is_information_only() -> None:
    # A smoke run (fast_dev_run) measures a batch or two: the phases' rules obey the minimum-evidence guard there,
    # as the other rules that judge the epoch's batches do; a window's trace is judged as before.
    from lightning_perf.diagnose.registry import diagnose

    few = phases(0.006, batches=2, step_time=0.02, samples=64)
    found = {f.id: f for f in diagnose(StageEpoch(epoch=few, facts=FACTS), Thresholds())}
    assert (
        found["optimizer_heavy"].severity == "info"
        and "from 2 measured batches only" in found["optimizer_heavy"].evidence
    )
    loop = window(step_time=0.010, optimizer_update_time=0.003, optimizer_foreach=False)
    found = {f.id: f for f in diagnose(StageEpoch(epoch=few, windows=(loop,), facts=FACTS), Thresholds())}
    assert found["optimizer_heavy"].severity == "warning"
