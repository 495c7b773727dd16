"""
Two runs compared
=================

What ``lightning-perf compare`` reads off each side (a run's report, or one trace) and how the two sides
differ: the headline metrics and their changes, the findings fixed, new and kept, the operators whose self time
changed most. One model and one set of computations for the text the command prints
(:mod:`lightning_perf.cli.compare`) and the page ``compare --html`` writes
(:mod:`lightning_perf.report.html.compare_page`).

A run's side is its last measured training epoch (past start-up effects), with the operators of its last
training window; a trace's side is that trace's steps. What a side cannot know (a trace's throughput, a CPU
run's CUDA peak) is ``None``, shown as a dash, and its change is not computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_perf.diagnose.model import Finding
from lightning_perf.records import EpochSummary, OperatorStat, TraceSummary, share
from lightning_perf.report.findings import epoch_label
from lightning_perf.report.json_report import ReportEpoch, report_epochs
from lightning_perf.trial_records import AdviceTrial, trials_of
from lightning_perf.units import TOLERANCE, change, count, duration_us, flops_rate, mib, percent, points, times


@dataclass(frozen=True)
class ComparedSide:
    """One side of a comparison (seconds, bytes, shares as fractions; ``None``: not known on this side).

    Attributes:
        label: The path the side was read from.
        kind: ``"run"`` (a ``perf_report.json``) or ``"trace"`` (one Kineto trace).
        facts: What the side ran on, as ``(name, value)`` to show side by side (device, precision, ...).
        step_p50, step_p90: Step-time percentiles (a trace: its mean step time, and no p90).
        throughput: Samples per second.
        flops_per_second, mfu: Achieved FLOP/s and model FLOPs utilization, where counted.
        data_wait: The share of the step spent waiting for data.
        host_peak, cuda_peak: Peaks of host resident memory and of CUDA allocated memory.
        findings: The warning and critical findings, by rule id.
        operators: The operator table the operator changes are computed from, by name (times in µs).
        operators_from: Where those operators come from (a window's name, a trace's file).
        epochs: A run's measured training epochs, in order (the per-epoch chart); empty for a trace.
        compile_seconds, graph_breaks, recompiles: What ``torch.compile`` did over a run's training epochs;
            ``None``: it compiled nothing there (or a trace).
        compiled_share, guard_share: A trace's share of the step in compiled regions and in Dynamo's guard
            checks; ``None``: none in it (or a run).
        trials: A run's advice trials, by rule (:class:`~lightning_perf.trial_records.AdviceTrial`): which
            findings' advice was measured on that run, and which stayed a prediction.
    """

    label: str
    kind: Literal["run", "trace"]
    step_p50: float | None
    step_p90: float | None = None
    throughput: float | None = None
    flops_per_second: float | None = None
    mfu: float | None = None
    data_wait: float | None = None
    host_peak: float | None = None
    cuda_peak: float | None = None
    findings: Mapping[str, Finding] = field(default_factory=dict)
    operators: Mapping[str, OperatorStat] = field(default_factory=dict)
    operators_from: str | None = None
    facts: tuple[tuple[str, str], ...] = ()
    epochs: tuple[EpochSummary, ...] = ()
    compile_seconds: float | None = None
    graph_breaks: int | None = None
    recompiles: int | None = None
    compiled_share: float | None = None
    guard_share: float | None = None
    trials: Mapping[str, AdviceTrial] = field(default_factory=dict)


def advice_state(side: ComparedSide, rule: str) -> str:
    """Whether a finding's advice was tried on ``side``'s run: ``"tried: 7.04x"`` (the advised setting's gain it
    measured; below ``advice_trial_min_gain`` the advice was withdrawn), ``"not tried"`` (the finding says why), or
    ``""`` where no trial was asked for (the advice is a prediction)."""
    trial = side.trials.get(rule)
    if trial is None:
        return ""
    if trial.untried is not None or trial.ratio is None:
        return "not tried"
    return f"tried: {times(trial.ratio)}"


def measured_train_epochs(report: Mapping[str, Any]) -> list[ReportEpoch]:
    """A report's training epochs that measured at least one batch, in order."""
    return [e for e in report_epochs(report) if e.summary.stage == "train" and e.summary.batches]


