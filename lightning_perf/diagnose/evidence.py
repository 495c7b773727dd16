"""
Too little evidence
===================

No loud finding from too few batches. A smoke run (``Trainer(fast_dev_run=True)``) measures one batch per
stage, whose data wait is the DataLoader's start-up: on Lightning's BoringModel it read "waits for data 36%",
critical. A stage's epoch of fewer than ``Thresholds.evidence_batches`` measured batches is judged together
with its latest epochs (:func:`lightning_perf.diagnosis_context.epoch_context`); where even that is fewer,
the findings of the rules that judge the epoch's own batches (:data:`BATCH_RULES`) are information only, their
evidence saying how few batches they rest on. The rules that judge a profiler window's trace are left alone:
a window records a few steps by design, and a smoke run opens none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.thresholds import Thresholds

# The rules whose measure comes from the epoch's batches (the always-on clocks), not from a window's trace.
BATCH_RULES = frozenset({"cpu_contention", "dataloader_bound", "step_time_unstable", "cpu_threads"})


def from_too_few_batches(findings: Sequence[Finding], ctx: StageEpoch, t: Thresholds) -> list[Finding]:
    """``findings``, the time-share ones made information where the epoch (pooled with its latest epochs) has
    fewer than ``t.evidence_batches`` measured batches."""
    measured = ctx.epoch.measured_batches
    if measured >= t.evidence_batches:
        return list(findings)
    batches = f"{measured} measured batch{'' if measured == 1 else 'es'}" + (
        f" of the last {ctx.pooled_epochs} epochs" if ctx.pooled_epochs > 1 else ""
    )
    note = f"from {batches} only (a warning needs {t.evidence_batches}); "
    return [
        dataclasses.replace(f, severity="info", evidence=note + f.evidence)
        if f.id in BATCH_RULES and f.severity != "info"
        else f
        for f in findings
    ]
