"""The run page (``report.html``): every figure it draws is a valid Plotly figure, it shows the run, the findings
(grouped, linked to their windows), the charts, the windows (breakdown, operators, how to open the trace),
FLOPs and compile health; it escapes what comes from a trace or a user; it renders any report, however little
it holds; and its size stays bounded however long the run. Reports built with the writer's own functions from
hand-made records, read back with the reader; and a real Trainer's, opened in headless Chromium."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser

import plotly.graph_objects as go
import pytest
import torch

import browser
from html_pages import assert_self_contained, figures_in
from lightning_perf import PerfCallback
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.registry import rule_explanation
from lightning_perf.readers import load_report
from lightning_perf.records import (
    CompileStats,
    GraphBreak,
    OperatorStat,
    RankSummary,
    Recompile,
    WindowRecord,
)
from lightning_perf.report.html import run_page
from lightning_perf.report.html.run_page import TITLE
from lightning_perf.report.json_report import keeps_step_split, report_dict, write_json_atomically
from lightning_perf.summarize.steps import step_split, summarize_epoch
from models import TinyModel, trainer
from summaries import window

EVIL = "<script>document.title='pwned'</script>"
MiB = 2**20


class Page(HTMLParser):
    """A page's ids, links to anchors, section ids in order, table headers and texts."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.sections: list[str] = []
        self.headers: list[str] = []
        self.text: list[str] = []
        self._in: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
            if tag == "section":
                self.sections.append(attrs["id"])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])
        self._in = tag

    def handle_data(self, data):
        if self._in == "th":
            self.headers.append(data)
        if self._in not in ("script", "style"):
            self.text.append(data)


def _operators(evil: bool, device: bool) -> tuple[OperatorStat, ...]:
    ops = [
        OperatorStat(
            name=f"aten::op{i}",
            calls=10 + i,
            self_cpu_time=100.0 + i,
            cpu_time=200.0 + i,
            self_device_time=(50.0 * i) if device else None,
            device_time=(60.0 * i) if device else None,
            self_cpu_memory=-1024 * i if device else None,
            input_shapes="[[32, 128], [128]]" if device else None,
        )
        for i in range(60)
    ]
    if evil:
        ops.append(
            OperatorStat(name=EVIL, calls=1, self_cpu_time=9e5, cpu_time=9e5, self_device_time=9e5 if device else None)
        )
    return tuple(ops)


def _window(stage: str, epoch: int, first: int, last: int, *, evil: bool, device: bool) -> WindowRecord:
    name = f"{stage}-epoch{epoch:03d}-batches{first:04d}-{last:04d}"
    gpu = {"device_busy": 0.007, "communication_time": 0.002, "communication_exposed_time": 0.001} if device else {}
    return WindowRecord(
        stage=stage,
        epoch=epoch,
        first_batch=first,
        last_batch=last,
        name=name,
        trace_path=f"/runs/{EVIL if evil else 'demo'}/perf/{name}/rank0.pt.trace.json.gz",
        step=first,
        device="cuda" if device else "cpu",
        cuda_max_allocated=3 * 2**30 if device else None,
        operators=_operators(evil, device),
        summary=window(name, **gpu),
    )


def _finding(rule: str, stage: str, epoch: int, severity: str = "warning", window: str | None = None, text: str = ""):
    return Finding(
        id=rule,
        severity=severity,
        title=f"{stage} {rule} {text}",
        evidence=f"evidence of {rule} {text}",
        advice=f"set `num_workers=4` {text}",
        stage=stage,
        epoch=epoch,
        window=window,
    )


