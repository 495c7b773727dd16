"""The profiling budget (lightning_perf.budget): pure, no trainer."""

from __future__ import annotations

import pytest

from lightning_perf.budget import ProfilingBudget, excess_time, window_cost, window_costs


def test_without_a_budget_every_window_opens():
    budget = ProfilingBudget(None)
    budget.call_started(0.0)
    budget.opened()
    budget.charge(100.0)
    assert budget.allows(1.0)


def test_a_window_opens_while_the_cost_so_far_and_one_more_stay_within_the_share():
    budget = ProfilingBudget(0.05)
    budget.call_started(0.0)
    assert budget.allows(0.1)  # nothing measured yet: the controller opens a stage's first window anyway
    budget.opened()
    budget.charge(0.5)  # one window of 0.5 s
    # 0.5 + 0.5 <= 0.05 * (t + 0.5)  <=>  t >= 19.5 s
    assert not budget.allows(19.4)
    assert budget.allows(19.6)


def test_over_a_long_run_the_cost_stays_near_the_share():
    budget = ProfilingBudget(0.03)
    budget.call_started(0.0)
    now, step, window = 0.0, 0.1, 0.6  # a window planned every 30 batches, each costing 6 steps
    for batch in range(100_000):
        now += step
        if batch % 30 == 0:
            if budget.allows(now):
                budget.opened()
                budget.charge(window)
                now += window
            else:
                budget.skipped()
    cost = budget.cost(now)
    assert cost.share == pytest.approx(0.03, abs=0.002) and cost.skipped > cost.windows


def test_the_runs_wall_time_is_its_trainer_calls():
    budget = ProfilingBudget(0.03)
    budget.call_started(10.0)
    budget.call_ended(14.0)  # fit: 4 s
    budget.call_started(100.0)  # a test call, much later
    assert budget.elapsed(101.0) == pytest.approx(5.0)
    budget.call_ended(102.0)
    assert budget.cost(500.0).run_seconds == pytest.approx(6.0)


def test_a_resumed_run_goes_on_with_what_it_spent():
    budget = ProfilingBudget(0.03)
    budget.call_started(0.0)
    budget.opened()
    budget.charge(1.0)
    budget.call_ended(10.0)
    resumed = ProfilingBudget(0.03)
    resumed.load_state_dict(budget.state_dict(50.0))
    assert resumed.cost(0.0) == budget.cost(0.0)
    budget.call_started(60.0)  # a checkpoint inside a call holds the time the call has run so far
    assert budget.state_dict(62.0)["run_seconds"] == pytest.approx(12.0)
    resumed.load_state_dict({})  # an older checkpoint
    assert resumed.cost(0.0).seconds == 0.0


def test_a_windows_cost_is_its_close_and_its_batches_beyond_the_median():
    steps = [0.1, 0.1, 0.3, 0.25, 0.2, 0.09, 0.1]
    assert excess_time(steps, [2, 3, 4, 5], 0.1) == pytest.approx(0.2 + 0.15 + 0.1)  # 5 is faster: none
    assert window_cost(0.4, steps, [2, 3, 4, 5, 99], 0.1) == pytest.approx(0.85)  # an index past the end: none
    assert window_cost(0.4, steps, [], 0.1) == 0.4


def test_an_epochs_cost_goes_to_the_window_each_batch_follows():
    from lightning_perf.records import WindowRecord

    def window(first: int, last: int, close: float) -> WindowRecord:
        return WindowRecord(
            stage="train",
            epoch=0,
            first_batch=first,
            last_batch=last,
            name=f"w{first}",
            trace_path="",
            step=0,
            device="cpu",
            close_seconds=close,
        )

    steps = [0.1, 0.5, 0.1, 0.2, 0.3, 0.3, 0.2, 0.1, 0.1, 0.2, 0.3, 0.1]
    # batch 1: the FLOP count; window A warms up at 3, records 4-5, batch 6 after its close; window B 9-10
    costed, other = window_costs(
        [window(9, 10, 0.05), window(4, 5, 0.1)], steps, [1, 3, 4, 5, 6, 8, 9, 10], 0.1, warmup=1, waited=0.02
    )
    assert other == pytest.approx(0.4)
    a, b = costed
    assert a.name == "w4" and a.cost_seconds == pytest.approx(0.1 + 0.1 + 0.2 + 0.2 + 0.1)
    assert b.name == "w9" and b.cost_seconds == pytest.approx(0.05 + 0.1 + 0.2 + 0.02)  # the wait: the last's
