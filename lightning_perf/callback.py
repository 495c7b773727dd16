"""
PerfCallback
============

Scheduled ``torch.profiler`` windows for every stage of a Lightning run, with traces that TensorBoard's
PyTorch Profiler tab, Perfetto and Holistic Trace Analysis read, and operator tables in TensorBoard.

The callback is Lightning's hooks, the wiring between the units that do the work (:mod:`lightning_perf.hooks`
lists them) and the error policy. Its stage events, each epoch's and batch's, are
:class:`~lightning_perf.hooks.stage_events.StageEvents`; here are the run's setup, the end of each Trainer call
and the checkpoint state. What it has measured is read back through
:class:`~lightning_perf.hooks.results_view.ResultsView`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_perf.collect.batch import BatchSizer
from lightning_perf.collect.device_phases import DeviceTimeline
from lightning_perf.collect.loops import LoopStartTimer
from lightning_perf.collect.memory import CudaPeaks
from lightning_perf.collect.phases import StepEndHooks
from lightning_perf.collect.ranks import EXCEPTION_WAIT_SECONDS, WAIT_SECONDS
from lightning_perf.collect.run_info import optimizer_info, run_info
from lightning_perf.config import (
    DEFAULT_MAX_TRACE_MB,
    DEFAULT_MAX_WINDOWS,
    DEFAULT_SCHEDULE,
    STAGES,
    PerfConfig,
    Schedule,
    SortKey,
    Stage,
    schedule_warning,
)
from lightning_perf.hooks import run_state
from lightning_perf.hooks.epoch_report import EpochReporter
from lightning_perf.hooks.error_policy import ErrorPolicy, warn
from lightning_perf.hooks.flop_count import run_peak_flops
from lightning_perf.hooks.live_status import LiveStatus
from lightning_perf.hooks.profiler_windows import ProfilerWindows, window_notes
from lightning_perf.hooks.rank_staging import RankStaging
from lightning_perf.hooks.results_view import ResultsView
from lightning_perf.hooks.run_setup import (
    call_run_info,
    charted_stages,
    output_places,
    refuse_other_profilers,
    shared_verdicts,
    where_to_look,
)
from lightning_perf.hooks.stage_events import StageEvents
from lightning_perf.hooks.stage_measure import StageMeasure
from lightning_perf.hooks.window_control import WindowControl
from lightning_perf.schedule import make_plan


class PerfCallback(StageEvents, ResultsView):
    r"""Profiles chosen batches of each stage and logs what they show.

    Outside its windows the callback does two clock reads, a batch-size lookup, a few list appends and
    integer comparisons per batch: no profiler, no ``record_function``, no module hooks, no device
    synchronization.

    Args:
        schedule: When to record, as :class:`~lightning_perf.Schedule` or a mapping of its fields
            (``skip_first``, ``wait``, ``warmup``, ``active``, ``repeat``), with the meaning they have in
            ``torch.profiler.schedule``, counted in batches of each stage and restarted every epoch.
            Default (also for ``None``): ``Schedule()``: skip 5 batches, warm up 1, record 1, once per epoch.
        batches: Explicit batch indices (within an epoch) to record, each run of consecutive indices one
            window, each preceded by ``schedule.warmup`` warm-up batches. Replaces the cycles of ``schedule``.
        stages: Which of ``"train"``, ``"validate"``, ``"test"``, ``"predict"`` to profile.
        max_windows: At most this many windows per stage per run (``0``: none).
        dirpath: Output directory. Default: ``<logger.log_dir>/perf``, so that ``tensorboard --logdir <logger
            root>`` shows a run's scalars and traces. Without a logger: ``<default_root_dir>/perf`` where it is
            set, else ``perf`` beside the first ``ModelCheckpoint(dirpath=...)``, else ``./perf``; the console
            says where, once. Under ``Trainer(fast_dev_run=...)`` nothing is written (no window, event file or
            report).
        record_shapes: Record operator input shapes (``torch.profiler`` option; larger traces; an "Input shapes"
            column in the operator table).
        profile_memory: Record tensor allocations (``torch.profiler`` option; slower windows; memory columns in
            the operator table).
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
            tensor found in it (in tensors, dicts, lists, tuples and dataclasses, nested).
        thresholds: Overrides of the bottleneck rules' thresholds, by name (see
            :class:`~lightning_perf.diagnose.thresholds.Thresholds`), e.g. ``{"dataloader_warning": 0.2}``.
        verbose: What the console shows at each epoch end: ``0`` nothing, ``1`` one line per epoch and the
            warning and critical findings with their advice, ``2`` also info findings and all evidence. A
            finding that persists unchanged is printed once, then named on the epoch's line.
        ranks: The global ranks that record profiler windows (default: all). Every rank measures its
            batches and joins the per-epoch cross-rank summary either way.
        max_trace_mb: The most a window's trace may hold, in MB of (uncompressed) JSON, about ten times
            its gzipped file; a larger one keeps its first steps that fit, with a warning.
        strict: Re-raise a failure of our own collection or reporting instead of warning once and going on.
            Default (``None``): the environment variable ``LIGHTNING_PERF_STRICT`` (``1`` = strict), else off.
        peak_flops: The device's peak FLOP/s for the run's dtype, what MFU divides by; default (``None``): the
            dense datasheet figure for the device (:func:`lightning_perf.peak_flops`), where it is known.
        profile_budget: The share of the run's wall time the profiling may cost (its windows' profiled batches,
            closes and processing, and the FLOP count: :mod:`lightning_perf.budget`). Each stage's first window
            opens as planned; a later one, and the FLOP count once the run's first window has opened, only while
            the measured cost so far leaves room (a run too short for it has no FLOP count). ``None``: every
            planned window opens and the FLOP count runs at once. Default (``"auto"``): ``0.02`` with the default
            schedule, and ``None`` with a ``schedule`` or ``batches`` of your own (which keep their meaning
            unless you set a budget too).
        memory_history: On CUDA, record the allocator's history from the first training epoch (it costs: off by
            default), and on an out-of-memory error save ``memory_snapshot.pickle`` beside the report (open it at
            pytorch.org/memory_viz) and name its largest live allocations by call site in the report.
        try_advice: Try a finding's advised setting on the run's own data, once per run, at a training epoch's end
            where the profiling budget has room: a DataLoader setting, an optimizer's ``fused``/``foreach``, a
            ``torch.set_num_threads`` count and a mixed precision (on one step of a copy of the module). The advice
            then reports the setting's measured speed against the current one, and withdraws it where it showed no
            gain. The training is unchanged (its data order, random streams, thread count and parameters).
            ``False``: no trial; advice stays predicted.
        live: Show a short status in Lightning's progress bar while an epoch runs (item ``perf``): the recent
            batches' samples per second, data wait and phases, and the ids of the warnings in force, updated at
            ``Trainer(log_every_n_steps=...)`` from numbers already measured. ``False``: the bar is left as it is.

    Raises:
        ValueError: At construction, listing every invalid argument with its value and what is allowed.
        MisconfigurationException: At setup, if another torch profiler would run at the same time
            (``Trainer(profiler="pytorch")`` or an active ``torch.profiler.profile``).

    Logged (see docs/output.md, "Logged metrics", for units and cadence):
        ``perf/<stage>/batch/*`` and ``perf/<stage>/epoch/*`` scalars to every logger, and TensorBoard's Custom
        Scalars charts of them (a batch's step time with its data wait and compute); the text
        ``perf/operators/<stage>`` (one operator table per window) and ``perf/findings/<stage>`` (each epoch's
        findings). On TensorBoard, training series are at the trainer's ``global_step``, the other stages' at
        their own batch count; a logger with one step axis (CSV, W&B, ...) gets them at the step Lightning logs
        its own rows at, with ``epoch``. ``perf_report.json``, and the HTML report beside it (:attr:`page_path`).

    Example::

        from lightning_perf import PerfCallback

        trainer = Trainer(callbacks=[PerfCallback(schedule={"wait": 1, "warmup": 1, "active": 2, "repeat": 2})])
        trainer.fit(model)
        trainer.callbacks[0].windows  # one WindowRecord per saved trace
    """

    def __init__(
        self,
        *,
        schedule: Schedule | None = DEFAULT_SCHEDULE,  # or a mapping
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
        peak_flops: float | None = None,
        profile_budget: float | Literal["auto"] | None = "auto",
        memory_history: bool = False,
        try_advice: bool = True,
        live: bool = True,
    ) -> None:
        self.config = PerfConfig.build(**{name: value for name, value in locals().items() if name != "self"})
        if (warning := schedule_warning(self.config.schedule)) is not None:
            warn(warning)
        self._policy = ErrorPolicy(self.config.strict)
        self._epochs = EpochReporter(self.config, BatchSizer(batch_size_fn), self._policy)
        self._staging = RankStaging(self._policy)
        self._profiler_windows = ProfilerWindows(
            self.config,
            self._policy,
            self._staging,
            self._epochs.add_window,
            self._epochs.budget,
            notes=self._window_notes,  # (a bound method, not a lambda: the callback pickles, e.g. into darts' save)
        )
        self._control = WindowControl(
            make_plan(self.config),
            max_windows=self.config.max_windows,
            stages=STAGES,
            new_window=self._profiler_windows.new_window,
            started=self._epochs.window_started,
            warn=self._policy.warn_once,
            info=self._policy.info_once,
            chosen=self.config.chosen_plan,
            budget=self._epochs.budget,
            warmup=self.config.schedule.warmup,
        )
        self._policy.drop = self._control.drop
        # The measured stages' clocks and counts: what the per-batch hooks touch, one lookup away.
        self._stages: dict[str, StageMeasure] = {stage: self._epochs.stages[stage] for stage in self.config.stages}
        self._flops = self._epochs.flops
        self._positions = self._control.stages
        self._phase_marks = self._stages["train"].clock.phase_marks if "train" in self._stages else None
        self._bind_marks(self._phase_marks)
        self._state_texts = run_state.RecordTexts()
        self._loop_timer = LoopStartTimer()  # what Lightning's loops spend starting DataLoaders before our hooks
        self._step_ends = StepEndHooks()  # the optimizer step's end, for each batch's phases
        self._live = LiveStatus(self.config.live)  # the progress bar's status item
        self._windows_at_setup = 0
        self._resuming = True
        self._report_file: str | None = None
        self.dirpath: str | None = None
        self.tensorboard_logdir: str | None = None

    @functools.cached_property
    @override
    def state_key(self) -> str:
        # Two PerfCallbacks with different stages or output directories keep separate state in a checkpoint.
        # (Lightning asks for it at every hook call: built once, then read from the instance without a call.)
        return self._generate_state_key(stages=self.config.stages, dirpath=self.config.dirpath)

    @override
    def state_dict(self) -> dict[str, Any]:
        """See :func:`lightning_perf.hooks.run_state.state_dict`."""
        self._profiler_windows.join()
        return run_state.state_dict(self._positions, self._epochs, self._state_texts)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """See :func:`lightning_perf.hooks.run_state.load_state_dict`. Only a resumed ``fit`` takes the state
        back: ``validate``, ``test`` and ``predict`` with a ``ckpt_path`` evaluate a checkpoint (Lightning restores
        every callback's state then too), and this run keeps what it has measured."""
        if not self._resuming:
            return
        run_state.load_state_dict(state_dict, self._positions, self._epochs, self._policy.warn_once)
        self._windows_at_setup = len(self.windows)  # the call's message counts the windows it saves

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        refuse_other_profilers(trainer)
        self._epochs.budget.call_started(time.perf_counter())
        charted = charted_stages(stage, self.config.stages, ran={e.stage for e in self.epochs})
        places = output_places(trainer, self.config.dirpath, self._report_file, charted)  # all None: fast_dev_run
        self.dirpath, self.tensorboard_logdir = places.dirpath, places.tensorboard_logdir
        if places.place is not None:
            self._policy.info_once("output-dir", f"lightning-perf: output in {places.dirpath} ({places.place})")
        self._report_file = places.report_file
        self._epochs.report_path, self._epochs.outputs = places.report_path, places.outputs
        device = trainer.strategy.root_device
        cuda = self._epochs.cuda_peaks = CudaPeaks(device) if device.type == "cuda" else None
        if "train" in self._stages:  # on CUDA, each training batch's phases as the device ran them
            self._stages["train"].clock.phase_marks.device = DeviceTimeline() if cuda is not None else None
        run, self._epochs.call_plan = call_run_info(self._epochs.run_info, run_info(trainer), fit=stage == "fit")
        self._epochs.run_info = run
        run["peak_flops"] = run_peak_flops(run, self.config.peak_flops)
        rank, ranks, world_size = trainer.global_rank, self.config.ranks, trainer.world_size
        self._profiler_windows.prepare(self.dirpath, places.outputs, rank=rank, world_size=world_size, cuda_peaks=cuda)
        # and no window under fast_dev_run: Lightning writes nothing then, nor do we
        self._control.records = (ranks is None or rank in ranks) and not trainer.fast_dev_run  # type: ignore[attr-defined]
        self._windows_at_setup = len(self.windows)
        self._resuming = stage == "fit"  # a checkpoint's state is taken back by a resumed fit only
        self._policy.safely(None, self._loop_timer.install, trainer)
        self._policy.safely(None, self._epochs.compile.install, trainer)
        self._policy.safely(None, self._live.install, trainer)
        if world_size > 1:
            self._staging.open()
        self._control.verdicts = shared_verdicts(world_size, ranks, self._epochs.budget, self._policy.warn_once)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The optimizers exist from here (configured after setup): optimizer_heavy advises what would change.
        self._policy.safely(None, lambda: self._epochs.keep_optimizer_info(optimizer_info(trainer)))
        if self._phase_marks is not None:
            self._policy.safely(None, self._step_ends.install, trainer.optimizers, self._phase_marks)
        self._dispatch_step_hook()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._end(trainer, wait=WAIT_SECONDS)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Interrupted (an exception, Ctrl-C, SIGTERM): save what is open, so the traces and the report stay valid.
        # Lightning calls no callback's teardown after this: the call ends here too.
        self._policy.safely(None, self._epochs.failed, trainer, exception, self._positions)  # an OOM's diagnosis
        self._end(trainer, wait=EXCEPTION_WAIT_SECONDS, interrupted=True)

    def _window_notes(self, stage: str) -> dict[str, Any]:
        """What a closing window of ``stage`` adds to its trace's metadata (:func:`window_notes`)."""
        return window_notes(self._epochs.run_info.get("dataloaders", {}).get(stage), self._epochs.stages[stage].clock)

    def _end(self, trainer: pl.Trainer, *, wait: float, interrupted: bool = False) -> None:
        """A Trainer call ends: what was installed comes off, the open window is saved, the staged traces are
        published (at most ``wait`` s for the ranks), the epochs an interruption stopped and those still carried
        (epoch_report, Notes 2) are summarized, the report is written, and the console says where the call's
        windows and report are."""
        self._policy.safely(None, self._loop_timer.uninstall)
        self._policy.safely(None, self._epochs.compile.uninstall)
        self._policy.safely(None, self._step_ends.uninstall)
        self._dispatch_step_hook()
        self._policy.safely(None, self._live.uninstall)
        stage = self._control.open.stage if self._control.open is not None else None
        self._flops.cancel()
        self._policy.safely(stage, lambda: self._profiler_windows.save(self._control.close(shortened=True)))
        self._profiler_windows.end()
        self._policy.safely(None, self._staging.publish, wait=wait)
        self._policy.safely(None, self._staging.close)
        self._policy.safely(None, self._epochs.end_stages, trainer, self._positions, interrupted=interrupted)
        self._epochs.end_call(trainer)  # the call's time, its windows' processing included, counts in the run's
        self._policy.safely(None, self._epochs.write_report, trainer, now=True)
        self._policy.safely(None, self._epochs.close_outputs)
        saved = max(len(self.windows) - self._windows_at_setup, 0)
        page, budget = self.page_path, self._epochs.budget
        if message := where_to_look(saved, self.dirpath, self.tensorboard_logdir, page, budget, self.report_path):
            rank_zero_info(message)
