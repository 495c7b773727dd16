"""The traces page (``analyze --html``): real GPU traces, as ``analyze`` reads them, grouped by directory, with
the cross-rank table and findings of a directory of ranks, each trace's breakdown, findings, operator table and
how to open it; names escaped; the operator rows bounded however many traces; drawn in headless Chromium."""

from __future__ import annotations

import dataclasses
import shutil

import plotly.graph_objects as go
import pytest

import browser
from html_pages import assert_self_contained, figures_in
from lightning_perf.cli.analyze import analyzed_trace
from lightning_perf.diagnosis_context import cross_rank_findings
from lightning_perf.records import OperatorStat
from lightning_perf.report.html import AnalyzedDirectory, traces_page
from lightning_perf.report.html.traces_page import CHART_TRACES, MIN_TRACE_OPERATORS, TITLE
from lightning_perf.summarize.ranks import rank_summary_of_trace

EVIL = "<script>document.title='pwned'</script>"


def directory_of(paths) -> AnalyzedDirectory:
    """The traces of one directory as ``analyze`` reads them (its steps, without printing)."""
    traces = [analyzed_trace(str(path), precision=None, world_size=len(paths), operators=True) for path in paths]
    traces.sort(key=lambda t: t.rank)
    ranks = tuple(rank_summary_of_trace(t.rank, t.summary) for t in traces)
    if len(traces) < 2 or len({r.rank for r in ranks}) < len(ranks):
        return AnalyzedDirectory(str(paths[0].parent), tuple(traces))
    return AnalyzedDirectory(str(paths[0].parent), tuple(traces), ranks, tuple(cross_rank_findings(list(ranks))))


@pytest.fixture(scope="module")
def gpu_dirs(tmp_path_factory, request):
    from conftest import GPU_TRACES

    if not GPU_TRACES.exists():
        pytest.skip(f"real GPU traces not found at {GPU_TRACES}")
    single, ranks = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("ranks")
    shutil.copy(GPU_TRACES / "v100_single_rank.json.gz", single)
    for name in ("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz"):
        shutil.copy(GPU_TRACES / name, ranks)
    return [directory_of(sorted(single.iterdir())), directory_of(sorted(ranks.iterdir()))]


def _figures(page: str) -> dict:
    figures = figures_in(page)
    for figure in figures.values():
        go.Figure(figure)
    return figures


def test_real_gpu_traces_make_a_page_with_every_part(gpu_dirs):
    page = traces_page(gpu_dirs).text()
    assert_self_contained(page)
    figures = _figures(page)
    assert len(figures) == 2  # the single trace's breakdown; the directory of ranks' breakdown per rank
    single, ranks = gpu_dirs
    assert [len(f["data"][0]["y"]) for f in figures.values()] == [1, 2]
    assert page.count("<h3>Across ranks</h3>") == 1
    assert page.count('<section id="trace-') == 3
    for part in ("device busy", "communication", "CPU execution"):  # a row of each breakdown table
        assert page.count(f'<td>{part}</td><td class="num" data-sort=') == 3
    assert page.count('<th class="num">Self device</th>') == 3  # device runs: the device columns
    assert page.count('href="https://ui.perfetto.dev"') == 3 and page.count("TraceAnalysis(trace_dir=") == 3
    for trace in (*single.traces, *ranks.traces):
        assert f"<code>{trace.path}</code>" in page
        for finding in trace.findings:
            assert f"<code>{finding.id}</code>" in page
    for finding in ranks.findings:
        assert f"<code>{finding.id}</code>" in page


def test_a_trace_s_operator_and_path_are_escaped(gpu_dirs):
    single = gpu_dirs[0]
    [trace] = single.traces
    evil = OperatorStat(name=EVIL, calls=1, self_cpu_time=1e9, cpu_time=1e9, self_device_time=1e9, device_time=1e9)
    trace = dataclasses.replace(trace, path=f"/runs/{EVIL}.json.gz", operators=(evil, *trace.operators))
    page = traces_page([dataclasses.replace(single, path=f"/runs/{EVIL}", traces=(trace,))]).text()
    assert EVIL not in page and "<script>document" not in page
    escaped = "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;"
    assert page.count(escaped) == 4  # the directory (navigation, heading), the trace's path, the operator
    assert f"<td>{escaped}</td>" in page  # the operator table's cell
    _figures(page)


def test_many_traces_keep_the_page_bounded(gpu_dirs):
    [trace] = gpu_dirs[0].traces
    operators = tuple(dataclasses.replace(trace.operators[0], name=f"op{i}") for i in range(100))
    traces = tuple(
        dataclasses.replace(trace, rank=r, path=f"/runs/many/rank{r}.json.gz", operators=operators) for r in range(300)
    )
    page = traces_page([AnalyzedDirectory("/runs/many", traces)]).text()
    assert page.count("<tr>") <= 300 * (MIN_TRACE_OPERATORS + 1 + 20 + 3 + 1) + 1
    [figure] = _figures(page).values()
    assert len(figure["data"][0]["y"]) == CHART_TRACES
    assert "No cross-rank comparison" in page


def test_no_trace_is_a_page_that_says_so():
    assert "No trace was analyzed." in traces_page([]).text()


def test_the_traces_page_in_a_browser(gpu_dirs, tmp_path):
    single = gpu_dirs[0]
    [trace] = single.traces
    evil = OperatorStat(name=EVIL, calls=1, self_cpu_time=1e9, cpu_time=1e9, self_device_time=1e9, device_time=1e9)
    directories = [
        dataclasses.replace(single, traces=(dataclasses.replace(trace, operators=(evil, *trace.operators)),))
    ]
    page = traces_page([*directories, gpu_dirs[1]]).text()
    figures = _figures(page)
    path = tmp_path / "traces.html"
    path.write_text(page, encoding="utf-8")

    rendered = browser.render(path, artifact="traces-page", height=3200)
    assert rendered.console == []
    assert list(rendered.charts.values()) == [True] * len(figures) == [True, True]
    assert rendered.dom.count('<table class="sortable"><thead><tr><th class="">Operator</th>') == 3
    assert '<div class="finding ' in rendered.dom and "Across ranks" in rendered.text
    assert f"<title>{TITLE}</title>" in rendered.dom  # the operator's script did not run
    assert EVIL in rendered.text  # shown as text


def test_a_trace_with_collectives_shows_their_table_and_one_steps_communication(gpu_trace, tmp_path):
    path = tmp_path / "a100_nccl_2rank_rank0.json.gz"
    shutil.copy(gpu_trace(path.name), path)
    html = traces_page([directory_of([path])]).text()
    assert "<h4>Collectives</h4>" in html and "<td>allreduce</td><td>default_pg</td>" in html
    assert "Per step: communication 15.6 ms, of it 2.44 ms overlapped with compute and <b>13.2 ms exposed</b>" in html
    assert "One step's communication" in html  # the bar's title, in its figure's JSON
