"""
Generated reference
===================

The parts of the site that the code can write, so that they cannot drift from it:

- the findings catalogue: each rule's summary and notes (its docstring, from the rule registry) and its
  thresholds (the ``Args:`` of :class:`~lightning_perf.diagnose.thresholds.Thresholds`, each default and the
  comment above its constant in ``thresholds.py``, which gives its source);
- the command line, from ``lightning-perf``'s argparse parser;
- ``perf_report.json``'s records, from the ``Attributes:`` of the dataclasses in ``lightning_perf/records.py``.

Each ``*_problems`` function lists the items without text; ``docs/hooks.py`` fails the build on any, and
``tests/docs/`` fails the suite. Nothing here imports torch or Lightning.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lightning_perf import records, run_record, trial_records, units
from lightning_perf.cli import build_parser
from lightning_perf.diagnose import thresholds as thresholds_module
from lightning_perf.diagnose.registry import RULES, SUMMARY_RULES
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.docstrings import doc_entries, plain_roles, summary_and_notes
from lightning_perf.validation import BYTES, COUNT, FRACTION, RATIO, SECONDS, kinds_of

#: The rules' catalogue, by id, in the registry's order.
ALL_RULES: dict[str, Callable[..., Any]] = {**RULES, **SUMMARY_RULES}

#: The records ``perf_report.json`` holds, in the order the schema page lists them.
REPORT_RECORDS: tuple[type, ...] = (
    run_record.RunInfo,
    run_record.LoaderInfo,
    records.EpochSummary,
    records.WindowRecord,
    records.TraceSummary,
    records.OperatorStat,
    records.CollectiveStats,
    records.RankSummary,
    records.CompileStats,
    records.GraphBreak,
    records.Recompile,
    records.ModelMemory,
    trial_records.AdviceTrial,
)

#: The page whose sections the findings catalogue fills.
FINDINGS_PAGE = Path(__file__).resolve().parent / "findings.md"

#: The marker a page holds where a generated block goes: ``<!-- generated: rule dataloader_bound -->``.
MARKER = re.compile(r"<!-- generated: ([\w-]+)(?: (\w+))? -->")


# --- thresholds ----------------------------------------------------------------------------------------------


def threshold_constants(cls: type = Thresholds) -> dict[str, str]:
    """The module constant that is each threshold's default, by the threshold's name."""
    source = inspect.getsource(cls)
    return dict(re.findall(r"^    (\w+): [^=]+= declared\([^,]+, (\w+)\)", source, re.MULTILINE))


def constant_comments(source: str) -> dict[str, str]:
    """The comment above each module-level constant of ``source``: its source, by the constant's name.

    Notes:
        1. Constants assigned one after another share the comment above the first of them.
        2. A ``# ---`` line (a rule's heading) or a blank line ends the comment.
    """
    lines = source.splitlines()
    comments: dict[str, str] = {}
    assignment = re.compile(r"^([A-Z][A-Z0-9_]*) = ")
    for i, line in enumerate(lines):
        if not (match := assignment.match(line)):
            continue
        j = i - 1
        while j >= 0 and assignment.match(lines[j]):
            j -= 1
        block: list[str] = []
        while j >= 0 and lines[j].startswith("#") and not lines[j].startswith("# ---"):
            block.insert(0, lines[j].lstrip("#").strip())
            j -= 1
        comments[match.group(1)] = " ".join(block)
    return comments


def threshold_default(name: str, cls: type = Thresholds) -> str:
    """A threshold's default, in the unit the rules print it in."""
    value = getattr(cls(), name)
    kind = kinds_of(cls)[name]
    if value is None:
        return "None"
    if kind is FRACTION:
        return units.percent(value)
    if kind is SECONDS:
        return units.duration(value)
    if kind is BYTES:
        return units.size(value)
    if kind is RATIO:
        return units.times(value)
    if kind is COUNT:
        return str(value)
    return f"{value:g}"


def rules_of(text: str) -> list[str]:
    """The rule ids a threshold's text names in double backticks."""
    return list(dict.fromkeys(rule for rule in re.findall(r"``(\w+)``", text) if rule in ALL_RULES))


