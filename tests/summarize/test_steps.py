"""Pure layers of the always-on metrics: epoch summaries, metric names, nested memory peaks, the report."""

import dataclasses
import json
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_perf.collect.memory import NestedPeaks
from lightning_perf.collect.steps import LOSS_FOLD, StepClock
from lightning_perf.diagnose.model import Finding
from lightning_perf.records import RankSummary, WindowRecord
from lightning_perf.report.findings import CLEAN, console_report, ranks_table
from lightning_perf.report.json_report import SCHEMA_VERSION, report_dict, write_json_atomically
from lightning_perf.report.metrics import batch_metrics, epoch_metrics
from lightning_perf.summarize.steps import percentile, pool_epochs, step_split, summarize_epoch


@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=50), st.sampled_from([0, 10, 50, 90, 100]))
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-9)


def test_epoch_summary_from_per_batch_times():
    summary = summarize_epoch(
        stage="train", epoch=2, data_wait=[0.3, 0.1, 0.1, 0.1], compute=[0.1, 0.1, 0.1, 0.1], batch_sizes=[8, 8, 8, 4]
    )
    assert (summary.batches, summary.samples) == (4, 28)
    assert summary.step_time == pytest.approx(1.0)
    assert summary.data_wait_fraction == pytest.approx(0.6)
    assert summary.step_time_p50 == pytest.approx(0.2) and summary.step_time_max == pytest.approx(0.4)
    assert summary.throughput == pytest.approx(28.0)


def test_a_batch_that_never_ended_is_left_out_and_unknown_sizes_give_no_throughput():
    summary = summarize_epoch(stage="test", epoch=0, data_wait=[0.1, 0.1], compute=[0.1], batch_sizes=[None, None])
    assert summary.batches == 1 and summary.samples is None and summary.throughput is None


def test_empty_epoch():
    summary = summarize_epoch(stage="validate", epoch=0, data_wait=[], compute=[], batch_sizes=[])
    assert (summary.batches, summary.step_time, summary.data_wait_fraction, summary.throughput) == (0, 0, 0, None)


def test_metric_names_and_units():
    assert batch_metrics("train", data_wait=0.01, compute=0.03, batch_size=8, loss=0.5) == {
        "perf/train/batch/step_time_ms": pytest.approx(40.0),
        "perf/train/batch/data_wait_ms": pytest.approx(10.0),
        "perf/train/batch/compute_ms": pytest.approx(30.0),
        "perf/train/batch/samples_per_s": pytest.approx(200.0),
        "perf/train/batch/loss": 0.5,
    }
    summary = summarize_epoch(
        stage="validate",
        epoch=0,
        data_wait=[0.0],
        compute=[0.5],
        batch_sizes=[None],
        host_rss=2**20,
        host_rss_peak=2**21,
    )
    metrics = epoch_metrics(summary)
    assert metrics["perf/validate/epoch/host_rss_mb"] == 1.0 and metrics["perf/validate/epoch/host_rss_peak_mb"] == 2.0
    assert "perf/validate/epoch/samples_per_s" not in metrics and "perf/validate/epoch/loss" not in metrics


def test_nested_peaks_keep_an_epochs_peak_across_a_window_reset():
    peaks = NestedPeaks()
    peaks.start("train", (0, 0))
    # 100 allocated at the window start; the window's reset must not lose it from the epoch.
    peaks.start("window", (100, 120))
    assert peaks.read("window", (40, 60)) == (40, 60)
    assert peaks.read("train", (40, 60)) == (100, 120)
    peaks.start("train", (40, 60))  # next epoch: a fresh period
    assert peaks.read("train", (10, 20)) == (10, 20)