def build_report(
    *,
    epochs: int = 3,
    batches: int = 40,
    device: bool = True,
    evil: bool = False,
    ranks: int = 2,
    windows_per_stage: int = 1,
    operators: bool = True,
) -> dict:
    """A report as the callback writes it: train and validate epochs with per-batch splits (a stall at batch
    30, batches 10-12 profiled, batch 0 compiled in train epoch 0), windows, findings, ranks, compile, FLOPs."""
    text = EVIL if evil else ""
    summaries, splits, findings, per_rank, windows = [], {}, {}, {}, []
    for stage in ("train", "validate"):
        stage_windows = [
            _window(stage, e, 10, 12, evil=evil, device=device) for e in range(min(windows_per_stage, epochs))
        ]
        windows += stage_windows
        for e in range(epochs):
            n = batches if keeps_step_split(e, e < windows_per_stage) or e == epochs - 1 else 4
            wait = [0.002 + 0.0001 * (i % 3) for i in range(n)]
            compute = [0.010 + 0.0002 * (i % 5) for i in range(n)]
            if n > 30:
                compute[30] = 0.080  # a stall
            profiled = [e < windows_per_stage and 10 <= i <= 12 for i in range(n)]
            gpu = {"cuda_max_allocated": 2 * 2**30 + e * MiB, "cuda_max_reserved": 3 * 2**30} if device else {}
            flops = {"flops_per_batch": 1e10, "flops_per_second": 5e13, "mfu": 0.16} if stage == "train" else {}
            summaries.append(
                summarize_epoch(
                    stage=stage,
                    epoch=e,
                    data_wait=wait,
                    compute=compute,
                    batch_sizes=[32] * n,
                    profiled=profiled,
                    loss=1 / (e + 1),
                    host_rss_peak=900 * MiB + e * MiB,
                    **gpu,
                    **flops,
                )
            )
            if n == batches:
                compiled = [0] if (stage, e) == ("train", 0) else []
                splits[(stage, e)] = step_split(wait, compute, profiled=profiled, compiled=compiled)
            named = stage_windows[0].name if stage_windows and e == 0 else None
            findings[(stage, e)] = [_finding("dataloader_bound", stage, e, "critical" if e else "warning", named, text)]
            if e % 2 == 0:
                findings[(stage, e)].append(_finding("step_time_unstable", stage, e, "info", text=text))
            per_rank[(stage, e)] = [
                RankSummary(
                    rank=r,
                    step_time_p50=0.010 + 0.001 * r,
                    step_time_p90=0.012 + 0.001 * r,
                    step_time_max=0.02,
                    data_wait_fraction=0.1,
                    throughput=3000.0,
                    host_rss_peak=900 * MiB,
                    cuda_max_allocated=2 * 2**30 if device else None,
                    cuda_max_reserved=None,
                    communication_share=0.05,
                    cpu_wait_share=0.04 + 0.01 * r,
                )
                for r in range(ranks)
            ]
    compile = CompileStats(
        graphs=3,
        breaks=1,
        recompiles=1,
        limit_reached=False,
        seconds=4.2,
        break_sites=(GraphBreak(reason=f"Tensor.item() {text}", location=f"/src/{text}model.py:3", count=2),),
        recompile_guards=(Recompile(function="forward (model.py:9)", guard="L['n'] == 3", count=1),),
        steps=(0,),
    )
    run = {
        "torch": "2.13.0",
        "lightning": "2.6.6",
        "device": "cuda" if device else "cpu",
        "device_name": "NVIDIA A100-SXM4-80GB" if device else "x86_64",
        "world_size": ranks,
        "precision": "bf16-mixed",
        "strategy": "DDPStrategy",
        "dataloaders": {"train": {"num_workers": 4, "pin_memory": True, "persistent_workers": True, "batch_size": 32}},
        "peak_flops": 312e12,
        "flops": {"by_module": [[f"encoder{text}", 6e9], ["head", 2e9]], "counted": [{"flops": 1e10, "samples": 32}]},
    }
    report = report_dict(
        generated_by="lightning-perf test",
        run=run,
        epochs=summaries,
        windows=windows,
        findings=findings,
        ranks={k: v for k, v in per_rank.items() if ranks > 1},
        compile={("train", 0): compile},
        steps=splits,
    )
    if not operators:
        for w in report["windows"]:
            del w["operators"]
    return report


def _read_back(report: dict, tmp_path) -> dict:
    path = tmp_path / "perf_report.json"
    write_json_atomically(report, str(path))
    return load_report(path)


def _valid_figures(page: str) -> dict:
    figures = figures_in(page)
    for figure in figures.values():
        go.Figure(figure)  # raises on a property Plotly does not know
    return figures


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    report = _read_back(build_report(), tmp_path_factory.mktemp("rich"))
    return report, run_page(report, source="/runs/demo/perf").text()


def test_every_figure_of_a_rich_page_is_valid_and_has_axis_titles(rich):
    _, page = rich
    figures = _valid_figures(page)
    # 2 per-batch, 5 per-epoch, per stage 1 rank spread + 3 per rank, 2 window breakdowns, FLOP/s, modules.
    assert len(figures) == 2 + 5 + 2 * 4 + 2 + 1 + 1
    for figure in figures.values():
        layout = figure["layout"]
        assert layout["xaxis"]["title"]["text"], layout
        named = [trace for trace in figure["data"] if trace.get("showlegend", True)]
        assert all(trace.get("hovertemplate") for trace in figure["data"])
        assert len(named) == 1 or all(trace.get("name") for trace in named)
    assert_self_contained(page)


