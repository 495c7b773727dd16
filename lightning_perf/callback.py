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
import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_perf import __version__, layout
from lightning_perf.collect.batch import BatchSizer
from lightning_perf.collect.cpu import EpochCpu
from lightning_perf.collect.loader import dataset_facts
from lightning_perf.collect.loops import LoopStartTimer
from lightning_perf.collect.memory import CudaPeaks, host_rss
from lightning_perf.collect.packages import lightning_classes
from lightning_perf.collect.profiler import ProfilerWindow, WindowState, torch_profiler_active
from lightning_perf.collect.ranks import EXCEPTION_WAIT_SECONDS, WAIT_SECONDS, RankExchange, rank_values
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
from lightning_perf.readers import InputError, load_report
from lightning_perf.records import EpochSummary, RankSummary, TraceSummary, WindowRecord, from_values, plain
from lightning_perf.report.charts import step_split_caption, step_split_image
from lightning_perf.report.findings import ShownFindings, console_report, findings_markdown, ranks_markdown
from lightning_perf.report.json_report import REPORT_FILENAME, ReportFile, report_dict, report_epochs, window_dict
from lightning_perf.report.metrics import batch_metrics, epoch_metrics
from lightning_perf.report.outputs import Outputs
from lightning_perf.schedule import Action, make_plan
from lightning_perf.summarize.ranks import rank_work_times
from lightning_perf.summarize.steps import summarize_epoch
from lightning_perf.window_close import ClosedWindow, WindowWorker, process_window

STRICT_ENV = "LIGHTNING_PERF_STRICT"


# Version 2 keeps only what resuming needs, bounded however long the run: each stage's position, the windows
# (at most max_windows per stage), the rules' recent history, and the report's path (a resumed run takes the
# earlier epochs back from that report). Version 1 also kept every epoch, finding and per-rank table.
STATE_VERSION = 2
# The earlier epochs of a stage the rules see (memory_growth reads a trailing run of epochs; its count
# saturates here), and so what a checkpoint keeps of them.
HISTORY_EPOCHS = 32


