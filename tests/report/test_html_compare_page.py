"""The compare page (``lightning-perf compare --html``) on real traces and on runs' reports: its sections, the
direction of its colours, its escaping, its bounds, its figures (each validated by Plotly's schema), and the
page as a browser draws it."""

from __future__ import annotations

import dataclasses
import re

import plotly.graph_objects as go
import pytest

from html_pages import assert_self_contained, figures_in
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnosis_context import trace_context, trace_stage
from lightning_perf.readers import load_report, load_trace
from lightning_perf.records import OperatorStat
from lightning_perf.report.comparison import ComparedSide, operator_changes, run_side, trace_side
from lightning_perf.report.html.compare_page import BAR_COLOURS, CHART_OPERATORS, OPERATOR_ROWS, SAME, compare_page
from lightning_perf.report.html.figures import MAX_EPOCH_POINTS
from lightning_perf.report.json_report import report_dict, write_json_atomically
from lightning_perf.summarize.events import distributed_info
from lightning_perf.summarize.operators import operator_stats
from lightning_perf.summarize.step_summary import summarize_trace
from lightning_perf.summarize.steps import summarize_epoch

SCRIPT = "<script>document.title='pwned'</script>"


def _trace_side(path) -> ComparedSide:
    """A trace's side as ``compare`` reads it: summary, the trace rules' findings, operators."""
    trace = load_trace(path)
    summary = summarize_trace(trace, window=path.name)
    findings = diagnose(trace_context(summary, distributed_info(trace), stage=trace_stage(trace)))
    return trace_side(str(path), summary, findings, operator_stats(trace))


def _finding(rule: str, severity, epoch: int, title: str = "Training waits for data") -> Finding:
    return Finding(
        id=rule,
        severity=severity,
        title=title,
        evidence=f"{rule}: the numbers",
        advice="Set `num_workers=4`.",
        stage="train",
        epoch=epoch,
    )


def _op(name: str, self_cpu_time: float) -> OperatorStat:
    return OperatorStat(name=name, calls=1, self_cpu_time=self_cpu_time, cpu_time=self_cpu_time)


def _run_side(tmp_path, name, *, step, wait, epochs=3, findings=(), operators=(), host=None) -> ComparedSide:
    """A run's side from a report written and read back as ``compare`` reads it: ``epochs`` training epochs of
    8 batches of 32 samples, each ``step`` seconds of which ``wait`` wait for data; ``findings`` in the last."""
    summaries = [
        summarize_epoch(
            stage="train",
            epoch=e,
            data_wait=[wait] * 8,
            compute=[step - wait] * 8,
            batch_sizes=[32] * 8,
            host_rss_peak=host,
        )
        for e in range(epochs)
    ]
    run = {"device": "cuda", "device_name": "NVIDIA H200", "world_size": 1, "precision": "bf16-mixed"}
    report = report_dict(
        generated_by="lightning-perf test",
        run=run,
        epochs=summaries,
        windows=[],
        findings={("train", epochs - 1): list(findings)},
    )
    path = tmp_path / name / "perf_report.json"
    path.parent.mkdir()
    write_json_atomically(report, str(path))
    side = run_side(str(path.parent), load_report(path), operators=operators, operators_from="window-0")
    assert side is not None
    return side


def _validated(page: str) -> dict:
    assert_self_contained(page)
    figures = figures_in(page)
    for figure in figures.values():
        go.Figure(figure)  # raises on a property Plotly does not know
    return figures


def _row(page: str, first_cell: str) -> str:
    return page.split(f"<td>{first_cell}</td>", 1)[1].split("</tr>", 1)[0]