def test_report_is_plain_json_and_written_atomically(tmp_path):
    epoch = summarize_epoch(stage="train", epoch=0, data_wait=[0.1], compute=[0.2], batch_sizes=[4])
    window = WindowRecord(
        stage="train", epoch=0, first_batch=6, last_batch=8, name="w", trace_path="/t", step=6, device="cpu"
    )
    report = report_dict(generated_by="test", run={"torch": "x"}, epochs=[epoch], windows=[window])
    assert report["version"] == SCHEMA_VERSION
    assert report["stages"]["train"]["epochs"][0]["samples"] == 4
    assert report["windows"][0]["operators"] == []  # a window without operators keeps none
    path = tmp_path / "perf_report.json"
    write_json_atomically(report, str(path))
    assert json.loads(path.read_text()) == report
    assert [p.name for p in tmp_path.iterdir()] == ["perf_report.json"]


def test_the_epoch_loss_is_the_mean_of_every_batch_loss_however_long_the_epoch():
    import torch

    clock = StepClock(batch_size=lambda batch: None)
    for epoch_length in (3, 2 * LOSS_FOLD + 7):
        clock.epoch_start()
        for i in range(epoch_length):
            clock.batch_start(None)
            clock.batch_end(torch.tensor(float(i), requires_grad=True) * 2)
            assert clock.last_loss is not None and not clock.last_loss.requires_grad
        assert len(clock.losses) < LOSS_FOLD  # summed on the device as they come, not kept one by one
        assert clock.mean_loss() == pytest.approx(epoch_length - 1)  # the mean of 0, 2, 4, ... 2(n-1)
    clock.epoch_start()
    assert clock.mean_loss() is None


def test_a_clean_distributed_epoch_prints_its_rank_table():
    # A distributed epoch with no finding to show: the headline says so, and the per-rank table follows.
    summary = summarize_epoch(stage="train", epoch=0, data_wait=[0.01] * 4, compute=[0.1] * 4, batch_sizes=[8] * 4)
    ranks = [
        RankSummary(rank=r, step_time_p50=0.11, step_time_p90=0.12, step_time_max=0.13, data_wait_fraction=0.09,
                    throughput=72.0, host_rss_peak=None, cuda_max_allocated=None, cuda_max_reserved=None,
                    communication_share=None)
        for r in (0, 1)
    ]  # fmt: skip
    text = console_report(summary, [], verbose=1, ranks=ranks)
    assert text.splitlines()[0].endswith(f"| {CLEAN}")
    assert len(text.splitlines()) == 1 + len(ranks_table(ranks)) and "rank" in text.splitlines()[1]


def test_a_clean_headline_names_the_notes_it_does_not_show():
    # An IterableDataset rollout waited for data 91% of the time, and nothing was predicted to help: dataloader_bound
    # is info, hidden at verbose=1; "no bottleneck found" read as if nothing had been measured.
    summary = summarize_epoch(stage="train", epoch=0, data_wait=[0.1] * 4, compute=[0.01] * 4, batch_sizes=[8] * 4)
    note = Finding(id="dataloader_bound", severity="info", title="t", evidence="e", advice="a", stage="train", epoch=0)
    text = console_report(summary, [note], verbose=1)
    assert text.endswith("| nothing to change found (notes: dataloader_bound; verbose=2 shows them)"), text
    assert CLEAN not in text


def test_a_headline_says_when_too_few_batches_held_findings_back():
    # fast_dev_run's one batch, waiting 36% of its step for the DataLoader's start-up: dataloader_bound is held back
    # to info by the minimum-evidence guard. "nothing to change found" read as a clean result.
    from lightning_perf.diagnose.model import StageEpoch
    from lightning_perf.diagnose.registry import diagnose

    summary = summarize_epoch(stage="train", epoch=0, data_wait=[0.036], compute=[0.064], batch_sizes=[8])
    found = diagnose(StageEpoch(epoch=summary))
    assert [f.severity for f in found if f.id == "dataloader_bound"] == ["info"]
    text = console_report(summary, found, verbose=1)
    assert text.endswith("| 1 measured batch: too little to judge (notes: dataloader_bound; verbose=2 shows them)")