def _draws_step_split(epoch: int, has_window: bool) -> bool:
    """Whether an epoch gets a step-split image: at a stage's epochs 0, 1, 2, 4, 8, ... and at every epoch
    with a profiler window. TensorBoard keeps a sample of 4 images per tag by default, so one per epoch of a
    long run would be work nobody sees."""
    return has_window or epoch & (epoch - 1) == 0


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
    cpu: EpochCpu = dataclasses.field(default_factory=EpochCpu)  # the epoch's wall time, workers' CPU, CPU waits
    in_epoch: bool = False  # between its epoch start and end: what an interruption leaves to summarize
    history: deque[EpochSummary] = dataclasses.field(default_factory=lambda: deque(maxlen=HISTORY_EPOCHS))


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
            a logger), so that ``tensorboard --logdir <logger root>`` shows a run's scalars and traces. Under
            ``Trainer(fast_dev_run=...)`` nothing is written (no window, event file or report).
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
            warning and critical findings with their advice, ``2`` also info findings and all evidence. A
            finding that persists unchanged is printed once, then named on the epoch's line.
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
        ``perf/findings/<stage>`` (each epoch's findings). On TensorBoard, training series are at the trainer's
        ``global_step``, the other stages' at their own batch count; a logger with one step axis (CSV, W&B,
        ...) gets them at the step Lightning logs its own rows at, with ``epoch``.

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
        self._worker = WindowWorker()  # writes and summarizes closed windows off the training thread, in order
        self._loop_timer = LoopStartTimer()  # what Lightning's loops spend starting DataLoaders before our hooks
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
        self._exchange: RankExchange[list[tuple[str, str]]] | None = None  # the cross-rank gathers; at setup
        self._world_size = 1
        self._records = True  # this rank records windows (config.ranks); decided at setup
        self._report_file: str | None = None
        self._report: ReportFile | None = None  # on rank zero, from setup on
        self._shown = ShownFindings()
        self._state_key: str | None = None
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
        """Where ``perf_report.json`` goes: ``perf_report-1.json``, ... when another run's is already there;
        ``None`` before setup, and under ``fast_dev_run`` (nothing is written)."""
        if self.dirpath is None or self._report_file is None:
            return None
        return os.path.join(self.dirpath, self._report_file)

    # ------------------------------------------------------------------ checkpoints

    @property
    @override
    def state_key(self) -> str:
        # Two PerfCallbacks with different stages or output directories keep separate state in a checkpoint.
        # (Lightning asks for it at every hook call: built once.)
        if self._state_key is None:
            self._state_key = self._generate_state_key(stages=self.config.stages, dirpath=self.config.dirpath)
        return self._state_key

    @override
    def state_dict(self) -> dict[str, Any]:
        """Plain values only, bounded however long the run: where each stage is, its windows, the rules' recent
        history, and where the report is (a resumed run takes the earlier epochs back from it)."""
        self._join_windows()
        return {
            "version": STATE_VERSION,
            "stages": {
                stage: {
                    "epoch": st.epoch,
                    "total_batches": st.total_batches,
                    "windows_used": st.windows_used,
                    "history": [plain(e) for e in st.history],
                }
                for stage, st in self._stages.items()
            },
            "windows": [window_dict(w, with_summary=False) for w in self.windows],
            "report_path": self.report_path,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s values, and the earlier epochs from the report it names where that file
        is still there (else the rules' recent history only); tolerates the keys a different version wrote or
        left out at the top level, and the record fields a newer one added. Version 1 kept the whole history."""
        for stage, saved in state_dict.get("stages", {}).items():
            if stage in self._stages:
                st = self._stages[stage]
                st.epoch = int(saved.get("epoch", st.epoch))
                st.total_batches = int(saved.get("total_batches", st.total_batches))
                st.windows_used = int(saved.get("windows_used", st.windows_used))
                st.history.clear()
                st.history.extend(from_values(EpochSummary, e) for e in saved.get("history", []))
        self.windows = [from_values(WindowRecord, w) for w in state_dict.get("windows", [])]
        self.epochs, self._findings, self._ranks = [], {}, {}
        if "epochs" in state_dict:  # version 1
            self.epochs = [from_values(EpochSummary, e) for e in state_dict["epochs"]]
            for f in state_dict.get("findings", []):
                finding = from_values(Finding, f)
                self._findings.setdefault((finding.stage, finding.epoch), []).append(finding)
            self._ranks = {
                (saved["stage"], saved["epoch"]): tuple(from_values(RankSummary, r) for r in saved["ranks"])
                for saved in state_dict.get("ranks", [])
            }
            for stage, st in self._stages.items():
                st.history.clear()
                st.history.extend(e for e in self.epochs if e.stage == stage)
        elif not self._load_earlier_report(state_dict.get("report_path")):
            self.epochs = sorted((e for st in self._stages.values() for e in st.history), key=lambda e: e.epoch)

    def _load_earlier_report(self, path: str | None) -> bool:
        """Takes the epochs, findings and per-rank tables back from an earlier run's report; whether it could."""
        if not path or not os.path.isfile(path):
            return False
        try:
            epochs = report_epochs(load_report(path))
        except InputError as err:
            self._warn_once("earlier_report", f"PerfCallback: the report to resume from is unreadable ({err}).")
            return False
        for summary, findings, ranks in epochs:
            self.epochs.append(summary)
            if findings:
                self._findings[(summary.stage, summary.epoch)] = findings
            if ranks:
                self._ranks[(summary.stage, summary.epoch)] = tuple(ranks)
        return True

    # ------------------------------------------------------------------ setup and teardown

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if isinstance(trainer.profiler, lightning_classes("profilers", "PyTorchProfiler")):
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
        self._prepare_outputs(trainer)
        self._use_cuda = trainer.strategy.root_device.type == "cuda"
        self._cuda_peaks = CudaPeaks(trainer.strategy.root_device) if self._use_cuda else None
        self._run_info = {**run_info(trainer), "dataloaders": self._run_info.get("dataloaders", {})}
        self._rank = trainer.global_rank
        self._world_size = trainer.world_size
        self._records = (self.config.ranks is None or self._rank in self.config.ranks) and not trainer.fast_dev_run
        self._windows_at_setup = len(self.windows)
        self._safely(None, self._loop_timer.install, trainer)
        if self._world_size > 1:
            self._open_exchange()

    def _prepare_outputs(self, trainer: pl.Trainer) -> None:
        """Decides where everything goes: ``dirpath``, the report's name, the loggers (of either Lightning
        package), the ``tensorboard --logdir`` to show; nowhere under ``fast_dev_run``."""
        if trainer.fast_dev_run:
            # Lightning writes nothing in this mode, nor do we: no window, event file or report (setup leaves
            # _records off), the console summary only.
            self.dirpath = self.tensorboard_logdir = None
            self._outputs = None
            return
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
        tensorboard = lightning_classes("loggers", "TensorBoardLogger")
        logger = trainer.loggers[0] if trainer.loggers else None
        if isinstance(logger, (*tensorboard, *lightning_classes("loggers", "CSVLogger"))):
            self.tensorboard_logdir = logger.root_dir  # a CSVLogger's log_dir holds our own event file
        else:
            self.tensorboard_logdir = self.dirpath
        self._outputs = Outputs(
            trainer.loggers,
            tensorboards=[lg for lg in trainer.loggers if isinstance(lg, tensorboard)],
            fallback_dir=self.dirpath,
        )
        self._outputs.prepare()  # not inside the first window's close: opening a writer takes tens of ms

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._safely(None, self._loop_timer.uninstall)
        self._close_window_safely()
        self._join_windows()
        self._safely(None, self._publish_staged, wait=WAIT_SECONDS)
        self._safely(None, self._close_exchange)
        self._safely(None, self._write_report, trainer, now=True)
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
        self._join_windows()
        self._safely(None, self._publish_staged, wait=EXCEPTION_WAIT_SECONDS)
        self._safely(None, self._close_exchange)
        self._safely(None, self._end_interrupted_epochs, trainer)
        self._safely(None, self._write_report, trainer, now=True)

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
        if trainer.sanity_checking:
            self._loop_timer.take("validate")  # the sanity check's DataLoader start-up is no epoch's
        else:
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
        self._safely(None, self._publish_staged)  # those whose gather every rank has joined since; no blocking
        st = self._stages[stage]
        st.epoch, st.batch, st.num_batches, st.windows_this_epoch = epoch, first_batch, num_batches, 0
        st.in_epoch = True
        waited = self._loop_timer.take(stage)
        self._safely(stage, self._start_measuring, stage, st, trainer, waited)
        self._safely(stage, self._before_batch, stage, st, trainer)
        st.clock.epoch_start(waited)

    def _start_measuring(self, stage: str, st: _StageState, trainer: pl.Trainer, waited: float) -> None:
        st.host_rss_peak = host_rss()
        if self._cuda_peaks is not None:
            self._cuda_peaks.start(stage)
        dataloaders = self._run_info.setdefault("dataloaders", {})
        if stage not in dataloaders:
            loader = first_dataloader(stage_dataloaders(trainer, stage))
            settings = dataloader_settings(loader)
            dataloaders[stage] = settings and {**settings, **dataset_facts(loader, trainer.lightning_module)}
        st.cpu.start(already=waited, workers=bool((dataloaders[stage] or {}).get("num_workers")))

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
            self._outputs.log_scalars(
                metrics,
                self._step(stage, st, trainer),
                logger_step=self._logger_step(stage, trainer, epoch_end=False),
                epoch=trainer.current_epoch,
            )
        rss = host_rss()
        if rss is not None:
            st.host_rss_peak = max(rss, st.host_rss_peak or 0)

    def _step(self, stage: str, st: _StageState, trainer: pl.Trainer) -> int:
        """The stage's step axis: the trainer's global step for training, the stage's own batch count else."""
        return trainer.global_step if stage == "train" else st.total_batches

    @staticmethod
    def _logger_step(stage: str, trainer: pl.Trainer, *, epoch_end: bool) -> int | None:
        """The run's one step axis, for the loggers that have no other (CSV, W&B, MLflow, ...): the step
        Lightning logs its own rows at, so that the axis stays monotonic with ours among them. ``None`` for a
        validation, test or predict batch: the whole of such a run sits at one step of that axis.

        Lightning logs its rows (and ``LearningRateMonitor`` and ``DeviceStatsMonitor`` theirs) at its count of
        batches that stepped the optimizer, a private counter read here with ``global_step`` as the fallback:
        the same number in automatic optimization, but ``on_train_batch_end`` sees ``global_step`` already past
        the batch whose row Lightning writes next, and a manual-optimization module's optimizers each count.
        """
        if stage != "train" and not epoch_end:
            return None
        step = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "_batches_that_stepped", trainer.global_step)
        # Lightning logs a training epoch's end at its last batch's step: its count has moved past that batch.
        return max(step - 1, 0) if stage == "train" and epoch_end else step

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
        self._join_windows()  # the epoch's windows are written and in self.windows before anything reads them
        st = self._stages[stage]
        st.in_epoch = False
        summary: EpochSummary | None = None
        try:
            summary = self._measure_epoch(stage, st)
        except Exception as err:
            self._fail(stage, err)
        ranks = self._gather_ranks(stage, summary, trainer)  # on every rank, whatever happened above
        self._safely(stage, self._publish_staged)
        if summary is not None:
            self._safely(stage, self._report_epoch, summary, st, trainer, ranks)
            st.history.append(summary)
        first = self._plan.first_active()
        if (
            st.windows_this_epoch == 0
            and first is not None
            and st.batch <= first
            and st.windows_used < self.config.max_windows
            and self._records  # this rank records windows at all (not under fast_dev_run, or ranks=[...])
        ):
            self._warn_once(
                f"short:{stage}",
                f"PerfCallback: the {stage} epoch had {st.batch} batches, too few for the schedule (its first"
                f" recorded batch is {first}), so it has no profiler window. Lower `schedule.skip_first`/`wait`,"
                f" or pass `batches=[...]`.",
            )

    def _measure_epoch(self, stage: str, st: _StageState, *, interrupted: bool = False) -> EpochSummary:
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
            loading_cpu_share=clock.loading_cpu_share(),
            **st.cpu.read(),
            host_rss=rss,
            host_rss_peak=max(rss or 0, st.host_rss_peak or 0) or None,
            cuda_max_allocated=cuda.max_allocated if cuda else None,
            cuda_max_reserved=cuda.max_reserved if cuda else None,
            cuda_capacity=cuda.capacity if cuda else None,
            cuda_utilization=cuda.utilization if cuda else None,
        )
        if interrupted:
            summary = dataclasses.replace(summary, interrupted=True)
        self.epochs.append(summary)
        return summary

    def _end_interrupted_epochs(self, trainer: pl.Trainer) -> None:
        """Summarizes, diagnoses and reports the stage epochs an interruption stopped (this rank's own numbers:
        the other ranks may not be there to gather from); a validation run inside a training epoch first."""
        for stage in sorted(self.config.stages, key=lambda s: s == "train"):
            st = self._stages[stage]
            if not st.in_epoch:
                continue
            st.in_epoch = False
            st.clock.drop_unfinished()
            if st.clock.batches:
                summary = self._measure_epoch(stage, st, interrupted=True)
                self._report_epoch(summary, st, trainer, ())
                st.history.append(summary)

    def _open_exchange(self) -> None:
        """Our own process group for the cross-rank summaries (at setup: every rank creates it, in order)."""
        self._close_exchange()  # a run that ended with neither teardown nor on_exception
        try:
            self._exchange = RankExchange.open()
        except Exception as err:
            self._warn_once("exchange", f"PerfCallback: no cross-rank summaries: creating their group failed ({err}).")
            return
        if self._exchange is None:
            self._info_once(
                "exchange",
                "PerfCallback: torch.distributed is not initialized under this strategy: no cross-rank summaries"
                " (each rank still measures its own epochs).",
            )

    def _close_exchange(self) -> None:
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.close()

    def _gather_ranks(self, stage: str, summary: EpochSummary | None, trainer: pl.Trainer) -> tuple[RankSummary, ...]:
        """Every rank's epoch numbers, on rank zero; ``()`` on the other ranks and in a single process.

        Every rank issues the gather, whatever happened to its own measurements, and goes on; rank zero alone
        waits for it (:mod:`lightning_perf.collect.ranks` says why no callback order can deadlock it).
        """
        exchange = self._exchange
        if exchange is None:
            return ()
        try:
            values = rank_values(summary, self._window_summaries(stage, summary.epoch) if summary else ())
        except Exception:  # whatever went wrong, this rank still takes part in the collective
            values = rank_values(None, [])
        try:
            exchange.issue(values, payload=self._staged)  # the traces staged so far, published once it is done
            self._staged = []
            ranks = exchange.wait(WAIT_SECONDS) if trainer.is_global_zero else ()
        except Exception as err:
            self._warn_once("gather", f"PerfCallback: gathering the ranks' epoch summaries failed ({err}).")
            return ()
        if ranks is None:
            self._warn_once(
                "gather-timeout",
                f"PerfCallback: a rank did not reach the end of the {stage} epoch within {WAIT_SECONDS:g} s of rank"
                " zero: that epoch has no per-rank table (training goes on).",
            )
            return ()
        return ranks

    def _publish_staged(self, wait: float | None = None) -> None:
        """Gives this rank's traces their final names once every rank has written its own.

        The traces staged before an epoch end's gather are written on every rank once that gather is done,
        which this rank checks without blocking; at the end of a run (``wait``), it waits that long at most
        for its gathers, then publishes every trace. TensorBoard's profiler plugin loads a run directory once,
        when it first holds a trace: the ranks of a window must appear together, or the later ones would be
        missed.
        """
        exchange = self._exchange
        if exchange is None:  # a single process, or no torch.distributed: nothing to wait for
            ready, self._staged = [self._staged], []
        elif wait is None:
            ready = exchange.poll()
        else:
            ready, _ = exchange.drain(wait)
            ready.append(self._staged)
            self._staged = []
        for staged in ready:
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
            self._outputs.log_scalars(
                epoch_metrics(summary),
                step,
                logger_step=self._logger_step(stage, trainer, epoch_end=True),
                epoch=trainer.current_epoch,
            )
            if summary.batches and _draws_step_split(summary.epoch, st.windows_this_epoch > 0):
                tag = f"perf/{stage}/step_split"
                self._outputs.add_image(tag, step_split_image(clock.data_wait, clock.compute), step)
                self._outputs.add_text(tag + "_caption", step_split_caption(clock.data_wait, clock.compute), step)
            self._outputs.add_text(FINDINGS_TAG.format(stage=stage), findings_markdown(summary, findings), step)
            if ranks:
                self._outputs.add_text(RANKS_TAG.format(stage=stage), ranks_markdown(summary, ranks), step)
        if trainer.is_global_zero:
            fresh, unchanged = self._shown.split(stage, findings)
            first = not st.history  # the stage's first epoch in this process shows its per-rank table
            message = console_report(
                summary,
                fresh,
                verbose=self.config.verbose,
                ranks=ranks if fresh or first else (),
                unchanged=unchanged,
            )
            if message:
                rank_zero_info(message)
        self._write_report(trainer, now=not st.history)  # a stage's first epoch, at once; then on the budget

    def _write_report(self, trainer: pl.Trainer, *, now: bool) -> None:
        """Rewrites ``perf_report.json`` (rank zero): ``now``, or when its time budget allows
        (:class:`~lightning_perf.report.json_report.ReportFile`)."""
        path = self.report_path
        if path is None or not trainer.is_global_zero:
            return
        if self._report is None or self._report.path != path:
            self._report = ReportFile(path)
        if now:
            self._report.write(self.report)
        else:
            self._report.update(lambda: self.report)

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
            history=tuple(st.history),
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
            num_nodes=run.get("num_nodes", 1),
            cpu_count=run.get("cpu_count"),
            torch_threads=run.get("torch_threads"),
            num_workers=loader.get("num_workers"),
            pin_memory=loader.get("pin_memory"),
            persistent_workers=loader.get("persistent_workers"),
            batch_size=loader.get("batch_size"),
            dataset=loader.get("dataset"),
            shared_state=loader.get("shared_state"),
            epochs=run.get("max_epochs"),  # a validate, test or predict call plans 1
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
        """Stops the open window and has torch export its trace: all that happens on the training thread (its
        stall is the record's ``close_seconds``). The rest, the trace file, the operator table and the record,
        is a job for the window worker (:mod:`lightning_perf.window_close`), joined at the epoch's end."""
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
            # Under a name no trace reader picks up, until every rank has written its own (_publish_staged,
            # after the join at the epoch's end: the job has written it by then).
            written = layout.staged_path(trace_path)
            self._staged.append((written, trace_path))
        else:
            written = trace_path
        export_path = window.export()
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
            close_seconds=time.perf_counter() - start,
        )
        closed = ClosedWindow(
            record=record,
            export_path=export_path,
            written_path=written,
            operators_path=os.path.join(window_dir, layout.operators_filename(self._rank)),
            ran=frozenset(window.ran),
        )
        self._worker.submit(self._process_window, closed)

    def _process_window(self, closed: ClosedWindow) -> None:
        """The window worker's job, on its thread: the window's trace, operator table and record, then the
        record in :attr:`windows` (jobs run one at a time, in order, so the windows stay in order)."""
        processed = process_window(closed, self.config, self._outputs)
        if processed.cut_to is not None:
            self._warn_once(
                f"cut:{closed.record.stage}",
                f"PerfCallback: a {closed.record.stage} window's trace was larger than"
                f" max_trace_mb={self.config.max_trace_mb:g}; it keeps its first {processed.cut_to} step(s)."
                " Record fewer batches (`schedule.active`), or raise `max_trace_mb`.",
            )
        self.windows.append(processed.record)

    def _join_windows(self) -> None:
        """Waits until the closed windows are written and in :attr:`windows`; a window the worker failed to write
        goes to the error policy (:meth:`_fail`) here, on the training thread: warned once, or re-raised when
        ``strict``."""
        self._worker.join(on_error=lambda err: self._fail(None, err))

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
