"""Window plans: the same actions as ``torch.profiler.schedule`` for the same numbers."""

import math

import pytest
import torch.profiler
from hypothesis import given
from hypothesis import strategies as st

from lightning_perf import Schedule
from lightning_perf.schedule import Action, BatchListPlan, CyclePlan

_TORCH = {
    torch.profiler.ProfilerAction.NONE: Action.NONE,
    torch.profiler.ProfilerAction.WARMUP: Action.WARMUP,
    torch.profiler.ProfilerAction.RECORD: Action.RECORD,
    torch.profiler.ProfilerAction.RECORD_AND_SAVE: Action.RECORD_AND_SAVE,
}


def torch_actions(schedule: Schedule, n: int) -> list[Action]:
    fn = torch.profiler.schedule(
        skip_first=schedule.skip_first,
        wait=schedule.wait,
        warmup=schedule.warmup,
        active=schedule.active,
        repeat=schedule.repeat,
    )
    return [_TORCH[fn(i)] for i in range(n)]


N, W, R, S = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (Schedule(skip_first=0, wait=1, warmup=1, active=2, repeat=2), [N, W, R, S, N, W, R, S, N, N]),
        (Schedule(skip_first=2, wait=0, warmup=1, active=1, repeat=1), [N, N, W, S, N, N, N, N, N, N]),
        (Schedule(skip_first=5, wait=0, warmup=1, active=3, repeat=1), [N, N, N, N, N, W, R, R, S, N]),
        (Schedule(skip_first=0, wait=0, warmup=0, active=1, repeat=3), [S, S, S, N, N, N, N, N, N, N]),
    ],
)
def test_table_matches_torch(schedule, expected):
    plan = CyclePlan(schedule)
    assert [plan.action(i) for i in range(10)] == expected == torch_actions(schedule, 10)


def schedules(min_repeat: int = 1) -> st.SearchStrategy[Schedule]:
    """Small schedules; ``min_repeat=0`` lets them repeat for as long as the epoch lasts."""
    return st.builds(
        Schedule,
        skip_first=st.integers(0, 6),
        wait=st.integers(0, 4),
        warmup=st.integers(0, 3),
        active=st.integers(1, 4),
        repeat=st.integers(min_repeat, 4),
    )


@given(schedule=schedules())
def test_any_finite_schedule_matches_torch(schedule):
    plan = CyclePlan(schedule)
    assert [plan.action(i) for i in range(60)] == torch_actions(schedule, 60)


def test_repeat_zero_runs_as_many_full_cycles_as_the_epoch_allows():
    plan = CyclePlan(Schedule(skip_first=0, wait=1, warmup=1, active=2, repeat=0))
    # Unknown length: cycles forever, as torch does.
    assert [plan.action(i) for i in range(12)] == torch_actions(plan.schedule, 12)
    # 10 batches: cycles start at 0, 4 and 8; the third would need batches 8..11, so it never starts.
    assert [plan.action(i, num_batches=10) for i in range(10)] == [N, W, R, S, N, W, R, S, N, N]


def test_first_active():
    assert CyclePlan(Schedule(skip_first=5, wait=2, warmup=1, active=3)).first_active() == 8
    assert BatchListPlan([9, 4], warmup=2).first_active() == 4


def test_batch_list_windows_merge_runs_and_never_overlap_warmups():
    plan = BatchListPlan([3, 4, 7, 8, 9, 11], warmup=2)
    assert plan.windows == [(1, 3, 4), (5, 7, 9), (10, 11, 11)]
    actions = [plan.action(i) for i in range(13)]
    assert actions == [N, W, W, R, S, W, W, R, R, S, W, S, N]


def test_batch_list_at_epoch_start_has_no_warmup():
    plan = BatchListPlan([0], warmup=1)
    assert [plan.action(i, math.inf) for i in range(3)] == [S, N, N]


def _first_acting(plan, batch: int, num_batches: float, horizon: int = 80) -> float:
    return next((b for b in range(batch, horizon) if plan.action(b, num_batches) is not Action.NONE), math.inf)


@given(schedule=schedules(min_repeat=0), num_batches=st.one_of(st.just(math.inf), st.integers(0, 40)))
def test_a_cycle_plans_next_action_is_the_first_batch_it_acts_on(schedule, num_batches):
    # (repeat=0 with an unknown epoch length acts forever: the horizon stands in for the epoch there.)
    plan = CyclePlan(schedule)
    horizon = 80 if num_batches != math.inf or schedule.repeat else 10_000
    for batch in range(60):
        assert plan.next_action(batch, num_batches) == _first_acting(plan, batch, num_batches, horizon), batch


@given(batches=st.lists(st.integers(0, 40), min_size=0, max_size=8), warmup=st.integers(0, 3))
def test_a_batch_lists_next_action_is_the_first_batch_it_acts_on(batches, warmup):
    plan = BatchListPlan(batches, warmup)
    for batch in range(50):
        assert plan.next_action(batch) == _first_acting(plan, batch, math.inf), batch
