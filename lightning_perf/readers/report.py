"""
Reading a ``perf_report.json``: :func:`load_report` checks it against the schema the record dataclasses
declare (:class:`~lightning_perf.records.EpochSummary` and the others), so that a field added there is checked
here without a second list to keep in step. Imports neither torch nor lightning.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lightning_perf.diagnose.model import SEVERITIES, Finding, RunFacts
from lightning_perf.layout import REPORT_SCHEMA_VERSION as SCHEMA_VERSION
from lightning_perf.readers.files import KINDS, InputError, Invalid, at, check, missing, must, read_json
from lightning_perf.records import (
    CollectiveStats,
    CompileStats,
    EpochSummary,
    GraphBreak,
    OperatorStat,
    RankSummary,
    Recompile,
    TraceSummary,
    WindowRecord,
)
from lightning_perf.validation import is_int as _is_int
from lightning_perf.validation import shown as _shown

# Run facts that perf_report.json keeps per stage under run["dataloaders"][stage]; the rest are run-level.
DATALOADER_FACTS = frozenset({"num_workers", "pin_memory", "persistent_workers", "batch_size"})


@dataclass(frozen=True)
class _Field:
    """One field of a record as perf_report.json writes it."""

    name: str
    kinds: tuple[str, ...]
    nullable: bool
    required: bool  # no default in the dataclass: every writer of this schema version wrote it
    default: Any = None


def _fields_of(
    cls: type, *, skip: Iterable[str] = (), annotations: Mapping[str, str] | None = None
) -> tuple[_Field, ...]:
    """The checkable fields of a record dataclass, from its annotations (``"int"``, ``"float | None"``...).

    ``annotations`` replaces the annotation of the fields it names (for a type alias such as ``Severity``).

    Raises:
        TypeError: At import, for an annotation this module cannot check: a programming error, caught by
            the tests, rather than a field silently left unchecked.
    """
    skip, annotations = set(skip), dict(annotations or {})
    result = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        annotation = annotations.get(f.name, f.type)
        if not isinstance(annotation, str):  # the records' module without ``from __future__ import annotations``
            annotation = annotation.__name__ if isinstance(annotation, type) else str(annotation)
        parts = [part.strip() for part in annotation.split("|")]
        kinds = tuple(part for part in parts if part != "None")
        if not kinds or any(kind not in KINDS for kind in kinds):
            raise TypeError(f"{cls.__name__}.{f.name}: cannot check the annotation {annotation!r}")
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        result.append(_Field(f.name, kinds, "None" in parts, not has_default, default if has_default else None))
    return tuple(result)


EPOCH_FIELDS = _fields_of(EpochSummary)
RANK_FIELDS = _fields_of(RankSummary)
FINDING_FIELDS = _fields_of(Finding, annotations={"severity": "str"})
WINDOW_FIELDS = _fields_of(WindowRecord, skip=("operators", "summary", "collectives"))  # as the report writes it
TRACE_SUMMARY_FIELDS = _fields_of(TraceSummary)
# run.memory is a nested mapping: summarize.memory.checked_memory checks it where it is read.
RUN_FIELDS = _fields_of(RunFacts, skip=DATALOADER_FACTS | {"memory"})
DATALOADER_FIELDS = tuple(f for f in _fields_of(RunFacts, skip=("memory",)) if f.name in DATALOADER_FACTS)
COMPILE_LISTS = ("break_sites", "recompile_guards", "steps")  # CompileStats' tuples, checked item by item
COMPILE_FIELDS = _fields_of(CompileStats, skip=COMPILE_LISTS)
GRAPH_BREAK_FIELDS = _fields_of(GraphBreak)
RECOMPILE_FIELDS = _fields_of(Recompile)
OPERATOR_FIELDS = _fields_of(OperatorStat)
COLLECTIVE_FIELDS = _fields_of(CollectiveStats)


def _check_record(record: Any, fields: Iterable[_Field], where: str, *, fill: bool = True) -> dict[str, Any]:
    """Checks one record object field by field; fills in, where ``fill``, the defaults of absent optional
    fields (written by every current writer, perhaps not by an older one of the same schema version)."""
    if not isinstance(record, dict):
        raise must(where, "an object", record)
    for field in fields:
        if field.name not in record:
            if field.required:
                raise missing(at(where, field.name))
            if fill:
                record[field.name] = field.default
            continue
        check(at(where, field.name), record[field.name], field.kinds, nullable=field.nullable)
    return record


def _list(container: dict[str, Any], key: str, where: str, *, default: list[Any] | None = None) -> list[Any]:
    field = at(where, key)
    if key not in container:
        if default is None:
            raise missing(field)
        container[key] = default
    value = container[key]
    if not isinstance(value, list):
        raise must(field, "an array", value)
    return value


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a ``perf_report.json`` and checks it against its schema (see
    :mod:`lightning_perf.report.json_report`).

    Notes:
        1. ``version`` is :data:`~lightning_perf.report.json_report.SCHEMA_VERSION`; a newer one is refused
           with the lightning-perf release that wrote it, before anything else is read.
        2. ``run`` is an object; the facts the rules use (``device``, ``world_size``... and per stage under
           ``dataloaders``: ``num_workers``, ``pin_memory``...) have the types of
           :class:`~lightning_perf.diagnose.model.RunFacts` where present.
        3. ``stages`` maps each stage to ``{"epochs": [...]}``; every epoch has the fields of
           :class:`~lightning_perf.records.EpochSummary` with their annotated types (``int``, ``float``
           (an integer is a number too), ``| None``: or null), its ``stage`` is the stage it is listed
           under, and its ``findings`` and ``ranks`` are arrays of
           :class:`~lightning_perf.diagnose.model.Finding` and :class:`~lightning_perf.records.RankSummary`
           objects (a finding's ``severity`` one of ``info``, ``warning``, ``critical``). Its ``compile``, where
           present, is a :class:`~lightning_perf.records.CompileStats` object: its ``break_sites`` and
           ``recompile_guards`` arrays of :class:`~lightning_perf.records.GraphBreak` and
           :class:`~lightning_perf.records.Recompile` objects, its ``steps`` an array of integers.
           Its ``steps``, where present, holds the arrays of numbers ``data_wait`` and ``compute`` of one length,
           ``per_bar`` (an integer, at least 1), ``profiled`` (``[first, last]`` pairs of integers) and
           ``compiled`` (integers).
        4. ``windows`` is an array of :class:`~lightning_perf.records.WindowRecord` objects, each ``summary``
           null or a :class:`~lightning_perf.records.TraceSummary` object, its ``operators`` (where present) an
           array of :class:`~lightning_perf.records.OperatorStat` objects, its ``collectives`` (where present) an
           array of :class:`~lightning_perf.records.CollectiveStats` objects.
        5. Numbers are finite. Keys the schema does not name are allowed (a newer writer's additions).
        6. A record's field that has a default in its dataclass may be absent: it is filled in with that
           default (so ``EpochSummary(**fields)`` works on what is returned); one without is required.

    Raises:
        InputError: Naming the file and the problem (for a field: its path, e.g.
            ``stages.train.epochs[2].step_time_p50``).
    """
    name, data = read_json(path)
    try:
        return _checked_report(data)
    except Invalid as err:
        raise InputError(f"{name}: {err}") from None


