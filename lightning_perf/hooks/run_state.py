"""
Run state
=========

What :class:`~lightning_perf.PerfCallback` keeps in a checkpoint, and how a resumed run takes it back.

Version 6 keeps only what resuming needs, bounded however long the run: each stage's position and batches, the
windows (at most ``max_windows`` per stage), the report's path, and of each stage's recent history only the
records the report on disk does not hold yet (its rewrites are paced). A resumed run takes the earlier epochs
back from that report, up to the batches the checkpoint counted (a run that went on past the checkpoint wrote
more, which the resumed run measures again), then the checkpoint's own. Lightning's default ``ModelCheckpoint``
saves the state at every epoch end: version 4 held the rules' whole recent history, about 50 kB a checkpoint for
a run of short epochs. ``torch.save`` pickles a nested value object by object (a Python ``persistent_id`` call
each): a 32-epoch history of dicts cost 1.4 ms per checkpoint, of a text per epoch 0.1-0.3 ms, as one text
0.06-0.19 ms (``benchmarks/checkpoint_state.py``, a 2-CPU machine). So the state is a JSON text and, since
version 6, the records the report lacks as one more text, their JSON compressed (zlib, then base64: plain
values, as JSON and every checkpoint format keep them): between the report's rewrites (at most every 30 s) they
were most of a 54-kB state at every checkpoint of a run of 10-ms epochs, and a checkpoint file that much larger
cost the run 0.1-0.3 ms an epoch (``benchmarks/epoch_blocks.py``'s harness, a state of that size against a tiny
one in alternate blocks of one fit); packed, 14 kB, in about 0.25 ms each time a stage measures an epoch, not
at every checkpoint. Each epoch and each window is encoded once (:class:`RecordTexts`), and the text of a
sequence that has not changed is reused. Versions 1-5 still load.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from lightning_perf.diagnose.model import Finding
from lightning_perf.hooks.epoch_report import EpochReporter
from lightning_perf.hooks.stage_measure import HISTORY_EPOCHS
from lightning_perf.hooks.window_control import StagePosition
from lightning_perf.readers import InputError, load_report
from lightning_perf.records import EpochSummary, RankSummary, WindowRecord, from_values, plain
from lightning_perf.report.json_report import report_epochs, window_dict, window_record

STATE_VERSION = 6
# zlib's fastest level: 54 kB of records to 10.5 kB in 0.22 ms on a 2-CPU machine, where level 6 took 0.8 ms for
# 8.7 kB (the records of a run of 10-ms epochs between two rewrites of the report).
RECENT_LEVEL = 1

T = TypeVar("T")


class RecordTexts:
    """The JSON array texts of sequences of frozen records that change at their end (each stage's history, the
    windows), each record encoded once for as long as it is kept: a checkpoint at every epoch end encodes only
    the epoch that is new since the last one, and reuses the text of a sequence that has not changed (its
    epochs measured in a group), and what is joined or packed of them (:meth:`joined`)."""

    def __init__(self) -> None:
        # by key: the records, each with its text (the record keeps its id from reuse), and the array's text
        self._held: dict[str, tuple[dict[int, tuple[Any, str]], str]] = {}
        self._joined: dict[str, tuple[tuple[str, ...], Any]] = {}

    def array(self, key: str, records: Sequence[Any], encode: Callable[[Any], Any] = plain) -> str:
        """The JSON text of ``[encode(r) for r in records]``: the last call's for ``key`` where its records end
        the same, else joined from the texts held and the new records' (the others forgotten)."""
        held, text = self._held.get(key, ({}, "[]"))
        if len(held) == len(records) and (not records or id(records[-1]) in held):
            return text  # a sequence that changes at its end only: the same length and last record, unchanged
        held = {id(r): held.get(id(r)) or (r, json.dumps(encode(r))) for r in records}
        text = f"[{', '.join(t for _, t in held.values())}]"
        self._held[key] = (held, text)
        return text

    def joined(self, key: str, parts: tuple[str, ...], join: Callable[[], T]) -> T:
        """``join()``: the last call's for ``key`` where ``parts`` are the same texts (the same objects) as then."""
        last, value = self._joined.get(key, ((), None))
        if value is None or len(last) != len(parts) or any(a is not b for a, b in zip(last, parts, strict=True)):
            value = join()
            self._joined[key] = (parts, value)
        return cast(T, value)


