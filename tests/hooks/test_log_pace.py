"""Tests of lightning_perf.hooks.log_pace: the per-batch scalars are written within their share of the wall time
however fine the Trainer's logging cadence, and at every logging point while that share allows."""

from __future__ import annotations

import itertools

import pytest

from clocks import FakeClock
from lightning_perf.hooks.log_pace import LOG_BURST, LOG_SHARE, LogPace


def run(pace: LogPace, clock: FakeClock, *, points: int, step: float, cost: float) -> list[int]:
    """Logging points ``step`` seconds apart, each write taking ``cost``: the points written."""
    written = []
    for point in range(points):
        if pace.due():
            written.append(point)
            clock.now += cost
            pace.spent(cost)
        clock.now += step
    return written


def test_a_coarse_cadence_is_written_at_every_point():
    # Lightning's default: a write every 50 batches of 3 ms (0.15 s apart), 0.3 ms each: 0.2% of the time.
    clock = FakeClock()
    pace = LogPace(clock=clock)
    assert run(pace, clock, points=1000, step=0.15, cost=3e-4) == list(range(1000))
    assert pace.skipped == 0


def test_a_fine_cadence_is_thinned_to_the_share_once_the_burst_is_spent():
    # log_every_n_steps=1 on 1-ms steps, 0.4 ms a write: 40% of the time unpaced.
    clock = FakeClock()
    pace = LogPace(clock=clock)
    written = run(pace, clock, points=100_000, step=1e-3, cost=4e-4)
    # Write k at every point (each 1 ms step and 0.4 ms write) while k writes cost no more than the burst and the
    # share of the time since the first: k * 0.4 ms <= LOG_BURST + LOG_SHARE * k * 1.4 ms.
    burst = int(LOG_BURST / (4e-4 - LOG_SHARE * 1.4e-3)) + 1
    assert written[:burst] == list(range(burst))  # the first writes at every point
    assert written[burst] > burst  # then fewer
    spent = len(written) * 4e-4
    assert spent <= LOG_BURST + LOG_SHARE * clock.now + 4e-4  # within the share, one write at most beyond it
    assert spent >= LOG_SHARE * clock.now * 0.9  # and not far below it: the series keeps its points
    assert pace.skipped == 100_000 - len(written)
    gaps = {b - a for a, b in itertools.pairwise(written[burst:])}
    assert gaps <= {39, 40}, gaps  # evenly spread: 0.4 ms / 1% = 40 ms, the write itself and 39-40 points


def test_a_stage_idle_for_a_while_writes_again_at_once():
    # Validation between training epochs: the time in between counts, so its first points are written.
    clock = FakeClock()
    pace = LogPace(clock=clock)
    run(pace, clock, points=10_000, step=1e-3, cost=4e-4)
    clock.now += 60.0
    assert pace.due()


@pytest.mark.parametrize(("share", "burst"), [(0.0, 0.0), (0.5, 1.0)])
def test_share_and_burst_are_the_callers(share, burst):
    clock = FakeClock()
    pace = LogPace(share=share, burst=burst, clock=clock)
    written = run(pace, clock, points=100, step=1e-3, cost=1e-3)
    assert len(written) == (1 if burst == 0.0 else 100)


def test_a_write_is_charged_its_wall_time_less_the_threads_wait_for_a_cpu():
    # Beside two CPU burners a write preempted for a scheduler slice took 3-5 ms of wall time: the other processes'
    # time, not the write's. Charged in full, a short run's burst went in a few writes.
    clock, queue = FakeClock(), FakeClock()
    pace = LogPace(burst=0.95e-3, share=0.0, clock=clock, waited=queue)
    for _ in range(10):
        assert pace.due()
        pace.start()
        clock.now += 4e-3  # 4 ms of wall time, of which 3.9 ms in the run queue
        queue.now += 3.9e-3
        pace.end()
    assert not pace.due()  # ten writes of 0.1 ms each: the 0.95-ms burst is spent, and no more


def test_a_stalled_write_is_charged_no_more_than_the_stall_cap():
    # CI: one validation write stalled about 10 ms (the whole heap collected late in a long process, we think), the
    # burst was spent at the second write and the stage lost every later point of a 0.1-s run.
    clock = FakeClock()
    pace = LogPace(clock=clock)
    written = []
    for point, cost in enumerate([3e-4, 0.05, *[3e-4] * 20]):
        if pace.due():
            written.append(point)
            clock.now += cost
            pace.spent(cost)
        clock.now += 1e-3
    assert written == list(range(22))
    assert pace.skipped == 0


def test_a_logger_slow_at_every_write_is_charged_in_full():
    # A remote logger, 5 ms at every write: its cheapest write is slow too, so the stall cap leaves it alone and
    # the writes are thinned to the share.
    clock = FakeClock()
    pace = LogPace(clock=clock)
    written = run(pace, clock, points=10_000, step=1e-3, cost=5e-3)
    spent = len(written) * 5e-3
    assert spent <= LOG_BURST + LOG_SHARE * clock.now + 5e-3
    assert spent >= LOG_SHARE * clock.now * 0.9