def _counted(summary, *, flops_per_second=4.12e13, mfu=0.3149):
    """``summary`` as an epoch whose FLOPs were counted (the callback fills these in)."""
    import dataclasses

    return dataclasses.replace(summary, flops_per_batch=1.2e12, flops_per_second=flops_per_second, mfu=mfu)


def test_flops_metrics_are_logged_only_where_known():
    summary = summarize_epoch(stage="train", epoch=0, data_wait=[0.0], compute=[0.5], batch_sizes=[8])
    assert not {"perf/train/epoch/tflops", "perf/train/epoch/mfu"} & set(epoch_metrics(summary))
    metrics = epoch_metrics(_counted(summary))
    assert metrics["perf/train/epoch/tflops"] == pytest.approx(41.2)  # TFLOP/s
    assert metrics["perf/train/epoch/mfu"] == pytest.approx(0.3149)  # a share, 0-1
    metrics = epoch_metrics(_counted(summary, mfu=None))  # counted, but the device's peak is unknown (CPU)
    assert "perf/train/epoch/tflops" in metrics and "perf/train/epoch/mfu" not in metrics


def test_the_headline_shows_flops_and_mfu_after_the_throughput_and_nothing_without_them():
    from lightning_perf.report.findings import headline

    summary = summarize_epoch(stage="train", epoch=0, data_wait=[0.01] * 2, compute=[0.1] * 2, batch_sizes=[8] * 2)
    plain = "2 batches, step p50 110.00 ms, p90 110.00 ms, data wait 9%, 73 samples/s"
    assert headline(summary) == plain
    assert headline(_counted(summary)) == plain + ", 41.2 TFLOP/s, MFU 31%"  # MFU rounded down
    assert headline(_counted(summary, mfu=None)) == plain + ", 41.2 TFLOP/s"


def test_the_rank_table_has_a_flops_column_only_where_a_rank_s_flops_are_known():
    from lightning_perf.report.findings import ranks_markdown

    def rank(r, flops_per_second):
        return RankSummary(rank=r, step_time_p50=0.11, step_time_p90=0.12, step_time_max=0.13, data_wait_fraction=0.09,
                           throughput=72.0, host_rss_peak=None, cuda_max_allocated=None, cuda_max_reserved=None,
                           communication_share=None, flops_per_second=flops_per_second)  # fmt: skip

    summary = summarize_epoch(stage="train", epoch=0, data_wait=[0.01], compute=[0.1], batch_sizes=[8])
    without = [rank(0, None), rank(1, None)]
    assert "FLOP/s" not in "\n".join(ranks_table(without)) + ranks_markdown(summary, without)
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in ranks_table([rank(0, 4.12e13), rank(1, None)])]
    assert header[5:8] == ["samples/s", "FLOP/s", "comm exposed"]  # after samples/s
    assert rows[0][5:7] == ["72", "41.2 TFLOP/s"] and rows[1][5:7] == ["72", "-"]
    markdown = ranks_markdown(summary, [rank(0, 4.12e13), rank(1, 8.12e11)]).splitlines()
    assert "| samples/s | FLOP/s | comm exposed |" in markdown[2]
    assert markdown[3].count("---:") == len(markdown[2].split(" | "))
    assert "| 72 | 812 GFLOP/s | - |" in markdown[5]


def test_the_top_modules_are_shares_of_the_counted_batch_and_odd_entries_are_left_out():
    from lightning_perf.report.json_report import report_top_modules

    counted = [{"flops": 400, "samples": 8, "shape": "8x16"}, {"flops": 800, "samples": 16, "shape": "16x16"}]
    run = {"flops": {"by_module": [["head", 100], ["body", 300], ["bad", "x"], [1, 2]], "counted": counted}}
    assert report_top_modules(run) == [("body", 0.75), ("head", 0.25)]  # of the first batch counted, largest first
    for odd in (
        {},
        {"flops": None},
        {"flops": {"by_module": [["a", 1]], "counted": []}},
        {"flops": {"counted": counted}},
    ):
        assert report_top_modules(odd) == []


