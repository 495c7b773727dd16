"""
The run page
============

``<dirpath>/report.html`` and ``lightning-perf report RUN_DIR --html OUT``: a run's ``perf_report.json`` as one
self-contained page (:func:`run_page`), in the order a person reads it:

1. the run: a banner where an epoch was interrupted; device, precision, strategy, world size, versions, each
   stage's DataLoader settings and headline (its latest complete epoch, and its median step over the epochs;
   rank 0's in a distributed run, as the per-batch and per-epoch charts, and the windows' traces);
2. the findings, most severe first, one entry per rule and stage with the epochs it fired in, each linking to
   the section of the window that shows it (:mod:`~lightning_perf.report.html.findings_html`);
3. the charts: per-batch step time, per-epoch step time, data wait, throughput, loss and memory, per rank
   (:mod:`~lightning_perf.report.html.run_charts`);
4. each profiler window: its step breakdown, operator table and how to open its trace
   (:mod:`~lightning_perf.report.html.run_windows`);
5. FLOPs and MFU, and what ``torch.compile`` did, where the run has them.

Any report the reader accepts renders: one written before a key was added (no per-batch ``steps``, no window
``operators``), a CPU run, a run without windows or findings, a stage without epochs, interrupted epochs.

Size: Plotly's JavaScript (about 4.6 MiB), plus a bounded rest however long the run: the per-batch chart holds
at most 16 epochs a stage, each per-epoch line at most 500 points, the findings one entry per rule and stage,
at most 40 windows with a section and 50 operators each (see the modules' constants).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_perf.records import MANUAL_NOTE, EpochSummary
from lightning_perf.report.findings import epoch_label, epoch_numbers, headline, phase_split
from lightning_perf.report.html.compile_html import compile_html
from lightning_perf.report.html.document import Cell, Page, Section, esc, number_cell, page, table
from lightning_perf.report.html.findings_html import (
    STAGE_ORDER,
    about_findings,
    findings_html,
    grouped,
    severity_counts,
)
from lightning_perf.report.html.flops_html import flops_html
from lightning_perf.report.html.memory_html import memory_html
from lightning_perf.report.html.run_charts import charts_html
from lightning_perf.report.html.run_windows import anchor, shown_windows, windows_html
from lightning_perf.report.json_report import ReportEpoch, report_epochs, window_record
from lightning_perf.trial_records import trials_of
from lightning_perf.units import count, flops_rate, ms, percent

TITLE = "lightning-perf run report"

NO_CHARTS = (
    '<p class="note">No charts on this page: the run recorded no profiler window, and the page of a run without'
    " one is kept small (a loop of short Trainer calls writes one per call). <code>lightning-perf report RUN_DIR"
    " --html report.html</code> draws them from <code>perf_report.json</code>.</p>"
)
"""The charts section of a page drawn without charts (``run_page(..., charts=False)``)."""

MAX_BANNERS = 4
"""Interrupted epochs with a banner of their own (a run stops once; a resumed run may have a few)."""
# The run's facts shown, in order: perf_report.json's run key, and its label.
RUN_FACTS = (
    ("precision", "precision"),
    ("strategy", "strategy"),
    ("world_size", "world size"),
    ("num_nodes", "nodes"),
    ("cpu_count", "CPUs"),
    ("torch_threads", "torch threads"),
    ("float32_matmul_precision", "float32 matmul precision"),
    ("compiled_modules", "compiled modules"),
    ("max_epochs", "max epochs"),
    ("torch", "torch"),
    ("lightning", "lightning"),
)
# The DataLoader settings shown per stage: run.dataloaders.<stage>'s key, and its label.
LOADER_FACTS = (
    ("dataset", "dataset"),
    ("batch_size", "batch size"),
    ("num_workers", "num_workers"),
    ("pin_memory", "pin_memory"),
    ("persistent_workers", "persistent_workers"),
    ("prefetch_factor", "prefetch_factor"),
    ("drop_last", "drop_last"),
    ("iterable_class", "no DataLoader: iterates"),
)


def _text(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _run_fact(run: Mapping[str, Any], key: str) -> str:
    if key == "compiled_modules" and run[key] is None:
        return "none"  # RunFacts.compiled_modules: None where no module's .compile() was called
    return _text(run[key])


def _run_facts(run: Mapping[str, Any]) -> str:
    device = _text(run.get("device"))
    if run.get("device_name"):
        device += f" ({run['device_name']})"
    rows = [["device", device]]
    rows += [[label, _run_fact(run, key)] for key, label in RUN_FACTS if key in run]
    peak = run.get("peak_flops")
    if isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0:
        rows.append(["peak per device", flops_rate(peak)])
    return table(["", ""], rows)


def _loader_fact(loader: Mapping[str, Any], key: str) -> str:
    if key == "prefetch_factor" and loader.get(key) is None and loader.get("num_workers") == 0:
        return "\N{EN DASH}"  # no worker, nothing prefetched: the setting does not apply
    return _text(loader.get(key))


def _loaders(run: Mapping[str, Any]) -> str:
    loaders = run.get("dataloaders")
    if not isinstance(loaders, Mapping) or not loaders:
        return ""
    keys = [
        (key, label)
        for key, label in LOADER_FACTS
        if any(isinstance(v, Mapping) and key in v for v in loaders.values())
    ]
    rows = []
    for stage, loader in loaders.items():
        if isinstance(loader, Mapping):
            rows.append([stage, *(_loader_fact(loader, key) for key, _ in keys)])
        else:
            rows.append([stage, *("unknown" for _ in keys)])
    return "<h3>DataLoaders</h3>" + table(["stage", *(label for _, label in keys)], rows)


def headline_epoch(epochs: Sequence[EpochSummary]) -> EpochSummary:
    """The epoch a stage's headline shows: its latest complete one, else (every epoch interrupted) its latest."""
    return _headline_epochs(epochs)[-1]


