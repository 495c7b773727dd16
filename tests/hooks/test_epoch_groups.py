"""Runs of short epochs: once a stage's measurement pace is spent, an epoch is carried into the next one and
the two are measured together (epoch_report, Notes 2): one summary, one set of scalars and findings; a window's
epoch ends its group, the epochs still carried are measured at the end of the call, and an interruption
measures them with the epoch it stopped."""

import json
import logging

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from clocks import FakeClock
from lightning_perf import PerfCallback
from lightning_perf.collect.steps import StepClock
from lightning_perf.hooks.log_pace import LogPace
from lightning_perf.hooks.stage_measure import GROUP_SECONDS, StageMeasure
from lightning_perf.summarize.steps import summarize_epoch
from models import TinyModel, trainer


@pytest.fixture
def spent_pace(monkeypatch):
    """No burst and no share: the first epoch start's reading spends the pace, and every epoch is carried (into a
    group of any age: a slow machine's)."""
    from lightning_perf.hooks import stage_measure

    monkeypatch.setattr(stage_measure, "MEASURE_BURST", 0.0)
    monkeypatch.setattr(stage_measure, "MEASURE_SHARE", 0.0)
    monkeypatch.setattr(stage_measure, "GROUP_SECONDS", float("inf"))


def _groups(callback, stage):
    return [(e.epoch, e.epochs, e.batches) for e in callback.epochs if e.stage == stage]


def test_carried_epochs_are_measured_together_and_those_left_at_the_end_of_the_call(tmp_path, caplog, spent_pace):
    callback = PerfCallback(batches=[100_000], verbose=1)
    t = trainer(tmp_path, [callback], max_epochs=6, limit_train_batches=2, limit_val_batches=1)
    with caplog.at_level(logging.INFO):
        t.fit(TinyModel(n=8))
    # Epochs 0-5 carried, one after the other, and measured at the end of the fit.
    assert _groups(callback, "train") == [(5, 6, 12)]
    assert _groups(callback, "validate") == [(5, 6, 6)]
    scalars = EventAccumulator(t.logger.log_dir).Reload()
    assert [s.value for s in scalars.Scalars("perf/train/epoch/batches")] == [12.0]  # one point per group
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("lightning-perf | train epochs 0-5 |") for m in messages), messages
    for stage in ("train", "validate"):  # said once per stage
        assert (
            sum(
                m.startswith(f"PerfCallback: the {stage} epochs are short: to keep their measurement") for m in messages
            )
            == 1
        )
    with open(callback.report_path) as f:
        report = json.load(f)
    assert [(e["epoch"], e["epochs"]) for e in report["stages"]["train"]["epochs"]] == [(5, 6)]
    with open(callback.page_path, encoding="utf-8") as f:
        page = f.read()
    assert "<b>train epochs 0-5</b>" in page  # the page's headline names the group
    # The fit's last training group was diagnosed with the validation group inside it.
    assert ("train", 5) in callback._epochs.findings_by_epoch


def test_an_epoch_with_a_window_ends_its_group(tmp_path, spent_pace):
    # Batch 1 of each epoch, until the budget or max_windows stops it: epoch 0's window at the least.
    callback = PerfCallback(batches=[1], max_windows=2, stages=["train"])
    trainer(tmp_path, [callback], max_epochs=6, limit_val_batches=0).fit(TinyModel(n=16, batch_size=4))
    windowed = sorted({w.epoch for w in callback.windows})
    groups = _groups(callback, "train")
    assert windowed and windowed == [epoch for epoch, _, _ in groups[: len(windowed)]]  # each measured alone
    assert all(epochs == 1 for _, epochs, _ in groups[: len(windowed)])
    assert groups[len(windowed) :] == [(5, 5 - windowed[-1], 4 * (5 - windowed[-1]))]  # the rest together


