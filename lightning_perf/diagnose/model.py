"""
Diagnosis inputs and findings
=============================

The plain data the rules read (:class:`StageEpoch`, :class:`RunFacts`) and write (:class:`Finding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_perf.records import CollectiveStats, CompileStats, EpochSummary, TraceSummary
from lightning_perf.trial_records import AdviceTrial

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What the rules need to know about the run and the stage's DataLoader (``None``: unknown)."""

    device: str = "cpu"  # "cpu", "cuda", ...
    device_name: str | None = None
    precision: str | None = None  # Lightning's precision string, e.g. "32-true", "bf16-mixed"
    world_size: int = 1
    num_nodes: int = 1
    strategy: str | None = None  # the strategy's class name, e.g. "DDPStrategy", "FSDPStrategy"
    cpu_count: int | None = None  # CPUs this process may run on (affinity, and no more than its cgroup quota)
    cpu_quota: float | None = None  # the cgroup's CPU quota, in CPUs, where one is set
    torch_threads: int | None = None  # torch.get_num_threads()
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    batch_size: int | None = None
    dataset: str | None = None  # "map" or "iterable"
    shared_state: str | None = None  # what the dataset shares with the LightningModule, described
    dataset_class: str | None = None  # the class whose __getitem__ makes the samples (through torch's Subset)
    dataset_library: str | None = None  # the installed package defining that class; None: the user's own code
    dataset_length: int | None = None  # len(dataset): the samples of a whole pass, however many an epoch loads
    loader_built_by: str | None = None  # the installed library whose hook built the DataLoader; None: the user
    loader_builder: str | None = None  # that hook, "Class.train_dataloader"
    iterable_class: str | None = None  # no DataLoader: the class of what the Trainer iterates (its own batches)
    iterable_library: str | None = None  # the installed package defining it; None: the user's own code
    epochs: int | None = None  # epochs of this stage the run does (1 for a validate/test/predict call)
    peak_flops: float | None = None  # the device's dense peak FLOP/s for the run's dtype (table or option)
    val_check_steps: int | None = None  # validation runs every N training batches, across epochs (step-based)
    optimizer: str | None = None  # the first optimizer's class name
    optimizer_fused: bool | None = None  # it was built with fused=True (False: not; None: unknown or no such option)
    optimizer_fusable: bool | None = None  # a torch optimizer with a fused implementation (Adam, AdamW, SGD, Adagrad)
    optimizer_built_by: str | None = None  # the installed library whose configure_optimizers built it; None: the user
    optimizer_builder: str | None = None  # that hook, "Class.configure_optimizers"
    compiled_modules: str | None = None  # the modules `nn.Module.compile()` was called on, named, at setup
    progress_bar: str | None = None  # the progress bar's class, where one draws ("TQDMProgressBar", ...)
    progress_bar_refresh: int | None = None  # its refresh_rate (TQDM: batches between redraws; Rich: a second)
    memory: Mapping[str, Any] | None = None  # run.memory: what fills memory (summarize.memory.memory_report)
    manual_optimization: bool | None = None  # the module optimizes manually (`automatic_optimization=False`)


@dataclass(frozen=True, kw_only=True)
class StageEpoch:
    """One stage's epoch, as the rules see it.

    Attributes:
        epoch: The epoch's always-on summary.
        history: The same stage's earlier epochs, oldest first.
        windows: Summaries of this epoch's profiler windows' traces.
        validation: For a training epoch, the validation epochs that ran during it.
        facts: The run and the stage's DataLoader.
        step_times: This epoch's per-batch step times (seconds), in batch order; NaN for a batch that ran
            inside a profiler window (the profiler slows it down).
        rank_step_times: Per global rank of a distributed run, its median step time less the share it spent
            waiting in collectives (its own work: under DDP every rank's step lasts as long as the slowest
            rank's, so the slow rank is the one that waits least).
        compile: What ``torch.compile`` did during the epoch; ``None`` when nothing compiled in the run so far
            (or torch could not tell).
        fit_seconds: For a training epoch, the training and validation step time of the fit so far (this epoch
            included); ``None`` where unknown.
        pooled_epochs: The epochs ``epoch`` sums: more than 1 where an epoch of too few batches is judged with the
            latest ones (:func:`~lightning_perf.summarize.steps.pool_epochs`), or where short epochs were measured
            together (``EpochSummary.epochs``); its first-batch wait is then the sum of theirs.
        collectives: Each window's collectives, by the window's name (``TraceSummary.window``).
        rank_waits: Per global rank of a distributed run, the share of its step it spent in collectives with no
            compute overlapping (from its windows): who waits for whom.
        rank_cpu_waits: Per global rank of a distributed run, the share of its epoch its training thread waited
            for a CPU (``EpochSummary.cpu_wait_share``, rank zero's own included): the rules run on rank zero.
        advice_trials: The run's advice trials so far, by rule id (:class:`~lightning_perf.trial_records.
            AdviceTrial`): a rule whose advised setting was tried on the run's data reports the measurement.
    """

    epoch: EpochSummary
    history: tuple[EpochSummary, ...] = ()
    step_times: tuple[float, ...] = ()
    windows: tuple[TraceSummary, ...] = ()
    validation: tuple[EpochSummary, ...] = ()
    facts: RunFacts = field(default_factory=RunFacts)
    rank_step_times: Mapping[int, float] | None = None
    compile: CompileStats | None = None
    fit_seconds: tuple[float, float] | None = None
    pooled_epochs: int = 1
    collectives: Mapping[str, tuple[CollectiveStats, ...]] = field(default_factory=dict)
    rank_waits: Mapping[int, float] | None = None
    rank_cpu_waits: Mapping[int, float] | None = None
    advice_trials: Mapping[str, AdviceTrial] = field(default_factory=dict)

    @property
    def stage(self) -> str:
        return self.epoch.stage

    def over_batches(self) -> str:
        """What the epoch's figures are over, for evidence: "8 batches", or "the last 2 epochs, 8 batches" where
        it pools epochs."""
        measured = self.epoch.measured_batches
        batches = f"{measured} batch{'' if measured == 1 else 'es'}"
        return batches if self.pooled_epochs <= 1 else f"the last {self.pooled_epochs} epochs, {batches}"


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A bottleneck a rule found, with the numbers that show it and what to change.

    Attributes:
        id: The rule's id, e.g. ``"dataloader_bound"``.
        severity: ``"info"``, ``"warning"`` or ``"critical"``.
        title: One line, e.g. "Training waits for data 62% of the time".
        evidence: The numbers that triggered the rule, with its threshold.
        advice: A concrete change (a Trainer or DataLoader argument, a code pattern) and its expected effect.
        window: The trace window (run directory name) that shows it, when one does.
        stage: The stage it was found in.
        epoch: The stage's epoch.
    """

    id: str
    severity: Severity
    title: str
    evidence: str
    advice: str
    stage: str
    epoch: int
    window: str | None = None
