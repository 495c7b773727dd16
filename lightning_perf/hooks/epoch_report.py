"""
Epoch reports
=============

Each stage epoch's always-on measurement and what becomes of it: the per-batch scalars, the epoch's summary,
its diagnosis, its scalars, images and texts, the console's lines and ``perf_report.json``. An
:class:`EpochReporter` holds what the run has measured so far (its epochs, windows, findings and per-rank
tables, and each stage's recent history for the rules); :class:`~lightning_perf.PerfCallback` calls it from
its hooks.

Notes:
    1. An epoch's findings (its diagnosis, their TensorBoard text, the console line) cost about 1 ms (2-CPU
       machine: 0.3 ms the rules, 0.3 ms the text, 0.4 ms the console line through a progress bar): nothing to
       an epoch of seconds, a tenth of one of 10 ms, and a run of hundreds of those took 1.5x as long as a bare
       one. Each stage's findings are paced as the per-batch scalars are (:class:`~lightning_perf.hooks.
       log_pace.LogPace`, with :data:`~lightning_perf.hooks.log_pace.REPORT_SHARE`): an epoch whose findings
       the pace skips is still measured (its summary, scalars, the report's epochs) and its findings wait,
       replaced by the next epoch's; the stage's latest are reported at the end of the Trainer call
       (:meth:`EpochReporter.report_pending`) and an interrupted epoch's at once. The rules judge a short
       epoch with its latest ones (``StageEpoch.pooled_epochs``), so a skipped epoch's batches still count.
    2. Measuring an epoch costs 1.5-2.5 ms besides its findings (2-CPU machine: its CPU readings at start and
       end, its summary, scalars, report budget and files): a run of epochs of a few milliseconds took 1.2-1.8x
       as long as a bare one. In a single process, once the epochs' measurement has spent its pace
       (:class:`~lightning_perf.hooks.log_pace.LogPace`, with :data:`~lightning_perf.hooks.log_pace.
       MEASURE_SHARE` of the wall time after :data:`~lightning_perf.hooks.log_pace.MEASURE_BURST`; one pace
       for all stages, whose short epochs alternate: training's and the validation run's inside it), an epoch
       that ends is carried into the next one (:meth:`StageMeasure.carry <lightning_perf.hooks.stage_measure.
       StageMeasure.carry>`): nothing is read at the next one's start, and the two are measured together, as
       one summary (:attr:`~lightning_perf.records.EpochSummary.epochs`, numbered by its last epoch) with one
       set of scalars and findings; a group is measured once it is :data:`~lightning_perf.hooks.stage_measure.
       GROUP_SECONDS` old (3 s) all the same. An epoch with a window is measured at its end, so a window
       belongs to one group's last epoch; the epochs still carried at the end of a Trainer call are measured
       then (:meth:`EpochReporter.end_stages`). A distributed run measures every epoch alone: its epoch end is
       a cross-rank gather, which every rank must join alike, and the pace is each rank's own clock. A
       checkpoint holds no carried epoch: a run resumed from one measures from where it goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn

from lightning_perf import __version__
from lightning_perf.budget import ProfilingBudget
from lightning_perf.collect.batch import BatchSizer
from lightning_perf.collect.loader import loader_info
from lightning_perf.collect.memory import CudaPeaks, host_rss
from lightning_perf.collect.run_info import (
    launched_ranks,
)
from lightning_perf.config import PerfConfig
from lightning_perf.diagnose.evidence import too_little
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnosis_context import epoch_context, epoch_windows, run_facts, with_cpu_use
from lightning_perf.hooks.advice_trials import AdviceTrials
from lightning_perf.hooks.compile_tracking import CompileTracking
from lightning_perf.hooks.console_lines import ConsoleLines
from lightning_perf.hooks.error_policy import ErrorPolicy
from lightning_perf.hooks.failure import out_of_memory
from lightning_perf.hooks.flop_count import FlopCounting
from lightning_perf.hooks.log_pace import MEASURE_SHARE, REPORT_SHARE
from lightning_perf.hooks.memory_tracking import MemoryTracking
from lightning_perf.hooks.profiling_cost import cost_epoch, profiling_report
from lightning_perf.hooks.stage_measure import (
    EpochReview,
    Reviews,
    logger_step,
    say,
    stage_measures,
    stage_step,
)
from lightning_perf.hooks.window_control import StagePosition
from lightning_perf.layout import page_path
from lightning_perf.records import CompileStats, EpochSummary, RankSummary, StepSplit, WindowRecord
from lightning_perf.report.findings import finding_lines, findings_text
from lightning_perf.report.html import Page, run_page
from lightning_perf.report.json_report import REWRITE_MIN_SECONDS, ReportFile, keep_step_split, report_dict
from lightning_perf.report.metrics import epoch_metrics
from lightning_perf.report.outputs import Outputs
from lightning_perf.summarize.flops import epoch_flops
from lightning_perf.summarize.steps import step_split, summarize_epoch
from lightning_perf.units import limit, seconds_or_ms


def paced_reports(stage: str, summary: EpochSummary) -> str:
    """The note, once per stage, that its epochs are too short to report each (module Notes 1)."""
    return (
        f"PerfCallback: the {stage} epochs are short (the latest {seconds_or_ms(summary.wall_time or 0.0)}): to"
        f" keep their reports within {limit(REPORT_SHARE)} of the run's time, the findings and the console line"
        " come for some of them, judged with the latest epochs, and for the last at the end of the call; every"
        " measured epoch still has its scalars and its entry in perf_report.json."
    )


def grouped_epochs(stage: str, epoch: int) -> str:
    """The note, once per stage, that its epochs are measured in groups from ``epoch`` on (module Notes 2)."""
    return (
        f"PerfCallback: the {stage} epochs are short: to keep their measurement within {limit(MEASURE_SHARE)} of the"
        f" run's time, consecutive epochs from epoch {epoch} on are measured together, each group as one epoch"
        " named by its last (one set of scalars and findings; in perf_report.json, `epochs` counts them)."
    )


def draw_page(report: Mapping[str, Any], *, source: str) -> Page | None:
    """The run's page beside its report: with its charts once the run has a profiler window; without them
    (no Plotly: tens of kB, not megabytes) before, so that a loop of short window-less Trainer calls leaves
    small pages (:func:`~lightning_perf.report.html.run_page`). ``None``, no page, for a report of predict
    epochs alone with no window and nothing to change found (no warning, nothing critical): the page would repeat
    ``perf_report.json``'s numbers, and a loop of short predict calls (one Trainer each, as forecasting libraries
    make them) paid 0.7 ms a call for it."""
    if not report.get("windows") and set(report.get("stages", {})) == {"predict"}:
        epochs = report["stages"]["predict"]["epochs"]
        if all(f.get("severity") == "info" for epoch in epochs for f in epoch.get("findings", ())):
            return None
    return run_page(report, source=source, charts=bool(report.get("windows")))


class EpochReporter:
    """Measures each stage epoch, diagnoses it and reports it, and keeps what the run has measured.

    Args:
        config: The callback's options (``log_loss``, ``verbose``, ``thresholds``).
        batch_size: What counts a batch's samples.
        policy: Where warnings go, and what a failing rule does.

    The callback sets :attr:`outputs`, :attr:`cuda_peaks`, :attr:`run_info`, :attr:`call_plan` and :attr:`report_path`
    at setup.
    """

    def __init__(self, config: PerfConfig, batch_size: BatchSizer, policy: ErrorPolicy) -> None:
        self.config = config
        self.stages = stage_measures(batch_size.size, log_loss=config.log_loss)
        self.outputs: Outputs | None = None
        self.cuda_peaks: CudaPeaks | None = None
        self.run_info: dict[str, Any] = {}
        #: The Trainer call's own plan (``max_epochs``, ...), over :attr:`run_info` in the diagnosis
        #: (:func:`~lightning_perf.hooks.run_setup.call_run_info`).
        self.call_plan: dict[str, Any] = {}
        self.report_path: str | None = None  # where perf_report.json goes (None: nowhere)
        #: Every window saved so far in this process, in order.
        self.windows: list[WindowRecord] = []
        #: Every stage epoch measured so far in this process, in order.
        self.epochs: list[EpochSummary] = []
        #: The findings of the latest stage epoch that ended (on rank zero).
        self.findings: list[Finding] = []
        self.findings_by_epoch: dict[tuple[str, int], list[Finding]] = {}
        self.ranks: dict[tuple[str, int], tuple[RankSummary, ...]] = {}
        #: What torch.compile did, by stage epoch (none for a run that compiles nothing).
        self.compile_stats: dict[tuple[str, int], CompileStats] = {}
        #: The per-batch step splits the report keeps (:func:`~lightning_perf.report.json_report.keeps_step_split`).
        self.step_splits: dict[tuple[str, int], StepSplit] = {}
        self._batch_size = batch_size
        self._policy = policy
        self._reviews = Reviews()  # what each epoch's diagnosis reads that later epochs change
        self._report: ReportFile | None = None  # on rank zero, from the first write on
        #: Each stage's records the report on disk holds (at its last write, or taken back): ``hooks/run_state``.
        self.reported: dict[str, int] = {}
        self.budget = ProfilingBudget(config.profile_budget, config.schedule.warmup)  # the profiling's cost, its budget
        # The training batches' FLOP counts, per sample as the epoch counts them, within the budget.
        asked = config.peak_flops is not None
        self.flops = FlopCounting(batch_size, self.budget, windows_planned=config.max_windows != 0, asked=asked)
        self._lines = ConsoleLines(config.verbose, flops=self.flops.not_counted)  # what the console says, and when
        self.compile = CompileTracking(self.stages)  # what torch.compile does, per stage epoch
        self.memory = MemoryTracking(self.flops)  # what the model holds, after each training epoch's first batch
        self.trials = AdviceTrials(self.budget, policy, config.thresholds, self.stages, enabled=config.try_advice)
        self.oom: Finding | None = None  # an out-of-memory error's finding, until its epoch is reported
        #: A batch's end has work to do (:meth:`batch_ended`): a plain attribute, read after every batch.
        self.batch_due = False

    def report(self) -> dict[str, Any]:
        """Everything measured so far, as written to ``perf_report.json``."""
        return report_dict(
            generated_by=f"lightning-perf {__version__}",
            run=self.run_info,
            epochs=self.epochs,
            windows=self.windows,
            findings=self.findings_by_epoch,
            ranks=self.ranks,
            compile=self.compile_stats,
            steps=self.step_splits,
        )

    def add_window(self, record: WindowRecord) -> None:
        """A saved window's record, in the order the windows closed."""
        self.windows.append(record)
        self.memory.window_saved(record)

    def keep_optimizer_info(self, info: Any) -> None:
        """The run's optimizers, once they exist (``optimizer_heavy`` advises what would change)."""
        self.run_info["optimizer_info"] = self.call_plan["optimizer_info"] = info

    def end_call(self, trainer: pl.Trainer) -> None:
        """A Trainer call ends: the stages' pending findings are reported (:meth:`report_pending`), its wall time
        counts in the run's, and the report's ``run.profiling`` says so."""
        self._policy.safely(None, self.report_pending, trainer)
        self.budget.call_ended(time.perf_counter())
        self.run_info["profiling"] = profiling_report(self.budget)

    def close_outputs(self) -> None:
        """Closes what :attr:`outputs` opened, and puts ``torch.cuda.empty_cache`` back (at the end of a Trainer
        call). The loggers are Lightning's to flush: it finalizes (and so saves) each of them right after the
        callbacks' teardown."""
        self.memory.end()
        if self.outputs is not None:
            self.outputs.close()

    def start_epoch(self, stage: str, trainer: pl.Trainer, waited: float, node_ranks: frozenset[int]) -> None:
        """A stage epoch starts: its memory peaks, its DataLoader's settings (once), its CPU use (with the node's
        other ranks'). ``waited``: what Lightning's loop spent starting the DataLoader before the hook. A carried
        epoch's start reads nothing (Notes 2: measured with the one before); the others' is charged to its pace."""
        st = self.stages[stage]
        if st.carried:
            return
        st.measure_pace.start()
        self.compile.epoch_start()
        st.host_rss_peak = host_rss()
        if self.cuda_peaks is not None:
            self.cuda_peaks.start(stage)
        dataloaders = self.run_info.setdefault("dataloaders", {})
        if stage not in dataloaders:
            dataloaders[stage] = loader_info(trainer, stage)
        workers = bool((dataloaders[stage] or {}).get("num_workers"))
        st.cpu.start(already=waited, workers=workers, ranks=launched_ranks(trainer) | node_ranks)
        if stage == "train":
            self.memory.epoch_start(history=self.config.memory_history and self.cuda_peaks is not None)
            self.batch_due = True
        st.measure_pace.end()

    def carry(self, stage: str, pos: StagePosition, waited: float, *, alone: bool) -> bool:
        """Whether the stage epoch that just ended is carried into the next one (Notes 2; :meth:`StageMeasure.carry
        <lightning_perf.hooks.stage_measure.StageMeasure.carry>`, ``waited``: its end waited for a window's
        processing), said once per stage."""
        st = self.stages[stage]
        if not st.carry(time.perf_counter(), windowed=bool(waited or pos.windows_this_epoch), alone=alone):
            return False
        self._policy.info_once(f"grouped:{stage}", lambda: grouped_epochs(stage, pos.epoch))
        return True

    def window_started(self, stage: str, trainer: pl.Trainer) -> int:
        """A profiler window starts recording (the window controller's ``started``): its CUDA peaks start;
        returns its step on the stage's axis."""
        if self.cuda_peaks is not None:
            self.cuda_peaks.start("window")
        self.stages[stage].cpu.pause()  # the window's own CPU use is no contention of the run (EpochCpu.pause)
        return stage_step(stage, trainer, self.stages[stage].total_batches)

    def measure(self, stage: str, epoch: int, *, interrupted: bool = False, waited: float = 0.0) -> EpochSummary:
        """The stage epoch's summary from its batches, added to :attr:`epochs`, and what its profiling cost
        (``waited``: the seconds its end waited for its windows' processing). From here to the end of
        :meth:`report_epoch`, its cost is charged to the stage's measurement pace (Notes 2)."""
        st = self.stages[stage]
        st.measure_pace.start()
        clock = st.clock
        rss = host_rss()
        cuda = self.cuda_peaks.read(stage, utilization=True) if self.cuda_peaks is not None else None
        compiled = self.compile.take(stage)
        if compiled is not None:
            self.compile_stats[(stage, epoch)] = compiled
        left_out = clock.left_out(compiled.steps if compiled is not None else ())
        summary = summarize_epoch(
            stage=stage,
            epoch=epoch,
            data_wait=clock.data_wait,
            compute=clock.compute,
            batch_sizes=clock.batch_sizes,
            profiled=left_out,
            loss=clock.mean_loss(),
            loading_cpu_share=clock.loading_cpu_share(),
            loading_queue_share=clock.loading_queue_share(),
            epoch_starts=clock.epoch_starts,
            phases=clock.phase_marks.epoch_phases(),
            **st.cpu.read(),
            host_rss=rss,
            host_rss_peak=max(rss or 0, st.host_rss_peak or 0) or None,
            cuda_max_allocated=cuda.max_allocated if cuda else None,
            cuda_max_reserved=cuda.max_reserved if cuda else None,
            cuda_capacity=cuda.capacity if cuda else None,
            cuda_utilization=cuda.utilization if cuda else None,
        )
        if stage == "train":
            flops = epoch_flops(
                self.flops.counts,
                batch_sizes=clock.batch_sizes,
                data_wait=clock.data_wait,
                compute=clock.compute,
                profiled=left_out,
                peak=self.run_info.get("peak_flops"),
            )
            summary = dataclasses.replace(summary, **dataclasses.asdict(flops))
        if interrupted:
            summary = dataclasses.replace(summary, interrupted=True)
        self.epochs.append(summary)
        cost_epoch(self.budget, self.windows, stage, epoch, clock, compiled, summary.step_time_p50, waited)
        self.run_info["profiling"] = profiling_report(self.budget)
        return summary

    def flops_batch_start(self, batch: Any, batch_idx: int) -> bool:
        """Offers a training batch for counting (:meth:`~lightning_perf.hooks.flop_count.FlopCounting.offer`);
        whether it is being counted."""
        counted = self.flops.offer(batch, batch_idx, self._policy)
        self.batch_due = counted or self.batch_due
        return counted

    def batch_ended(self, stage: str, trainer: pl.Trainer) -> None:
        """A batch that :attr:`batch_due` marked has ended: its FLOP count is kept, the model's memory counted."""
        if self.flops.active:
            self.flops.finish(trainer.lightning_module, self.run_info, self._policy)
        if stage == "train" and self.memory.due:
            self._policy.safely(None, self.memory.count, trainer)
        self.batch_due = self.flops.active or self.memory.due

    def report_epoch(
        self, summary: EpochSummary, trainer: pl.Trainer, ranks: tuple[RankSummary, ...], *, now: bool = False
    ) -> None:
        """Reports the epoch: its scalars, the memory line, and its findings (the diagnosis on rank zero, their
        TensorBoard text, the console line) as the stage's report pace allows (module Notes 1), or ``now``; then
        the epoch joins the stage's history, and the report files (with the epoch's step split) are written."""
        stage = summary.stage
        st = self.stages[stage]
        if ranks:
            self.ranks[(stage, summary.epoch)] = ranks
        memory = None
        if stage == "train":
            try:
                memory = self.memory.report(trainer, summary, self.run_info)
                if warning := self.memory.empty_cache_warning(summary):
                    self._policy.warn_once("empty_cache", warning)
            except Exception as err:
                self._policy.fail(None, err)
        st.pending = self._reviews.review(summary, ranks, st.history, len(self.epochs), trainer)
        if self._batch_size.failed:
            self._policy.warn_once(
                "batch_size_fn", f"PerfCallback: {self._batch_size.failed}; throughput is not measured."
            )
        if self.outputs is not None:
            self.outputs.log_scalars(
                epoch_metrics(summary),
                stage_step(stage, trainer, st.total_batches),
                logger_step=logger_step(stage, trainer, epoch_end=True),
                epoch=trainer.current_epoch,
            )
        if trainer.is_global_zero:
            if memory and self.config.verbose:
                say(trainer, memory)
            if summary.batches:
                clock, compiled = st.clock, self.compile_stats.get((stage, summary.epoch))
                split = step_split(
                    clock.data_wait, clock.compute, profiled=clock.profiled, compiled=compiled.steps if compiled else ()
                )
                keep_step_split(self.step_splits, stage, summary.epoch, split)
        if now or st.report_pace.due():
            st.report_pace.start()
            self.report_pending(trainer, stage, always=now)
            st.report_pace.end()
        else:
            self._policy.info_once(f"report_pace:{stage}", paced_reports(stage, summary))
        # Fit: on the report's and the page's budgets (the report file's first update writes the report at once;
        # training's first epoch end writes its validation's); the other calls: at the end
        in_first_train_epoch = "train" in self.config.stages and not self.stages["train"].history
        st.history.append(summary)
        st.records += 1
        if trainer.state.fn == TrainerFn.FITTING and (stage == "train" or not in_first_train_epoch):
            self.write_report(trainer)
        st.measure_pace.end()

    def report_pending(self, trainer: pl.Trainer, stage: str | None = None, *, always: bool = False) -> None:
        """Reports the findings of the stage's latest epoch (every stage's, for ``None``: at the end of a Trainer
        call) where the pace left them pending: the diagnosis on rank zero, their TensorBoard text, the console
        (:class:`~lightning_perf.hooks.console_lines.ConsoleLines`: ``always`` prints it at once)."""
        names = (stage,) if stage is not None else self.config.stages
        reviews = [review for name in names if (review := self.stages[name].pending) is not None]
        say_it = functools.partial(say, trainer)
        for review in sorted(reviews, key=lambda r: r.order):  # in the order the epochs ended
            name = review.summary.stage
            self.stages[name].pending = None
            summary, ranks = review.summary, review.ranks
            findings, held = self._diagnose(review, trainer) if trainer.is_global_zero else ([], None)
            compiled = self.compile_stats.get((name, summary.epoch))
            if self.outputs is not None:
                step = stage_step(name, trainer, self.stages[name].total_batches)
                findings_text(self.outputs.add_text, step, summary, findings, ranks, compiled)
            if trainer.is_global_zero:
                self._lines.epoch(
                    say_it,
                    summary,
                    findings,
                    order=review.order,
                    first=not review.history,  # the stage's first epoch in this process shows its per-rank table
                    now=always or stage is None,
                    ranks=ranks,
                    compiled=compiled,
                    too_little=held,
                    manual=bool(self.run_info.get("manual_optimization")),
                )
        if stage is None:  # the call's end: each stage's latest line held back (its latest status)
            self._lines.flush(say_it)

    def failed(self, trainer: pl.Trainer, error: BaseException, positions: Mapping[str, StagePosition]) -> None:
        """An exception ends the call: an out-of-memory error's diagnosis (:func:`~lightning_perf.hooks.failure.
        out_of_memory`) goes in the report and the failing epoch's findings."""
        self.oom = out_of_memory(trainer, error, self.stages, positions, self.memory, self.cuda_peaks, self.run_info)
        self.memory.oom_snapshot(self.run_info, self.report_path)

    def end_stages(self, trainer: pl.Trainer, positions: Mapping[str, StagePosition], *, interrupted: bool) -> None:
        """Summarizes, diagnoses and reports what a Trainer call's end leaves, a validation run inside a training
        epoch first: the stage epochs an interruption stopped (this rank's own numbers: the other ranks may not
        be there to gather from; with the epochs carried into them), and the epochs still carried (Notes 2);
        ``positions``: where each stage is (its epoch)."""
        for stage in sorted(self.config.stages, key=lambda s: s == "train"):
            st = self.stages[stage]
            stopped = interrupted and st.in_epoch
            if stopped:
                st.clock.drop_unfinished()
            if (st.carried and not st.in_epoch) or (stopped and st.clock.batches):
                summary = self.measure(stage, positions[stage].epoch, interrupted=stopped)
                self.report_epoch(summary, trainer, (), now=stopped)
            st.carried = False
            st.in_epoch = st.in_epoch and not interrupted
        if self.oom is not None and trainer.is_global_zero:  # no epoch of its stage had a batch to report
            say(trainer, "\n".join(["lightning-perf:", *finding_lines([self.oom], verbose=2)]))

    def write_report(self, trainer: pl.Trainer, *, now: bool = False) -> None:
        """Rewrites ``perf_report.json`` at :attr:`report_path` and the HTML page beside it (rank zero): both
        ``now`` (a call's end, an interruption), else each when its time budget allows
        (:class:`~lightning_perf.report.json_report.ReportFile`: its first update writes the report)."""
        path = self.report_path
        if path is None or not trainer.is_global_zero:
            return
        if self._report is None or self._report.path != path:
            source = os.path.dirname(os.path.abspath(path))
            # A partial of a module's function, not a lambda: the callback pickles (libraries save it).
            draw = functools.partial(draw_page, source=source)
            self._report = ReportFile(path, min_interval=REWRITE_MIN_SECONDS, page=(page_path(path), draw))
        writes = self._report.writes
        if now:
            self._report.write(self.report())
        else:
            self._report.update(self.report)
        if self._report.writes != writes:
            self.reported = {stage: st.records for stage, st in self.stages.items()}

    def _diagnose(self, review: EpochReview, trainer: pl.Trainer) -> tuple[list[Finding], str | None]:
        summary, stage = review.summary, review.summary.stage
        st = self.stages[stage]
        compiled = self.compile_stats.get((stage, summary.epoch))
        shown = epoch_windows(self.windows, stage, summary.epoch, latest=True)
        context = epoch_context(
            summary,
            history=review.history,
            windows=tuple(with_cpu_use(w) for w in shown),
            collectives={w.name: w.collectives for w in shown},
            validation=review.validation,
            facts=run_facts({**self.run_info, **self.call_plan}, stage),
            data_wait=st.clock.data_wait,
            compute=st.clock.compute,
            profiled=st.clock.left_out(compiled.steps if compiled is not None else ()),
            ranks=review.ranks,
            compile=compiled,
            evidence_batches=self.config.thresholds.evidence_batches,
            fit_seconds=review.fit_seconds,
        )
        findings = self.trials.diagnose(context, self.run_info, trainer, self.cuda_peaks)  # the advice tried
        if self.oom is not None and (self.oom.stage, self.oom.epoch) == (stage, summary.epoch):
            findings, self.oom = [self.oom, *findings], None
        self.findings_by_epoch[(stage, summary.epoch)] = findings
        self.findings = findings
        return findings, too_little(context, self.config.thresholds)
