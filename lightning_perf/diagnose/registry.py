"""
Rule registry
=============

Every bottleneck rule, by id, in catalogue order, and :func:`diagnose`, which runs them all on one stage's
epoch. The catalogue (what each rule measures, its thresholds and why) is in README.md, "Bottleneck rules".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from lightning_perf.diagnose.model import SEVERITIES, Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import Rule
from lightning_perf.diagnose.rules_data import dataloader_bound, h2d_copy
from lightning_perf.diagnose.rules_device import cpu_threads, device_idle, host_sync, launch_bound, precision
from lightning_perf.diagnose.rules_distributed import communication_bound, rank_straggler
from lightning_perf.diagnose.rules_memory import memory_growth, memory_pressure
from lightning_perf.diagnose.rules_step import framework_overhead, optimizer_heavy, step_time_unstable, validation_heavy
from lightning_perf.diagnose.thresholds import Thresholds

__all__ = ["CROSS_RANK_RULES", "RULES", "Rule", "diagnose"]

# Each rule's id is its function's name.
RULES: dict[str, Rule] = {
    rule.__name__: rule
    for rule in (
        dataloader_bound,
        host_sync,
        device_idle,
        launch_bound,
        h2d_copy,
        precision,
        memory_pressure,
        memory_growth,
        optimizer_heavy,
        validation_heavy,
        framework_overhead,
        step_time_unstable,
        communication_bound,
        rank_straggler,
        cpu_threads,
    )
}

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

    Args:
        ctx: The stage's epoch, its history, trace windows and run facts.
        thresholds: The rules' thresholds; the defaults when ``None``.
        on_error: Called with the rule's id and the exception when a rule raises; the rule is skipped either
            way, so one broken rule never hides the others' findings.
        rules: The ids of the rules to run (e.g. :data:`CROSS_RANK_RULES`); every rule when ``None``.

    Returns:
        The findings, most severe first (critical, warning, info), then in catalogue order.

    Raises:
        ValueError: ``rules`` names a rule that does not exist.
    """
    if rules is not None and (unknown := sorted(set(rules) - RULES.keys())):
        raise ValueError(f"no rule named {', '.join(map(repr, unknown))}; the rules are: {', '.join(RULES)}")
    thresholds = thresholds if thresholds is not None else Thresholds()
    findings: list[tuple[int, int, Finding]] = []
    for order, (rule_id, rule) in enumerate(RULES.items()):
        if rules is not None and rule_id not in rules:
            continue
        try:
            result = rule(ctx, thresholds)
        except Exception as err:  # a rule's bug must not stop the others or the training
            if on_error is not None:
                on_error(rule_id, err)
            continue
        results: Sequence[Finding] = () if result is None else (result,) if isinstance(result, Finding) else result
        findings.extend((-SEVERITIES.index(f.severity), order, f) for f in results)
    findings.sort(key=lambda item: item[:2])
    return [f for _, _, f in findings]
