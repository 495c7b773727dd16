"""
PerfCallback
============

Scheduled ``torch.profiler`` windows for every stage of a Lightning run, with traces that TensorBoard's
PyTorch Profiler tab, Perfetto and Holistic Trace Analysis read, and operator tables in TensorBoard.

The callback only wires the layers together: :mod:`lightning_perf.schedule` says which batches to record,
:mod:`lightning_perf.collect.profiler` records them, :mod:`lightning_perf.summarize` and
:mod:`lightning_perf.report` turn the records into tables and files.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_perf import __version__, layout
from lightning_perf.collect.batch import BatchSizer
from lightning_perf.collect.memory import CudaPeaks, host_rss
from lightning_perf.collect.profiler import ProfilerWindow, WindowState, torch_profiler_active
from lightning_perf.collect.ranks import gather_ranks, rank_values
from lightning_perf.collect.run_info import dataloader_settings, first_dataloader, run_info, stage_dataloaders
from lightning_perf.collect.steps import StepClock
from lightning_perf.config import (
    DEFAULT_MAX_TRACE_MB,
    DEFAULT_MAX_WINDOWS,
    STAGES,
    PerfConfig,
    Schedule,
    SortKey,
    Stage,
)
from lightning_perf.diagnose.model import Finding, RunFacts, StageEpoch
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.records import EpochSummary, RankSummary, TraceSummary, WindowRecord, from_values
from lightning_perf.report.charts import step_split_caption, step_split_image
from lightning_perf.report.findings import console_report, findings_markdown, ranks_markdown
from lightning_perf.report.json_report import REPORT_FILENAME, report_dict, window_dict, write_json_atomically
from lightning_perf.report.markdown import operator_table
from lightning_perf.report.metrics import batch_metrics, epoch_metrics
from lightning_perf.report.outputs import Outputs
from lightning_perf.schedule import Action, make_plan
from lightning_perf.summarize.events import as_trace
from lightning_perf.summarize.operators import default_sort_key, top_operators
from lightning_perf.summarize.ranks import rank_work_times
from lightning_perf.summarize.steps import summarize_epoch
from lightning_perf.summarize.trace import operator_stats, summarize_trace

OPERATORS_TAG = "perf/operators/{stage}"
STRICT_ENV = "LIGHTNING_PERF_STRICT"


STATE_VERSION = 1


def _strict_from_environment() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")

FINDINGS_TAG = "perf/findings/{stage}"
RANKS_TAG = "perf/ranks/{stage}"


@dataclass
class _StageState:
    """Where one stage is: its epoch, its batch within the epoch, its clocks, and the windows it has used."""

    clock: StepClock
    epoch: int = -1
    batch: int = 0
    num_batches: float = math.inf
    total_batches: int = 0  # over the whole run: the stage's own TensorBoard step axis
    windows_used: int = 0
    windows_this_epoch: int = 0
    host_rss_peak: int | None = None


class PerfCallback(Callback):
    r"""Profiles chosen batches of each stage and logs what they show.

    Outside its windows the callback does two clock reads, a batch-size lookup, a few list appends and
    integer comparisons per batch: no profiler, no ``record_function``, no module hooks, no device
    synchronization.

    Args:
        schedule: When to record, as :class:`~lightning_perf.Schedule` or a mapping of its fields
            (``skip_first``, ``wait``, ``warmup``, ``active``, ``repeat``), with the meaning they have in
            ``torch.profiler.schedule``, counted in batches of each stage and restarted every epoch.
            Default (also for ``None``): ``Schedule()``: skip 5 batches, warm up 1, record 3, once per epoch.
        batches: Explicit batch indices (within an epoch) to record, each run of consecutive indices one
            window, each preceded by ``schedule.warmup`` warm-up batches. Replaces the cycles of ``schedule``.
        stages: Which of ``"train"``, ``"validate"``, ``"test"``, ``"predict"`` to profile.
        max_windows: At most this many windows per stage per run (``0``: none).
        dirpath: Output directory. Default: ``<logger.log_dir>/perf`` (``<default_root_dir>/perf`` without
            a logger), so that ``tensorboard --logdir <logger root>`` shows a run's scalars and traces.
        record_shapes: Record operator input shapes (``torch.profiler`` option; larger traces).
        profile_memory: Record tensor allocations (``torch.profiler`` option; slower windows).
        with_stack: Record Python call stacks (``torch.profiler`` option; much larger, slower traces).
        with_flops: Estimate FLOPs of matmul and conv operators (``torch.profiler`` option).
        row_limit: Operators per window in the operator table.
        sort_by: Operator table order: one of ``self_cpu_time``, ``cpu_time``, ``self_device_time``,
            ``device_time``, ``calls``, ``self_cpu_memory``, ``self_device_memory``. Default (``None``):
            self device time when CUDA is profiled, else self CPU time.
        tensorboard_compat: Rewrite the few event categories that torch-tb-profiler 0.4.3 misreads, so its
            Overview shows the DataLoader and Runtime shares (see :mod:`lightning_perf.traces`).
        log_loss: Log the loss each ``*_step`` returns (a tensor, or a mapping's ``"loss"``).
        batch_size_fn: ``batch -> int``, the samples in a batch; default: the first dimension of the first
            tensor found in it.
        thresholds: Overrides of the bottleneck rules' thresholds, by name (see
            :class:`~lightning_perf.diagnose.thresholds.Thresholds`), e.g. ``{"dataloader_warning": 0.2}``.
        verbose: What the console shows at each epoch end: ``0`` nothing, ``1`` one line per epoch and the
            warning and critical findings with their advice, ``2`` also info findings and all evidence.
        ranks: The global ranks that record profiler windows (default: all). Every rank measures its
            batches and joins the per-epoch cross-rank summary either way.
        max_trace_mb: The most a window's trace may hold, in MB of (uncompressed) JSON; a larger one keeps
            its first steps that fit, with a warning.
        strict: Re-raise a failure of our own collection or reporting instead of warning once and going on.
            Default (``None``): the environment variable ``LIGHTNING_PERF_STRICT`` (``1`` = strict), else off.

    Raises:
        ValueError: At construction, listing every invalid argument with its value and what is allowed.
        MisconfigurationException: At setup, if another torch profiler would run at the same time
            (``Trainer(profiler="pytorch")`` or an active ``torch.profiler.profile``).

    Logged (see README, "Logged metrics", for units and cadence):
        ``perf/<stage>/batch/*`` and ``perf/<stage>/epoch/*`` scalars to every logger; the images
        ``perf/<stage>/step_split``; the text ``perf/operators/<stage>`` (one operator table per window) and
        ``perf/findings/<stage>`` (each epoch's findings). Training series are at the trainer's
        ``global_step``, the other stages' at their own batch count.

    Example::

        from lightning_perf import PerfCallback

        trainer = Trainer(callbacks=[PerfCallback(schedule={"wait": 1, "warmup": 1, "active": 2, "repeat": 2})])
        trainer.fit(model)
        trainer.callbacks[0].windows  # one WindowRecord per saved trace
    """

    def __init__(
        self,
        *,
        schedule: Schedule | None = Schedule(),  # a mapping of its fields works too (see Args)
        batches: Sequence[int] | None = None,
        stages: Sequence[Stage] = STAGES,
        max_windows: int = DEFAULT_MAX_WINDOWS,
        dirpath: str | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        row_limit: int = 20,
        sort_by: SortKey | None = None,
        tensorboard_compat: bool = True,
        log_loss: bool = True,
        batch_size_fn: Callable[[Any], int] | None = None,
        thresholds: dict[str, float] | None = None,
        verbose: int = 1,
        ranks: Sequence[int] | None = None,
        max_trace_mb: float = DEFAULT_MAX_TRACE_MB,
        strict: bool | None = None,
    ) -> None:
        self.config = PerfConfig.build(
            schedule=schedule,
            batches=batches,
            stages=stages,
            max_windows=max_windows,
            dirpath=dirpath,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            row_limit=row_limit,
            sort_by=sort_by,
            tensorboard_compat=tensorboard_compat,
            log_loss=log_loss,
            batch_size_fn=batch_size_fn,
            thresholds=thresholds,
            verbose=verbose,
            ranks=ranks,
            max_trace_mb=max_trace_mb,
            strict=strict,
        )
        self._plan = make_plan(self.config)
        self._strict = self.config.strict if self.config.strict is not None else _strict_from_environment()
        if self.config.schedule.warmup == 0:
            rank_zero_warn(
                "PerfCallback: schedule.warmup=0: the first recorded batch of each window will carry the"
                " profiler's own start-up cost. torch.profiler recommends warmup >= 1."
            )
        self._batch_size = BatchSizer(batch_size_fn)
        self._stages: dict[str, _StageState] = {stage: _StageState(StepClock(self._batch_size)) for stage in STAGES}
        self._window: ProfilerWindow | None = None
        self._window_stage: str | None = None
        self._window_epoch = 0
        self._warned: set[str] = set()
        self._outputs: Outputs | None = None
        self._cuda_peaks: CudaPeaks | None = None
        self._run_info: dict[str, Any] = {}
        self._use_cuda = False
        self._rank = 0
        self._window_step = 0
        self._windows_at_setup = 0
        self.dirpath: str | None = None
        self.tensorboard_logdir: str | None = None
        #: Every window saved so far in this process, in order.
        self.windows: list[WindowRecord] = []
        #: Every stage epoch measured so far in this process, in order.
        self.epochs: list[EpochSummary] = []
        #: The findings of the latest stage epoch that ended (on rank zero).
        self.findings: list[Finding] = []
        self._findings: dict[tuple[str, int], list[Finding]] = {}
        self._ranks: dict[tuple[str, int], tuple[RankSummary, ...]] = {}
        self._staged: list[tuple[str, str]] = []  # (written, final) trace paths, published at epoch ends
        self._world_size = 1
        self._records = True  # this rank records windows (config.ranks); decided at setup
        self._report_file: str | None = None
        self._validation_in_train_epoch: list[EpochSummary] = []

    @property
    def report(self) -> dict[str, Any]:
        """Everything measured so far, as written to ``perf_report.json`` (see README for the schema)."""
        return report_dict(
            generated_by=f"lightning-perf {__version__}",
            run=self._run_info,
            epochs=self.epochs,
            windows=self.windows,
            findings=self._findings,
            ranks=self._ranks,
        )

    def findings_for(self, stage: str, epoch: int | None = None) -> list[Finding]:
        """The findings of a stage's epoch, or of all its epochs (``epoch=None``), oldest first."""
        return [f for (s, e), found in self._findings.items() if s == stage and epoch in (None, e) for f in found]

    @property
    def report_path(self) -> str | None:
        """Where ``perf_report.json`` goes: ``perf_report-1.json``, ... when another run's is already there."""
        return None if self.dirpath is None or self._report_file is None else os.path.join(self.dirpath, self._report_file)

    # ------------------------------------------------------------------ checkpoints

    @property
    @override
    def state_key(self) -> str:
        # Two PerfCallbacks with different stages or output directories keep separate state in a checkpoint.
        return self._generate_state_key(stages=self.config.stages, dirpath=self.config.dirpath)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Plain values only: where each stage is, and the history the report keeps."""
        return {
            "version": STATE_VERSION,
            "stages": {
                stage: {"epoch": st.epoch, "total_batches": st.total_batches, "windows_used": st.windows_used}
                for stage, st in self._stages.items()
            },
            "epochs": [dataclasses.asdict(e) for e in self.epochs],
            "windows": [window_dict(w, with_summary=False) for w in self.windows],
            "findings": [dataclasses.asdict(f) for found in self._findings.values() for f in found],
            "ranks": [
                {"stage": stage, "epoch": epoch, "ranks": [dataclasses.asdict(r) for r in ranks]}
                for (stage, epoch), ranks in self._ranks.items()
            ],
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s values; tolerates the keys a different version wrote or left out at the
        top level, and the record fields a newer one added."""
        for stage, saved in state_dict.get("stages", {}).items():
            if stage in self._stages:
                st = self._stages[stage]
                st.epoch = int(saved.get("epoch", st.epoch))
                st.total_batches = int(saved.get("total_batches", st.total_batches))
                st.windows_used = int(saved.get("windows_used", st.windows_used))
        self.epochs = [from_values(EpochSummary, e) for e in state_dict.get("epochs", [])]
        self.windows = [from_values(WindowRecord, w) for w in state_dict.get("windows", [])]
        self._findings = {}
        for f in state_dict.get("findings", []):
            finding = from_values(Finding, f)
            self._findings.setdefault((finding.stage, finding.epoch), []).append(finding)
        self._ranks = {
            (saved["stage"], saved["epoch"]): tuple(from_values(RankSummary, r) for r in saved["ranks"])
            for saved in state_dict.get("ranks", [])
        }

    # ------------------------------------------------------------------ setup and teardown

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if isinstance(trainer.profiler, PyTorchProfiler):
            raise MisconfigurationException(
                "PerfCallback cannot run together with Lightning's PyTorchProfiler (`Trainer(profiler=\"pytorch\")`):"
                " two torch profilers cannot run at once. Remove the `profiler` argument; PerfCallback records"
                " the same traces, on a schedule you choose."
            )
        if torch_profiler_active():
            raise MisconfigurationException(
                "PerfCallback found a torch profiler already running (a `torch.profiler.profile` context around"
                " the Trainer call?): two torch profilers cannot run at once. Remove one of them."
            )
        self.dirpath = os.path.abspath(
            self.config.dirpath or os.path.join(trainer.log_dir or trainer.default_root_dir, layout.PERF_SUBDIR)
        )
        try:
            os.makedirs(self.dirpath, exist_ok=True)
        except OSError as err:
            raise MisconfigurationException(
                f"PerfCallback cannot write its output directory dirpath={self.dirpath!r}: {err}"
            ) from err
        if self._report_file is None or not os.path.exists(os.path.join(self.dirpath, self._report_file)):
            self._report_file = layout.unused_name(self.dirpath, REPORT_FILENAME)
        logger = trainer.loggers[0] if trainer.loggers else None
        if isinstance(logger, (TensorBoardLogger, CSVLogger)):
            self.tensorboard_logdir = logger.root_dir
        else:
            self.tensorboard_logdir = self.dirpath
        self._outputs = Outputs(trainer.loggers, fallback_dir=self.dirpath)
        self._outputs.prepare()  # not inside the first window's close: opening a writer takes tens of ms
        self._use_cuda = trainer.strategy.root_device.type == "cuda"
        self._cuda_peaks = CudaPeaks(trainer.strategy.root_device) if self._use_cuda else None
        self._run_info = {**run_info(trainer), "dataloaders": self._run_info.get("dataloaders", {})}
        self._rank = trainer.global_rank
        self._world_size = trainer.world_size
        self._records = self.config.ranks is None or self._rank in self.config.ranks
        self._windows_at_setup = len(self.windows)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._close_window_safely()
        self._safely(None, self._publish_staged)
        if self._outputs is not None:
            self._outputs.flush()
            self._outputs.close()
        new = self.windows[self._windows_at_setup :]
        if new:
            rank_zero_info(
                f"lightning-perf: {len(new)} profiler window(s) saved under {self.dirpath}\n"
                f"  View them: tensorboard --logdir {self.tensorboard_logdir}"
            )

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Interrupted (an exception, Ctrl-C): save what is open, so the traces and the report stay valid.
        self._close_window_safely()
        self._safely(None, self._publish_staged)
        if trainer.is_global_zero and self.report_path is not None:
            self._safely(None, write_json_atomically, self.report, self.report_path)

    # ------------------------------------------------------------------ stage hooks

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start("train", trainer, trainer.current_epoch, trainer.num_training_batches)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx != self._stages["train"].batch and "train" in self.config.stages:
            # Resumed from a mid-epoch checkpoint: Lightning continues the epoch without on_train_epoch_start.
            self._epoch_start("train", trainer, trainer.current_epoch, trainer.num_training_batches, batch_idx)
        self._batch_start("train", batch)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batch_end("train", trainer, outputs)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end("train", trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A validation run inside a training epoch must not land in a training window's trace: a window that
        # has recorded batches pauses; one that has not (still warming up) is dropped and set up again after
        # validation, so that the validation run can have a window of its own.
        if trainer.sanity_checking or self._window_stage != "train" or self._window is None:
            return
        try:
            if self._window.state is WindowState.RECORDING and self._window.ran:
                self._window.pause()
            else:
                self._close_window(shortened=False)
        except Exception as err:
            self._fail("train", err)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING or "train" not in self.config.stages:
            return
        self._stages["train"].clock.restart()  # the validation run is no training batch's data wait
        try:
            if self._window is not None and self._window.state is WindowState.PAUSED:
                self._window.resume()
            elif self._window is None:
                self._before_batch("train", self._stages["train"], trainer)
        except Exception as err:
            self._fail("train", err)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._eval_epoch_start("validate", trainer, trainer.num_val_batches)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.sanity_checking:
            self._batch_start("validate", batch)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self._batch_end("validate", trainer, outputs)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._epoch_end("validate", trainer)

    @override
    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_epoch_start("test", trainer, trainer.num_test_batches)

    @override
    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_start("test", batch)

    @override
    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_end("test", trainer, outputs)

    @override
    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end("test", trainer)

    @override
    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_epoch_start("predict", trainer, trainer.num_predict_batches)

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_start("predict", batch)

    @override
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_end("predict", trainer, outputs)

    @override
    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end("predict", trainer)

    # ------------------------------------------------------------------ the machinery, stage-agnostic

    def _eval_epoch_start(self, stage: str, trainer: pl.Trainer, num_batches: Sequence[float]) -> None:
        epoch = self._stages[stage].epoch + 1
        self._epoch_start(stage, trainer, epoch, sum(num_batches))

    def _epoch_start(
        self, stage: str, trainer: pl.Trainer, epoch: int, num_batches: float, first_batch: int = 0
    ) -> None:
        if stage not in self.config.stages:
            return
        st = self._stages[stage]
        st.epoch, st.batch, st.num_batches, st.windows_this_epoch = epoch, first_batch, num_batches, 0
        self._safely(stage, self._start_measuring, stage, st, trainer)
        self._safely(stage, self._before_batch, stage, st, trainer)
        st.clock.epoch_start()

    def _start_measuring(self, stage: str, st: _StageState, trainer: pl.Trainer) -> None:
        st.host_rss_peak = host_rss()
        if self._cuda_peaks is not None:
            self._cuda_peaks.start(stage)
        dataloaders = self._run_info.setdefault("dataloaders", {})
        if stage not in dataloaders:
            dataloaders[stage] = dataloader_settings(first_dataloader(stage_dataloaders(trainer, stage)))

    def _batch_start(self, stage: str, batch: Any) -> None:
        if stage not in self.config.stages:
            return
        st = self._stages[stage]
        window = self._window
        if window is not None and self._window_stage == stage:
            st.clock.batch_start(batch, profiled=True)
            window.mark_ran(st.batch)
        else:
            st.clock.batch_start(batch)

    def _batch_end(self, stage: str, trainer: pl.Trainer, outputs: Any) -> None:
        if stage not in self.config.stages:
            return
        st = self._stages[stage]
        st.clock.batch_end(outputs, keep_loss=self.config.log_loss and stage != "predict")
        st.total_batches += 1
        # Inline try blocks, not _safely(): free in CPython 3.11 when nothing raises, and no bound-method or
        # argument-tuple allocation on every batch.
        cadence = trainer.log_every_n_steps  # 0 (e.g. Trainer(barebones=True)): no per-batch scalars
        if cadence and st.total_batches % cadence == 0:
            try:
                self._log_batch(stage, st, trainer)
            except Exception as err:
                self._fail(stage, err)
        if self._window is not None:
            try:
                self._end_window_step(stage, st)
            except Exception as err:
                self._fail(stage, err)
        st.batch += 1
        try:
            self._before_batch(stage, st, trainer)
        except Exception as err:
            self._fail(stage, err)
        # What we did after the batch (logging, closing a window) is no part of the next batch's data wait.
        st.clock.restart()

    def _log_batch(self, stage: str, st: _StageState, trainer: pl.Trainer) -> None:
        clock = st.clock
        loss = clock.last_loss
        metrics = batch_metrics(
            stage,
            data_wait=clock.data_wait[-1],
            compute=clock.compute[-1],
            batch_size=clock.batch_sizes[-1],
            loss=None if loss is None else float(loss),  # the one device sync, at the logging cadence only
        )
        if self._outputs is not None:
            self._outputs.log_scalars(metrics, self._step(stage, st, trainer))
        rss = host_rss()
        if rss is not None:
            st.host_rss_peak = max(rss, st.host_rss_peak or 0)

    def _step(self, stage: str, st: _StageState, trainer: pl.Trainer) -> int:
        """The stage's step axis: the trainer's global step for training, the stage's own batch count else."""
        return trainer.global_step if stage == "train" else st.total_batches

    def _end_window_step(self, stage: str, st: _StageState) -> None:
        window = self._window
        if window is not None and self._window_stage == stage and window.state is WindowState.RECORDING:
            window.end_step()
            if self._plan.action(st.batch, st.num_batches) is Action.RECORD_AND_SAVE:
                self._close_window(shortened=False)

    def _epoch_end(self, stage: str, trainer: pl.Trainer) -> None:
        if stage not in self.config.stages:
            return
        if self._window_stage == stage:
            self._safely(stage, self._close_window, shortened=True)
        st = self._stages[stage]
        summary: EpochSummary | None = None
        try:
            summary = self._measure_epoch(stage, st)
        except Exception as err:
            self._fail(stage, err)
        ranks = self._gather_ranks(stage, summary, trainer)  # on every rank, whatever happened above
        self._safely(stage, self._publish_staged)
        if summary is not None:
            self._safely(stage, self._report_epoch, summary, st, trainer, ranks)
        first = self._plan.first_active()
        if (
            st.windows_this_epoch == 0
            and first is not None
            and st.batch <= first
            and st.windows_used < self.config.max_windows
        ):
            self._warn_once(
                f"short:{stage}",
                f"PerfCallback: the {stage} epoch had {st.batch} batches, too few for the schedule (its first"
                f" recorded batch is {first}), so it has no profiler window. Lower `schedule.skip_first`/`wait`,"
                f" or pass `batches=[...]`.",
            )

    def _measure_epoch(self, stage: str, st: _StageState) -> EpochSummary:
        clock = st.clock
        rss = host_rss()
        cuda = self._cuda_peaks.read(stage, utilization=True) if self._cuda_peaks is not None else None
        summary = summarize_epoch(
            stage=stage,
            epoch=st.epoch,
            data_wait=clock.data_wait,
            compute=clock.compute,
            batch_sizes=clock.batch_sizes,
            profiled=clock.profiled,
            loss=clock.mean_loss(),
            host_rss=rss,
            host_rss_peak=max(rss or 0, st.host_rss_peak or 0) or None,
            cuda_max_allocated=cuda.max_allocated if cuda else None,
            cuda_max_reserved=cuda.max_reserved if cuda else None,
            cuda_capacity=cuda.capacity if cuda else None,
            cuda_utilization=cuda.utilization if cuda else None,
        )
        self.epochs.append(summary)
        return summary

    def _gather_ranks(self, stage: str, summary: EpochSummary | None, trainer: pl.Trainer) -> tuple[RankSummary, ...]:
        """Every rank's epoch numbers, through the strategy's collective; ``()`` in a single process."""
        if self._world_size <= 1:
            return ()
        try:
            values = rank_values(summary, self._window_summaries(stage, summary.epoch) if summary else ())
        except Exception:  # whatever went wrong, this rank still takes part in the collective
            values = rank_values(None, [])
        try:
            return gather_ranks(trainer, values)
        except Exception as err:
            self._warn_once("gather", f"PerfCallback: gathering the ranks' epoch summaries failed ({err}).")
            return ()

    def _publish_staged(self) -> None:
        """Gives this rank's traces their final names once every rank has written its own (after a gather).

        TensorBoard's profiler plugin loads a run directory once, when it first holds a trace: the ranks of a
        window must appear together, or the later ones would be missed.
        """
        staged, self._staged = self._staged, []
        for written, final in staged:
            if os.path.exists(written):
                os.replace(written, final)

    def _report_epoch(
        self, summary: EpochSummary, st: _StageState, trainer: pl.Trainer, ranks: tuple[RankSummary, ...]
    ) -> None:
        stage, clock = summary.stage, st.clock
        if ranks:
            self._ranks[(stage, summary.epoch)] = ranks
        findings = self._diagnose(summary, st, trainer, ranks) if trainer.is_global_zero else []
        if self._batch_size.failed:
            self._warn_once("batch_size_fn", f"PerfCallback: {self._batch_size.failed}; throughput is not measured.")
        if self._outputs is not None:
            step = self._step(stage, st, trainer)
            self._outputs.log_scalars(epoch_metrics(summary), step)
            if summary.batches:
                tag = f"perf/{stage}/step_split"
                self._outputs.add_image(tag, step_split_image(clock.data_wait, clock.compute), step)
                self._outputs.add_text(tag + "_caption", step_split_caption(clock.data_wait, clock.compute), step)
            self._outputs.add_text(FINDINGS_TAG.format(stage=stage), findings_markdown(summary, findings), step)
            if ranks:
                self._outputs.add_text(RANKS_TAG.format(stage=stage), ranks_markdown(summary, ranks), step)
        if trainer.is_global_zero:
            message = console_report(summary, findings, verbose=self.config.verbose, ranks=ranks)
            if message:
                rank_zero_info(message)
            if self.report_path is not None:
                write_json_atomically(self.report, self.report_path)

    def _window_summaries(self, stage: str, epoch: int) -> tuple[TraceSummary, ...]:
        """The trace summaries of the stage epoch's windows."""
        return tuple(w.summary for w in self.windows if w.stage == stage and w.epoch == epoch and w.summary)

    def _diagnose(
        self, summary: EpochSummary, st: _StageState, trainer: pl.Trainer, ranks: tuple[RankSummary, ...]
    ) -> list[Finding]:
        stage = summary.stage
        if stage == "validate" and trainer.state.fn == TrainerFn.FITTING:
            self._validation_in_train_epoch.append(summary)
        validation: tuple[EpochSummary, ...] = ()
        if stage == "train":
            validation, self._validation_in_train_epoch = tuple(self._validation_in_train_epoch), []
        context = StageEpoch(
            epoch=summary,
            history=tuple(e for e in self.epochs[:-1] if e.stage == stage),
            windows=self._window_summaries(stage, summary.epoch),
            validation=validation,
            facts=self._facts(stage),
            step_times=tuple(
                math.nan if p else w + c for w, c, p in zip(st.clock.data_wait, st.clock.compute, st.clock.profiled)
            ),
            rank_step_times=rank_work_times(ranks) or None,
        )
        findings = diagnose(context, self.config.thresholds, on_error=self._rule_failed)
        self._findings[(stage, summary.epoch)] = findings
        self.findings = findings
        return findings

    def _facts(self, stage: str) -> RunFacts:
        run = self._run_info
        loader = run.get("dataloaders", {}).get(stage) or {}
        return RunFacts(
            device=run.get("device", "cpu"),
            device_name=run.get("device_name"),
            precision=run.get("precision"),
            world_size=run.get("world_size", 1),
            cpu_count=run.get("cpu_count"),
            torch_threads=run.get("torch_threads"),
            num_workers=loader.get("num_workers"),
            pin_memory=loader.get("pin_memory"),
            persistent_workers=loader.get("persistent_workers"),
            batch_size=loader.get("batch_size"),
        )

    def _rule_failed(self, rule_id: str, err: Exception) -> None:
        if self._strict:
            raise err
        self._warn_once(
            f"rule:{rule_id}", f"PerfCallback: the {rule_id} rule failed ({type(err).__name__}: {err}); it is skipped."
        )

    def _before_batch(self, stage: str, st: _StageState, trainer: pl.Trainer) -> None:
        """Sets the profiler up for batch ``st.batch`` of ``stage``, as the plan says."""
        if st.batch >= st.num_batches:
            # The epoch's last batch is done: a window still open cannot complete.
            if self._window_stage == stage:
                self._close_window(shortened=True)
            return
        if self._window is None and (not self._records or st.windows_used >= self.config.max_windows):
            return  # no window to open on this rank, or no more for this stage: nothing to plan, every batch
        action = self._plan.action(st.batch, st.num_batches)
        if action is Action.NONE:
            return
        window = self._window
        if window is None:
            window = self._open_window(stage, st, trainer)
            if window is None:
                return
        elif self._window_stage != stage:
            self._info_once(
                f"overlap:{stage}",
                f"PerfCallback: a {stage} window was skipped: it fell inside a {self._window_stage} window"
                f" (a validation run in the middle of a training window). Only one profiler can run at a time.",
            )
            return
        if action is Action.WARMUP:
            if window.state is WindowState.CREATED:
                window.warm_up()
            return
        if window.state in (WindowState.CREATED, WindowState.WARMING_UP):
            window.start()
            self._window_step = self._step(stage, st, trainer)
            if self._cuda_peaks is not None:
                self._cuda_peaks.start("window")
        window.begin_step(st.batch)

    def _open_window(self, stage: str, st: _StageState, trainer: pl.Trainer) -> ProfilerWindow | None:
        if torch_profiler_active():
            self._warn_once(
                f"busy:{stage}",
                f"PerfCallback: a {stage} window was skipped because another torch profiler is running.",
            )
            return None
        self._window = ProfilerWindow(
            use_cuda=self._use_cuda,
            record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory,
            with_stack=self.config.with_stack,
            with_flops=self.config.with_flops,
            metadata={"lightning_perf": {"stage": stage, "epoch": st.epoch, "global_rank": self._rank}},
        )
        self._window_stage = stage
        self._window_epoch = st.epoch
        st.windows_used += 1
        if st.windows_used == self.config.max_windows:
            self._info_once(
                f"max:{stage}",
                f"PerfCallback: this {stage} window is the last of max_windows={self.config.max_windows}; no more"
                f" {stage} traces in this run.",
            )
        return self._window

    def _close_window(self, *, shortened: bool) -> None:
        # Reading a trace back builds many small acyclic objects: the cyclic collector would run over and
        # over while they are built, for nothing (half the time on large traces), so it waits meanwhile.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._close_window_collecting_later(shortened=shortened)
        finally:
            if collecting:
                gc.enable()

    def _close_window_collecting_later(self, *, shortened: bool) -> None:
        window, stage = self._window, self._window_stage
        if window is None or stage is None:
            return
        self._window = self._window_stage = None
        st = self._stages[stage]
        start = time.perf_counter()
        cuda = self._cuda_peaks.read("window") if self._cuda_peaks is not None else None
        if window.state is not WindowState.STOPPED:
            window.stop()
        recorded = window.recorded
        if not recorded:
            st.windows_used -= 1  # nothing recorded: the window does not count against max_windows
            return
        if shortened:
            self._warn_once(
                f"shortened:{stage}",
                f"PerfCallback: a {stage} window was cut short by the end of its epoch or of the run (recorded"
                f" batches {recorded[0]}-{recorded[-1]}); its trace is saved as it is.",
            )
        st.windows_this_epoch += 1
        assert self.dirpath is not None
        name = layout.window_dirname(stage, self._window_epoch, recorded[0], recorded[-1])
        window_dir = os.path.join(self.dirpath, name)
        if os.path.exists(os.path.join(window_dir, layout.trace_filename(self._rank))):
            window_dir = os.path.join(self.dirpath, layout.unused_name(self.dirpath, name))
        os.makedirs(window_dir, exist_ok=True)
        trace_path = os.path.join(window_dir, layout.trace_filename(self._rank))
        if self._world_size > 1:
            # Under a name no trace reader picks up, until every rank has written its own (_publish_staged).
            written = layout.staged_path(trace_path)
            self._staged.append((written, trace_path))
        else:
            written = trace_path
        trace = window.save(
            written,
            tensorboard_compat=self.config.tensorboard_compat,
            max_bytes=int(self.config.max_trace_mb * 2**20),
        )
        typed = as_trace(trace, shapes=self.config.record_shapes)  # the trace as saved, as the analyses read it
        del trace
        if window.cut_to is not None:
            self._warn_once(
                f"cut:{stage}",
                f"PerfCallback: a {stage} window's trace was larger than max_trace_mb={self.config.max_trace_mb:g};"
                f" it keeps its first {window.cut_to} step(s). Record fewer batches (`schedule.active`), or raise"
                " `max_trace_mb`.",
            )
        record = WindowRecord(
            stage=stage,
            epoch=self._window_epoch,
            first_batch=recorded[0],
            last_batch=recorded[-1],
            name=os.path.basename(window_dir),
            trace_path=trace_path,
            step=self._window_step,
            device="cuda" if self._use_cuda else "cpu",
            shortened=shortened,
            cuda_max_allocated=cuda.max_allocated if cuda else None,
            cuda_max_reserved=cuda.max_reserved if cuda else None,
            operators=operator_stats(typed, group_by_input_shape=self.config.record_shapes),
            summary=summarize_trace(typed, window=os.path.basename(window_dir)),
        )
        sort_by = self.config.sort_by or default_sort_key(record.device)
        table = operator_table(record, top_operators(record.operators, sort_by=sort_by, row_limit=self.config.row_limit), sort_by=sort_by)
        with open(os.path.join(window_dir, layout.operators_filename(self._rank)), "w", encoding="utf-8") as f:
            f.write(table)
        if self._outputs is not None:
            self._outputs.add_text(OPERATORS_TAG.format(stage=stage), table, record.step)
        self.windows.append(dataclasses.replace(record, close_seconds=time.perf_counter() - start))

    def _close_window_safely(self) -> None:
        self._safely(self._window_stage, self._close_window, shortened=True)

    def _safely(self, stage: str | None, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as err:
            self._fail(stage, err)

    def _fail(self, stage: str | None, err: Exception) -> None:
        """Our own collection or reporting failed: drop the stage's window, say so once, let training go on
        (or re-raise, when ``strict``)."""
        if self._strict:
            raise err
        window = None
        if stage is not None and self._window_stage == stage:
            window, self._window, self._window_stage = self._window, None, None
        if window is not None and window.state not in (WindowState.CREATED, WindowState.STOPPED):
            try:
                window.stop()
            except Exception:  # the profiler is already broken; nothing more to save
                pass
        self._warn_once(
            f"error:{type(err).__name__}",
            f"PerfCallback: {f'measuring the {stage} stage' if stage else 'saving its output'} failed"
            f" ({type(err).__name__}: {err}); what it was measuring is lost, training goes on, and later epochs"
            " and windows are still measured.",
        )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)

    def _info_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_info(message)
