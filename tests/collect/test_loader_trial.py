"""The DataLoader trial's reading of a loader as a training epoch reads it (lightning_perf.collect.loader_trial):
every batch timed from the epoch's ``iter``, persistent workers started once, and the epoch's time per batch."""

from __future__ import annotations

import multiprocessing

import pytest
from torch.utils.data import DataLoader

from lightning_perf.collect.loader_trial import epoch_wait, fetch_times, trial_loader, warmup_batches
from models import SleepyDataset


def test_an_epoch_holds_its_first_batches_as_timed_and_the_rest_at_the_steady_pace() -> None:
    times = [0.100, 0.0, 0.0, 0.010, 0.010]  # the workers' start-up, what they loaded meanwhile, then 10 ms a batch
    assert epoch_wait(times, 2, 5) == pytest.approx(0.120 / 5)
    assert epoch_wait(times, 2, 3) == pytest.approx(0.100 / 3)  # an epoch shorter than the trial: its first batches
    assert epoch_wait(times, 2, 25) == pytest.approx((0.120 + 20 * 0.010) / 25)
    # The start-up weighs less the longer the epoch: what timing the steady pace alone overstated.
    assert epoch_wait(times, 2, 1000) == pytest.approx(0.0102, rel=0.02)
    assert epoch_wait([], 2, 10) == 0.0


@pytest.mark.parametrize("persistent", [False, True])
def test_every_batch_is_timed_and_no_worker_outlives_the_pass(persistent: bool) -> None:
    base = DataLoader(SleepyDataset(n=64, sleep_s=0.002), batch_size=4)
    setting = {"num_workers": 2, "persistent_workers": persistent}
    read = warmup_batches(trial_loader(base, [], setting)) + 3
    loader = trial_loader(base, [i % 64 for i in range(read * 4)], setting)
    before = set(multiprocessing.active_children())
    times = fetch_times(loader, compute=0.001)
    assert len(times) == read and all(t >= 0 for t in times)
    # The first batch waits for a worker's 4 samples at 2 ms each (and, without persistent workers, their start).
    assert times[0] >= 0.008
    assert set(multiprocessing.active_children()) <= before