def run_side(
    label: str,
    report: Mapping[str, Any],
    *,
    operators: Iterable[OperatorStat] = (),
    operators_from: str | None = None,
) -> ComparedSide | None:
    """A run's side: its last measured training epoch, and ``operators`` (its last training window's, read
    by the caller). ``None`` where the report has no measured training epoch."""
    train = measured_train_epochs(report)
    if not train:
        return None
    last = train[-1].summary
    stats = [e.compile for e in report_epochs(report) if e.summary.stage == "train" and e.compile is not None]
    return ComparedSide(
        label=label,
        kind="run",
        step_p50=last.step_time_p50,
        step_p90=last.step_time_p90,
        throughput=last.throughput,
        flops_per_second=last.flops_per_second,
        mfu=last.mfu,
        data_wait=last.data_wait_fraction,
        host_peak=last.host_rss_peak,
        cuda_peak=last.cuda_max_allocated,
        findings=_shown(train[-1].findings),
        operators={op.name: op for op in operators},
        operators_from=operators_from,
        facts=_run_facts(report.get("run", {}), train, len(report.get("windows", []))),
        epochs=tuple(e.summary for e in train),
        compile_seconds=sum(s.seconds for s in stats) if stats else None,
        graph_breaks=sum(s.breaks for s in stats) if stats else None,
        recompiles=sum(s.recompiles for s in stats) if stats else None,
        trials=trials_of(report.get("run", {})),
    )


def trace_side(
    label: str, summary: TraceSummary, findings: Iterable[Finding], operators: Iterable[OperatorStat]
) -> ComparedSide:
    """A trace's side: its summary, the trace-level rules' findings and its operators."""
    busy = share(summary.device_busy, summary)
    return ComparedSide(
        label=label,
        kind="trace",
        step_p50=summary.step_time,
        data_wait=share(summary.dataloader_time, summary),
        findings=_shown(findings),
        operators={op.name: op for op in operators},
        operators_from=summary.window,
        facts=(
            ("trace", summary.window),
            ("steps", count(summary.steps)),
            ("device busy", "-" if busy is None else percent(busy)),
            ("operators per step", count(summary.ops_per_step)),
        ),
        compiled_share=share(summary.compiled_time, summary),
        guard_share=share(summary.guard_time, summary),
    )


def _shown(findings: Iterable[Finding]) -> dict[str, Finding]:
    """The warning and critical findings, by rule id (a comparison leaves the info ones out)."""
    return {f.id: f for f in findings if f.severity != "info"}


def _run_facts(run: Mapping[str, Any], train: Sequence[ReportEpoch], windows: int) -> tuple[tuple[str, str], ...]:
    def text(value: Any) -> str:
        return "-" if value is None or value == "" else str(value)

    loader = run.get("dataloaders", {}).get("train") if isinstance(run.get("dataloaders"), Mapping) else None
    settings = (
        ", ".join(
            f"{key}={loader.get(key)}" for key in ("num_workers", "pin_memory", "persistent_workers", "batch_size")
        )
        if isinstance(loader, Mapping)
        else None
    )
    device = " ".join(str(part) for part in (run.get("device"), run.get("device_name")) if part)
    return (
        ("device", text(device)),
        ("world size", text(run.get("world_size"))),
        ("precision", text(run.get("precision"))),
        ("strategy", text(run.get("strategy"))),
        ("torch", text(run.get("torch"))),
        ("lightning", text(run.get("lightning"))),
        ("train DataLoader", text(settings)),
        ("training epochs measured", count(sum(e.summary.epochs for e in train))),
        ("headline from", f"train {epoch_label(train[-1].summary)}"),
        ("profiler windows", count(windows)),
    )


# --- The headline metrics ------------------------------------------------------------------------------------


def _time(v: float) -> str:
    return duration_us(v * 1e6)


def _small_share(v: float) -> str:
    return percent(v, 1)  # as `analyze` shows the guard checks


def _rate(v: float) -> str:
    return f"{count(v)}/s"


NOISE_RATIO = 0.05
"""A relative change under 5% is the "same" (shown uncoloured, not as better or worse): it is within the
run-to-run noise of an unchanged program. Where the number comes from: this project's overhead benchmark
(docs/cost.md) ran the same Trainer in interleaved rounds, and the rounds' step times spread 0.95-1.12 of
their median; a GPU's clocks and a shared host move step times and operator totals by a few percent between
runs too. Used for every metric but shares and counts, and for operators' self times."""
NOISE_POINTS = 0.01
"""A share (data wait, MFU, compiled regions, guard checks) that moved by under one percentage point is the
"same": shares are shown as whole percentages rounded down (:func:`~lightning_perf.units.percent`), so a change
under a point cannot be read off the two values shown, and it moves the step by under 1% of it, within
:data:`NOISE_RATIO` of the step time."""
NOISE_US = 5.0
"""An operator whose self time per window moved by under 5 µs is the "same", whatever its ratio (11 µs ->
11.4 µs is not slower): less than the host's cost of one kernel launch or one eager operator's dispatch, 5-10 µs
(the ``launch_bound`` rule's figures in :mod:`lightning_perf.diagnose.thresholds`)."""
COUNT_NOISE = 0.0
"""Counts (graph breaks, recompiles) have no noise: one more recompile is one more."""