def _headline_epochs(epochs: Sequence[EpochSummary]) -> Sequence[EpochSummary]:
    """The epochs a stage's headline reads: the complete ones, or (every epoch interrupted) all of them."""
    return [e for e in epochs if not e.interrupted] or epochs


def _headline_row(stage: str, epochs: Sequence[EpochSummary]) -> list[Cell | str]:
    if not epochs:
        return [stage, number_cell(0), *(number_cell(None) for _ in range(8))]
    complete = _headline_epochs(epochs)  # an interrupted epoch only if nothing else
    e = complete[-1]
    p50s = [x.step_time_p50 for x in complete if x.measured_batches > 0]
    median = statistics.median(p50s) if p50s else None
    shown = f"{epoch_numbers(e)}{' (interrupted)' if e.interrupted else ''}"
    ran = sum(x.epochs for x in epochs)
    return [
        stage,
        number_cell(ran, count(ran)),
        Cell(shown, sort=float(e.epoch), num=True),
        number_cell(e.batches, f"{count(e.batches)} ({count(e.profiled_batches)} profiled)"),
        number_cell(e.step_time_p50, ms(e.step_time_p50)),
        number_cell(e.step_time_p90, ms(e.step_time_p90)),
        number_cell(median, None if median is None else ms(median)),
        number_cell(e.data_wait_fraction, percent(e.data_wait_fraction)),
        number_cell(e.throughput, None if e.throughput is None else count(e.throughput)),
        number_cell(e.mfu, None if e.mfu is None else percent(e.mfu, 1)),
    ]


def _headlines(stages: Mapping[str, Sequence[ReportEpoch]], *, world_size: int, manual: bool = False) -> str:
    if not stages:
        return '<p class="note">No stage epoch was measured.</p>'
    summaries = {stage: [e.summary for e in epochs] for stage, epochs in stages.items()}
    headers = ["stage", "epochs", "epoch shown", "batches", "step p50", "step p90", "p50 over epochs"]
    headers += ["data wait", "samples/s", "MFU"]
    rows = [_headline_row(stage, epochs) for stage, epochs in summaries.items()]
    shown = {stage: headline_epoch(epochs) for stage, epochs in summaries.items() if epochs}
    lines = "".join(
        f"<li><b>{esc(stage)} {epoch_label(e)}</b>: {esc(headline(e))}"
        + (f"; p90 {esc(p90)}" if (p90 := phase_split(e, "p90")) is not None else "")
        + (f" ({esc(MANUAL_NOTE)})" if manual and e.forward_p50 is not None else "")
        + "</li>"
        for stage, e in shown.items()
    )
    ranks = (
        f" Rank 0's numbers, of {world_size} ranks: every rank's are under <a href=\"#charts\">Charts</a>, per rank."
        if world_size > 1
        else ""
    )
    note = (
        '<p class="note">Each stage\'s latest complete epoch (an interrupted one only where no epoch completed;'
        " times, percentiles and throughput leave out the batches that ran inside a profiler window, counted"
        " FLOPs or compiled); p50 over epochs: the median of the epochs' median steps."
        f"{ranks}</p>"
    )
    title = "Headline (rank 0)" if world_size > 1 else "Headline"
    return f"<h3>{title}</h3>" + table(headers, rows, numeric=[False, *([True] * 9)]) + note + f"<ul>{lines}</ul>"


