"""What ``compare`` computes, once for its text and its page: changes and their direction, findings fixed, new
and kept, operator changes, and a run's side read off its report."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_perf.diagnose.model import Finding
from lightning_perf.records import CompileStats, OperatorStat
from lightning_perf.report.comparison import (
    NOISE_POINTS,
    NOISE_RATIO,
    NOISE_US,
    ComparedSide,
    Metric,
    change_text,
    finding_changes,
    headline_metrics,
    kept_label,
    noise,
    operator_changes,
    operator_clock,
    run_side,
    verdict,
)
from lightning_perf.report.json_report import report_dict
from lightning_perf.summarize.steps import summarize_epoch


@pytest.mark.parametrize(
    ("before", "after", "lower_is_better", "unit", "text", "word"),
    [
        (0.1, 0.08, True, "s", "-20.0% (better)", "better"),  # a step time that fell
        (100.0, 80.0, False, "samples/s", "-20.0% (worse)", "worse"),  # a throughput that fell
        (0.5, 0.5, True, "s", "+0.0% (same)", "same"),
        # Within run-to-run noise (under NOISE_RATIO, 5%): the same, not better or worse; 5% itself is a change.
        (0.1, 0.104, True, "s", "+4.0% (same)", "same"),
        (100.0, 96.0, False, "samples/s", "-4.0% (same)", "same"),
        (0.1, 0.105, True, "s", "+5.0% (worse)", "worse"),
        # A share's change is in percentage points (12% -> 13% is +1.0 pp, not +8.3%), the same under 1 pp.
        (0.12, 0.13, True, "share", "+1.0 pp (worse)", "worse"),
        (0.11, 0.10, True, "share", "-1.0 pp (better)", "better"),  # 0.10 - 0.11 is a hair under 0.01
        (0.12, 0.125, True, "share", "+0.5 pp (same)", "same"),
        (0.40, 0.31, False, "share", "-9.0 pp (worse)", "worse"),  # MFU
        (0.2, 0.3, None, "share", "+10.0 pp", None),  # compiled regions: neither way is better
        (0.0, 0.3, True, "share", "+30.0 pp (worse)", "worse"),  # a share from zero has a change
        (20, 21, True, "count", "+5.0% (worse)", "worse"),  # a count has no noise: one more recompile is one more
        (None, 0.3, True, "s", "", None),  # unknown before
        (0.0, 0.3, True, "s", "", None),  # no relative change from zero
    ],
)
def test_a_change_and_its_direction(before, after, lower_is_better, unit, text, word):
    assert change_text(before, after, lower_is_better=lower_is_better, unit=unit) == text
    metric = Metric("x", unit, before, after, lower_is_better, str)
    assert (metric.change, metric.verdict) == (text, word)


def test_noise_thresholds_are_what_their_documentation_says():
    assert (NOISE_RATIO, NOISE_POINTS, NOISE_US) == (0.05, 0.01, 5.0)
    assert [noise(unit) for unit in ("s", "samples/s", "bytes", "share", "count")] == [0.05, 0.05, 0.05, 0.01, 0.0]
    assert verdict(0.049, True) == "same" and verdict(-0.05, True) == "better" and verdict(0.0, None) is None


def _finding(rule: str, severity) -> Finding:
    return Finding(id=rule, severity=severity, title=rule, evidence="", advice="", stage="train", epoch=0)


def _side(findings=(), operators=(), **values) -> ComparedSide:
    return ComparedSide(
        label="x",
        kind="trace",
        step_p50=values.pop("step_p50", 0.1),
        findings={f.id: f for f in findings},
        operators={op.name: op for op in operators},
        **values,
    )


def test_findings_fixed_new_and_kept_with_their_severities():
    before = _side([_finding("a", "critical"), _finding("b", "warning"), _finding("c", "warning")])
    after = _side([_finding("a", "warning"), _finding("c", "warning"), _finding("d", "critical")])
    changes = finding_changes(before, after)
    assert [f.id for f in changes.fixed] == ["b"] and [f.id for f in changes.new] == ["d"]
    assert [kept_label(b, a) for b, a in changes.kept] == ["a (critical -> warning)", "c"]


def test_operator_changes_largest_first_with_the_side_that_lacks_one():
    def op(name, cpu, device=None):
        return OperatorStat(name=name, calls=1, self_cpu_time=cpu, cpu_time=cpu, self_device_time=device)

    before = _side(operators=[op("mm", 10.0, 500.0), op("gone", 30.0), op("same", 5.0), op("add", 11.0)])
    after = _side(operators=[op("mm", 10.0, 200.0), op("new", 40.0), op("same", 5.0), op("add", 11.4)])
    changes = operator_changes(before, after)
    assert [(c.name, c.before, c.after, c.in_before, c.in_after, c.word, c.verdict) for c in changes] == [
        ("mm", 500.0, 200.0, True, True, "faster", "better"),  # device time where the device ran it
        ("new", 0.0, 40.0, False, True, "new", "worse"),
        ("gone", 30.0, 0.0, True, False, "gone", "better"),
        ("add", 11.0, 11.4, True, True, "same", "same"),  # 0.4 us: under NOISE_US, whatever its ratio
        ("same", 5.0, 5.0, True, True, "same", "same"),
    ]
    assert operator_clock(before, after) == "device"
    assert operator_clock(_side(operators=[op("x", 1.0)]), _side()) == "CPU"


@pytest.mark.parametrize(
    ("before", "after", "word", "verdict"),
    [
        (1000.0, 1040.0, "same", "same"),  # 4%: under NOISE_RATIO
        (1000.0, 960.0, "same", "same"),
        (1000.0, 1050.0, "slower", "worse"),  # 5% is a change
        (1000.0, 900.0, "faster", "better"),
        (11.0, 11.0, "same", "same"),  # the trial's "+0 us (slower)"
        (20.0, 24.9, "same", "same"),  # +25% but under 5 us
        (20.0, 25.0, "slower", "worse"),
        (None, 3.0, "new", "same"),  # a new operator of a few us is noise too
        (None, 3000.0, "new", "worse"),
        (3000.0, None, "gone", "better"),
    ],
)
def test_an_operator_s_change_within_the_noise_is_the_same(before, after, word, verdict):
    def ops(time):
        return [] if time is None else [OperatorStat(name="op", calls=1, self_cpu_time=time, cpu_time=time)]

    [c] = operator_changes(_side(operators=ops(before)), _side(operators=ops(after)))
    assert (c.word, c.verdict) == (word, verdict)


def test_a_run_s_side_is_its_last_measured_training_epoch():
    epochs = [
        summarize_epoch(stage="train", epoch=e, data_wait=[0.01] * 4, compute=[0.1 * (e + 1)] * 4, batch_sizes=[8] * 4)
        for e in range(3)
    ]
    validation = summarize_epoch(stage="validate", epoch=0, data_wait=[0.0], compute=[0.5], batch_sizes=[8])
    compiled = CompileStats(graphs=2, breaks=1, recompiles=0, limit_reached=False, seconds=3.0)
    report = report_dict(
        generated_by="test",
        run={"device": "cpu", "precision": "32-true"},
        epochs=[*epochs, validation],
        windows=[],
        compile={("train", 0): compiled, ("train", 1): dataclasses.replace(compiled, seconds=1.0, recompiles=2)},
    )
    side = run_side("run", report)
    assert side is not None and side.step_p50 == pytest.approx(0.31) and [e.epoch for e in side.epochs] == [0, 1, 2]
    assert (side.compile_seconds, side.graph_breaks, side.recompiles) == (4.0, 2, 2)  # over the training epochs
    assert ("precision", "32-true") in side.facts and ("headline from", "train epoch 2") in side.facts
    names = [m.name for m in headline_metrics(side, side)]
    assert names[-3:] == ["compile time", "graph breaks", "recompiles"] and "guard checks" not in names
    assert run_side("run", report_dict(generated_by="test", run={}, epochs=[validation], windows=[])) is None
