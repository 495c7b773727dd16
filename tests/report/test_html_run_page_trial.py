"""The run page after its trial on real Lightning programs: the batch that closes a window is no stall, the
profiled stretches are named for what they are, a distributed run's page says whose numbers it shows, an
interrupted run's headline shows a complete epoch under a banner, the step breakdown says it scales the
host's parts, the per-epoch axes start at 0 with whole epochs, and the smaller fixes (facts, units, labels,
paths, ids, titles). Reports built as in ``test_html_run_page``."""

from __future__ import annotations

import os
import re

import pytest
from test_html_run_page import Page, _read_back, _valid_figures, build_report

from lightning_perf.records import OperatorStat, StepSplit, WindowRecord
from lightning_perf.report.html import run_page
from lightning_perf.report.html.breakdown import host_scale
from lightning_perf.report.html.document import esc
from lightning_perf.report.html.figures import epoch_figures, flops_figure
from lightning_perf.report.html.step_figures import (
    AFTER,
    CLOSE,
    LEFT_OUT,
    MAX_STEP_EPOCHS,
    PROFILED,
    STALL_FACTOR,
    EpochSteps,
    kept_epochs,
    step_figure,
)
from lightning_perf.report.html.windows import breakdown_html, open_instructions, operator_table, summary_facts
from lightning_perf.report.json_report import ReportEpoch
from lightning_perf.units import si_scale
from summaries import epoch, window

STALL = f"stall (>= {STALL_FACTOR:g}x median)"
CLOSE_MARKS = "window close (trace saved)"


def _steps(n=40, *, spikes=(), profiled=(), windows=(), epoch_no=0) -> EpochSteps:
    compute = [0.010] * n
    for i in spikes:
        compute[i] = 0.010 * (STALL_FACTOR + 2)
    split = StepSplit(data_wait=(0.001,) * n, compute=tuple(compute), profiled=profiled)
    records = [
        WindowRecord(
            stage="train", epoch=epoch_no, first_batch=a, last_batch=b, name=name, trace_path="t", step=0, device="cpu"
        )
        for name, a, b in windows
    ]
    return EpochSteps.of(ReportEpoch(summary=epoch(epoch=epoch_no), steps=split), records)


def _traces(figure) -> dict:
    return {t["name"]: t for t in figure["data"]}


def test_the_batch_after_a_window_is_its_close_not_a_stall():
    # The FLOP count at batch 1; the profiler on for batches 5-8 (warm-up 5, window 6-8); its close at 9.
    steps = _steps(spikes=(2, 9, 30), profiled=((1, 1), (5, 8)), windows=[("w", 6, 8)])
    assert steps.stalls() == [30]
    assert steps.closes() == {2: AFTER, 9: CLOSE}
    traces = _traces(step_figure("train", [steps]))
    assert traces[STALL]["x"] == [30]
    assert traces[CLOSE_MARKS]["x"] == [2, 9] and traces[CLOSE_MARKS]["text"] == [AFTER, CLOSE]
    assert "%{text}" in traces[CLOSE_MARKS]["hovertemplate"]


def test_a_window_s_close_at_the_epoch_s_end_marks_nothing():
    steps = _steps(n=8, spikes=(7,), profiled=((5, 7),), windows=[("w", 6, 7)])
    assert steps.closes() == {} and steps.stalls() == []


def test_profiled_stretches_are_named_for_what_they_hold():
    with_window = step_figure("train", [_steps(profiled=((1, 1), (5, 8)), windows=[("train-e0-w", 6, 8)])])
    shapes = [(s["x0"], s["x1"], s["name"], s["showlegend"]) for s in with_window["layout"]["shapes"]]
    assert shapes == [
        (0.5, 1.5, LEFT_OUT, True),
        (4.5, 5.5, LEFT_OUT, False),
        (5.5, 8.5, "profiler window train-e0-w", True),
    ]
    fills = {s["name"]: s["fillcolor"] for s in with_window["layout"]["shapes"]}
    assert fills[LEFT_OUT] != fills["profiler window train-e0-w"]
    without = step_figure("train", [_steps(profiled=((1, 1), (5, 8)))])  # no window of the epoch in the report
    assert {s["name"] for s in without["layout"]["shapes"]} == {PROFILED}
    assert "warm-up" in PROFILED and "FLOP count" in PROFILED and "left out" in PROFILED