def test_the_page_reads_in_order_and_every_link_lands(rich):
    _, page = rich
    parsed = Page(page)
    top = [s for s in parsed.sections if not s.startswith("window-")]
    assert top == ["run", "findings", "charts", "windows", "flops", "compile", "about-findings"]
    assert set(parsed.links) <= set(parsed.ids)
    assert len(parsed.ids) == len(set(parsed.ids))
    text = "".join(parsed.text)
    for fact in (
        "NVIDIA A100-SXM4-80GB",
        "bf16-mixed",
        "DDPStrategy",
        "2.13.0",
        "2.6.6",
        "num_workers",
        "312 TFLOP/s",
        "CPU wait",
    ):
        assert fact in text
    assert "Written by lightning-perf test to /runs/demo/perf." in text


def test_findings_are_grouped_most_severe_first_and_link_to_their_window(rich):
    _, page = rich
    findings = page[page.index('<section id="findings">') : page.index('<section id="charts">')]
    # Two rules in two stages, however many epochs; the latest finding's severity decides the order.
    assert re.findall(r'class="finding (\w+)"', findings) == ["critical", "critical", "info", "info"]
    assert findings.count("train, epochs 0-2") == 1 and findings.count("train, epochs 0, 2") == 1
    # The window shows the finding of epoch 0; the group shows the latest (epoch 2), which names no window.
    assert "#window-" not in findings
    assert "<code>num_workers=4</code>" in findings  # advice's code spans
    # Each finding names the documentation's section that explains it.
    ids = re.findall(r'class="finding \w+"><p>.*?<code>(\w+)</code>', findings)
    docs = re.findall(r"explained in the documentation: <code>([^<]+)</code>", findings)
    assert len(docs) == len(ids) == 4 and docs == [f"docs/findings.md#{i}" for i in ids]


def test_each_finding_links_to_what_its_rule_measures_on_the_page_itself(rich):
    _, page = rich
    findings = page[page.index('<section id="findings">') : page.index('<section id="charts">')]
    ids = re.findall(r'class="finding \w+"><p>.*?<code>(\w+)</code>', findings)
    links = re.findall(r'<a href="#about-(\w+)">what this rule measures</a>', findings)
    assert links == ids
    about = page[page.index('<section id="about-findings">') :]
    for rule_id in set(ids):
        # The link's target is on the page, with the rule's own docstring: the text of the site's catalogue.
        summary, notes = rule_explanation(rule_id)
        entry = about[about.index(f'<div id="about-{rule_id}">') :]
        entry = entry[: entry.index("</div>")]
        assert html.unescape(re.sub(r"<[^>]+>", "", entry)).count(summary.replace("`", "")) == 1
        assert len(re.findall("<li>", entry)) == len(notes) > 0
    assert about.count('<div id="about-') == len(set(ids))  # once per rule, however many findings


def test_a_finding_of_epochs_measured_together_counts_each_of_them():
    # Epochs 1 and 2 measured as one record (numbered 2): its findings fired in both.
    report = build_report(epochs=3)
    train = report["stages"]["train"]["epochs"]
    train[:] = [e for e in train if e["epoch"] != 1]
    train[-1]["epochs"] = 2
    page = run_page(report, charts=False).text()
    findings = page[page.index('<section id="findings">') : page.index('<section id="charts">')]
    assert findings.count("train, epochs 0-2") == 2 and "train, epochs 0, 2" not in findings


def test_a_finding_links_to_its_window_and_one_gone_says_so():
    report = build_report(epochs=4)
    for stage in report["stages"].values():
        for epoch in stage["epochs"]:
            for f in epoch["findings"]:
                if f["id"] == "dataloader_bound":
                    f["window"] = "train-epoch000-batches0010-0012"
    page = run_page(report).text()
    assert page.count('shown by window <a href="#window-train-epoch000-batches0010-0012">') == 2
    assert page.count("(not in the latest, 3)") == 2  # step_time_unstable: epochs 0 and 2 of 0-3
    assert 'id="window-train-epoch000-batches0010-0012"' in page