def threshold_rows(
    doc: str | None = Thresholds.__doc__, source: str | None = None, cls: type = Thresholds
) -> dict[str, list[tuple[str, str, str, str]]]:
    """Each rule's thresholds as ``(name, default, meaning, source)`` rows; ``""`` holds those of no one rule."""
    source = source if source is not None else inspect.getsource(thresholds_module)
    meanings = doc_entries(doc, "Args")
    comments = constant_comments(source)
    constants = threshold_constants(cls)
    rows: dict[str, list[tuple[str, str, str, str]]] = {}
    previous: list[str] = []
    for name in cls.names():
        meaning = meanings.get(name, "")
        comment = comments.get(constants.get(name, ""), "")
        # "...with device busy / step time below this": the sentence, and the rule, of the entry before it
        rules = rules_of(meaning) or (previous if meaning.startswith("...") else [])
        previous = rules
        for rule in rules or [""]:
            rows.setdefault(rule, []).append(
                (name, threshold_default(name, cls), plain_roles(meaning), plain_roles(comment))
            )
    return rows


def catalogue_problems(
    rules: Mapping[str, Callable[..., Any]] = ALL_RULES,
    doc: str | None = Thresholds.__doc__,
    source: str | None = None,
    page: str | None = None,
) -> list[str]:
    """What the findings catalogue lacks: a rule without a summary or notes, or without its section on
    ``page`` (the text of docs/findings.md); a threshold without a meaning or a source."""
    problems = []
    for rule_id, rule in rules.items():
        summary, notes = summary_and_notes(rule.__doc__)
        if not summary or not notes:
            problems.append(f"rule {rule_id}: its docstring has no summary line or no Notes: section")
        if page is not None and f"<!-- generated: rule {rule_id} -->" not in page:
            problems.append(f"rule {rule_id}: docs/findings.md has no section for it (<!-- generated: rule ... -->)")
    for rows in threshold_rows(doc, source).values():
        for name, _, meaning, comment in rows:
            if not meaning:
                problems.append(f"threshold {name}: no entry in Thresholds' Args:")
            if not comment:
                problems.append(f"threshold {name}: no comment above its constant in thresholds.py giving its source")
    return problems


def rule_block(rule_id: str) -> str:
    """One rule's generated reference: its summary, its notes, and its thresholds' table."""
    summary, notes = summary_and_notes(ALL_RULES[rule_id].__doc__)
    lines = [f'??? info "`{rule_id}` in the code: {summary}"', ""]
    lines += [f"    {i}. {note}" for i, note in enumerate(notes, start=1)]
    rows = threshold_rows().get(rule_id, [])
    if rows:
        lines += ["", *_indent(_threshold_table(rows))]
    return "\n".join(lines) + "\n"


def overview_block() -> str:
    """One row per rule: its id (a link to its section), what it is about, and its thresholds' defaults."""
    lines = ["| rule | what it finds | thresholds (default) |", "|---|---|---|"]
    by_rule = threshold_rows()
    for rule_id, rule in ALL_RULES.items():
        summary, _ = summary_and_notes(rule.__doc__)
        limits = ", ".join(f"`{name}` {default}" for name, default, _, _ in by_rule.get(rule_id, []))
        lines.append(f"| [`{rule_id}`](#{section_anchor(rule_id)}) | {_cell(summary)} | {limits} |")
    return "\n".join(lines) + "\n"


def section_anchor(rule_id: str, page: str | None = None) -> str:
    """The anchor of the rule's section on docs/findings.md: its heading's ``{#id}`` (that of the first rule
    the heading names, for a section of several)."""
    page = page if page is not None else FINDINGS_PAGE.read_text()
    for heading in re.findall(r"^## (.*)$", page, re.MULTILINE):
        if f"`{rule_id}`" in heading and (anchor := re.search(r"\{#(\w+)\}", heading)):
            return anchor.group(1)
    return rule_id


def shared_thresholds_block() -> str:
    """The thresholds that belong to no one rule."""
    return "\n".join(_threshold_table(threshold_rows().get("", []))) + "\n"


def _threshold_table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    lines = ["| threshold | default | what it bounds | where the number comes from |", "|---|---|---|---|"]
    lines += [
        f"| `{name}` | {default} | {_cell(meaning)} | {_cell(comment)} |" for name, default, meaning, comment in rows
    ]
    return lines


# --- the command line ----------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Each subcommand's name, help and parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return {name: (helps.get(name, ""), sub) for name, sub in action.choices.items()}
    return {}


def _documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's arguments a user sees: not ``--help``, not the subcommands, not the suppressed ones."""
    return [
        action
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        and action.help != argparse.SUPPRESS
    ]