def _checked_report(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise Invalid(f"not a perf_report.json: the top level must be an object, got {_shown(data)}")
    _check_version(data)
    if "generated_by" in data:
        check("generated_by", data["generated_by"], ("str",))

    if "run" not in data:
        raise missing("run")
    run = _check_record(data["run"], RUN_FIELDS, "run", fill=False)
    loaders = run.get("dataloaders", {})
    if not isinstance(loaders, dict):
        raise must("run.dataloaders", "an object", loaders)
    for stage, loader in loaders.items():
        if loader is not None:  # None: the stage had no DataLoader to inspect
            _check_record(loader, DATALOADER_FIELDS, at("run.dataloaders", stage), fill=False)

    if "stages" not in data:
        raise missing("stages")
    stages = data["stages"]
    if not isinstance(stages, dict):
        raise must("stages", "an object", stages)
    for stage, entry in stages.items():
        where = at("stages", stage)
        if not isinstance(entry, dict):
            raise must(where, "an object", entry)
        for i, epoch in enumerate(_list(entry, "epochs", where)):
            _check_epoch(epoch, stage, at(at(where, "epochs"), i))

    for i, window in enumerate(_list(data, "windows", "")):
        where = at("windows", i)
        _check_record(window, WINDOW_FIELDS, where)
        summary = window.setdefault("summary", None)
        if summary is not None:
            _check_record(summary, TRACE_SUMMARY_FIELDS, at(where, "summary"))
        for j, operator in enumerate(_list(window, "operators", where, default=[])):
            _check_record(operator, OPERATOR_FIELDS, at(at(where, "operators"), j))
        for j, collective in enumerate(_list(window, "collectives", where, default=[])):
            _check_record(collective, COLLECTIVE_FIELDS, at(at(where, "collectives"), j))
    return data


def _check_version(data: dict[str, Any]) -> None:
    if "version" not in data:
        raise missing("version", " (not a perf_report.json?)")
    version = data["version"]
    if not _is_int(version):
        raise must("version", "an integer", version)
    if version > SCHEMA_VERSION:
        writer = data.get("generated_by")
        known = isinstance(writer, str) and re.fullmatch(r"lightning-perf [\w.+-]{1,40}", writer)
        by = (
            f"It was written by {writer}: read it with that release or a newer one"
            if known
            else ("Read it with the lightning-perf release that wrote it or a newer one")
        )
        raise Invalid(
            f"report schema version {version} is newer than this lightning-perf reads (version {SCHEMA_VERSION})"
            f"\n{by} (pip install -U lightning-perf)."
        )
    if version != SCHEMA_VERSION:
        raise Invalid(f"unknown report schema version {version} (this lightning-perf reads version {SCHEMA_VERSION})")


def _check_epoch(epoch: Any, stage: str, where: str) -> None:
    _check_record(epoch, EPOCH_FIELDS, where)
    if epoch["stage"] != stage:
        shown = _shown(epoch["stage"])
        raise Invalid(f"field {at(where, 'stage')} is {shown}, but the epoch is listed under {stage!r}")
    for i, finding in enumerate(_list(epoch, "findings", where, default=[])):
        place = at(at(where, "findings"), i)
        _check_record(finding, FINDING_FIELDS, place)
        if finding["severity"] not in SEVERITIES:
            raise must(at(place, "severity"), "one of " + ", ".join(map(repr, SEVERITIES)), finding["severity"])
    for i, rank in enumerate(_list(epoch, "ranks", where, default=[])):
        _check_record(rank, RANK_FIELDS, at(at(where, "ranks"), i))
    if "compile" in epoch:  # absent: the run compiled nothing, or its writer predates compile stats
        _check_compile(epoch["compile"], at(where, "compile"))
    if "steps" in epoch:  # absent: an epoch whose step split the report does not keep, or an older writer
        _check_steps(epoch["steps"], at(where, "steps"))


def _check_steps(steps: Any, where: str) -> None:
    if not isinstance(steps, dict):
        raise must(where, "an object", steps)
    for key in ("data_wait", "compute"):
        for i, value in enumerate(_list(steps, key, where)):
            check(at(at(where, key), i), value, ("float",))
    if len(steps["data_wait"]) != len(steps["compute"]):
        raise Invalid(f"{at(where, 'data_wait')} and {at(where, 'compute')} differ in length")
    check(at(where, "per_bar"), steps.setdefault("per_bar", 1), ("int",))
    if steps["per_bar"] < 1:
        raise must(at(where, "per_bar"), "at least 1", steps["per_bar"])
    for i, stretch in enumerate(_list(steps, "profiled", where, default=[])):
        place = at(at(where, "profiled"), i)
        if not (isinstance(stretch, list) and len(stretch) == 2 and all(_is_int(b) for b in stretch)):
            raise must(place, "a [first, last] pair of batch indices", stretch)
    for i, batch in enumerate(_list(steps, "compiled", where, default=[])):
        check(at(at(where, "compiled"), i), batch, ("int",))


def _check_compile(stats: Any, where: str) -> None:
    _check_record(stats, COMPILE_FIELDS, where)
    for i, site in enumerate(_list(stats, "break_sites", where, default=[])):
        _check_record(site, GRAPH_BREAK_FIELDS, at(at(where, "break_sites"), i))
    for i, guard in enumerate(_list(stats, "recompile_guards", where, default=[])):
        _check_record(guard, RECOMPILE_FIELDS, at(at(where, "recompile_guards"), i))
    for i, step in enumerate(_list(stats, "steps", where, default=[])):
        check(at(at(where, "steps"), i), step, ("int",))