def noise(unit: str) -> float:
    """The change under which a metric of ``unit`` is the "same": in points for a share (a fraction, as
    :func:`difference` gives it), else relative (see :data:`NOISE_RATIO`, :data:`NOISE_POINTS`)."""
    return {"share": NOISE_POINTS, "count": COUNT_NOISE}.get(unit, NOISE_RATIO)


@dataclass(frozen=True)
class Metric:
    """One headline metric on both sides.

    Attributes:
        name: What it is, e.g. ``"step time p50"``.
        unit: The unit of its values as a chart's axis says it (``"s"``, ``"samples/s"``, ``"share"``, ...); a
            share's change is in percentage points, any other's relative.
        before, after: Its value on each side; ``None`` where unknown.
        lower_is_better: Which way is an improvement; ``None`` where neither way is.
        format: How one value reads.
    """

    name: str
    unit: str
    before: float | None
    after: float | None
    lower_is_better: bool | None
    format: Callable[[float], str]

    def text(self, value: float | None) -> str:
        """``value`` formatted, ``"-"`` where unknown."""
        return "-" if value is None else self.format(value)

    @property
    def delta(self) -> float | None:
        """The change (:func:`difference`): in points for a share, else ``after / before - 1``; ``None`` where
        not computed."""
        return difference(self.before, self.after, self.unit)

    @property
    def verdict(self) -> str | None:
        """``"better"``, ``"worse"`` or ``"same"`` (within the noise); ``None`` where not computed or neither way
        is better."""
        return verdict(self.delta, self.lower_is_better, noise(self.unit))

    @property
    def change(self) -> str:
        """The change as the table shows it, e.g. ``"-12.3% (better)"``, ``"+1.0 pp (worse)"``; empty where
        not computed."""
        return change_text(self.before, self.after, lower_is_better=self.lower_is_better, unit=self.unit)


def relative_change(before: float | None, after: float | None) -> float | None:
    """``after / before - 1``; ``None`` where either is unknown or ``before`` is zero."""
    if before is None or after is None or before == 0:
        return None
    return after / before - 1


def difference(before: float | None, after: float | None, unit: str) -> float | None:
    """How ``after`` differs from ``before``: for a share, ``after - before`` (percentage points, as a fraction:
    12% -> 13% is 0.01, not +8%); else :func:`relative_change`. ``None`` where not computed."""
    if unit != "share":
        return relative_change(before, after)
    return None if before is None or after is None else after - before


def verdict(delta: float | None, lower_is_better: bool | None, noise: float = NOISE_RATIO) -> str | None:
    """Whether a change of ``delta`` is ``"better"``, ``"worse"`` or the ``"same"`` (under ``noise``, in the
    units of ``delta``); ``None`` where there is no change computed or neither way is better."""
    if delta is None or lower_is_better is None:
        return None
    if abs(delta) + TOLERANCE < noise or not delta:  # a change of exactly the noise is one (0.13 - 0.12 < 0.01)
        return "same"
    return "better" if (delta < 0) == lower_is_better else "worse"


def change_text(
    before: float | None, after: float | None, *, lower_is_better: bool | None = True, unit: str = "s"
) -> str:
    """A change as text, ``"-12.3% (better)"``, a share's in points, ``"+1.0 pp (worse)"``, within the noise
    ``"+0.4% (same)"`` (no word where neither way is better); empty where not computed."""
    delta = difference(before, after, unit)
    if delta is None:
        return ""
    text = points(delta) if unit == "share" else change(delta)
    word = verdict(delta, lower_is_better, noise(unit))
    return text if word is None else f"{text} ({word})"


