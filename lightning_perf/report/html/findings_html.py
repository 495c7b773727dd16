"""
Findings on a page
==================

A run's findings, most severe first, each with its evidence and advice and a link to the section of the
window that shows it. A rule that fires in many epochs is one entry (:func:`grouped`): its latest finding,
with the epochs it fired in as ranges (``"epochs 0-5, 9"``, at most :data:`MAX_EPOCH_RANGES` of them), so the
list is as long as the rules that fired, not as the run. Formatting only: the rules decide.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lightning_perf.diagnose.model import SEVERITIES, Finding
from lightning_perf.diagnose.registry import rule_explanation
from lightning_perf.report.findings import docs_section
from lightning_perf.report.html.document import Cell, Section, esc, table
from lightning_perf.trial_records import AdviceTrial
from lightning_perf.units import count, ms, plural, seconds_or_ms, size, times

MAX_EPOCH_RANGES = 12
"""Epoch ranges named per finding (a rule firing every other epoch of a long run would name hundreds); the
rest are counted."""
STAGE_ORDER = ("train", "validate", "test", "predict")
_CODE = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class FindingGroup:
    """One rule's findings in one stage.

    Attributes:
        latest: Its finding in the latest epoch it fired in.
        epochs: The epochs it fired in, ascending: each of a record of short epochs measured together.
    """

    latest: Finding
    epochs: tuple[int, ...]


def _stage_rank(stage: str) -> int:
    return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)


def grouped(findings: Iterable[Finding], spans: Mapping[tuple[str, int], int] | None = None) -> list[FindingGroup]:
    """``findings`` grouped by stage and rule, most severe first (by the latest finding's severity), then by
    stage (train, validate, test, predict), then by how many epochs the rule fired in (most first), then id.
    ``spans``: the epochs of each record of several, by ``(stage, epoch)`` (:attr:`~lightning_perf.records.
    EpochSummary.epochs`): a finding of such a record fired in each of them."""
    latest: dict[tuple[str, str], Finding] = {}
    epochs: dict[tuple[str, str], set[int]] = {}
    spans = spans or {}
    for f in findings:
        key = (f.stage, f.id)
        before = latest.get(key)
        if before is None or f.epoch >= before.epoch:
            latest[key] = f
        first = f.epoch - spans.get((f.stage, f.epoch), 1) + 1
        epochs.setdefault(key, set()).update(range(first, f.epoch + 1))
    groups = [FindingGroup(latest[key], tuple(sorted(epochs[key]))) for key in latest]
    return sorted(
        groups,
        key=lambda g: (
            -SEVERITIES.index(g.latest.severity),
            _stage_rank(g.latest.stage),
            -len(g.epochs),
            g.latest.id,
        ),
    )


def epoch_ranges(epochs: Sequence[int], limit: int = MAX_EPOCH_RANGES) -> str:
    """Ascending epochs as ranges: ``[0, 1, 2, 5]`` -> ``"epochs 0-2, 5"``; ``[3]`` -> ``"epoch 3"``; beyond
    ``limit`` ranges, the first ones and a count of the rest."""
    ranges: list[tuple[int, int]] = []
    for e in epochs:
        if ranges and e == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], e)
        else:
            ranges.append((e, e))
    names = [str(a) if a == b else f"{a}-{b}" for a, b in ranges]
    if len(epochs) == 1:
        return f"epoch {names[0]}"
    text = ", ".join(names[:limit])
    if len(names) > limit:
        text += f" and {count(len(names) - limit)} more ranges ({plural(len(epochs), 'epoch')} in all)"
    return f"epochs {text}"


def rich_text(text: str) -> str:
    """A finding's text, escaped, with its ```code``` spans as ``<code>``."""
    return _CODE.sub(r"<code>\1</code>", esc(text))


def finding_html(
    finding: Finding,
    *,
    where: str = "",
    anchors: Mapping[str, str] | None = None,
    trial: AdviceTrial | None = None,
) -> str:
    """One finding as a block: severity, title, id, ``where`` (e.g. its stage and epochs) and its window (a
    link where ``anchors`` maps the window's name to a section id on the page), then evidence and advice, the
    ``trial`` of its advice where one was made (:func:`trial_html`), and the documentation's section that explains
    it (:func:`~lightning_perf.report.findings.docs_section`)."""
    head = [f'<span class="severity">{esc(finding.severity)}</span><strong>{rich_text(finding.title)}</strong>']
    head.append(f"<code>{esc(finding.id)}</code>")
    if where:
        head.append(esc(where))
    if finding.window:
        anchor = (anchors or {}).get(finding.window)
        name = f"<code>{esc(finding.window)}</code>"
        head.append(f'shown by window <a href="#{esc(anchor)}">{name}</a>' if anchor else f"window {name}")
    return (
        f'<div class="finding {esc(finding.severity)}"><p>{" · ".join(head)}</p>'
        f"<p><b>Evidence:</b> {rich_text(finding.evidence)}</p>"
        f"<p><b>Advice:</b> {rich_text(finding.advice)}</p>"
        f"{trial_html(trial) if trial is not None else ''}{_explained(finding.id)}</div>"
    )


def trial_html(trial: AdviceTrial) -> str:
    """The record of a finding's advice tried on the run (issue 48): the setting, both medians, the ratio and its
    spread, what was timed and what the trial cost, and a step's peak memory with each where it was measured; or
    why it was not tried."""
    if trial.untried is not None or trial.ratio is None or trial.current is None or trial.advised is None:
        return (
            f'<p class="note"><b>Not tried:</b> <code>{esc(trial.setting)}</code>: {rich_text(trial.untried or "")}</p>'
        )
    spread = "-" if trial.spread is None else f"{times(trial.spread[0])}-{times(trial.spread[1])}"
    row = [
        Cell(f"<code>{esc(trial.setting)}</code>", html=True),
        Cell(ms(trial.current), num=True),
        Cell(ms(trial.advised), num=True),
        Cell(times(trial.ratio), num=True),
        Cell(spread, num=True),
        Cell(f"{count(trial.batches)} x {count(trial.repetitions)}", num=True),
        Cell(seconds_or_ms(trial.seconds), num=True),
    ]
    headers = ["tried", "now", "with it", "gain", "spread", "timed x repetitions", "cost"]
    memory = (
        f"<p>A step's peak memory: {esc(size(trial.current_peak))} now, {esc(size(trial.advised_peak))} with it.</p>"
        if trial.current_peak is not None and trial.advised_peak is not None
        else ""
    )
    return "<p><b>Tried on this run:</b></p>" + table(headers, [row], numeric=[False, *[True] * 6]) + memory


def _explained(rule_id: str) -> str:
    """A finding's line to its rule's explanation: on this page (:func:`about_findings`), and in the documentation."""
    here = ""
    if rule_explanation(rule_id) is not None:
        here = f'<a href="#{esc(about_anchor(rule_id))}">what this rule measures</a> · '
    return f'<p class="docs">{here}explained in the documentation: <code>{esc(docs_section(rule_id))}</code></p>'


def about_anchor(rule_id: str) -> str:
    """The id of a rule's entry in :func:`about_findings`."""
    return f"about-{rule_id}"


def about_findings(findings: Iterable[Finding]) -> Section | None:
    """The page's "About these findings": for each rule among ``findings``, in the order first met, what it
    measures (its first line and notes, the same text as the documentation site's catalogue: see
    :func:`~lightning_perf.diagnose.registry.rule_explanation`), so that the page explains itself offline;
    ``None`` where no finding has such a rule."""
    entries = []
    for rule_id in dict.fromkeys(f.id for f in findings):
        if (explanation := rule_explanation(rule_id)) is None:
            continue
        summary, notes = explanation
        items = "".join(f"<li>{rich_text(note)}</li>" for note in notes)
        entries.append(
            f'<div id="{esc(about_anchor(rule_id))}"><h3><code>{esc(rule_id)}</code>: {rich_text(summary)}</h3>'
            + (f"<ol>{items}</ol>" if items else "")
            + f'<p class="docs">More, with its thresholds and their sources: <code>{esc(docs_section(rule_id))}</code>'
            " (the documentation site; <code>make docs</code> builds it offline).</p></div>"
        )
    return Section("about-findings", "About these findings", "".join(entries)) if entries else None


def findings_html(
    groups: Sequence[FindingGroup],
    *,
    anchors: Mapping[str, str] | None = None,
    latest_epochs: Mapping[str, int] | None = None,
    clean: str = "No bottleneck found.",
    trials: Mapping[str, AdviceTrial] | None = None,
) -> str:
    """The grouped findings, one block each (``clean`` where there are none). ``latest_epochs``: each stage's
    latest epoch, to say of a finding that it no longer fires."""
    if not groups:
        return f'<p class="note">{esc(clean)}</p>'
    blocks = []
    for g in groups:
        f = g.latest
        where = f"{f.stage}, {epoch_ranges(g.epochs)}"
        latest = (latest_epochs or {}).get(f.stage)
        if latest is not None and f.epoch < latest:
            where += f" (not in the latest, {latest})"
        trial = (trials or {}).get(f.id) if f.stage == "train" else None
        blocks.append(finding_html(f, where=where, anchors=anchors, trial=trial))
    return "".join(blocks)


def severity_counts(groups: Sequence[FindingGroup]) -> str:
    """``"2 critical, 1 warning, 3 info"`` over the groups (no zero counts); ``""`` for none."""
    counts = {s: sum(1 for g in groups if g.latest.severity == s) for s in reversed(SEVERITIES)}
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n)
