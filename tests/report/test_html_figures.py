"""The pages' pure pieces: the step breakdown (on real GPU traces and hand-built summaries), the per-batch
chart's markers and kept epochs, the per-epoch thinning, and the findings' grouping."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest

from lightning_perf.diagnose.model import Finding
from lightning_perf.readers import load_trace
from lightning_perf.records import StepSplit
from lightning_perf.report.html.breakdown import (
    COMMUNICATION,
    CPU_EXECUTION,
    DATA_LOADING,
    DEVICE_BUSY,
    OTHER,
    step_breakdown,
)
from lightning_perf.report.html.figures import breakdown_figure, epoch_figures, thinned
from lightning_perf.report.html.findings_html import epoch_ranges, grouped
from lightning_perf.report.html.step_figures import STALL_FACTOR, EpochSteps, kept_epochs, step_figure
from lightning_perf.report.json_report import ReportEpoch
from lightning_perf.summarize.step_summary import summarize_trace
from summaries import epoch, window

GPU_TRACES = ["v100_single_rank.json.gz", "a100_nccl_2rank_rank0.json.gz", "sampled_128rank_rank0.json.gz"]


@pytest.mark.parametrize("name", GPU_TRACES)
def test_the_breakdown_of_a_real_gpu_trace_adds_up_to_its_step(gpu_trace, name):
    summary = summarize_trace(load_trace(gpu_trace(name)), window=name)
    parts = dict(step_breakdown(summary))
    assert list(parts) == [DEVICE_BUSY, COMMUNICATION, DATA_LOADING, CPU_EXECUTION, OTHER]
    assert all(v >= 0 for v in parts.values())
    assert math.isclose(sum(parts.values()), summary.step_time, rel_tol=1e-9)
    assert math.isclose(parts[COMMUNICATION], summary.communication_exposed_time, rel_tol=1e-9)
    assert math.isclose(parts[DEVICE_BUSY], summary.device_busy - summary.communication_exposed_time, rel_tol=1e-9)
    go.Figure(breakdown_figure([("step", list(parts.items()))], title=name))


def test_a_cpu_breakdown_is_the_host_s_time_as_measured():
    summary = window(step_time=0.010, dataloader_time=0.002, host_op_time=0.007, framework_time=0.003)
    assert step_breakdown(summary) == [(DATA_LOADING, 0.002), (CPU_EXECUTION, 0.005), (OTHER, 0.003)]


def test_host_parts_are_scaled_into_the_time_the_device_was_idle():
    summary = window(
        step_time=0.010,
        dataloader_time=0.002,
        host_op_time=0.008,
        framework_time=0.002,
        device_busy=0.006,
        communication_exposed_time=0.001,
    )
    parts = dict(step_breakdown(summary))
    assert parts[DEVICE_BUSY] == pytest.approx(0.005) and parts[COMMUNICATION] == pytest.approx(0.001)
    # 4 ms of the step without device work or exposed communication, over 2 + 6 + 2 ms of host parts.
    assert parts[DATA_LOADING] == pytest.approx(0.0008) and parts[CPU_EXECUTION] == pytest.approx(0.0024)
    assert parts[OTHER] == pytest.approx(0.0008)


def test_a_breakdown_never_goes_negative_or_past_the_step():
    summary = window(step_time=0.010, host_op_time=0.0, framework_time=0.0, device_busy=0.5)
    parts = dict(step_breakdown(summary))
    assert parts == {DEVICE_BUSY: 0.010, DATA_LOADING: 0.0, CPU_EXECUTION: 0.0, OTHER: 0.0}


def _epoch_steps(n=100, *, epoch_no=0, stall_at=(), profiled=(), compiled=(), per_bar=1) -> EpochSteps:
    compute = [0.010] * n
    for i in stall_at:
        compute[i] = 0.010 * (STALL_FACTOR + 1)
    split = StepSplit(
        data_wait=(0.001,) * n, compute=tuple(compute), per_bar=per_bar, profiled=profiled, compiled=compiled
    )
    return EpochSteps.of(ReportEpoch(summary=epoch(epoch=epoch_no), steps=split))


def test_stalls_are_spikes_outside_windows_and_compiles():
    steps = _epoch_steps(stall_at=(5, 20, 40), profiled=((18, 22),), compiled=(40,))
    assert steps.stalls() == [5]
    figure = step_figure("train", [steps])
    go.Figure(figure)
    traces = {t["name"]: t for t in figure["data"]}
    assert traces[f"stall (>= {STALL_FACTOR:g}x median)"]["x"] == [5]
    assert traces["torch.compile compiled"]["x"] == [40]
    [shape] = figure["layout"]["shapes"]
    assert (shape["x0"], shape["x1"]) == (17.5, 22.5)


def test_merged_bars_sit_over_the_batches_they_stand_for():
    steps = _epoch_steps(n=10, per_bar=3, compiled=(7,))
    figure = step_figure("train", [steps])
    assert figure["data"][0]["x0"] == 1 and figure["data"][0]["dx"] == 3
    assert figure["data"][2]["x"] == [7]  # the bar of batches 6-8
    assert "mean of 3 batches" in figure["layout"]["title"]["text"]


def test_kept_epochs_prefer_the_latest_the_first_and_those_with_windows():
    steps = [_epoch_steps(n=4, epoch_no=e) for e in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300)]
    kept = [e.epoch for e in kept_epochs(steps, window_epochs={1, 2}, limit=5)]
    assert kept == [0, 1, 2, 256, 300]
    figure = step_figure("train", kept_epochs(steps, set(), limit=5))
    go.Figure(figure)
    buttons = figure["layout"]["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["epoch 0", "epoch 64", "epoch 128", "epoch 256", "epoch 300"]
    assert buttons[1]["args"][0]["visible"] == [False] * 5 + [True] * 5 + [False] * 15
    assert [t["visible"] for t in figure["data"]][-5:] == [True] * 5  # the latest shown first


def test_long_runs_are_thinned_to_evenly_spaced_epochs_with_first_and_last():
    assert thinned(10, 20) == list(range(10))
    kept = thinned(100_000, 500)
    assert len(kept) == 500 and kept[0] == 0 and kept[-1] == 99_999
    stages = {"train": [epoch(epoch=i, loss=1.0) for i in range(2_000)]}
    for figure in epoch_figures(stages):
        go.Figure(figure)
        assert all(len(t["x"]) == 500 for t in figure["data"])


def _finding(rule, stage, epoch_no, severity="warning"):
    return Finding(id=rule, severity=severity, title=rule, evidence="", advice="", stage=stage, epoch=epoch_no)


def test_findings_are_one_entry_per_rule_and_stage_with_their_epochs():
    findings = [_finding("a", "train", e) for e in (0, 1, 2, 3, 4, 5, 9)]
    findings += [_finding("b", "validate", 0, "critical"), _finding("a", "validate", 1, "info")]
    groups = grouped(findings)
    assert [(g.latest.id, g.latest.stage, g.latest.epoch) for g in groups] == [
        ("b", "validate", 0),
        ("a", "train", 9),
        ("a", "validate", 1),
    ]
    assert epoch_ranges(groups[1].epochs) == "epochs 0-5, 9"
    assert epoch_ranges((3,)) == "epoch 3"


def test_a_finding_of_epochs_measured_together_fired_in_each_of_them():
    # Records of short epochs measured together are numbered by their last epoch: 24-118, then 119-190, then 272
    # alone; a record with no span given is one epoch.
    findings = [_finding("a", "train", e) for e in (118, 190, 272, 300)]
    groups = grouped(findings, {("train", 118): 95, ("train", 190): 72, ("train", 300): 1})
    assert epoch_ranges(groups[0].epochs) == "epochs 24-190, 272, 300"
    assert len(groups[0].epochs) == 95 + 72 + 2


def test_epoch_ranges_are_bounded():
    text = epoch_ranges(list(range(0, 2_000, 2)), limit=3)
    assert text == "epochs 0, 2, 4 and 997 more ranges (1,000 epochs in all)"
