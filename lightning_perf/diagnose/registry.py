"""
Rule registry
=============

Every bottleneck rule, by id, in catalogue order, and :func:`diagnose`, which runs them all on one stage's
epoch: first the :data:`RULES`, each on the epoch alone, then the :data:`SUMMARY_RULES`, which also read the
others' findings of the epoch (``low_mfu`` names the findings that explain a low MFU). The catalogue (what
each rule measures, its thresholds and why) is docs/findings.md, whose generated part comes from each rule's
docstring and from :mod:`~lightning_perf.diagnose.thresholds`: a rule added here needs both, and a section there.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from lightning_perf.diagnose.busy_machine import measured_while_busy, told
from lightning_perf.diagnose.contention import cpu_contention
from lightning_perf.diagnose.cpu_threads import cpu_threads
from lightning_perf.diagnose.evidence import from_too_few_batches
from lightning_perf.diagnose.model import SEVERITIES, Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import Rule, SummaryRule
from lightning_perf.diagnose.rules_compile import compile_graph_breaks, compile_recompiles, compile_time, compile_unused
from lightning_perf.diagnose.rules_compute import low_mfu
from lightning_perf.diagnose.rules_data import dataloader_bound, h2d_copy
from lightning_perf.diagnose.rules_device import device_idle, host_sync, launch_bound, precision
from lightning_perf.diagnose.rules_distributed import (
    communication_bound,
    fsdp_all_gathers,
    low_bus_bandwidth,
    rank_straggler,
    small_collectives,
)
from lightning_perf.diagnose.rules_memory import memory_breakdown, memory_growth, memory_pressure
from lightning_perf.diagnose.rules_step import framework_overhead, optimizer_heavy, validation_heavy
from lightning_perf.diagnose.rules_unstable import step_time_unstable
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.docstrings import summary_and_notes

__all__ = ["CROSS_RANK_RULES", "RULES", "RULE_IDS", "SUMMARY_RULES", "Rule", "SummaryRule", "diagnose"]

# Each rule's id is its function's name.
RULES: dict[str, Rule] = {
    rule.__name__: rule
    for rule in (
        cpu_contention,
        dataloader_bound,
        host_sync,
        device_idle,
        launch_bound,
        h2d_copy,
        precision,
        memory_pressure,
        memory_breakdown,
        memory_growth,
        optimizer_heavy,
        validation_heavy,
        framework_overhead,
        step_time_unstable,
        compile_graph_breaks,
        compile_recompiles,
        compile_time,
        compile_unused,
        communication_bound,
        small_collectives,
        low_bus_bandwidth,
        fsdp_all_gathers,
        rank_straggler,
        cpu_threads,
    )
}

#: The rules that read the findings of the RULES above for the same epoch; they run after them.
SUMMARY_RULES: dict[str, SummaryRule] = {rule.__name__: rule for rule in (low_mfu,)}

#: Every rule's id, in catalogue order: the :data:`RULES`, then the :data:`SUMMARY_RULES`.
RULE_IDS: tuple[str, ...] = (*RULES, *SUMMARY_RULES)

#: The rules that compare the ranks of a run (``StageEpoch.rank_step_times``): what ``lightning-perf analyze``
#: runs over a directory of one window's ranks, besides the rules it runs on each trace.
CROSS_RANK_RULES: tuple[str, ...] = (rank_straggler.__name__,)


def diagnose(
    ctx: StageEpoch,
    thresholds: Thresholds | None = None,
    *,
    on_error: Callable[[str, Exception], None] | None = None,
    rules: Collection[str] | None = None,
) -> list[Finding]:
    """Runs every rule (or the ``rules`` named) on one stage's epoch.

    Notes:
        1. The :data:`RULES` run first, each on ``ctx`` alone.
        2. On a busy machine (``cpu_contention`` fires), the time-share findings that waiting for a CPU may
           explain become information (:func:`~lightning_perf.diagnose.busy_machine.measured_while_busy`), and so
           do those from too few batches (:func:`~lightning_perf.diagnose.evidence.from_too_few_batches`).
        3. Then the :data:`SUMMARY_RULES`, each given the findings of step 1 in catalogue order. When one of
           them is among ``rules``, every rule of step 1 runs for it, so that a summary rule always sees the
           whole epoch: their findings are returned only when named too, their errors reach ``on_error``.
        4. ``cpu_contention`` comes first: what it says changes how to read the rest. Its advice names the
           findings the busy machine made information, and those that keep their severity
           (:func:`~lightning_perf.diagnose.busy_machine.told`).

    Args:
        ctx: The stage's epoch, its history, trace windows and run facts.
        thresholds: The rules' thresholds; the defaults when ``None``.
        on_error: Called with the rule's id and the exception when a rule raises; the rule is skipped either
            way, so one broken rule never hides the others' findings.
        rules: The ids of the rules to run (e.g. :data:`CROSS_RANK_RULES`); every rule when ``None``.

    Returns:
        The findings: ``cpu_contention``'s, then the others most severe first (critical, warning, info), then
        in catalogue order.

    Raises:
        ValueError: ``rules`` names a rule that does not exist.
    """
    catalogue = (*RULES, *SUMMARY_RULES)
    if rules is not None and (unknown := sorted(set(rules) - set(catalogue))):
        raise ValueError(f"no rule named {', '.join(map(repr, unknown))}; the rules are: {', '.join(catalogue)}")
    thresholds = thresholds if thresholds is not None else Thresholds()
    wanted = set(catalogue if rules is None else rules)
    summaries = [rule_id for rule_id in SUMMARY_RULES if rule_id in wanted]
    findings: list[tuple[int, int, Finding]] = []
    found: list[Finding] = []  # step 1's findings, for the summary rules
    for order, (rule_id, rule) in enumerate(RULES.items()):
        if rule_id in wanted or summaries:
            results = _run(rule_id, on_error, rule, ctx, thresholds)
            judged = from_too_few_batches(measured_while_busy(results, ctx, thresholds), ctx, thresholds)
            found.extend(judged)
            if rule_id in wanted:
                findings.extend((_rank(f), order, f) for f in judged)
    for order, rule_id in enumerate(summaries, start=len(RULES)):
        results = _run(rule_id, on_error, SUMMARY_RULES[rule_id], ctx, thresholds, tuple(found))
        findings.extend((_rank(f), order, f) for f in results)
    findings.sort(key=lambda item: item[:2])
    return told([f for _, _, f in findings])


def _rank(f: Finding) -> int:
    """The sort rank of a finding: ``cpu_contention`` first, then by severity, most severe first."""
    return -len(SEVERITIES) if f.id == cpu_contention.__name__ else -SEVERITIES.index(f.severity)


def _run(
    rule_id: str,
    on_error: Callable[[str, Exception], None] | None,
    rule: Callable[..., Finding | Sequence[Finding] | None],
    *args: object,
) -> Sequence[Finding]:
    """``rule(*args)``'s findings as a sequence; none when it raises (reported to ``on_error``)."""
    try:
        result = rule(*args)
    except Exception as err:  # a rule's bug must not stop the others or the training
        if on_error is not None:
            on_error(rule_id, err)
        return ()
    return () if result is None else (result,) if isinstance(result, Finding) else result


def rule_explanation(rule_id: str) -> tuple[str, list[str]] | None:
    """What a rule measures: its docstring's first line and its ``Notes:``
    (:func:`~lightning_perf.docstrings.summary_and_notes`); ``None`` for no such rule. One text for the
    documentation site's catalogue and the report page's "About these findings"."""
    rule = RULES.get(rule_id) or SUMMARY_RULES.get(rule_id)
    return None if rule is None else summary_and_notes(rule.__doc__)