def state_dict(positions: Mapping[str, StagePosition], reporter: EpochReporter, texts: RecordTexts) -> dict[str, Any]:
    """The version, a JSON text of where each stage is, the windows and where the report is, and the records the
    report on disk lacks, packed (module docstring; the caller has joined the window worker: every closed window
    is in ``reporter.windows``).

    Args:
        positions: Each stage's position (:attr:`~lightning_perf.hooks.window_control.WindowControl.stages`).
        reporter: What the run has measured.
        texts: The texts from the last call, kept by the caller.

    Notes:
        It runs at every checkpoint, at every epoch end of a run of short epochs. What changes at every call
        (the positions, the run's profiling) is written as it is; the rest, the windows' text and the packed
        records, anew only where one of their parts changed. The positions and the profiling's numbers are written
        by f-strings (a JSON text as is): ``json.dumps`` took 14 us for them in a tight loop, 45 us between the
        fit's steps.
    """
    positions = {stage: pos for stage, pos in positions.items() if pos.epoch >= 0}  # a stage yet to run: nothing
    stages = ", ".join(
        f'"{stage}": {{"epoch": {pos.epoch}, "total_batches": {reporter.stages[stage].total_batches},'
        f' "windows_used": {pos.windows_used}}}'
        for stage, pos in positions.items()  # plain names and integers
    )
    windows = texts.array("windows", reporter.windows, functools.partial(window_dict, with_analysis=False))
    recent = tuple(texts.array(stage, _unreported(reporter, stage)) for stage in positions)
    path = reporter.report_path

    def pack() -> str:
        arrays = ", ".join(f'"{stage}": {text}' for stage, text in zip(positions, recent, strict=True))
        return base64.b64encode(zlib.compress(f"{{{arrays}}}".encode(), RECENT_LEVEL)).decode("ascii")

    rest = texts.joined(
        "rest", (windows, path or ""), lambda: f'"report_path": {json.dumps(path)}, "windows": {windows}'
    )
    profiling = _numbers(reporter.budget.state_dict(time.perf_counter()))
    return {
        "version": STATE_VERSION,
        "state": f'{{"stages": {{{stages}}}, "profiling": {profiling}, {rest}}}',
        "recent": texts.joined("recent", recent, pack),
    }


def _unreported(reporter: EpochReporter, stage: str) -> Sequence[EpochSummary]:
    """The stage's latest records that the report on disk lacks, of its recent history (all of it where no report
    is written: another rank's, or no output directory); after a resume, those the report lacked."""
    st = reporter.stages[stage]
    lacking = min(st.records - reporter.reported.get(stage, 0), len(st.history))
    return tuple(st.history)[len(st.history) - lacking :] if lacking > 0 else ()


def _numbers(values: Mapping[str, float]) -> str:
    """The JSON text of plain names and numbers, as ``json.dumps`` writes it (``repr`` of a finite float or an
    int) but by an f-string: ``json.dumps`` took 33 us for the profiling's four numbers between a fit's steps."""
    if not all(math.isfinite(v) for v in values.values()):
        return json.dumps(values)
    return "{" + ", ".join(f'"{name}": {value!r}' for name, value in values.items()) + "}"