def test_the_menu_shows_every_kept_epoch_up_to_its_cap():
    steps = [_steps(n=4, epoch_no=e) for e in range(MAX_STEP_EPOCHS + 4)]
    assert MAX_STEP_EPOCHS == 16
    assert len(kept_epochs(steps, set())) == 16
    logspaced = [_steps(n=4, epoch_no=e) for e in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 301, 302)]
    assert len(kept_epochs(logspaced, {300, 301})) == 13  # all of them


def test_a_distributed_run_says_whose_numbers_it_shows(tmp_path):
    page = run_page(_read_back(build_report(ranks=2), tmp_path), source="/runs/demo/perf").text()
    figures = _valid_figures(page)
    titles = [f["layout"]["title"]["text"] for f in figures.values()]
    assert sum("step time per batch" in t and "(rank 0)" in t for t in titles) == 2
    assert "Step time per epoch (p50, p90) (rank 0)" in titles and "Achieved FLOP/s per epoch (rank 0)" in titles
    assert "<h3>Headline (rank 0)</h3>" in page
    name = "train-epoch000-batches0010-0012"
    assert "<code>rank1.pt.trace.json.gz</code>" in page
    assert f"<code>lightning-perf analyze /runs/demo/perf/{name} --html ranks.html</code>" in page

    single = run_page(_read_back(build_report(ranks=1), tmp_path)).text()
    assert "rank 0" not in single and "rank1.pt.trace" not in single


def _interrupt(report: dict, stage: str, at: int) -> dict:
    last = report["stages"][stage]["epochs"][-1]
    last.update(interrupted=True, batches=at)
    return report


def test_an_interrupted_run_s_headline_shows_its_latest_complete_epoch(tmp_path):
    page = run_page(_read_back(_interrupt(build_report(epochs=3, ranks=1), "train", 17), tmp_path)).text()
    run = page[page.index('<section id="run">') : page.index('<section id="findings">')]
    assert re.search(r'<p class="banner">This run was interrupted during train epoch 2 \(after 17 batches\)', run)
    assert "the headline shows train epoch 1, the latest complete one" in run
    assert run.index('class="banner"') < run.index("<table")  # at the top
    headline = run[run.index("<h3>Headline") :]
    row = re.search(r"<tr><td>train</td>(.*?)</tr>", headline).group(1)
    assert '<td class="num" data-sort="1.0">1</td>' in row  # the epoch shown
    assert "<b>train epoch 1</b>" in headline

    clean = run_page(_read_back(build_report(epochs=3, ranks=1), tmp_path)).text()
    assert 'class="banner"' not in clean


def test_the_breakdown_says_it_scales_the_host_s_parts():
    ddp = window(
        step_time=0.035,
        dataloader_time=0.00163,
        host_op_time=0.0317,
        framework_time=0.00296,
        communication_time=0.0101,
        communication_exposed_time=0.0101,
    )
    scale = host_scale(ddp)
    assert scale is not None and scale < 1
    html = breakdown_html(ddp, title="t", with_chart=False)
    assert "shared in proportion to their measured lengths" in html and "1.63 ms in the DataLoader" in html
    assert "(scaled: see below)" in html
    exact = window(step_time=0.010, dataloader_time=0.002, host_op_time=0.007, framework_time=0.003)
    assert host_scale(exact) is None
    assert "shared in proportion" not in breakdown_html(exact, title="t", with_chart=False)


def test_per_epoch_axes_show_whole_epochs_from_zero():
    [one_step, one_wait, *_] = epoch_figures({"train": [epoch(epoch=0, loss=0.5)]})
    assert one_step["layout"]["xaxis"]["range"] == [-0.5, 0.5] and one_step["layout"]["xaxis"]["dtick"] == 1
    assert one_wait["layout"]["yaxis"]["rangemode"] == "tozero"
    figures = {
        f["layout"]["title"]["text"]: f for f in epoch_figures({"train": [epoch(epoch=i, loss=1.0) for i in range(20)]})
    }
    assert figures["Step time per epoch (p50, p90)"]["layout"]["xaxis"]["range"] == [-0.5, 19.5]
    assert "rangemode" not in figures["Loss per epoch"]["layout"]["yaxis"]  # a loss may be negative