def headline_metrics(before: ComparedSide, after: ComparedSide) -> list[Metric]:
    """The metrics compared, in the order shown, with what ``torch.compile`` did where either side shows it:
    a run's compile time, graph breaks and recompiles over its training epochs (lower is better); a trace's
    share of the step in compiled regions (neither way is better: faster compiled code shrinks it too) and in
    guard checks (lower is better)."""

    def metric(name: str, unit: str, attr: str, lower: bool | None, fmt: Callable[[float], str]) -> Metric:
        return Metric(name, unit, getattr(before, attr), getattr(after, attr), lower, fmt)

    metrics = [
        metric("step time p50", "s", "step_p50", True, _time),
        metric("step time p90", "s", "step_p90", True, _time),
        metric("throughput", "samples/s", "throughput", False, _rate),
        metric("FLOP/s", "FLOP/s", "flops_per_second", False, flops_rate),
        metric("MFU", "share", "mfu", False, percent),
        metric("data wait", "share", "data_wait", True, percent),
        metric("host memory peak", "bytes", "host_peak", True, mib),
        metric("CUDA allocated peak", "bytes", "cuda_peak", True, mib),
    ]
    if before.compile_seconds is not None or after.compile_seconds is not None:
        metrics += [
            metric("compile time", "s", "compile_seconds", True, _time),
            metric("graph breaks", "count", "graph_breaks", True, count),
            metric("recompiles", "count", "recompiles", True, count),
        ]
    if before.compiled_share is not None or after.compiled_share is not None:
        metrics.append(metric("compiled regions", "share", "compiled_share", None, percent))
    if before.guard_share is not None or after.guard_share is not None:
        metrics.append(metric("guard checks", "share", "guard_share", True, _small_share))
    return metrics


# --- Findings and operators ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FindingChanges:
    """The findings (warning and critical) fixed, new and kept, each list by rule id.

    Attributes:
        fixed: Before's findings whose rule no longer fires after.
        new: After's findings whose rule did not fire before.
        kept: ``(before's, after's)`` finding of each rule that fires on both sides.
    """

    fixed: tuple[Finding, ...]
    new: tuple[Finding, ...]
    kept: tuple[tuple[Finding, Finding], ...]


def finding_changes(before: ComparedSide, after: ComparedSide) -> FindingChanges:
    """The findings fixed, new and kept from ``before`` to ``after``."""
    return FindingChanges(
        fixed=tuple(before.findings[i] for i in sorted(set(before.findings) - set(after.findings))),
        new=tuple(after.findings[i] for i in sorted(set(after.findings) - set(before.findings))),
        kept=tuple((before.findings[i], after.findings[i]) for i in sorted(set(before.findings) & set(after.findings))),
    )


def kept_label(before: Finding, after: Finding) -> str:
    """A kept finding's id, with its change of severity where it changed: ``"x (critical -> warning)"``."""
    return before.id if before.severity == after.severity else f"{before.id} ({before.severity} -> {after.severity})"


@dataclass(frozen=True)
class OperatorChange:
    """One operator's self time per window on both sides, in µs (0 on a side that did not run it).

    Attributes:
        name: The operator.
        before, after: Its self time (device time where a device was profiled, else CPU time).
        in_before, in_after: Whether the side's table has it.
    """

    name: str
    before: float
    after: float
    in_before: bool = True
    in_after: bool = True

    @property
    def delta(self) -> float:
        """``after - before``, in µs: negative where it got faster."""
        return self.after - self.before

    @property
    def same(self) -> bool:
        """Whether the change is within the noise: under :data:`NOISE_US`, or under :data:`NOISE_RATIO` of
        the time before (an operator on both sides)."""
        if abs(self.delta) < NOISE_US:
            return True
        return self.in_before and self.in_after and abs(self.delta) + TOLERANCE < NOISE_RATIO * self.before

    @property
    def verdict(self) -> str:
        """``"better"`` (faster), ``"worse"`` (slower) or ``"same"`` (within the noise)."""
        return "same" if self.same else "better" if self.delta < 0 else "worse"

    @property
    def word(self) -> str:
        """How the change reads: ``"new"``, ``"gone"``, else ``"faster"``, ``"slower"`` or ``"same"``."""
        if not self.in_before or not self.in_after:
            return "new" if not self.in_before else "gone"
        return {"better": "faster", "worse": "slower"}.get(self.verdict, "same")


def operator_time(op: OperatorStat) -> float:
    """An operator's self time: on the device where a device ran it, else on the CPU (µs)."""
    return op.self_device_time if op.self_device_time else op.self_cpu_time


def operator_changes(before: ComparedSide, after: ComparedSide) -> list[OperatorChange]:
    """Every operator of either side, the largest change of self time first (ties by name)."""
    changes = [
        OperatorChange(
            name=name,
            before=operator_time(before.operators[name]) if name in before.operators else 0.0,
            after=operator_time(after.operators[name]) if name in after.operators else 0.0,
            in_before=name in before.operators,
            in_after=name in after.operators,
        )
        for name in set(before.operators) | set(after.operators)
    ]
    return sorted(changes, key=lambda c: (-abs(c.delta), c.name))


def operator_clock(before: ComparedSide, after: ComparedSide) -> str:
    """Which clock the operators' self times are on: ``"device"`` where either side profiled a device."""
    sides = (*before.operators.values(), *after.operators.values())
    return "device" if any(op.self_device_time for op in sides) else "CPU"
