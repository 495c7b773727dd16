"""Tests of lightning_perf.hooks.flop_count: which training batch is counted, and when the budget holds the count
back (issue 26: "FLOP counting ... count against the same budget")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_perf.budget import ProfilingBudget
from lightning_perf.hooks.flop_count import HELD_STRIDE, FlopCounting, count_fits
from lightning_perf.report.profiling import profiling_line

BATCH = torch.randn(4, 8)


class Clock:
    """Seconds that the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def counting(
    share: float | None = 0.02, *, windows_planned: bool = True, asked: bool = False
) -> tuple[FlopCounting, ProfilingBudget, Clock]:
    clock = Clock()
    budget = ProfilingBudget(share)
    budget.call_started(0.0)
    return FlopCounting(budget=budget, windows_planned=windows_planned, asked=asked, clock=clock), budget, clock


def offer(flops: FlopCounting, batches: range) -> int | None:
    """Offers ``batches`` of one epoch as the callback does (from ``offer_from`` on), running each counted one;
    the batch counted."""
    model = nn.Linear(8, 2)
    for i in batches:
        if not flops.pending:
            break
        if i >= flops.offer_from and flops.batch_start(BATCH, i):
            model(BATCH).sum().backward()
            assert flops.batch_end(model) is not None
            return i
    return None


def test_without_a_budget_the_epochs_second_batch_is_counted():
    flops, budget, _ = counting(None)
    flops.epoch_start()
    assert offer(flops, range(10)) == 1
    assert not flops.held and not budget.flops_held and len(flops.counts) == 1


def test_the_count_waits_for_the_first_window_then_for_room():
    flops, budget, clock = counting(0.02)
    flops.epoch_start()
    assert offer(flops, range(1, 6)) is None  # no window yet: its findings come first
    assert flops.pending and flops.held and budget.flops_held
    budget.opened()
    budget.charge(0.1)  # the window cost 0.1 s: room for one more as costly at (0.1 + 0.1) / 0.02 - 0.1 = 9.9 s
    clock.now = 9.8
    assert offer(flops, range(6, 9)) is None  # batch 8 held back (1, 2 and 4 were): the next offer is batch 16
    line = profiling_line(budget.cost(clock.now))
    assert line is not None and line.endswith("; the FLOP count held back for the budget (2%)")
    clock.now = 9.95
    assert offer(flops, range(9, 40)) == 16
    assert not flops.pending and not flops.held and not budget.flops_held
    assert "held back" not in (profiling_line(budget.cost(clock.now)) or "")


def test_a_held_count_is_offered_ever_further_apart_up_to_the_stride():
    # Asked at every batch, the budget took 4.5 us of a 1-ms step in the fit (Notes 2).
    flops, budget, _ = counting(0.02)
    budget.opened()
    budget.charge(0.1)
    flops.epoch_start()
    offered = []
    for i in range(200):
        if i >= flops.offer_from:
            offered.append(i)
            assert not flops.batch_start(BATCH, i)
    assert offered == [1, 2, 4, 8, 16, 32, *range(48, 200, HELD_STRIDE)]
    flops.epoch_start()  # a new epoch: offered from its second batch, one by one again
    assert flops.offer_from == 1 and not flops.batch_start(BATCH, 1) and flops.offer_from == 2


def test_a_held_count_is_offered_again_next_epoch_from_its_second_batch():
    flops, budget, clock = counting(0.02)
    budget.opened()
    budget.charge(0.1)
    flops.epoch_start()
    assert offer(flops, range(10)) is None
    clock.now = 20.0
    flops.epoch_start()
    assert offer(flops, range(10)) == 1  # not its first: its data wait holds the DataLoader's start-up


def test_a_run_planning_no_window_counts_at_once():
    flops, _, _ = counting(0.02, windows_planned=False)
    flops.epoch_start()
    assert offer(flops, range(10)) == 1


def test_a_first_epoch_that_opened_no_window_stops_the_wait():
    """Epochs shorter than the schedule's first window: the count waits for none after the first epoch."""
    flops, _, _ = counting(0.02)
    flops.epoch_start()
    assert offer(flops, range(4)) is None
    flops.epoch_start()
    assert offer(flops, range(4)) == 1