def cli_problems(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """The subcommands and flags of ``lightning-perf`` that have no help text."""
    parser = parser or build_parser()
    problems = [f"lightning-perf {action.dest}: no help" for action in _documented_actions(parser) if not action.help]
    for name, (help_text, sub) in _subcommands(parser).items():
        if not help_text:
            problems.append(f"lightning-perf {name}: no help")
        problems += [
            f"lightning-perf {name} {'/'.join(action.option_strings) or action.dest}: no help"
            for action in _documented_actions(sub)
            if not action.help
        ]
    return problems


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Every subcommand of ``lightning-perf``: its usage and a table of its arguments."""
    parser = parser or build_parser()
    lines: list[str] = []
    for name, (help_text, sub) in _subcommands(parser).items():
        lines += [f"### `lightning-perf {name}`", "", f"{help_text[:1].upper()}{help_text[1:]}.", ""]
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        lines += ["| argument | default | meaning |", "|---|---|---|"]
        for action in _documented_actions(sub):
            flags = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.dest.upper()}`"
            if action.metavar and action.option_strings:
                flags += f" `{action.metavar}`"
            default = "" if action.default in (None, False) or not action.option_strings else f"`{action.default}`"
            if action.choices:
                default += f" (one of {', '.join(f'`{choice}`' for choice in action.choices)})"
            lines.append(f"| {flags} | {default} | {_cell(action.help or '')} |")
        lines.append("")
    return "\n".join(lines)


# --- perf_report.json ----------------------------------------------------------------------------------------


def record_fields(cls: type) -> list[tuple[str, str, str]]:
    """A record's fields as ``(name, type, meaning)``, the meaning from its ``Attributes:`` (``""`` if none)."""
    meanings = doc_entries(cls.__doc__, "Attributes")
    if not dataclasses.is_dataclass(cls):  # a TypedDict: the run's JSON object (lightning_perf.run_record)
        return [(name, str(type_), meanings.get(name, "")) for name, type_ in cls.__annotations__.items()]
    return [(f.name, str(f.type), meanings.get(f.name, "")) for f in dataclasses.fields(cls)]


def schema_problems(classes: tuple[type, ...] = REPORT_RECORDS) -> list[str]:
    """The report's record fields that have no ``Attributes:`` entry."""
    return [
        f"{cls.__name__}.{name}: no entry in its Attributes:"
        for cls in classes
        for name, _, meaning in record_fields(cls)
        if not meaning
    ]


def schema_reference(classes: tuple[type, ...] = REPORT_RECORDS) -> str:
    """A section per record: its summary and a table of its fields."""
    lines: list[str] = []
    for cls in classes:
        summary = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        lines += [f"### `{cls.__name__}`", "", plain_roles(summary), ""]
        lines += ["| field | type | meaning |", "|---|---|---|"]
        lines += [
            f"| `{name}` | `{_cell(type_)}` | {_cell(plain_roles(meaning))} |"
            for name, type_, meaning in record_fields(cls)
        ]
        lines.append("")
    return "\n".join(lines)


# --- the pages -----------------------------------------------------------------------------------------------


def generated(kind: str, name: str | None) -> str:
    """The block a ``<!-- generated: KIND NAME -->`` marker stands for."""
    if kind == "rule" and name in ALL_RULES:
        return rule_block(name)
    if kind == "overview":
        return overview_block()
    if kind == "thresholds":
        return shared_thresholds_block()
    if kind == "cli":
        return cli_reference()
    if kind == "schema":
        return schema_reference()
    raise ValueError(f"no generated block {kind!r} {name or ''}; known: rule <id>, overview, thresholds, cli, schema")


def expand(markdown: str) -> str:
    """A page's Markdown with each marker followed by its generated block."""
    return MARKER.sub(lambda m: m.group(0) + "\n\n" + generated(m.group(1), m.group(2)), markdown)


def problems(docs_dir: Path) -> list[str]:
    """Everything the generated reference lacks, for the build and the tests."""
    page = (docs_dir / "findings.md").read_text()
    return catalogue_problems(page=page) + cli_problems() + schema_problems()


def _indent(lines: list[str]) -> list[str]:
    return [f"    {line}" if line else "" for line in lines]


def _cell(text: str) -> str:
    """Text fit for one table cell: no pipes breaking the row."""
    return text.replace("|", "\\|").replace("\n", " ")
