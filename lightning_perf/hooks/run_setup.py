"""
Run setup
=========

What :class:`~lightning_perf.PerfCallback` decides when a Trainer sets it up: whether it can run at all (one
torch profiler at a time), where its output goes (:func:`output_places`), and what the report says about the run
(:func:`call_run_info`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_perf import layout
from lightning_perf.budget import ProfilingBudget
from lightning_perf.collect.packages import lightning_classes
from lightning_perf.collect.profiler import torch_profiler_active
from lightning_perf.collect.verdicts import SharedVerdicts
from lightning_perf.report.json_report import REPORT_FILENAME
from lightning_perf.report.metrics import charts_layout
from lightning_perf.report.outputs import Outputs
from lightning_perf.report.profiling import profiling_line


def refuse_other_profilers(trainer: pl.Trainer) -> None:
    """Fails when another torch profiler would run at the same time as our windows.

    Raises:
        MisconfigurationException: ``Trainer(profiler="pytorch")`` (of either Lightning package), or a
            ``torch.profiler.profile`` already running.
    """
    # Trainer.profiler, .fast_dev_run: set by Lightning's connectors in __init__, unseen by mypy.
    profiler = trainer.profiler  # type: ignore[attr-defined]
    if isinstance(profiler, lightning_classes("profilers", "PyTorchProfiler")):
        raise MisconfigurationException(
            'PerfCallback cannot run together with Lightning\'s PyTorchProfiler (`Trainer(profiler="pytorch")`):'
            " two torch profilers cannot run at once. Remove the `profiler` argument; PerfCallback records"
            " the same traces, on a schedule you choose."
        )
    if torch_profiler_active():
        raise MisconfigurationException(
            "PerfCallback found a torch profiler already running (a `torch.profiler.profile` context around"
            " the Trainer call?): two torch profilers cannot run at once. Remove one of them."
        )


# The run facts that are a fit's plan: a later validate, test or predict call (one epoch, no optimizer) keeps the
# fit's in the report's ``run``, which describes the training it reports, and diagnoses its own epochs with its
# own (:func:`call_run_info`).
FIT_PLAN = ("max_epochs", "val_check_steps", "optimizer_info")
# What an earlier Trainer call measured and a later one keeps: the DataLoaders' settings, the FLOP counts, the
# advice trials (a `test` or `predict` on the fit's Trainer reports the fit's findings, whose page and `compare`
# labels read the trials).
MEASURED = ("dataloaders", "flops", "advice_trials")


def call_run_info(
    earlier: Mapping[str, Any], fresh: Mapping[str, Any], *, fit: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the report's ``run`` holds from a Trainer call's setup on, and the facts the call's epochs are
    diagnosed with.

    Args:
        earlier: The run facts the earlier calls left (``{}`` at the first).
        fresh: This call's own facts (:func:`~lightning_perf.collect.run_info.run_info`).
        fit: Whether the call is a ``fit``: its plan replaces an earlier fit's.

    Returns:
        ``(run, plan)``: ``fresh`` with what the earlier calls measured (:data:`MEASURED`) and, unless ``fit``, an
        earlier fit's :data:`FIT_PLAN`; and the call's own plan, which the diagnosis reads over ``run`` (a test
        call's epoch is diagnosed as the one epoch it is, while the report keeps the fit's ``max_epochs``).
    """
    keep = MEASURED if fit else MEASURED + FIT_PLAN
    run = {**fresh, **{key: earlier[key] for key in keep if key in earlier}}
    plan = {key: fresh[key] for key in FIT_PLAN if key in fresh}
    return run, plan


@dataclass(frozen=True)
class OutputPlaces:
    """Where a run's output goes; all ``None`` under ``fast_dev_run`` (but ``report_file``: kept for later).

    Attributes:
        dirpath: The output directory (traces, operator tables, the report).
        report_file: The report's file name in it: ``perf_report.json``, or ``perf_report-1.json``, ... when
            another run's is already there.
        report_path: ``dirpath`` joined with ``report_file``.
        tensorboard_logdir: The ``tensorboard --logdir`` that shows the run's scalars and traces.
        outputs: The loggers and the event file the callback writes to, its writer already opened.
        place: What chose ``dirpath`` where no logger or ``dirpath`` option did (:func:`~lightning_perf.layout.
            default_dirpath`), else ``None``.
    """

    dirpath: str | None
    report_file: str | None
    report_path: str | None
    tensorboard_logdir: str | None
    outputs: Outputs | None
    place: str | None = None