def test_two_real_gpu_traces(gpu_trace):
    before, after = (
        _trace_side(gpu_trace("v100_single_rank.json.gz")),
        _trace_side(gpu_trace("a100_8rank_rank3.json.gz")),
    )
    page = compare_page(before, after).text()
    figures = _validated(page)
    assert set(figures) == {"operators-chart"}  # no per-epoch charts for traces
    assert [f'id="{s}"' in page for s in ("sides", "headline", "findings", "operators", "epochs")] == [True] * 4 + [
        False
    ]
    assert "two traces" in page and "<td>trace</td><td>v100_single_rank.json.gz</td>" in page
    # 78.83 ms -> 77.49 ms: within run-to-run noise (under 5%), so grey and "same", not green and "better".
    assert '<span class="muted">-1.7% (same)</span>' in _row(page, "step time p50")
    assert "Not known on either side: step time p90, throughput" in page
    # The a100 trace waits on communication (a real finding of the rules): new, with its evidence and advice.
    assert "<td>new</td><td>communication_bound</td><td>-</td><td>warning</td>" in page
    assert "<b>Evidence:</b> communication with no compute overlapping" in page
    # The chart: the largest changes, the largest on top (Plotly draws the first category at the bottom).
    [bars] = figures["operators-chart"]["data"]
    deltas = [x * 1e3 for x in bars["x"]]
    assert len(deltas) == CHART_OPERATORS and [abs(d) for d in deltas] == sorted(abs(d) for d in deltas)
    assert bars["y"][-1] == "aten::convolution_backward" and deltas[-1] == pytest.approx(-211_580, abs=10)
    shown = list(reversed(operator_changes(before, after)[:CHART_OPERATORS]))
    assert bars["marker"]["color"] == [BAR_COLOURS[c.verdict] for c in shown]
    assert {c.verdict for c in shown} == {"better", "worse"}  # the largest changes are beyond the noise
    table = page.split('id="operators-table"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == 1 + OPERATOR_ROWS  # the header and the rows that changed most
    assert "(gone)" in _row(page, "aten::convolution_backward") and "(new)" in _row(page, "nccl:all_to_all")


def test_two_runs_side_by_side_with_their_epochs(tmp_path):
    dataloader = _finding("dataloader_bound", "critical", 2)
    before = _run_side(
        tmp_path,
        "before",
        step=0.1,
        wait=0.05,
        host=2**30,
        findings=[dataloader, _finding("tiny_ops", "warning", 2), _finding("low_util", "info", 2)],
    )
    after = _run_side(
        tmp_path,
        "after",
        step=0.05,
        wait=0.005,
        host=2**31,
        findings=[dataclasses.replace(dataloader, severity="warning"), _finding("memory_growth", "warning", 2)],
    )
    page = compare_page(before, after).text()
    figures = _validated(page)
    # Lower is better for step times, data wait and memory; higher for throughput.
    for metric, css in (("step time p50", "good"), ("throughput", "good"), ("data wait", "good")):
        assert f'<span class="{css}">' in _row(page, metric), metric
    assert '<span class="bad">+100.0% (worse)</span>' in _row(page, "host memory peak")
    assert "Not known on either side: FLOP/s, MFU, CUDA allocated peak." in page
    assert "<td>device</td><td>cuda NVIDIA H200</td><td>cuda NVIDIA H200</td>" in page
    # Findings: warning and critical only (low_util is info), each change with its severities.
    rows = re.findall(r"<tr><td>(fixed|new|kept)</td><td>(\w+)</td><td>([\w-]+)</td><td>([\w-]+)</td>", page)
    assert sorted(rows) == [
        ("fixed", "tiny_ops", "warning", "-"),
        ("kept", "dataloader_bound", "critical", "warning"),
        ("new", "memory_growth", "-", "warning"),
    ]
    assert "low_util" not in page and "kept, before: critical" in page
    assert '<p class="note">No operator table on either side' in page
    # Both runs' epochs, overlaid: step time p50 in ms and throughput, per epoch.
    step, throughput = figures["epochs-chart-0"], figures["epochs-chart-1"]
    assert [t["name"] for t in step["data"]] == ["before", "after"] and step["data"][0]["x"] == [0, 1, 2]
    assert step["data"][0]["y"] == pytest.approx([100.0] * 3) and step["data"][1]["y"] == pytest.approx([50.0] * 3)
    assert throughput["data"][1]["y"] == pytest.approx([640.0] * 3)  # 32 samples per 50 ms
    for figure in figures.values():
        layout = figure["layout"]
        assert layout["xaxis"]["title"]["text"] and layout["yaxis"]["title"]["text"]


def test_noise_is_grey_and_a_share_s_change_is_in_points(tmp_path):
    # The trial's page: every operator coloured faster or slower, "+0 us (slower)" in red for 11 us -> 11 us, and
    # data wait 12% -> 13% shown as "+6.4% (worse)".
    before_ops = [_op("aten::add", 11.0), _op("aten::mm", 1000.0), _op("aten::relu", 500.0), _op("aten::t", 2.0)]
    after_ops = [_op("aten::add", 11.3), _op("aten::mm", 1030.0), _op("aten::relu", 300.0), _op("aten::cat", 3.0)]
    before = _run_side(tmp_path, "before", step=0.1, wait=0.012, operators=before_ops)
    after = _run_side(tmp_path, "after", step=0.102, wait=0.0133, operators=after_ops)
    page = compare_page(before, after).text()
    figures = _validated(page)
    assert '<span class="muted">+2.0% (same)</span>' in _row(page, "step time p50")
    assert '<span class="bad">+1.0 pp (worse)</span>' in _row(page, "data wait")  # 12% -> 13.04%, not "+8.7%"
    assert '<span class="muted">+0 us (same)</span>' in _row(page, "aten::add")
    assert '<span class="muted">+30 us (same)</span>' in _row(page, "aten::mm")  # +3% of 1 ms
    assert '<span class="good">-200 us (faster)</span>' in _row(page, "aten::relu")
    assert '<span class="muted">+3 us (new)</span>' in _row(page, "aten::cat")
    assert '<span class="muted">-2 us (gone)</span>' in _row(page, "aten::t")
    assert "1 faster, 0 slower, 4 the same" in page and "grey: the same, within run-to-run noise" in page
    [bars] = figures["operators-chart"]["data"]
    assert bars["marker"]["color"] == [SAME] * 4 + ["#1e7d32"]  # the largest change on top


def test_names_from_traces_and_users_are_text(tmp_path):
    ops = [_op(SCRIPT, 50.0), _op("aten::mm & <b>", 10.0)]
    before = _run_side(tmp_path, "<b>before", step=0.1, wait=0.01, findings=[_finding("x", "warning", 2, SCRIPT)])
    after = _run_side(tmp_path, "after", step=0.1, wait=0.01, operators=ops)
    page = compare_page(before, after).text()
    figures = _validated(page)
    assert "<script>document" not in page and "</script>'" not in page and "<b>before" not in page
    assert "&lt;b&gt;before" in page and "&lt;script&gt;document.title=&#x27;pwned&#x27;" in page
    # In a chart too (Plotly reads its text as HTML and shows the entities as the characters they stand for).
    assert "aten::mm &amp; &lt;b&gt;" in figures["operators-chart"]["data"][0]["y"]


def test_a_run_against_a_trace_with_little_known(tmp_path, gpu_trace):
    # One epoch, no operators, no findings on one side; a trace on the other: nothing to chart per epoch.
    before = _run_side(tmp_path, "run", step=0.1, wait=0.0, epochs=1)
    after = _trace_side(gpu_trace("v100_single_rank.json.gz"))
    page = compare_page(before, after).text()
    figures = _validated(page)
    assert set(figures) == {"operators-chart"} and "two sides" in page
    assert "a run: its last measured training epoch; a trace: the mean of its steps" in page
    assert "(new)" in _row(page, "aten::convolution_backward")  # the run has no operator table
    sides = page.split('id="sides-table"', 1)[1].split("</table>", 1)[0]
    assert "<td>steps</td><td>-</td><td>5</td>" in sides and "<td>precision</td><td>bf16-mixed</td><td>-</td>" in sides
    empty = ComparedSide(label="a", kind="trace", step_p50=None)
    page = compare_page(empty, dataclasses.replace(empty, label="b")).text()
    assert _validated(page) == {} and "No warning or critical finding on either side" in page


def test_the_page_is_bounded_however_long_the_runs(tmp_path):
    ops = [_op(f"op{i}", float(i + 1)) for i in range(3 * OPERATOR_ROWS)]
    before = _run_side(tmp_path, "before", step=0.1, wait=0.01, epochs=2 * MAX_EPOCH_POINTS)
    after = _run_side(tmp_path, "after", step=0.1, wait=0.01, epochs=3, operators=ops)
    figures = _validated(page := compare_page(before, after).text())
    points = [len(trace["x"]) for trace in figures["epochs-chart-0"]["data"]]
    assert points[0] <= MAX_EPOCH_POINTS and points[1] == 3
    assert figures["epochs-chart-0"]["data"][0]["x"][-1] == 2 * MAX_EPOCH_POINTS - 1  # the latest epoch kept
    assert page.split('id="operators-table"', 1)[1].split("</table>", 1)[0].count("<tr>") == 1 + OPERATOR_ROWS
    assert len(figures["operators-chart"]["data"][0]["y"]) == CHART_OPERATORS


def test_the_page_in_a_browser(tmp_path, gpu_trace):
    browser = pytest.importorskip("browser", reason="tests/browser.py (the headless Chromium harness) not found")
    ops = operator_stats(load_trace(gpu_trace("v100_single_rank.json.gz")))
    renamed = [dataclasses.replace(op, name=SCRIPT) if op.name == "aten::mm" else op for op in ops]
    findings = [_finding("dataloader_bound", "critical", 2), _finding("tiny_ops", "warning", 2, title=SCRIPT)]
    before = _run_side(tmp_path, "before", step=0.1, wait=0.05, findings=findings[:1], operators=ops)
    after = _run_side(tmp_path, "after", step=0.06, wait=0.01, findings=findings[1:], operators=renamed)
    path = tmp_path / "compare.html"
    compare_page(before, after).write(path)
    rendered = browser.render(path, artifact="compare-page")
    assert rendered.console == []
    assert rendered.charts == {"operators-chart": True, "epochs-chart-0": True, "epochs-chart-1": True}
    assert 'id="findings-table"' in rendered.dom and 'id="operators-table"' in rendered.dom
    assert "<title>lightning-perf compare: two runs</title>" in rendered.dom  # no script of a name ran
    # The name is text where it is shown: the findings' table and block, the operators' chart and table.
    assert rendered.text.count(SCRIPT) == 4, rendered.text
    assert rendered.screenshot.is_file()
