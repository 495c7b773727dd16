"""Pure layers of the always-on metrics: epoch summaries, metric names, nested memory peaks, the report."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_perf.collect.memory import NestedPeaks
from lightning_perf.collect.steps import LOSS_FOLD, StepClock
from lightning_perf.records import RankSummary, WindowRecord
from lightning_perf.report.findings import CLEAN, console_report, ranks_table
from lightning_perf.report.json_report import SCHEMA_VERSION, report_dict, write_json_atomically
from lightning_perf.report.metrics import batch_metrics, epoch_metrics
from lightning_perf.summarize.steps import percentile, summarize_epoch


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
    assert "operators" not in report["windows"][0]
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
            clock.batch_end(torch.tensor(float(i), requires_grad=True) * 2, keep_loss=True)
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
