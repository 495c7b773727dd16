"""``dataloader_bound``'s advice once its setting was tried on the run's data (lightning_perf.diagnose.advice_tried):
the measurement leads, a setting with no gain is withdrawn, an untried one says why. Pure: no trainer, no torch."""

from __future__ import annotations

import dataclasses

import pytest
from test_loader_advice import CPU, epoch

from advice import settings
from lightning_perf.diagnose.advice_tried import advised_setting, loader_setting
from lightning_perf.diagnose.model import RunFacts, StageEpoch
from lightning_perf.diagnose.registry import RULES
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.trial_records import AdviceTrial

SETTING = "num_workers=2, persistent_workers=True"
# 40 batches waiting 12 ms of I/O a 6-ms compute, 20 epochs: 2 workers are advised.
IO = epoch(wait=0.012, compute=0.006, batches=40, loading_cpu_share=0.05)
FACTS = dataclasses.replace(CPU, cpu_count=2, torch_threads=2, epochs=20)


def judge(trials: dict[str, AdviceTrial], facts: RunFacts = FACTS, **overrides):
    context = StageEpoch(epoch=IO, facts=facts, advice_trials=trials)
    return RULES["dataloader_bound"](context, Thresholds.with_overrides(overrides))


def tried(ratio: float, *, setting: str = SETTING, current: float = 0.0121) -> AdviceTrial:
    return AdviceTrial(
        rule="dataloader_bound",
        setting=setting,
        epoch=0,
        compute=0.001,
        current=current,
        advised=current / ratio,
        ratio=ratio,
        spread=(ratio * 0.9, ratio * 1.1),
        batches=24,
        repetitions=3,
        seconds=0.42,
    )


def test_the_setting_is_read_from_the_advice_and_only_the_triable_arguments_count():
    assert advised_setting("x. Set `DataLoader(num_workers=2, persistent_workers=True)`: y") == SETTING
    assert loader_setting(SETTING) == {"num_workers": 2, "persistent_workers": True}
    assert loader_setting("num_workers=8, prefetch_factor=4") == {"num_workers": 8, "prefetch_factor": 4}
    assert advised_setting("Set `DataLoader(batch_size=64)`: larger batches") is None  # not a loader setting
    assert advised_setting("compare `DataLoader(num_workers=1, persistent_workers=True)` with this run") is None
    assert loader_setting("num_workers=many") is None


def test_without_a_trial_the_advice_is_the_prediction():
    f = judge({})
    assert f.severity == "critical" and settings(f.advice) == {"num_workers": 2, "persistent_workers": True}
    assert "predicted data wait" in f.advice and "Tried" not in f.advice


def test_a_tried_gain_leads_the_advice_with_the_measurement_instead_of_the_prediction():
    f = judge({"dataloader_bound": tried(3.2)})
    assert f.advice.startswith(
        "Tried on 24 batches of your data: with `num_workers=2, persistent_workers=True` the step waits 3.78 ms"
        " for a batch against 12.10 ms now (3.20x, 2.88x-3.52x over 3 repetitions, the step's 1.00 ms of compute"
        " between batches; the trial took 0.42 s)."
    )
    assert settings(f.advice) == {"num_workers": 2, "persistent_workers": True} and f.severity == "critical"
    assert "predicted data wait" not in f.advice


def test_a_trial_over_a_whole_epoch_says_its_figures_are_a_steps_time_per_batch():
    epoch_long = dataclasses.replace(tried(3.2, current=0.0131), epoch_batches=40)
    f = judge({"dataloader_bound": epoch_long})
    assert f.advice.startswith(
        "Tried on 24 batches of your data: with `num_workers=2, persistent_workers=True` a step takes 4.09 ms a"
        " batch against 13.10 ms now (3.20x, 2.88x-3.52x over 3 repetitions; over an epoch of 40 batches, the"
        " workers' start-up, each batch's wait and the step's 1.00 ms of compute; the trial took 0.42 s)."
    )
    f = judge({"dataloader_bound": dataclasses.replace(epoch_long, ratio=0.9, spread=(0.8, 1.0))})
    assert "0.90x (a step takes" in f.advice and f.severity == "info"


def test_a_trial_with_no_gain_withdraws_the_setting_and_the_finding_falls_to_info():
    f = judge({"dataloader_bound": tried(0.98)})
    assert "Tried `num_workers=2, persistent_workers=True` on 24 batches of your data: 0.98x" in f.advice
    assert "no gain; not advised." in f.advice
    assert settings(f.advice) == {} and f.severity == "info"
    # The threshold is the gain that counts: 1.05x is no gain at the default 1.1x, a gain at 1.02x.
    assert judge({"dataloader_bound": tried(1.05)}).severity == "info"
    steady = dataclasses.replace(tried(1.05), spread=(1.01, 1.1))
    assert judge({"dataloader_bound": steady}, advice_trial_min_gain=1.02).severity == "critical"
    # A gain overall that a repetition contradicts (it found the setting slower) is no gain either.
    doubtful = dataclasses.replace(tried(1.3), spread=(0.95, 1.5))
    assert judge({"dataloader_bound": doubtful}).severity == "info"
    assert "1.30x (the step waits" in judge({"dataloader_bound": doubtful}).advice


def test_an_untried_setting_says_it_is_a_prediction_and_why():
    why = "the profiling budget (2% of the run's time) has no room for a trial of about 0.40 s"
    f = judge({"dataloader_bound": AdviceTrial(rule="dataloader_bound", setting=SETTING, epoch=0, untried=why)})
    assert f"This is a prediction: `{SETTING}` was not tried on this run ({why})." in f.advice
    assert f.severity == "critical" and settings(f.advice) == {"num_workers": 2, "persistent_workers": True}


@pytest.mark.parametrize("other", ["pin_memory=True", "num_workers=4"])
def test_a_trial_of_another_setting_leaves_the_advice_as_it_was(other):
    assert judge({"dataloader_bound": tried(0.5, setting=other)}).advice == judge({}).advice


def test_the_record_goes_through_the_reports_json_and_back():
    record = tried(2.5)
    assert AdviceTrial.from_dict({**record.as_dict(), "later_key": 1}) == record


def test_a_trial_of_the_same_arguments_with_other_values_leads_and_leaves_the_advice():
    # The advice is predicted anew each epoch: 3 workers tried at one epoch's end, 2 advised at the next.
    other = "num_workers=3, persistent_workers=True"
    f = judge({"dataloader_bound": tried(2.6, setting=other)})
    assert f.advice.startswith(f"Tried on 24 batches of your data: with `{other}` the step waits 4.65 ms for a batch")
    assert settings(f.advice) == {"num_workers": 2, "persistent_workers": True} and f.severity == "critical"
    slower = judge({"dataloader_bound": tried(0.9, setting=other)})
    assert (
        slower.advice.startswith(f"Tried `{other}` on 24 batches of your data: 0.90x") and "no gain." in slower.advice
    )
    assert settings(slower.advice) == {"num_workers": 2, "persistent_workers": True}  # not what was tried
