"""
DataLoader advice
=================

What ``dataloader_bound`` advises, predicted from the run's facts rather than assumed: more workers help
only where a CPU is free for them (or loading waits on I/O, not on the CPU), where the epoch is long enough
to repay their start-up, and where the dataset does not depend on state the module changes.

The model, per batch of the epoch (means over the measured batches):

- ``wait`` (W): the data wait; ``compute`` (C): the rest of the step.
- Loading is **CPU-bound** when the training process used its CPU for at least ``CPU_BOUND`` of the wait
  (``EpochSummary.loading_cpu_share``, with ``num_workers=0``), or when the workers used at least
  ``CPU_BOUND`` of the CPUs they could (one each, at most this process's share: ``EpochSummary.worker_cpu``
  over the epoch's wall time).
- **Spare CPUs**: this process's share of the CPUs less those its own compute needs (torch's intra-op
  threads on a CPU run; one thread feeding the GPU on CUDA). Lightning suggests CPUs per device minus one
  (``suggested_max_num_workers``), the same on a GPU. None are spare on a busy machine: when the training
  thread waited for a CPU ``CONTENDED`` of the epoch or more (``EpochSummary.cpu_wait_share``), other
  processes hold the CPUs a worker would need.
- A batch from a worker costs the training process ``HANDOFF`` to receive (unpickling it, mapping its
  shared memory), whatever the workers do.
- One loader's time per batch ``L``: with no workers, the wait itself (``W``); with ``k`` workers that
  keep the step waiting, ``k * (W - HANDOFF + C)`` (each delivers one batch per ``L``, the step takes one
  per ``W + C``). With ``k'`` workers, CPU-bound loading delivers a batch every ``L / min(k', spare)``
  seconds, I/O-bound loading every ``L / k'``; the step then waits ``max(0, L / k' - C) + HANDOFF``:
  enough workers are ``ceil(L / C)``.
- **Start-up**: the first batch's wait beyond a steady batch's where something starts there: the workers
  (paid every epoch unless ``persistent_workers=True``), or a map-style dataset's one-off set-up (opening
  files on its first item). With no workers, an iterable dataset's first batch, or one of a dataset that
  reads the module's state, is no start-up: it is the dataset's own code producing the epoch's batches (a
  generator that runs a rollout before its first ``yield``), and stays in the wait per batch. Workers to add
  are chosen for the most time saved over the run's epochs (``RunFacts.epochs``) less their start-up, once
  with persistent workers: ``WORKER_STARTUP_GUESS`` each. None are suggested where that is no saving.
- An epoch of too few batches is judged with the latest ones (``StageEpoch.pooled_epochs``): the first
  batches are then one per epoch, and figures "per epoch" are over the pooled batches per epoch.

Where a number is missing or the prediction is no gain, the advice says what to measure instead of what to
set, and every suggested setting is written as one ``DataLoader(...)`` call, so that it can be applied as is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lightning_perf.diagnose.model import RunFacts, StageEpoch
from lightning_perf.diagnose.rule_helpers import cpus_per_process, on_cuda
from lightning_perf.diagnose.thresholds import CPU_CONTENTION
from lightning_perf.units import cpus, ms, percent, plural, seconds_or_ms

# Advice only: the most workers we suggest. Lightning suggests up to the CPUs per device minus one
# (`suggested_max_num_workers`); beyond about 8 workers returns diminish for most pipelines while each worker
# holds a copy of the dataset object and `prefetch_factor` batches (our judgment).
MAX_SUGGESTED_WORKERS = 8
# Loading is CPU-bound when the loading process (the training process with no workers, else each worker) is
# on a CPU at least half of the time it loads (our judgment: below that, more of it is waiting, on a disk,
# the network or a lock, than computing, and more workers overlap the waits whatever the CPU count).
CPU_BOUND = 0.5
# The wait is the workers' start-up when the first batch's extra wait is at least half of the epoch's wait.
STARTUP_DOMINANT = 0.5
# A worker's start-up, where none was measured: the DataLoader starts its workers one after another, and the
# first batch comes after all have started. Measured on a 2-CPU machine (fork, a small dataset, torch on one
# thread): 1, 2, 4, 8 workers took 0.14, 0.29, 0.54, 0.91 s to the first batch, about 0.1 s each; spawn and
# large datasets take longer.
WORKER_STARTUP_GUESS = 0.1
# Epochs to weigh the start-up against when the run's count is unknown (our judgment: fits without
# max_epochs usually run many; ten keeps a guess on the careful side).
UNKNOWN_EPOCHS = 10
# What a batch from a worker costs the training process to receive: measured with torch 2.13 on a 2-CPU
# machine, a batch of 64 small tensors (16 floats, or 1x28x28) took 2.0-2.4 ms through one persistent worker
# against 0.4-0.5 ms in-process, a 3x64x64 batch (3 MB) 6.1 ms against 0.7 ms (`DataLoader` over a
# `TensorDataset`, nothing else to do): 1.5-1.9 ms more per small batch, 5.4 ms per 3 MB one. The smaller
# figure, as a floor: larger batches cost more.
HANDOFF = 1.5e-3
# The CPUs are busy with others when the training thread waits for one a tenth of the epoch or more (our
# judgment: on an idle machine it waits well under 1%; on this project's shared 2-CPU machine, at load 2-5,
# 20-60%, and no worker setting made a real program faster there): cpu_contention's threshold.
CONTENDED = CPU_CONTENTION
# A saving below this (seconds per epoch) is written as none: "at most 0.00 ms" reads as a measurement.
NO_SAVING = 0.05e-3
_EPS = 1e-9  # 0.016 / 0.004 is 4.000000000000001: not 5 workers


@dataclass(frozen=True, kw_only=True)
class Loading:
    """What the epoch says about loading, per measured batch (seconds).

    Attributes:
        wait: Mean data wait.
        compute: Mean rest of the step.
        batches: Measured batches.
        startup: The part of ``first`` that is start-up (workers starting, a map-style dataset's set-up): all of
            it or none.
        cpu_share: The training process's CPU over wall time during the steady waits.
        worker_cpus: CPUs' worth the workers used over the epoch.
        spare: CPUs free for workers (at least 0); ``None``: unknown.
        cpu_wait: The share of the epoch the training thread waited for a CPU; ``None``: unknown.
        workers: The DataLoader's workers.
        first: The first batch's wait beyond a steady batch's, summed over ``epochs``.
        epochs: The epochs pooled (each with its first batch).
    """

    wait: float
    compute: float
    batches: int
    startup: float
    cpu_share: float | None
    worker_cpus: float | None
    spare: int | None
    cpu_wait: float | None = None
    workers: int = 0
    first: float = 0.0
    epochs: int = 1

    @property
    def contended(self) -> bool:
        """Other processes keep the CPUs busy."""
        return self.cpu_wait is not None and self.cpu_wait >= CONTENDED - _EPS

    @property
    def startup_share(self) -> float:
        """Start-up over the epoch's whole wait."""
        total = self.wait * self.batches
        return self.startup / total if total > 0 else 0.0

    @property
    def first_share(self) -> float:
        """The first batches' extra wait over the epoch's whole wait, start-up or not."""
        total = self.wait * self.batches
        return self.first / total if total > 0 else 0.0

    @property
    def per_epoch(self) -> float:
        """Measured batches per epoch (the pooled epochs' mean)."""
        return self.batches / max(self.epochs, 1)

    def first_wait(self) -> float:
        """An epoch's first batch's wait (the pooled epochs' mean)."""
        steady = max(self.wait * self.batches - self.first, 0.0) / max(self.batches, 1)
        return self.first / max(self.epochs, 1) + steady

    def load_time(self) -> float:
        """One loader's time per batch: the steady wait without workers, ``k * (W - HANDOFF + C)`` with
        ``k``."""
        steady = self.steady_wait()
        return steady if self.workers < 1 else self.workers * (max(steady - HANDOFF, 0.0) + self.compute)

    def needed(self) -> int:
        """Workers that would hide the loading behind compute: ``ceil(L / C)``, at least 1."""
        if self.compute <= 0:
            return MAX_SUGGESTED_WORKERS
        return max(1, math.ceil(self.load_time() / self.compute - _EPS))

    def steady_wait(self) -> float:
        """The mean wait of the batches after the first."""
        if self.batches <= 1:
            return self.wait
        return max(self.wait * self.batches - self.startup, 0.0) / self.batches

    def predicted_wait(self, workers: int, *, cpu_bound: bool) -> float:
        """The steady wait per batch with ``workers`` workers."""
        usable = min(workers, self.spare) if cpu_bound and self.spare is not None else workers
        if usable < 1:
            return self.steady_wait()
        return max(0.0, self.load_time() / usable - self.compute) + HANDOFF


def loading(ctx: StageEpoch) -> Loading:
    """The epoch's :class:`Loading`."""
    epoch, facts = ctx.epoch, ctx.facts
    n, epochs = max(epoch.measured_batches, 1), max(ctx.pooled_epochs, 1)
    wait = epoch.data_wait / n
    first = epoch.first_data_wait  # pooled: the sum of the epochs' first waits
    others = n - epochs  # batches that were not their epoch's first
    if first is None:
        steady = wait
    elif others > 0:
        steady = (epoch.data_wait - first) / others
    else:  # one batch per epoch: pooled, each batch is its epoch's first; alone, it is the epoch
        steady = 0.0 if epochs > 1 else wait
    extra = min(max((first or 0.0) - epochs * max(steady, 0.0), 0.0), epoch.data_wait)
    worker_cpus = (
        epoch.worker_cpu / epoch.wall_time
        if epoch.worker_cpu is not None and epoch.wall_time and facts.num_workers
        else None
    )
    load = Loading(
        wait=wait,
        compute=max(epoch.step_time - epoch.data_wait, 0.0) / n,
        batches=n,
        startup=extra if first_is_startup(facts) else 0.0,
        cpu_share=epoch.loading_cpu_share,
        worker_cpus=worker_cpus,
        spare=spare_cpus(facts),
        cpu_wait=epoch.cpu_wait_share,
        workers=facts.num_workers or 0,
        first=extra,
        epochs=epochs,
    )
    return dataclasses.replace(load, spare=0) if load.contended and load.spare is not None else load


def first_is_startup(facts: RunFacts) -> bool:
    """Whether the first batch's extra wait is start-up: workers starting, or a map-style dataset's one-off
    set-up; not where no worker starts and the dataset is iterable or reads the module's state (its first
    ``next()`` is its own code producing the epoch's batches)."""
    if facts.num_workers is None or facts.num_workers > 0:
        return True
    return facts.dataset != "iterable" and not facts.shared_state


def spare_cpus(facts: RunFacts) -> int | None:
    """CPUs of this process's share that its own compute leaves to workers: the share less torch's threads on
    a CPU run, less one on an accelerator; ``None`` when the CPU count is unknown."""
    per_process = cpus_per_process(facts)
    if per_process is None:
        return None
    return max(per_process - _own_threads(facts), 0)


def _own_threads(facts: RunFacts) -> int:
    """The CPUs the training process computes on: torch's threads on a CPU run, one feeding an accelerator."""
    return (facts.torch_threads or 1) if facts.device == "cpu" else 1


def loading_evidence(load: Loading, facts: RunFacts) -> list[str]:
    """The measurements the advice rests on, as evidence."""
    parts = []
    if load.first_share >= 0.01 and load.batches > 1:
        waited = (
            f"the first batch waited {ms(load.first_wait())}"
            if load.epochs <= 1
            else f"the first batches of the last {load.epochs} epochs waited {ms(load.first_wait())} each on average"
        )
        parts.append(
            f"{waited} (start-up {percent(load.startup_share)} of the wait)"
            if load.startup > 0
            else f"{waited} ({percent(load.first_share)} of the wait, the dataset's own code: no worker starts there)"
        )
    if load.cpu_share is not None:
        parts.append(
            f"the training process used or waited for a CPU {percent(min(load.cpu_share, 1.0))} of the sampled waits"
        )
    if load.worker_cpus is not None and facts.num_workers:
        parts.append(f"the {facts.num_workers} workers used {cpus(load.worker_cpus)}")
    if load.contended:
        parts.append(f"the training thread waited for a CPU {percent(load.cpu_wait or 0.0)} of the epoch")
    if load.spare is not None:
        parts.append(f"{load.spare} CPU{'s' if load.spare != 1 else ''} free for workers")
    return parts


@dataclass(frozen=True)
class LoaderAdvice:
    """What :func:`loader_advice` advises.

    Attributes:
        lines: The advice, sentence groups in order (empty strings are dropped by the finding).
        predicted_gain: ``False`` where no change is predicted to shorten the wait (the advice then says what
            to measure): the finding is then no more than information.
    """

    lines: list[str]
    predicted_gain: bool = True


def loader_advice(ctx: StageEpoch, load: Loading, *, elsewhere: bool = False) -> LoaderAdvice:
    """Advice for a DataLoader-bound epoch, from the run's facts.

    Args:
        ctx: The stage's epoch.
        load: Its :func:`loading`.
        elsewhere: The profiler windows show the DataLoader's own spans to be a small part of the step.

    Notes:
        In this order, the first that applies: a dataset sharing state with the module (workers would load
        stale data); workers oversubscribing a busy machine; a first batch whose start-up is most of the
        wait; windows that show the wait is not the DataLoader's (what else to look at); then workers to add,
        raise or lower, or what to measure.
    """
    facts = ctx.facts
    if facts.shared_state:
        return LoaderAdvice(_shared_state_advice(ctx, load))
    advice = _oversubscribed_advice(ctx, load) or _startup_advice(ctx, load)
    if not advice and elsewhere:
        return LoaderAdvice([ELSEWHERE])
    gain = True
    if not advice and facts.num_workers:
        advice = _with_workers(ctx, load)
    elif not advice:
        advice, gain = _without_workers(ctx, load)
    if on_cuda(ctx) and facts.pin_memory is False:
        advice.append(
            "Set `pin_memory=True`: copies from pinned memory run asynchronously (Lightning already moves"
            " batches with `non_blocking=True`)."
        )
    return LoaderAdvice(advice, gain)


# The DataLoader's own spans are small in every window and nothing else explains the wait.
ELSEWHERE = (
    "The DataLoader itself is a small part of the wait in the profiler windows: look at what else runs"
    " between batches, in the window's trace between `ProfilerStep` spans: the batch's transfer and"
    " `on_after_batch_transfer`/`transfer_batch_to_device`, other callbacks' batch-start and batch-end"
    " hooks, and Lightning's loop itself (0.3-1 ms a batch, which shows only when steps are a few ms)."
    " DataLoader settings will not change those."
)


def _oversubscribed_advice(ctx: StageEpoch, load: Loading) -> list[str]:
    """Workers and the training process's threads taking turns on too few CPUs of a busy machine."""
    facts = ctx.facts
    workers, per_process, own = facts.num_workers or 0, cpus_per_process(facts), _own_threads(facts)
    if not (workers and load.contended and per_process is not None and workers + own > per_process):
        return []
    return [
        f"Set `DataLoader(num_workers={max(per_process - own, 0)})`: {plural(workers, 'worker')} and the"
        f" training process's {plural(own, 'thread')} share {plural(per_process, 'CPU')}, and the training"
        f" thread waited for a CPU {percent(load.cpu_wait or 0.0)} of the epoch: the workers take their CPU"
        " time from the step."
        + (
            " (Or give them CPUs: `torch.set_num_threads(...)` lower, and compare the two runs with"
            " `lightning-perf compare`.)"
            if facts.device == "cpu" and own > 1
            else ""
        ),
        cheaper_samples(ctx),
    ]


def _startup_advice(ctx: StageEpoch, load: Loading) -> list[str]:
    """A wait that is mostly the first batch's: the dataset's start-up, or the workers'."""
    if load.startup_share < STARTUP_DOMINANT:
        return []
    workers = ctx.facts.num_workers or 0
    if not workers:
        return [
            f"Most of the wait is the first batch ({ms(load.startup / load.epochs)} more than the others): the"
            " dataset's start-up (opening files, building an index). Workers would not remove it: make that"
            " start-up cheaper, or do it once in `setup`."
        ]
    each = ms(load.startup / load.epochs)
    if ctx.facts.persistent_workers is False:
        return [
            f"Set `DataLoader(num_workers={workers}, persistent_workers=True)`: most of the wait is the"
            f" workers starting ({each} before the first batch, {percent(load.startup_share)} of"
            " the epoch's wait), which persistent workers pay once per run instead of every epoch."
        ]
    return [
        f"Most of the wait is the workers starting ({each} before the first batch): in a run"
        f" this short they may cost more than they save. Compare `DataLoader(num_workers=0)` with this run"
        " (`lightning-perf compare`)."
    ]


def cheaper_samples(ctx: StageEpoch) -> str:
    """How to make each batch cheaper to load, for the device."""
    where = (
        "move augmentation to the GPU on whole batches (in `LightningModule.on_after_batch_transfer`), use a"
        ' GPU decoder (`torchvision.io.decode_jpeg(..., device="cuda")`)'
        if on_cuda(ctx)
        else "augment whole batches at once (in `LightningModule.on_after_batch_transfer`) instead of each sample"
    )
    return (
        f"Make each batch cheaper to load: cache decoded or preprocessed data once (to memory or disk, in"
        f" `setup`), {where}, or store smaller inputs."
    )


def _shared_state_advice(ctx: StageEpoch, load: Loading) -> list[str]:
    facts = ctx.facts
    state = f"The dataset reads state the LightningModule holds ({facts.shared_state})"
    first = (
        f", {percent(load.first_share)} of it in each epoch's first batch ({ms(load.first_wait())})"
        if not load.startup and load.first_share >= STARTUP_DOMINANT
        else ""
    )
    if facts.num_workers:
        return [
            f"Set `DataLoader(num_workers=0)` unless that state is read-only. {state}: each of the"
            f" {facts.num_workers} DataLoader workers holds a copy made when it started and never sees the"
            " module's later changes, so it may be loading stale data.",
            cheaper_samples(ctx),
        ]
    return [
        f"{state}: do not add DataLoader workers, which would each hold a stale copy of it and silently load"
        f" old data. The wait is the module's own code producing batches ({ms(load.steady_wait())} per batch{first}):"
        " make it cheaper, or produce several samples per call (vectorized environments, a larger `batch_size`"
        " per sampling step).",
    ]


def _iterable_caveat(ctx: StageEpoch) -> str:
    if ctx.facts.dataset != "iterable":
        return ""
    return (
        "With an `IterableDataset`, every worker runs the whole iterator: split the stream in `__iter__` by"
        " `torch.utils.data.get_worker_info()`, or each sample comes once per worker."
    )


def _without_workers(ctx: StageEpoch, load: Loading) -> tuple[list[str], bool]:
    """The advice for a loader without workers, and whether it predicts a gain."""
    steady = load.steady_wait()
    cpu_bound = load.cpu_share is None or load.cpu_share >= CPU_BOUND
    if cpu_bound and load.spare is not None and load.spare < 1:
        threads = ctx.facts.torch_threads
        held = (
            f"other processes keep the CPUs busy (the training thread waited for one {percent(load.cpu_wait or 0.0)}"
            " of the epoch)"
            if load.contended
            else f"the training process computes on {plural(threads or 1, 'thread')} of its"
            f" {plural(cpus_per_process(ctx.facts) or 1, 'CPU')}"
        )
        return [
            f"No CPU is free for DataLoader workers: {held}, and loading is CPU-bound, so a worker would take its"
            " CPU time from the step: no gain is predicted from `num_workers`.",
            cheaper_samples(ctx),
            "To try workers anyway, give them a CPU (`torch.set_num_threads(...)` one lower, with"
            " `DataLoader(num_workers=1, persistent_workers=True)`) and compare the two runs with"
            " `lightning-perf compare`.",
        ], False
    most = min(load.needed(), MAX_SUGGESTED_WORKERS)
    if cpu_bound and load.spare is not None:
        most = min(most, load.spare)
    epochs = ctx.facts.epochs or UNKNOWN_EPOCHS
    k = max(range(1, most + 1), key=lambda w: (_net_saving(load, w, epochs, cpu_bound), -w))
    after = load.predicted_wait(k, cpu_bound=cpu_bound)
    saved = max(steady - after, 0.0) * load.per_epoch
    if _net_saving(load, k, epochs, cpu_bound) <= 0:
        gain = (
            f"Workers would save at most {seconds_or_ms(saved)} an epoch here"
            if saved >= NO_SAVING
            else "Workers would not shorten the wait here"
        )
        return [
            f"{gain} (receiving each batch from a worker costs the training process about {ms(HANDOFF)}); over"
            f" {plural(epochs, 'epoch')} that is no more than starting them costs (about"
            f" {seconds_or_ms(WORKER_STARTUP_GUESS)} each): no change to the DataLoader's settings is predicted to"
            f" help. To check, compare `DataLoader(num_workers={k}, persistent_workers=True)` with this run"
            " (`lightning-perf compare`).",
            _iterable_caveat(ctx),
        ], False
    why = (
        "loading waits more than it computes (I/O)"
        if not cpu_bound
        else f"{load.spare} CPU{' is' if load.spare == 1 else 's are'} free"
    )
    return [
        f"Set `DataLoader(num_workers={k}, persistent_workers=True)`: {why}, so {k} worker"
        f"{'s' if k > 1 else ''} can load batches while the model computes; predicted data wait"
        f" {ms(after)} per batch instead of {ms(steady)} (about {seconds_or_ms(saved)} less per epoch)."
        " `persistent_workers` starts the workers once per run, not at every epoch.",
        _iterable_caveat(ctx),
    ], True


def _net_saving(load: Loading, workers: int, epochs: int, cpu_bound: bool) -> float:
    """Seconds ``workers`` persistent workers would save over ``epochs`` epochs, their start-up paid."""
    saved = (load.steady_wait() - load.predicted_wait(workers, cpu_bound=cpu_bound)) * load.per_epoch
    return epochs * saved - workers * WORKER_STARTUP_GUESS


def _with_workers(ctx: StageEpoch, load: Loading) -> list[str]:
    facts = ctx.facts
    workers = facts.num_workers or 0
    per_process = cpus_per_process(facts)
    named, are = plural(workers, "worker"), "is" if workers == 1 else "are"
    capacity = min(workers, per_process or workers)  # one CPU per worker, at most this process's share
    cpu_bound = load.worker_cpus / capacity >= CPU_BOUND if load.worker_cpus is not None else None
    if per_process is not None and workers > per_process and cpu_bound is not False:
        target = max(load.spare or 0, 1)
        return [
            f"Set `DataLoader(num_workers={target})`: {workers} workers on {per_process} CPUs take turns on them"
            " (and with the training process), so more than the free CPUs only add memory and start-up.",
            cheaper_samples(ctx),
        ]
    if cpu_bound is False:
        if load.cpu_share is not None and load.cpu_share >= CPU_BOUND:
            return [
                f"The {named} {are} mostly idle ({cpus(load.worker_cpus or 0)} in all) while the training"
                " process is busy during the wait: receiving batches from the workers costs more than loading"
                " them. Compare `DataLoader(num_workers=0)` with this run (`lightning-perf compare`), or send"
                " fewer bytes per batch (smaller dtypes, uint8 images converted after the transfer)."
            ]
        target = min(2 * workers, MAX_SUGGESTED_WORKERS * 2)
        return [
            f"Set `DataLoader(num_workers={target}, prefetch_factor=4)`: the {named} {are} mostly"
            f" waiting ({cpus(load.worker_cpus or 0)} in all), on a disk or the network, not computing, so"
            " more of them overlap more waits, even beyond the CPU count.",
            _iterable_caveat(ctx),
        ]
    spare = load.spare
    if spare is not None and workers < spare:
        target = min(spare, max(load.needed(), workers + 1), MAX_SUGGESTED_WORKERS)
        if target > workers:
            return [
                f"Set `DataLoader(num_workers={target}, persistent_workers=True)`: the {named} {are} busy"
                f" computing and {plural(spare, 'CPU')} {'is' if spare == 1 else 'are'} free; predicted data wait"
                f" {ms(load.predicted_wait(target, cpu_bound=True))} per batch instead of {ms(load.steady_wait())}.",
            ]
    if cpu_bound:
        return [
            f"The CPU is the limit: the {named} {'keeps' if workers == 1 else 'keep'}"
            f" {cpus(load.worker_cpus or 0)} busy and no more are free, so more workers will not help.",
            cheaper_samples(ctx),
            _persistent(facts, workers),
        ]
    # Unknown whether the workers compute or wait (no /proc): say what to measure.
    return [
        f"Whether more workers help depends on whether the {named} {are} computing or waiting: watch"
        " their CPU use (`top`); if each is near 100%, make samples cheaper, otherwise try"
        f" `DataLoader(num_workers={2 * workers}, persistent_workers=True)` and compare the runs with"
        " `lightning-perf compare`.",
    ]


def _persistent(facts: RunFacts, workers: int) -> str:
    if facts.persistent_workers is False:
        return (
            f"Set `DataLoader(num_workers={workers}, persistent_workers=True)`, which starts the workers once per"
            " run instead of every epoch."
        )
    return ""
