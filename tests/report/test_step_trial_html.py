"""The page's record of a step trial: its peak memory with each setting, where it was measured."""

from __future__ import annotations

from lightning_perf.report.html.findings_html import trial_html
from lightning_perf.trial_records import AdviceTrial

GiB = 2**30


def record(**kw) -> AdviceTrial:
    values = dict(current=0.028, advised=0.0117, ratio=2.4, spread=(2.2, 2.6), batches=9, repetitions=3, seconds=0.6)
    return AdviceTrial(rule="precision", setting='precision="bf16-mixed"', epoch=0, **{**values, **kw})


def test_a_measured_peak_shows_beside_the_times_and_an_unmeasured_one_does_not():
    page = trial_html(record(current_peak=6 * GiB, advised_peak=3 * GiB))
    assert "<b>Tried on this run:</b>" in page and "2.40x" in page
    assert "A step's peak memory: 6.0 GiB now, 3.0 GiB with it." in page, page
    assert "peak memory" not in trial_html(record())