def test_an_interruption_measures_the_carried_epochs_with_the_one_it_stopped(tmp_path, spent_pace):
    class Stops(TinyModel):
        def training_step(self, batch, batch_idx):
            if self.current_epoch == 3 and batch_idx == 1:
                raise RuntimeError("stopped")
            return super().training_step(batch, batch_idx)

    callback = PerfCallback(batches=[100_000], stages=["train"])
    with pytest.raises(RuntimeError, match="stopped"):
        trainer(tmp_path, [callback], max_epochs=6, limit_val_batches=0).fit(Stops(n=8))
    [stopped] = [e for e in callback.epochs if e.stage == "train"]
    assert (stopped.epoch, stopped.epochs, stopped.batches, stopped.interrupted) == (3, 4, 7, True)
    with open(callback.page_path, encoding="utf-8") as f:
        assert "interrupted during train epochs 0-3 (after 7 batches)" in f.read()  # the page's banner


def test_a_clock_carried_into_the_next_epoch_keeps_its_batches_and_each_first_wait():
    clock = FakeClock()
    steps = StepClock(lambda batch: 4, clock=clock, cpu_clock=clock)

    def batch(wait, compute):
        clock.now += wait
        steps.batch_start(None)
        clock.now += compute
        steps.batch_end(None)
        steps.restart()

    steps.epoch_start(waited=0.5)  # Lightning started the DataLoader before the hook
    batch(0.1, 1.0)
    batch(0.1, 1.0)
    steps.epoch_start(waited=0.25, carried=True)
    batch(0.05, 1.0)
    summary = summarize_epoch(
        stage="train",
        epoch=1,
        data_wait=steps.data_wait,
        compute=steps.compute,
        batch_sizes=steps.batch_sizes,
        epoch_starts=steps.epoch_starts,
    )
    assert (summary.batches, summary.epochs) == (3, 2)
    assert summary.first_data_wait == pytest.approx(0.6 + 0.3)  # each epoch's first wait, its DataLoader's start
    steps.epoch_start()  # not carried: a new group
    assert steps.data_wait == [] and steps.epoch_starts == [0]


@pytest.mark.parametrize(
    ("windowed", "alone", "carried"),
    [(False, True, True), (True, True, False), (False, False, False)],
    ids=["carried", "a-window-ends-the-group", "distributed-measures-every-epoch"],
)
def test_an_epoch_is_carried_only_alone_without_a_window_and_with_the_pace_spent(windowed, alone, carried):
    clock = FakeClock()
    pace = LogPace(share=0.0, burst=0.0, clock=clock, waited=lambda: 0.0)
    measure = StageMeasure(StepClock(lambda batch: None, clock=clock), LogPace(clock=clock), pace)
    pace.start()
    clock.now += 0.002  # what the first epoch's measurement cost
    pace.end()
    assert measure.carry(0.0, windowed=windowed, alone=alone) is carried
    assert measure.carried is carried


def test_a_fresh_pace_measures_every_epoch_alone():
    clock = FakeClock()
    pace = LogPace(share=0.01, burst=0.1, clock=clock)
    measure = StageMeasure(StepClock(lambda batch: None, clock=clock), LogPace(clock=clock), pace)
    assert measure.carry(0.0, windowed=False, alone=True) is False


def test_a_group_lasts_at_most_group_seconds_then_a_new_one_starts():
    # A pace overspent (e.g. by the windows' epochs, each measured alone) would carry every epoch for as long as
    # it takes to pay back: a group is measured once it is GROUP_SECONDS old all the same.
    clock = FakeClock()
    pace = LogPace(share=0.0, burst=0.0, clock=clock, waited=lambda: 0.0)
    measure = StageMeasure(StepClock(lambda batch: None, clock=clock), LogPace(clock=clock), pace)
    pace.spent(0.002)
    ends = [0.0, 0.5, GROUP_SECONDS - 0.01, GROUP_SECONDS, GROUP_SECONDS + 0.5, 2 * GROUP_SECONDS + 0.5]
    assert [measure.carry(now, windowed=False, alone=True) for now in ends] == [True, True, True, False, True, False]


def test_the_stages_share_one_pace_for_their_measurement_and_one_for_their_per_batch_scalars():
    # Short training epochs alternate with the validation runs inside them: a pace per stage let each spend the
    # share (log_pace Notes 3; epoch_report Notes 2).
    callback = PerfCallback()
    stages = [callback._stages[stage] for stage in ("train", "validate", "test", "predict")]
    assert len({id(st.measure_pace) for st in stages}) == 1
    assert len({id(st.pace) for st in stages}) == 1