def _interrupted(stages: Mapping[str, Sequence[ReportEpoch]]) -> str:
    """A banner for each interrupted epoch (at most :data:`MAX_BANNERS`): where the run stopped, what the
    page shows instead."""
    cut = [e.summary for epochs in stages.values() for e in epochs if e.summary.interrupted]
    lines = []
    for e in cut[:MAX_BANNERS]:
        complete = [x.summary for x in stages[e.stage] if not x.summary.interrupted]
        instead = (
            f"the headline shows {e.stage} {epoch_label(complete[-1])}, the latest complete one"
            if complete
            else f"no {e.stage} epoch completed: the headline shows this one"
        )
        batches = f"{count(e.batches)} batch{'' if e.batches == 1 else 'es'}"
        lines.append(
            f"This run was interrupted during {e.stage} {epoch_label(e)} (after {batches}):"
            f" {instead}; the charts show the interrupted epoch as far as it ran."
        )
    if len(cut) > MAX_BANNERS:
        lines.append(f"... and {count(len(cut) - MAX_BANNERS)} more interrupted epochs.")
    return "".join(f'<p class="banner">{esc(line)}</p>' for line in lines)


def _stages(report: Mapping[str, Any]) -> dict[str, list[ReportEpoch]]:
    """The report's epochs by stage (train, validate, test, predict first), a stage without epochs too."""
    stages: dict[str, list[ReportEpoch]] = {stage: [] for stage in report.get("stages") or {}}
    for e in report_epochs(report):
        stages.setdefault(e.summary.stage, []).append(e)
    order = {stage: i for i, stage in enumerate(STAGE_ORDER)}
    return dict(sorted(stages.items(), key=lambda item: order.get(item[0], len(order))))


def run_page(report: Mapping[str, Any], *, source: str | None = None, charts: bool = True) -> Page:
    """The HTML page of a run's report.

    Args:
        report: ``perf_report.json``'s content, as :func:`lightning_perf.readers.load_report` returns it or
            :func:`lightning_perf.report.json_report.report_dict` builds it.
        source: Where the report came from (its file or directory), shown in the page's header.
        charts: Draw the charts (Plotly's JavaScript inline: about 4.6 MiB); ``False``: the tables and
            findings only, with a note saying how to draw the charts (:data:`NO_CHARTS`), a page of tens of kB.

    Returns:
        The whole document, self-contained (see :mod:`lightning_perf.report.html.document`).
    """
    run = report.get("run") or {}
    stages = _stages(report)
    windows = [window_record(w) for w in report.get("windows") or ()]
    findings = [f for epochs in stages.values() for e in epochs for f in e.findings]
    spans = {(e.summary.stage, e.summary.epoch): e.summary.epochs for epochs in stages.values() for e in epochs}
    groups = grouped(findings, spans)
    anchors = {w.name: anchor(w.name) for w in shown_windows(windows, findings)}
    latest = {stage: epochs[-1].summary.epoch for stage, epochs in stages.items() if epochs}
    generated = report.get("generated_by") or "lightning-perf"
    about = f"Written by {esc(generated)}" + (f" to <code>{esc(source)}</code>" if source else "") + "."
    counts = severity_counts(groups)
    world = run.get("world_size")
    world_size = world if isinstance(world, int) and not isinstance(world, bool) else 1
    facts = (
        _run_facts(run)
        + _loaders(run)
        + _headlines(stages, world_size=world_size, manual=run.get("manual_optimization") is True)
    )
    sections = [
        Section("run", "The run", _interrupted(stages) + facts + f'<p class="note">{about}</p>'),
        Section(
            "findings",
            f"Findings ({counts})" if counts else "Findings",
            findings_html(
                groups,
                anchors=anchors,
                latest_epochs=latest,
                clean="No bottleneck found in any epoch.",
                trials=trials_of(run),
            ),
        ),
        Section("charts", "Charts", charts_html(stages, windows, world_size=world_size) if charts else NO_CHARTS),
        Section(
            "windows",
            f"Profiler windows ({len(windows)})",
            windows_html(windows, findings, world_size=world_size, charts=charts),
        ),
    ]
    summaries = {stage: [e.summary for e in epochs] for stage, epochs in stages.items() if epochs}
    if (flops := flops_html(run, summaries, rank_zero=world_size > 1, charts=charts)) is not None:
        sections.append(Section("flops", "FLOPs and MFU", flops))
    if (memory := memory_html(run, charts=charts)) is not None:
        sections.append(Section("memory", "What fills memory", memory))
    if (compiled := compile_html(stages)) is not None:
        sections.append(Section("compile", "torch.compile", compiled))
    if (explained := about_findings(g.latest for g in groups)) is not None:
        sections.append(explained)
    subtitle = " · ".join(part for part in (source, generated, _device(run, world_size)) if part)
    return page(TITLE, subtitle, sections)


def _device(run: Mapping[str, Any], world_size: int) -> str:
    device = run.get("device_name") or run.get("device")
    return f"{device}" + (f", {world_size} ranks" if world_size > 1 else "") if device else ""
