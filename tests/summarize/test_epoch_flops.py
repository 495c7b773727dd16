"""An epoch's FLOPs per batch, achieved FLOP/s and MFU from the run's counts (lightning_perf.summarize.flops)."""

import pytest

from lightning_perf.summarize.flops import EpochFlops, FlopCount, epoch_flops


def test_counts_scale_per_sample_to_each_measured_batch_and_profiled_batches_are_left_out():
    figures = epoch_flops(
        [FlopCount(flops=800, samples=8)],
        batch_sizes=[8, 8, 8, 4],
        data_wait=[0.0] * 4,
        compute=[9.0, 1.0, 1.0, 1.0],  # the first ran in a window (or was counted): left out
        profiled=[True, False, False, False],
        peak=1_000.0,
    )
    assert figures.flops_per_batch == pytest.approx((800 + 800 + 400) / 3)
    assert figures.flops_per_second == pytest.approx(2_000 / 3.0)
    assert figures.mfu == pytest.approx(2_000 / 3.0 / 1_000)


def test_several_counts_average_their_flops_per_sample():
    figures = epoch_flops(
        [FlopCount(flops=100, samples=1), FlopCount(flops=300, samples=1)],
        batch_sizes=[2],
        data_wait=[0.0],
        compute=[1.0],
        profiled=[False],
        peak=None,
    )
    assert (figures.flops_per_batch, figures.flops_per_second, figures.mfu) == (400, 400, None)


def test_unknown_batch_sizes_count_every_batch_as_the_mean_count():
    figures = epoch_flops(
        [FlopCount(flops=100, samples=None), FlopCount(flops=300, samples=None)],
        batch_sizes=[None, None],
        data_wait=[0.0, 0.0],
        compute=[0.5, 0.5],
        profiled=[False, False],
        peak=None,
    )
    assert (figures.flops_per_batch, figures.flops_per_second) == (200, 400)


def test_no_count_no_time_or_no_peak_leave_their_figures_unknown():
    assert epoch_flops([], batch_sizes=[4], data_wait=[0.0], compute=[1.0], profiled=[False], peak=1.0) == EpochFlops()
    only_profiled = epoch_flops(
        [FlopCount(8, 4)], batch_sizes=[4], data_wait=[0.0], compute=[1.0], profiled=[True], peak=1.0
    )
    assert (only_profiled.flops_per_second, only_profiled.mfu) == (None, None)


def test_flops_per_second_are_over_wall_time_data_wait_included():
    # MFU over wall time, what users compare: a step waiting for data half its time does half the arithmetic a
    # second, so low_mfu's naming dataloader_bound as a cause holds.
    figures = epoch_flops(
        [FlopCount(flops=100, samples=1)],
        batch_sizes=[1, 1],
        data_wait=[1.0, 1.0],
        compute=[1.0, 1.0],
        profiled=[False, False],
        peak=100.0,
    )
    assert (figures.flops_per_second, figures.mfu) == (50.0, 0.5)
