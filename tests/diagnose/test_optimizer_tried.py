"""optimizer_heavy's advice once its implementation was tried on copies of the run's optimizer: pure, on
hand-made summaries."""

from __future__ import annotations

import dataclasses

from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.optimizer_tried import optimizer_setting
from lightning_perf.diagnose.registry import RULES
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.trial_records import AdviceTrial
from summaries import CPU, epoch, window


def heavy(trial: AdviceTrial | None, **facts_kw):
    """An Adam on CPU whose update takes 30% of the step (the trace shows a loop over the parameters)."""
    facts = dataclasses.replace(CPU, optimizer="Adam", optimizer_fused=False, optimizer_fusable=True, **facts_kw)
    context = StageEpoch(
        epoch=epoch(),
        windows=(window(step_time=1.0, optimizer_update_time=0.3, optimizer_foreach=False),),
        facts=facts,
        advice_trials={} if trial is None else {"optimizer_heavy": trial},
    )
    return RULES["optimizer_heavy"](context, Thresholds())


def tried(ratio: float, **kw) -> AdviceTrial:
    values = dict(current=0.0137, advised=0.0021, ratio=ratio, spread=(ratio * 0.9, ratio * 1.1))
    return AdviceTrial(
        rule="optimizer_heavy", setting="fused=True", epoch=0, batches=30, repetitions=3, seconds=0.73, **values, **kw
    )


def test_the_advised_implementation_is_read_from_the_advice() -> None:
    assert optimizer_setting(heavy(None).advice) == "fused=True"
    assert optimizer_setting("pass `foreach=True` ... (e.g. `torch.optim.SGD(..., foreach=True)`)") == "foreach=True"
    assert optimizer_setting("`Adam` has no fused implementation in torch.") is None


def test_a_gain_the_trial_measured_leads_the_advice() -> None:
    f = heavy(tried(6.5))
    assert f.severity == "warning"
    assert f.advice.startswith(
        "Tried on a copy of your optimizer, 30 steps each: with `fused=True` an update takes 2.10 ms against"
        " 13.70 ms now (6.50x, 5.85x-7.15x over 3 repetitions; the trial took 0.73 s)."
    )
    assert "`torch.optim.Adam(..., fused=True)`" in f.advice  # the advice itself follows


def test_no_gain_withdraws_the_implementation_and_the_finding_falls_to_info() -> None:
    f = heavy(tried(0.98))
    assert f.severity == "info"
    assert "(0.98x" in f.advice and "no gain; `fused=True` is not advised." in f.advice
    assert "updates them in one pass" not in f.advice  # the prediction is gone
    assert "Fewer, larger parameter tensors" in f.advice  # what else the advice names stays


def test_an_untried_implementation_stays_a_prediction_and_says_why() -> None:
    trial = AdviceTrial(rule="optimizer_heavy", setting="fused=True", epoch=0, untried="torch refused it: boom")
    f = heavy(trial)
    assert f.severity == "warning"
    assert f.advice.endswith("This is a prediction: `fused=True` was not tried on this run (torch refused it: boom).")


def test_a_trial_of_another_implementation_changes_nothing() -> None:
    other = dataclasses.replace(tried(3.0), setting="foreach=True")
    assert heavy(other).advice == heavy(None).advice