def _version_3(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """A version-4, -5 or -6 state as version 3 had it (one dict, a stage's saved records as its ``history``);
    others as they are."""
    if not isinstance(state.get("state"), str):
        return state
    decoded = json.loads(state["state"])
    if isinstance(state.get("recent"), str):  # version 6: the records the report lacked, packed
        decoded["recent"] = json.loads(zlib.decompress(base64.b64decode(state["recent"])))
    history = decoded.pop("history", None) or decoded.pop("recent", {})
    stages = {stage: {**saved, "history": history.get(stage, [])} for stage, saved in decoded.get("stages", {}).items()}
    return {**decoded, "stages": stages}


def load_state_dict(
    state: Mapping[str, Any],
    positions: Mapping[str, StagePosition],
    reporter: EpochReporter,
    warn: Callable[[str, str], None],
) -> None:
    """Restores :func:`state_dict`'s values, and the earlier epochs from the report it names where that file is
    still there (else the records the state holds only); tolerates the keys a different version wrote or left
    out at the top level, and the record fields a newer one added. Version 1 kept the whole history.

    Args:
        state: What :func:`state_dict` returned, as a checkpoint kept it.
        positions: Each stage's position, updated in place.
        reporter: What the run has measured, replaced by what the state holds.
        warn: ``(key, message)``: a warning to show once (an unreadable earlier report).

    Notes:
        1. Of each stage, the report's first records up to the batches the checkpoint counted: the epochs a run
           that went on past the checkpoint wrote are measured again, and a group of short epochs measured across
           it is in no record (its epochs up to the checkpoint are not measured again); one measured after the
           checkpoint that ends at it (a Trainer call's last, measured at its end) is kept. Where the report holds
           fewer (the run was killed before its rewrite), the checkpoint's own later records follow. The batches
           the checkpoint counted that no record holds (a group still carried at it, or the part of an epoch a
           checkpoint within it had seen) are named in a warning.
        2. No window on disk is dropped: the windows the reporter held (this process's earlier calls) and those
           the earlier report lists (a run that went on past the checkpoint) stay in the report after the
           checkpoint's, so that a resumed fit appends to what is on disk.
    """
    state = _version_3(state)
    held = list(reporter.windows)
    upto: dict[str, int] = {}  # each stage's batches at the checkpoint: the report's records up to them
    for stage, saved in state.get("stages", {}).items():
        if stage in positions:
            pos, st = positions[stage], reporter.stages[stage]
            pos.epoch = int(saved.get("epoch", pos.epoch))
            st.total_batches = upto[stage] = int(saved.get("total_batches", st.total_batches))
            pos.windows_used = int(saved.get("windows_used", pos.windows_used))
            st.history.clear()
            st.history.extend(_history_epoch(e) for e in saved.get("history", []))
    reporter.windows = [from_values(WindowRecord, w) for w in state.get("windows", [])]
    reporter.budget.load_state_dict(state.get("profiling", {}))  # a resumed fit goes on with what the run spent
    reporter.epochs, reporter.findings_by_epoch, reporter.ranks, reporter.compile_stats = [], {}, {}, {}
    reporter.step_splits, reporter.reported = {}, {}
    rebuilt = "epochs" in state  # the history rebuilt from the epochs taken back
    if "epochs" in state:  # version 1
        reporter.epochs = [from_values(EpochSummary, e) for e in state["epochs"]]
        for f in state.get("findings", []):
            finding = from_values(Finding, f)
            reporter.findings_by_epoch.setdefault((finding.stage, finding.epoch), []).append(finding)
        reporter.ranks = {
            (saved["stage"], saved["epoch"]): tuple(from_values(RankSummary, r) for r in saved["ranks"])
            for saved in state.get("ranks", [])
        }
    elif _load_earlier_report(state.get("report_path"), reporter, warn, upto):
        rebuilt = True
        for stage in upto:  # Notes 1: the records the state holds that the report lacked
            last = max((e.epoch for e in reporter.epochs if e.stage == stage), default=-1)
            reporter.epochs += [e for e in reporter.stages[stage].history if e.epoch > last]
    else:  # the report is gone, the earlier epochs with it: nothing to count what is missing against
        reporter.epochs = sorted((e for st in reporter.stages.values() for e in st.history), key=lambda e: e.epoch)
    for stage, st in reporter.stages.items():
        measured = [e for e in reporter.epochs if e.stage == stage]
        st.records = len(measured)
        if not rebuilt:
            continue
        st.history.clear()
        st.history.extend(measured[-HISTORY_EPOCHS:])
        if stage in upto and (lost := upto[stage] - sum(e.batches for e in measured)) > 0:  # Notes 1
            first = measured[-1].epoch + 1 if measured else 0
            warn(f"unrecorded:{stage}", unrecorded(stage, first, positions[stage].epoch, lost))
    names = {w.name for w in reporter.windows}
    reporter.windows += [w for w in held if w.name not in names]


def unrecorded(stage: str, first: int, last: int, batches: int) -> str:
    """The warning that a resumed run has no record of a stage's last epochs before its checkpoint: they were
    still being measured together (epoch_report, Notes 2), or the checkpoint was saved within an epoch."""
    epochs = f"epoch {first} was" if first >= last else f"epochs {first}-{last} were"
    return (
        f"PerfCallback: the checkpoint this run resumed from was saved before its {stage} {epochs} measured"
        f" ({batches} batch{'es' if batches != 1 else ''}: an epoch is measured at its end, short ones in groups):"
        " the report has no record of them, and goes on from the checkpoint."
    )


def _history_epoch(saved: str | Mapping[str, Any]) -> EpochSummary:
    """An epoch of a saved history: a dict (versions 2 and 4) or a JSON text (version 3)."""
    return from_values(EpochSummary, json.loads(saved) if isinstance(saved, str) else saved)


def _load_earlier_report(
    path: str | None, reporter: EpochReporter, warn: Callable[[str, str], None], upto: Mapping[str, int]
) -> bool:
    """Takes the epochs, findings, per-rank tables, compile numbers and step splits back from an earlier run's
    report (of a stage in ``upto``, its first records up to so many batches: :func:`load_state_dict` Notes 1), and
    its windows' summaries and top operators; whether it could. ``reporter.reported``: how many of each stage it
    took."""
    if not path or not os.path.isfile(path):
        return False
    try:
        report = load_report(path)
        epochs = report_epochs(report)
    except InputError as err:
        warn("earlier_report", f"PerfCallback: the report to resume from is unreadable ({err}).")
        return False
    batches: dict[str, int] = {}  # each stage's, over its records so far
    for epoch in epochs:
        summary = epoch.summary
        batches[summary.stage] = batches.get(summary.stage, 0) + summary.batches
        if batches[summary.stage] > upto.get(summary.stage, batches[summary.stage]):
            continue  # past the checkpoint, or across it
        reporter.reported[summary.stage] = reporter.reported.get(summary.stage, 0) + 1
        reporter.epochs.append(summary)
        if epoch.findings:
            reporter.findings_by_epoch[(summary.stage, summary.epoch)] = list(epoch.findings)
        if epoch.ranks:
            reporter.ranks[(summary.stage, summary.epoch)] = epoch.ranks
        if epoch.compile is not None:
            reporter.compile_stats[(summary.stage, summary.epoch)] = epoch.compile
        if epoch.steps is not None:
            reporter.step_splits[(summary.stage, summary.epoch)] = epoch.steps
    analysed = {
        w["name"]: w for w in report["windows"]
    }  # the checkpoint keeps a window's record, the report its analysis
    kept = {w.name for w in reporter.windows}
    reporter.windows = [window_record(analysed[w.name]) if w.name in analysed else w for w in reporter.windows]
    reporter.windows += [window_record(w) for name, w in analysed.items() if name not in kept]  # after the checkpoint
    return True