@pytest.mark.parametrize("share", [None, 0.02])
def test_epochs_of_one_batch_each_offer_their_first(share):
    flops, budget, clock = counting(share, windows_planned=False)
    budget.opened()
    budget.charge(0.1)
    flops.epoch_start()
    assert offer(flops, range(1)) is None
    for _ in range(3):  # held for the budget epoch after epoch: each still offers its only batch
        flops.epoch_start()
        counted = offer(flops, range(1))
        if share is None:
            assert counted == 0
            return
        assert counted is None
    clock.now = 20.0
    flops.epoch_start()
    assert offer(flops, range(1)) == 0


def test_a_later_count_held_back_does_not_say_the_runs_flops_were():
    flops, budget, clock = counting(0.02, windows_planned=False)
    flops.epoch_start()
    assert offer(flops, range(10)) == 1
    budget.opened()
    budget.charge(0.1)
    flops.epoch_start()
    assert offer(flops, range(10)) is None  # no room for another count (were its shapes new)
    assert not flops.held and not budget.cost(clock.now).flops_held


def test_a_user_who_gives_peak_flops_gets_the_first_candidate_counted_whatever_the_budget():
    # Issue 46: PerfCallback(peak_flops=1e12) on a 30-batch fit never showed the MFU it asked for.
    flops, budget, _ = counting(0.02, asked=True)
    budget.opened()
    budget.charge(0.1)  # no room before 9.9 s
    flops.epoch_start()
    assert offer(flops, range(10)) == 1
    assert not flops.held and flops.not_counted_why() is None


def test_the_batch_after_the_first_window_is_counted_whatever_the_budget():
    flops, budget, _ = counting(0.02)
    flops.epoch_start()
    assert offer(flops, range(1, 5)) is None  # no window yet
    assert flops.not_counted_why() == "they wait for the first profiler window"
    budget.opened()  # the window: batches 5 and 6; no room after it before 9.9 s
    budget.charge(0.1)
    flops.window_closed(7)
    assert flops.not_counted_why() == "they are counted on the next batch, after the profiler window"
    assert offer(flops, range(7, 30)) == 7
    assert not flops.held and flops.not_counted_why() is None


def test_a_window_closed_at_an_epochs_end_has_the_next_epochs_second_batch_counted():
    flops, budget, _ = counting(0.02)
    flops.epoch_start()
    budget.opened()
    budget.charge(0.1)
    flops.window_closed(8)  # its last batch, 7, closed it
    flops.epoch_start()
    assert offer(flops, range(8)) == 1  # not its first: its data wait holds the DataLoader's start-up


def test_a_count_held_for_the_budget_says_why():
    flops, budget, _ = counting(0.02, windows_planned=False)
    budget.opened()
    budget.charge(0.1)
    flops.epoch_start()
    assert offer(flops, range(10)) is None
    assert flops.not_counted_why() == "the profiling budget (2%) had no room"


def test_an_epoch_of_one_batch_says_its_first_batch_is_not_counted():
    flops, _, _ = counting(None, asked=True)
    flops.epoch_start()
    assert offer(flops, range(1)) is None
    assert (
        flops.not_counted_why()
        == "an epoch's first batch is not counted (its data wait holds the DataLoader's start-up)"
    )
    flops.epoch_start()
    assert offer(flops, range(1)) == 0 and flops.not_counted_why() is None


@pytest.mark.parametrize(
    ("share", "spent", "planned", "fits"),
    [
        (0.02, 0.0, 30, False),  # 2% of 30 steps: 0.6 steps, no room for a count of 3
        (0.02, 0.0, 150, True),  # 3 steps of 150
        (0.02, 0.1, 150, False),  # ... less what the window cost
        (0.02, 0.1, 1000, True),
        (0.02, 10.0, float("inf"), True),  # no end planned
        (None, 10.0, 30, True),  # no budget
    ],
)
def test_a_count_fits_the_budget_over_the_runs_planned_batches(share, spent, planned, fits):
    assert count_fits(share, spent, step=0.01, planned_batches=planned) is fits


def test_a_count_that_does_not_fit_the_plan_waits_for_room_after_the_first_window():
    flops, budget, clock = counting(0.02)
    flops.epoch_start()
    budget.opened()
    budget.charge(0.1)
    flops.window_closed(7, fits=False)
    assert offer(flops, range(7, 10)) is None
    assert flops.not_counted_why() == "the profiling budget (2%) had no room"
    clock.now = 20.0
    assert offer(flops, range(10, 40)) == 10