def test_windows_show_breakdown_operators_and_how_to_open_the_trace(rich):
    _, page = rich
    start = page.index('<section id="window-train-epoch000-batches0010-0012">')
    section = page[start : page.index("</section>", start)]
    headers = Page(section).headers
    assert headers[headers.index("Operator") :] == [
        "Operator",
        "Calls",
        "Self CPU",
        "CPU total",
        "Self device",
        "Device total",
        "Self CPU mem",
        "Input shapes",
    ]  # no FLOPs, no device memory: none recorded
    assert section.count("<tr>") >= 50 + 1  # 50 operators the report keeps, and their header
    for part in ("device busy", "communication", "data loading", "CPU execution", "other"):
        assert f"<td>{part}</td>" in section
    assert "ui.perfetto.dev" in section and "TraceAnalysis(trace_dir=" in section
    assert "tensorboard --logdir /runs/demo/perf</code>" in section and "Google Charts" in section


def test_a_cpu_run_leaves_out_device_columns_and_parts(tmp_path):
    page = run_page(_read_back(build_report(device=False, ranks=1), tmp_path)).text()
    _valid_figures(page)
    start = page.index('<section id="windows">')
    headers = Page(page[start:]).headers
    assert "Self device" not in headers and "Self CPU" in headers and "Input shapes" not in headers
    assert "<td>device busy</td>" not in page and "<td>CPU execution</td>" in page
    assert "per rank" not in page


def test_names_from_traces_and_users_are_escaped(tmp_path):
    page = run_page(_read_back(build_report(evil=True), tmp_path), source=f"/runs/{EVIL}").text()
    assert EVIL not in page  # in no text, attribute, table cell or figure's JSON
    assert "<script>document" not in page
    escaped = "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;"
    assert page.count(escaped) >= 6  # operator, module, path, source, finding, graph break...
    _valid_figures(page)


def _bare(report: dict) -> dict:
    """An old writer's report: no steps, operators, compile, FLOPs, dataloaders or ranks."""
    report = json.loads(json.dumps(report))
    for stage in report["stages"].values():
        for epoch in stage["epochs"]:
            for key in ("steps", "compile", "ranks", "findings"):
                epoch.pop(key, None)
    for w in report["windows"]:
        w.pop("operators", None)
    report["run"] = {"device": "cpu"}
    return report


def _without_summaries(report: dict) -> dict:
    for w in report["windows"]:
        w["summary"] = None
    return report


def _empty_stage(report: dict) -> dict:
    report["stages"]["test"] = {"epochs": []}
    return report


def _nothing_measured(report: dict) -> dict:
    epoch = report["stages"]["train"]["epochs"][0]
    epoch.update(batches=0, samples=None, step_time=0.0, data_wait=0.0, step_time_p50=0.0, step_time_p90=0.0)
    epoch.update(step_time_max=0.0, data_wait_fraction=0.0, throughput=None, loss=None, interrupted=True)
    epoch["steps"] = {"data_wait": [], "compute": [], "per_bar": 1, "profiled": [], "compiled": []}
    return report


MISSING = {
    "cpu only, one rank": lambda: build_report(device=False, ranks=1),
    "no windows": lambda: build_report(windows_per_stage=0),
    "a single epoch": lambda: build_report(epochs=1),
    "no operators (older writer)": lambda: build_report(operators=False),
    "an old report": lambda: _bare(build_report(device=False, ranks=1)),
    "windows without summaries": lambda: _without_summaries(build_report()),
    "a stage with no epochs": lambda: _empty_stage(build_report(epochs=1)),
    "an interrupted epoch with no batch": lambda: _nothing_measured(build_report(epochs=1, device=False)),
    "nothing at all": lambda: {"version": 1, "run": {}, "stages": {}, "windows": []},
}


@pytest.mark.parametrize("build", MISSING.values(), ids=MISSING.keys())
def test_a_report_with_missing_values_renders(build, tmp_path):
    report = _read_back(build(), tmp_path)
    page = run_page(report).text()
    _valid_figures(page)
    parsed = Page(page)
    assert {"run", "findings", "charts", "windows"} <= set(parsed.sections)
    assert set(parsed.links) <= set(parsed.ids)


def test_a_run_without_findings_says_so():
    report = build_report(epochs=1)
    for stage in report["stages"].values():
        for epoch in stage["epochs"]:
            epoch["findings"] = []
    assert "No bottleneck found in any epoch." in run_page(report).text()


