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
import re
from collections.abc import Sequence

from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.thresholds import Thresholds

# The rules whose measure comes from the epoch's batches (the always-on clocks), not from a window's trace. Not
# rank_straggler: `lightning-perf analyze` judges it on the ranks' traces, a window's few steps each.
BATCH_RULES = frozenset({"cpu_contention", "dataloader_bound", "step_time_unstable", "cpu_threads"})
# ... and those that judge every batch's phases (collect.phases) where no window shows them: a finding without a
# window came from the batches' clocks (optimizer_heavy, framework_overhead), one with a window from its trace.
PHASE_RULES = frozenset({"optimizer_heavy", "framework_overhead"})
# ... and those that count every batch of the epoch, the profiled ones at the mean of the others: validation_heavy's
# training time (fast_dev_run: one training batch and one validation batch warned in 1 of 6 runs).
EVERY_BATCH_RULES = frozenset({"validation_heavy"})
# The guard's note, opening the evidence of a finding it made information; held_back() reads it back.
_NOTE = "from {batches} only (a warning needs {needed}); "
_HELD = re.compile(r"from (?P<batches>.+?) only \(a warning needs \d+\); ")


def from_too_few_batches(findings: Sequence[Finding], ctx: StageEpoch, t: Thresholds) -> list[Finding]:
    """``findings``, the time-share ones made information where the epoch (pooled with its latest epochs) has
    fewer than ``t.evidence_batches`` measured batches (:data:`BATCH_RULES`), or batches (:data:`EVERY_BATCH_RULES`)."""
    counts = {"measured batch": ctx.epoch.measured_batches, "batch": ctx.epoch.batches}
    judged = []
    for f in findings:
        batch_judged = f.id in BATCH_RULES or (f.id in PHASE_RULES and f.window is None)
        kind = "measured batch" if batch_judged else "batch" if f.id in EVERY_BATCH_RULES else None
        if kind is None or f.severity == "info" or counts[kind] >= t.evidence_batches:
            judged.append(f)
            continue
        note = _NOTE.format(batches=_batches(counts[kind], kind, ctx), needed=t.evidence_batches)
        judged.append(dataclasses.replace(f, severity="info", evidence=note + f.evidence))
    return judged


def too_little(ctx: StageEpoch, t: Thresholds) -> str | None:
    """``"1 measured batch"`` where the epoch (pooled with its latest epochs) has fewer than
    ``t.evidence_batches`` measured batches, so that the rules of :data:`BATCH_RULES` could not warn; else
    ``None``. The console says so instead of a clean result, whether or not any rule fired."""
    n = ctx.epoch.measured_batches
    return _batches(n, "measured batch", ctx) if n < t.evidence_batches else None


def _batches(n: int, kind: str, ctx: StageEpoch) -> str:
    """``"1 measured batch"``, ``"5 batches of the last 3 epochs"``: ``n`` of ``kind``, and the epochs pooled."""
    pooled = f" of the last {ctx.pooled_epochs} epochs" if ctx.pooled_epochs > 1 else ""
    return f"{n} {kind}{'' if n == 1 else 'es'}{pooled}"


def held_back(findings: Sequence[Finding]) -> str | None:
    """The batches that :func:`from_too_few_batches` found too few (``"1 measured batch"``), where it made any of
    ``findings`` information; else ``None``."""
    for f in findings:
        if f.severity == "info" and (match := _HELD.match(f.evidence)):
            return match["batches"]
    return None