# ------------------------------------------------------------------ the report's per-batch step split


def test_the_step_split_has_a_bar_per_batch_with_its_window_stretches_and_compiled_batches():
    split = step_split(
        [0.1, 0.2, float("nan"), 0.0, -1.0],
        [1.0, 2.0, 3.0, float("inf"), 5.0],
        profiled=[False, True, True, False, True],
        compiled=[4, 0, 7, 0],
    )
    assert split.data_wait == (0.1, 0.2, 0.0, 0.0, 0.0)  # missing and negative times count as 0
    assert split.compute == (1.0, 2.0, 3.0, 0.0, 5.0)
    assert (split.per_bar, split.profiled, split.compiled) == (1, ((1, 2), (4, 4)), (0, 4))


def test_a_long_epoch_merges_consecutive_batches_into_at_most_max_bars_bars():
    split = step_split([1.0] * 10 + [3.0] * 11, [0.5] * 21, max_bars=10)
    assert split.per_bar == 3 and len(split.data_wait) == len(split.compute) == 7
    assert split.data_wait[3] == pytest.approx((1 + 3 + 3) / 3) and split.data_wait[-1] == 3.0  # last: 3 batches
    assert step_split([], []).data_wait == () and step_split([1.0], [2.0]).per_bar == 1


@given(st.integers(0, 5000), st.integers(1, 2000))
def test_the_step_split_never_has_more_bars_than_asked(n, max_bars):
    split = step_split([0.01] * n, [0.02] * n, max_bars=max_bars)
    assert len(split.data_wait) <= max_bars and len(split.data_wait) * split.per_bar >= n


def test_pooled_epochs_share_their_cpu_measures_over_their_wall_time():
    # A 1-batch epoch's own CPU wait and outside load are a few ms, read in 10 ms ticks: pooled, each epoch
    # counts for its wall time (the last one's alone said "waited 14%, other processes used 1.7 CPUs").
    def one(wait: float, load: float, wall: float):
        e = summarize_epoch(stage="validate", epoch=0, data_wait=[0.0], compute=[wall], batch_sizes=[2])
        return dataclasses.replace(e, cpu_wait_share=wait, other_cpu_load=load, wall_time=wall)

    pooled = pool_epochs([one(0.0, 0.0, 0.3), one(0.5, 2.0, 0.1)])
    assert pooled.cpu_wait_share == pytest.approx(0.125) and pooled.other_cpu_load == pytest.approx(0.5)
    assert (
        pool_epochs([one(0.1, 0.0, 0.1), dataclasses.replace(one(0.1, 0.0, 0.1), other_cpu_load=None)]).other_cpu_load
        is None
    )


def test_the_rank_table_of_128_ranks_lists_the_fastest_median_p90_and_slowest_not_128_rows():
    def rank(r, step):
        return RankSummary(rank=r, step_time_p50=step, step_time_p90=step, step_time_max=step, data_wait_fraction=0.0,
                           throughput=10.0, host_rss_peak=None, cuda_max_allocated=None, cuda_max_reserved=None,
                           communication_share=0.1)  # fmt: skip

    ranks = [rank(r, 0.100 + (0.050 if r == 77 else 0.0) + r * 1e-5) for r in range(128)]  # rank 77 straggles
    lines = ranks_table(ranks)
    assert lines[0] == "(128 ranks; by step p50: the fastest, the median, the 90th percentile and the 5 slowest)"
    listed = [int(line.split()[0]) for line in lines[2:]]
    # By step p50 (rank 77 last): sorted positions 0, 64, 115 and the last 5.
    assert listed == [0, 64, 116, 124, 125, 126, 127, 77]
    assert len(ranks_table(ranks[:16])) == 17  # up to 16 ranks: every one, under its header