def test_the_flop_rate_axis_takes_its_unit_from_the_data():
    assert si_scale(8.02e8) == ("M", 1e6) and si_scale(5e13) == ("T", 1e12) and si_scale(3.0) == ("", 1.0)
    cpu = flops_figure({"train": [epoch(epoch=0, flops_per_second=8.02e8)]})
    assert cpu["layout"]["yaxis"]["title"]["text"] == "achieved MFLOP/s" and cpu["data"][0]["y"] == [802.0]


def _run_with(**run) -> dict:
    report = build_report(epochs=1, ranks=1)
    report["run"].update(run)
    return report


def test_run_facts_say_none_and_not_applicable_and_have_no_empty_header(tmp_path):
    loader = {"num_workers": 0, "prefetch_factor": None, "batch_size": 8}
    page = run_page(_read_back(_run_with(compiled_modules=None, dataloaders={"train": loader}), tmp_path)).text()
    run = page[page.index('<section id="run">') : page.index('<section id="findings">')]
    assert "<td>compiled modules</td><td>none</td>" in run
    assert "unknown" not in run.split("<h3>DataLoaders</h3>")[1].split("</table>")[0]
    assert '<th class=""></th>' not in run


def test_times_have_one_spelling_and_validation_windows_no_optimizer(tmp_path):
    ops = [OperatorStat(name="aten::mm", calls=1, self_cpu_time=812.0, cpu_time=3420.0)]
    table = operator_table(ops, device="cpu")
    assert "812 µs" in table and "3.42 ms" in table and " us<" not in table
    facts = dict(summary_facts(window(optimizer_time=0.0, optimizer_update_time=0.0)))
    assert "in the optimizer step" not in facts and "of which the update" not in facts
    assert "in the optimizer step" in dict(summary_facts(window()))
    page = run_page(_read_back(build_report(epochs=1, ranks=1), tmp_path)).text()
    assert "training paused" not in page and "<td>the loop paused at its close</td>" in page


def test_open_commands_name_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    html = open_instructions("runs/x/rank0.pt.trace.json.gz")
    assert esc(f"trace_dir={os.path.join(str(tmp_path), 'runs', 'x')!r}") in html
    assert f"tensorboard --logdir {tmp_path / 'runs'}</code>" in html


def test_a_run_without_a_loss_says_why(tmp_path):
    report = build_report(epochs=2, ranks=1)
    for stage in report["stages"].values():
        for e in stage["epochs"]:
            e["loss"] = None
    page = run_page(_read_back(report, tmp_path)).text()
    assert "No loss: the step returned none (manual optimization, or a dict without <code>'loss'</code>)" in page
    assert "No loss" not in run_page(_read_back(build_report(epochs=2, ranks=1), tmp_path)).text()


def test_the_same_report_gives_the_same_page(tmp_path):
    report = _read_back(build_report(epochs=2), tmp_path)
    first, second = run_page(report).text(), run_page(report).text()
    assert first == second
    assert 'id="figure-0"' in first


@pytest.fixture(scope="module")
def distributed_page(tmp_path_factory):
    return run_page(_read_back(build_report(epochs=3), tmp_path_factory.mktemp("titles"))).text()


def test_titles_sit_left_and_the_menu_clear_of_the_mode_bar(distributed_page):
    figures = _valid_figures(distributed_page)
    for figure in figures.values():
        title = figure["layout"]["title"]
        assert (title["x"], title["xanchor"]) == (0, "left"), title
        for menu in figure["layout"].get("updatemenus", ()):
            assert menu["xanchor"] == "left" and menu["x"] == 0 and menu["yanchor"] == "bottom"
    assert set(Page(distributed_page).links) <= set(Page(distributed_page).ids)
