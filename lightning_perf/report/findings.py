"""
Findings, formatted
===================

An epoch's findings as a compact console table (printed by the callback at an epoch's end and by the
command line, :func:`finding_lines`) and as a markdown block for TensorBoard, under the epoch's headline and,
where ``torch.compile`` compiled something in it, its compile line (:func:`compile_line`). Formatting only:
what is a finding, and how bad, the rules decide.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from collections.abc import Callable, Container, Sequence

from lightning_perf.diagnose.evidence import held_back
from lightning_perf.diagnose.model import SEVERITIES, Finding
from lightning_perf.records import PHASES, CompileStats, EpochSummary, RankSummary
from lightning_perf.units import count, duration, flops_rate, mib, ms, percent, plural

CLEAN = "no bottleneck found"
FINDINGS_TAG = "perf/findings/{stage}"  # TensorBoard's text: an epoch's findings, and its per-rank table
RANKS_TAG = "perf/ranks/{stage}"

#: The page of the documentation site (``docs/``) with a section per rule, each anchored by its rule's id.
DOCS_FINDINGS = "docs/findings.md"
# Rules that share the section of the first rule its heading names (the anchor is that rule's id).
_SHARED_SECTION = dict.fromkeys(("compile_recompiles", "compile_time", "compile_unused"), "compile_graph_breaks")
# Findings with no section of their own on that page (the OOM diagnosis has its own on the memory page).
_OTHER_PAGES = {"out_of_memory": "docs/memory.md#out_of_memory"}
_SHOWN = {0: (), 1: ("warning", "critical"), 2: ("info", "warning", "critical")}

# A finding the console showed is shown again at a later epoch only when it changed: one of the numbers in its
# title moved by at least this share of the larger value (data wait 29% -> 37% is a change, 29% -> 31% is not:
# epoch-to-epoch noise of a steady run), or its severity moved by two levels (info <-> critical). A one-level
# flip with numbers that barely moved is a value wobbling at a threshold (27-33% around dataloader_bound's
# 30%: Lightning's DQN example flipped 66-88 times in 300 epochs), not news. The report and TensorBoard keep
# every epoch's findings either way.
MATERIAL_CHANGE = 0.2
# ... and by more than the stage's own variation: NOISE_SIGMAS standard deviations of that number over the
# finding's last NOISE_EPOCHS epochs (Shewhart's control limits: a value beyond 3 sigma of a process's own spread
# is a change in the process, not its noise). A program whose 13-batch epochs swing between 13% and 47% of data
# wait (sigma about 10 points) re-printed its dataloader_bound 34 times in 50 epochs with the fixed 20% alone.
NOISE_SIGMAS = 3.0
# How many of a finding's epochs its variation is measured over (a bounded window: constant work per epoch),
# and how many it needs before its variation counts (fewer: the fixed share alone).
NOISE_EPOCHS = 20
NOISE_MIN_EPOCHS = 5
# Findings shown again only for their severity, not their title's numbers: how busy the machine is moves with other
# people's work, not the program's (cpu_contention swinging 61-78% was printed in full 50 times in 300 epochs).
LEVEL_ONLY = frozenset({"cpu_contention"})
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _title_numbers(title: str) -> list[float]:
    return [float(n.replace(",", "")) for n in _NUMBER.findall(title)]


def _title_shape(title: str) -> str:
    """A title with its numbers taken out: what a finding says, apart from how much."""
    return _NUMBER.sub("#", title)


def changed(before: Finding, now: Finding, noise: Sequence[float] = ()) -> bool:
    """Whether ``now`` says something ``before`` (the same rule's finding at an earlier epoch) did not: a severity
    two levels apart, an ``info`` become a warning (the console hides info at ``verbose=1``; a warning flipping
    to critical at a threshold's edge is no news), or a title whose numbers moved materially.

    Args:
        before: What was shown.
        now: This epoch's finding.
        noise: For each number in the titles, its standard deviation over the finding's recent epochs (empty:
            unknown); a number must move by more than :data:`NOISE_SIGMAS` of it, as well as by
            :data:`MATERIAL_CHANGE` of the larger value.
    """
    if abs(SEVERITIES.index(before.severity) - SEVERITIES.index(now.severity)) > 1:
        return True
    if before.severity == "info" and now.severity != "info":  # the console hid it at verbose=1: not shown yet
        return True
    if now.id in LEVEL_ONLY:
        return False
    old, new = _title_numbers(before.title), _title_numbers(now.title)
    if len(old) != len(new):
        return True
    sigmas = list(noise) if len(noise) == len(new) else [0.0] * len(new)
    return any(
        abs(a - b) > max(MATERIAL_CHANGE * max(abs(a), abs(b)), NOISE_SIGMAS * sigma)
        for a, b, sigma in zip(old, new, sigmas, strict=True)
    )


class ShownFindings:
    """What the console showed of each stage's findings, so that a finding that persists or comes back unchanged
    is printed once, and again only when it :func:`changed` beyond the finding's own variation.

    Each way a rule words its finding (its title without the numbers: "step time unstable: p90 #x the median",
    "stalls every # batches") is remembered apart, for the whole run: a finding that comes and goes at its
    threshold, or swings between two wordings, is printed once in each and then named on the headline. Lightning's
    bug_report_model over 200 epochs of 4 batches printed 33 warnings this way when a finding absent for 3 epochs
    was forgotten; the report and TensorBoard keep every epoch's findings either way. Bounded: a rule words its
    findings in a few ways, and each keeps its last :data:`NOISE_EPOCHS` epochs' numbers.

    Example::

        shown = ShownFindings()
        fresh, unchanged = shown.split("train", findings)  # print ``fresh`` in full, name ``unchanged``
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, str], Finding] = {}  # what was shown, by stage, rule and wording
        self._recent: dict[tuple[str, str, str], deque[list[float]]] = {}  # its title's numbers, latest epochs

    def split(self, stage: str, findings: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
        """``(new or changed, unchanged)`` among a stage epoch's ``findings``, in their order; remembers what is
        shown."""
        fresh: list[Finding] = []
        unchanged: list[Finding] = []
        for f in findings:
            key = (stage, f.id, _title_shape(f.title))
            before = self._last.get(key)
            recent = self._recent.setdefault(key, deque(maxlen=NOISE_EPOCHS))
            numbers = _title_numbers(f.title)
            if before is None or changed(before, f, _spread(recent, len(numbers))):
                fresh.append(f)
                self._last[key] = f
            else:  # compared with what was shown, so that a slow drift still shows once it adds up
                unchanged.append(f)
            recent.append(numbers)
        return fresh, unchanged


def _spread(recent: Sequence[list[float]], n: int) -> list[float]:
    """Each of ``n`` title numbers' standard deviation over the ``recent`` epochs that had ``n`` numbers; empty
    with fewer than :data:`NOISE_MIN_EPOCHS` of them."""
    alike = [numbers for numbers in recent if len(numbers) == n]
    if len(alike) < NOISE_MIN_EPOCHS:
        return []
    return [statistics.pstdev(column) for column in zip(*alike, strict=True)]


def epoch_numbers(summary: EpochSummary) -> str:
    """``7``, or ``3-7`` for epochs measured together (:attr:`~lightning_perf.records.EpochSummary.epochs`)."""
    return f"{summary.epoch - summary.epochs + 1}-{summary.epoch}" if summary.epochs > 1 else str(summary.epoch)


def epoch_label(summary: EpochSummary) -> str:
    """``epoch 7``, or ``epochs 3-7`` for epochs measured together."""
    return f"epoch{'s' if summary.epochs > 1 else ''} {epoch_numbers(summary)}"


def headline(summary: EpochSummary) -> str:
    """An epoch's headline numbers on one line."""
    parts = [
        f"{summary.batches} batches",
        f"step p50 {ms(summary.step_time_p50)}, p90 {ms(summary.step_time_p90)}",
        f"data wait {percent(summary.data_wait_fraction)}",  # rounded down, as in the findings
    ]
    if (phases := phase_split(summary, "p50")) is not None:
        parts.append(f"p50 {phases}")
    if summary.throughput is not None:
        parts.append(f"{count(summary.throughput)} samples/s")
    if summary.flops_per_second is not None:
        parts.append(flops_rate(summary.flops_per_second))
    if summary.mfu is not None:
        parts.append(f"MFU {percent(summary.mfu)}")
    if summary.loss is not None:
        parts.append(f"loss {summary.loss:.4g}")
    return ", ".join(parts)


def phase_split(summary: EpochSummary, quantile: str) -> str | None:
    """A training epoch's median (``"p50"``) or 90th-percentile (``"p90"``) batch phases:
    ``"forward 20.10 ms, backward 10.20 ms, optimizer 15.10 ms, other 0.30 ms"``; ``None`` without a split."""
    values = [getattr(summary, f"{phase}_{quantile}") for phase in PHASES]
    if any(v is None for v in values):
        return None
    return ", ".join(f"{phase} {ms(v)}" for phase, v in zip(PHASES, values, strict=True))


def compile_line(stats: CompileStats | None) -> str | None:
    """What ``torch.compile`` did in an epoch, on one line: ``"compile: 4 graphs, 1 graph break, 2 recompiles,
    3.10 s compiling"`` (and ``", recompile limit reached"``); ``None`` without stats, or for an epoch of a
    compiled run in which nothing compiled (every epoch after the first, in a run whose shapes settle)."""
    if stats is None or not (stats.graphs or stats.breaks or stats.recompiles or stats.seconds or stats.limit_reached):
        return None
    line = (
        f"compile: {plural(stats.graphs, 'graph')}, {plural(stats.breaks, 'graph break')},"
        f" {plural(stats.recompiles, 'recompile')}, {duration(stats.seconds)} compiling"
    )
    return line + (", recompile limit reached" if stats.limit_reached else "")


def _clean(findings: Sequence[Finding], too_little: str | None = None) -> str:
    """The headline's end for an epoch with nothing to show: :data:`CLEAN`, or, where it has information findings
    (not shown at ``verbose=1``), their ids, so that a data wait nothing would help (``dataloader_bound`` at info)
    is not read as none; where the epoch had too few batches to judge (``too_little``, or a finding the guard held
    back: ``"1 measured batch: too little to judge"``), that first, which no clean result is."""
    notes = [f.id for f in findings if f.severity == "info"]
    batches = too_little or held_back(findings)
    if not notes:
        return f"{batches}: too little to judge" if batches else CLEAN
    listed = f"(notes: {', '.join(notes)}; verbose=2 shows them)"
    return f"{batches}: too little to judge {listed}" if batches else f"nothing to change found {listed}"


def console_report(
    summary: EpochSummary,
    findings: Sequence[Finding],
    *,
    verbose: int,
    ranks: Sequence[RankSummary] = (),
    unchanged: Sequence[Finding] = (),
    compile: CompileStats | None = None,
    note: str | None = None,
    too_little: str | None = None,
) -> str | None:
    """What the console shows at an epoch's end: ``None`` at ``verbose=0``.

    ``verbose=1``: the headline, the :func:`compile_line` of an epoch in which ``torch.compile`` compiled
    something (``compile``: its stats), the per-rank table of a distributed run and, per warning or critical
    finding, its title, window and advice; a clean single-process epoch is one line. ``verbose=2``: info
    findings too, and each finding's evidence. ``unchanged`` findings (shown at an earlier epoch, see
    :class:`ShownFindings`) are only named on the headline. ``note`` follows the headline's numbers (e.g. why the
    epoch's FLOPs are not counted yet). ``too_little``: the epoch's batches, where too few to judge
    (:func:`~lightning_perf.diagnose.evidence.too_little`), said instead of a clean result.
    """
    if verbose <= 0:
        return None
    shown = shown_findings(findings, verbose)
    still = [f.id for f in shown_findings(unchanged, verbose)]
    head = f"lightning-perf | {summary.stage} {epoch_label(summary)}{' (interrupted)' if summary.interrupted else ''}"
    head += f" | {headline(summary)}"
    if note:
        head += f" | {note}"
    if still:
        head += f" | unchanged: {', '.join(still)}"
    elif not shown:
        head += f" | {_clean(findings, too_little)}"
    compiled = compile_line(compile)
    if not shown and not ranks and compiled is None:
        return head
    lines = [head]
    lines += [] if compiled is None else ["  " + compiled]
    lines += ["  " + line for line in ranks_table(ranks)]
    lines += ["  " + line for line in finding_lines(shown, verbose=verbose)]
    return "\n".join(lines)


def shown_findings(findings: Sequence[Finding], verbose: int) -> list[Finding]:
    """The ``findings`` shown at ``verbose``: none at 0, warnings and critical at 1, all at 2."""
    severities = _SHOWN[max(0, min(verbose, 2))]
    return [f for f in findings if f.severity in severities]


def docs_section(rule_id: str) -> str:
    """Where the documentation explains a finding: its page and section, ``docs/findings.md#dataloader_bound``."""
    if rule_id in _OTHER_PAGES:
        return _OTHER_PAGES[rule_id]
    return f"{DOCS_FINDINGS}#{_SHARED_SECTION.get(rule_id, rule_id)}"


def finding_lines(findings: Sequence[Finding], *, verbose: int) -> list[str]:
    """Each finding as lines of text, ids aligned: severity, id, title and trace window; the evidence
    (``verbose >= 2``); the advice after ``->``, then the documentation's section (:func:`docs_section`). The
    caller indents them, and chooses which to show (:func:`shown_findings`)."""
    lines = []
    width = max((len(f.id) for f in findings), default=0)
    for f in findings:
        where = f"  [{f.window}]" if f.window else ""
        lines.append(f"{f.severity.upper():<8} {f.id:<{width}}  {f.title}{where}")
        if verbose >= 2:
            lines.append(f"{'':<8} {'':<{width}}  evidence: {f.evidence}")
        lines.append(f"{'':<8} {'':<{width}}  -> {f.advice}")
        lines.append(f"{'':<8} {'':<{width}}  docs: {docs_section(f.id)}")
    return lines


_RANK_COLUMNS = ("rank", "step p50", "step p90", "step max", "data wait", "samples/s", "comm exposed", "host peak")
# After samples/s, in a table where some rank's achieved FLOP/s are known (a run whose FLOPs were not counted
# keeps the table it always had).
_FLOPS_COLUMN = "FLOP/s"


def _rank_cells(r: RankSummary) -> list[str]:
    def time(v: float | None) -> str:
        return "-" if v is None else ms(v)

    def share(v: float | None) -> str:
        return "-" if v is None else percent(v)  # rounded down, as in the findings and the headline

    return [
        str(r.rank),
        time(r.step_time_p50),
        time(r.step_time_p90),
        time(r.step_time_max),
        share(r.data_wait_fraction),
        "-" if r.throughput is None else count(r.throughput),
        share(r.communication_share),
        "-" if r.host_rss_peak is None else mib(r.host_rss_peak),
    ]


def _rank_rows(ranks: Sequence[RankSummary]) -> list[list[str]]:
    """The per-rank table's header and one row per rank, as cells."""
    rows = [list(_RANK_COLUMNS), *(_rank_cells(r) for r in ranks)]
    if any(r.flops_per_second is not None for r in ranks):
        at = _RANK_COLUMNS.index("samples/s") + 1
        rows[0].insert(at, _FLOPS_COLUMN)
        for row, r in zip(rows[1:], ranks, strict=True):
            row.insert(at, "-" if r.flops_per_second is None else flops_rate(r.flops_per_second))
    return rows


def aligned(rows: Sequence[Sequence[str]], *, left: Container[int] = ()) -> list[str]:
    """Text rows as a console table: each column as wide as its widest cell, two spaces between columns, the
    cells of the columns in ``left`` aligned to the left (names), the others to the right (numbers)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    lines = []
    for row in rows:
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(cells)))
    return lines


#: Ranks the console's table lists one by one; beyond, it lists those of :func:`shown_ranks`.
MAX_RANK_ROWS = 16
SLOWEST_RANKS = 5


def shown_ranks(ranks: Sequence[RankSummary]) -> tuple[list[RankSummary], str | None]:
    """The ranks a table of ``ranks`` lists, and what they are where it does not list all: up to
    :data:`MAX_RANK_ROWS`, every one; beyond, by median step, the fastest rank, the median one, the one at the
    90th percentile and the :data:`SLOWEST_RANKS` slowest (each a real rank: its cells agree)."""
    if len(ranks) <= MAX_RANK_ROWS:
        return list(ranks), None
    by_step = sorted(ranks, key=lambda r: (r.step_time_p50 is None, r.step_time_p50 or 0.0, r.rank))
    n = len(by_step)
    picked = {0, n // 2, max(math.ceil(0.9 * n) - 1, 0), *range(n - SLOWEST_RANKS, n)}
    note = f"{n} ranks; by step p50: the fastest, the median, the 90th percentile and the {SLOWEST_RANKS} slowest"
    return [by_step[i] for i in sorted(picked)], note


def ranks_table(ranks: Sequence[RankSummary]) -> list[str]:
    """The per-rank table as aligned text lines (empty for a single process); of many ranks, those of
    :func:`shown_ranks`, under a line saying which."""
    if not ranks:
        return []
    shown, note = shown_ranks(ranks)
    lines = aligned(_rank_rows(shown))
    return [f"({note})", *lines] if note else lines


def ranks_markdown(summary: EpochSummary, ranks: Sequence[RankSummary]) -> str:
    """The per-rank table of a distributed epoch as markdown; the slowest rank's median step in bold."""
    slowest = max((r for r in ranks if r.step_time_p50 is not None), key=lambda r: r.step_time_p50 or 0.0, default=None)
    header, *rows = _rank_rows(ranks)
    lines = [
        f"**{summary.stage} {epoch_label(summary)}**, every rank:",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---:|" * len(header),
    ]
    for r, cells in zip(ranks, rows, strict=True):
        if r is slowest and len(ranks) > 1:
            cells[1] = f"**{cells[1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def findings_markdown(
    summary: EpochSummary, findings: Sequence[Finding], *, compile: CompileStats | None = None
) -> str:
    """An epoch's findings as a markdown block for TensorBoard's text dashboard (all severities), under its
    headline and, where ``torch.compile`` compiled something in it (``compile``: its stats), its
    :func:`compile_line`."""
    lines = [f"**{summary.stage} {epoch_label(summary)}**: {headline(summary)}", ""]
    if (p90 := phase_split(summary, "p90")) is not None:
        lines += [f"p90: {p90}", ""]
    compiled = compile_line(compile)
    if compiled is not None:
        lines += [compiled, ""]
    if not findings:
        lines.append("No bottleneck found.")
        return "\n".join(lines) + "\n"
    lines += ["| severity | finding | evidence | advice | trace window |", "|---|---|---|---|---|"]
    for f in findings:
        cells = [f.severity, f"**{f.title}** (`{f.id}`)", f.evidence, f.advice, f"`{f.window}`" if f.window else ""]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def findings_text(
    add_text: Callable[[str, str, int], None],
    step: int,
    summary: EpochSummary,
    findings: Sequence[Finding],
    ranks: Sequence[RankSummary],
    compiled: CompileStats | None,
) -> None:
    """An epoch's findings (and its per-rank table, where several ranks ran) as TensorBoard text at ``step``."""
    add_text(FINDINGS_TAG.format(stage=summary.stage), findings_markdown(summary, findings, compile=compiled), step)
    if ranks:
        add_text(RANKS_TAG.format(stage=summary.stage), ranks_markdown(summary, ranks), step)