def test_the_page_of_a_long_run_stays_small(tmp_path):
    from plotly.offline import get_plotlyjs

    # 2,000 train and validation epochs, each with findings and 8 ranks; the log-spaced ones with 6,000 batches
    # (2,000 bars of 3); 5 windows a stage of 50 operators each.
    report = build_report(epochs=2_000, batches=6_000, ranks=8, windows_per_stage=5)
    size = len(json.dumps(report))
    page = run_page(report).text()
    rest = len(page.encode()) - len(get_plotlyjs().encode())
    assert rest < 2_500_000, (rest, size)  # the report itself is several times larger
    figures = _valid_figures(page)
    steps = [f for f in figures.values() if f["layout"].get("barmode") == "stack" and "updatemenus" in f["layout"]]
    # Every epoch the report keeps: 0-4 (windows), 8, 16, ..., 1024 and the latest, 14 of the cap's 16.
    assert [len(f["layout"]["updatemenus"][0]["buttons"]) for f in steps] == [14, 14]
    assert max(len(t.get("x", ())) for f in figures.values() for t in f["data"] if t.get("type") == "scatter") <= 500


# --- a real run's page, in a real browser --------------------------------------------------------------------


class Labelled(TinyModel):
    """Runs its training step under a ``record_function`` named like a script: a label from the user."""

    def training_step(self, batch, batch_idx):
        with torch.profiler.record_function(EVIL):
            return super().training_step(batch, batch_idx)


def test_a_real_run_s_page_in_a_browser(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 2}, stages=["train", "validate"])
    trainer(tmp_path, [callback], max_epochs=2).fit(Labelled(n=32))
    report = load_report(next(tmp_path.rglob("perf_report.json")))
    assert all("steps" in e for e in report["stages"]["train"]["epochs"]) and report["windows"][0]["operators"]
    page = run_page(report, source=str(tmp_path)).text()
    figures = _valid_figures(page)
    path = tmp_path / "run.html"
    path.write_text(page, encoding="utf-8")

    rendered = browser.render(path, artifact="run-page", height=3200)
    assert rendered.console == []
    assert list(rendered.charts.values()) == [True] * len(figures)  # every chart drawn
    # per batch, per epoch, 4 windows' breakdowns, FLOP/s, modules, what fills memory
    assert len(figures) == 2 + 5 + 4 + 1 + 1 + 1
    assert "What fills memory" in rendered.dom and "optimizer state" in rendered.text
    assert '<div class="finding ' in rendered.dom
    assert rendered.dom.count('<table class="sortable"><thead><tr><th class="">Operator</th>') == 4
    assert f"<title>{TITLE}</title>" in rendered.dom  # the label's script did not run
    assert "<script>document.title='pwned'</script>" in rendered.text  # shown as text, in the operator table


def test_a_page_without_charts_keeps_every_table_and_finding_and_no_plotly(rich):
    report, full = rich
    page = run_page(report, source="/runs/demo/perf", charts=False).text()
    assert figures_in(page) == {} and "plotly" not in page.lower()
    assert len(page) < 200_000 < len(full)
    assert "lightning-perf report RUN_DIR --html report.html" in page  # how to draw the charts
    parsed, whole = Page(page), Page(full)
    assert parsed.sections == whole.sections  # every window keeps its section: its numbers and operators
    assert "Operator" in parsed.headers and set(parsed.headers) <= set(whole.headers)
    assert re.findall(r'class="finding (\w+)"', page) == re.findall(r'class="finding (\w+)"', full)
    assert_self_contained(page)


def test_the_memory_note_says_where_activations_were_measured_or_would_be():
    from lightning_perf.report.html.memory_html import memory_html
    from summaries import ADAM_MEMORY

    cpu = {**ADAM_MEMORY, "device": "cpu", "optimizers": ["Adam"]}
    assert "Activations are measured on CUDA, or in a training window with profile_memory=True." in memory_html(
        {"memory": cpu}, charts=False
    )
    saved = memory_html({"memory": {**cpu, "activations_saved": 1 << 20}}, charts=False)
    assert "what one training batch saved for the backward (its temporaries: activations are measured" in saved
    window = {**cpu, "activations": 1 << 20, "activations_window": "train-epoch000-batches0006-0006"}
    assert "allocated in window train-epoch000-batches0006-0006" in memory_html({"memory": window}, charts=False)
    cuda = {**ADAM_MEMORY, "device": "cuda", "optimizers": ["Adam"], "activations": 1 << 20}
    assert "Activations" not in memory_html({"memory": cuda}, charts=False).split('class="note"')[1]