def output_places(
    trainer: pl.Trainer, dirpath: str | None, report_file: str | None, stages: Sequence[str] = ()
) -> OutputPlaces:
    """Decides where everything goes: the output directory, the report's name, the loggers (of either
    Lightning package), the ``tensorboard --logdir`` to show; nowhere under ``fast_dev_run``.

    Args:
        trainer: The trainer being set up.
        dirpath: The ``dirpath`` option: default ``<logger.log_dir>/perf``, and without a logger
            :func:`~lightning_perf.layout.default_dirpath`.
        report_file: The report's name at an earlier setup of the same callback: kept while that file exists
            (``fit`` then ``test`` write one report).
        stages: The stages measured: TensorBoard's Custom Scalars layout draws theirs.

    Raises:
        MisconfigurationException: The output directory cannot be made.
    """
    if trainer.fast_dev_run:  # type: ignore[attr-defined]
        # Lightning writes nothing in this mode, nor do we: no window, event file or report, the console
        # summary only.
        return OutputPlaces(
            dirpath=None, report_file=report_file, report_path=None, tensorboard_logdir=None, outputs=None
        )
    place = None
    if dirpath is None:
        log_dir = trainer.log_dir  # every rank asks: Lightning broadcasts rank 0's
        checkpoints = [getattr(cb, "dirpath", None) for cb in trainer.checkpoint_callbacks]
        logger_dir = log_dir if trainer.loggers else None
        dirpath, place = layout.default_dirpath(logger_dir, trainer.default_root_dir, checkpoints, cwd=os.getcwd())
    dirpath = os.path.abspath(dirpath)
    try:
        os.makedirs(dirpath, exist_ok=True)
    except OSError as err:
        raise MisconfigurationException(
            f"PerfCallback cannot write its output directory dirpath={dirpath!r}: {err}"
        ) from err
    if report_file is None or not os.path.exists(os.path.join(dirpath, report_file)):
        report_file = layout.unused_name(dirpath, REPORT_FILENAME)
    tensorboard = lightning_classes("loggers", "TensorBoardLogger")
    logger = trainer.loggers[0] if trainer.loggers else None
    if logger is not None and isinstance(logger, (*tensorboard, *lightning_classes("loggers", "CSVLogger"))):
        tensorboard_logdir = logger.root_dir  # a CSVLogger's log_dir holds our own event file
    else:
        tensorboard_logdir = dirpath
    outputs = Outputs(
        trainer.loggers,
        tensorboards=[lg for lg in trainer.loggers if isinstance(lg, tensorboard)],
        fallback_dir=dirpath,
        layout=charts_layout(stages) if stages else None,  # written with the first per-batch scalars
    )
    outputs.prepare()  # not inside the first window's close: opening a writer takes tens of ms
    return OutputPlaces(
        dirpath=dirpath,
        report_file=report_file,
        report_path=os.path.join(dirpath, report_file),
        tensorboard_logdir=tensorboard_logdir,
        outputs=outputs,
        place=place,
    )


# The stages a Trainer call runs, by the ``stage`` Lightning passes to ``setup``.
CALL_STAGES = {"fit": ("train", "validate"), "validate": ("validate",), "test": ("test",), "predict": ("predict",)}


def charted_stages(call: str, enabled: Sequence[str], *, ran: Collection[str]) -> list[str]:
    """The stages TensorBoard's charts draw: those of ``enabled`` that this Trainer ``call`` (Lightning's
    ``setup`` stage) runs or that an earlier call ``ran``, in the order ``enabled`` lists them."""
    return [s for s in enabled if s in CALL_STAGES.get(call, ()) or s in ran]


def where_to_look(
    windows: int,
    dirpath: str | None,
    tensorboard_logdir: str | None,
    page: str | None,
    budget: ProfilingBudget | None = None,
    report: str | None = None,
) -> str:
    """The lines a Trainer call's end prints: the ``windows`` it saved and how to view them, the run's HTML
    report where it was written, else its ``perf_report.json`` (``report``: a window-less predict call has no page),
    and last what the profiling has cost the run (``budget``), after a window or a page; empty when none."""
    lines = []
    if windows:
        lines.append(f"lightning-perf: {windows} profiler window(s) saved under {dirpath}")
        lines.append(f"  View them: tensorboard --logdir {tensorboard_logdir}")
    if page is not None and os.path.exists(page):
        lines.append(f"lightning-perf: report (opens offline in a browser): {page}")
    if lines and budget is not None and (line := profiling_line(budget.cost(time.perf_counter()))):
        lines.append(line)
    if not lines and report is not None and os.path.exists(report):
        lines.append(f"lightning-perf: report: {report}")
    return "\n".join(lines)


def shared_verdicts(
    world_size: int, ranks: Sequence[int] | None, budget: ProfilingBudget, warn: Callable[[str, str], None]
) -> SharedVerdicts | None:
    """The ranks' shared budget verdicts for a setup (:class:`~lightning_perf.collect.verdicts.SharedVerdicts`,
    decided by the lowest rank that records windows); ``None`` in a single process or without a budget. Call it
    on every rank at every setup: the ranks' verdicts are matched by how many each has opened."""
    if world_size <= 1 or budget.share is None:
        return None
    recording = [rank for rank in (range(world_size) if ranks is None else ranks) if rank < world_size]
    return SharedVerdicts.open(min(recording), warn) if recording else None
