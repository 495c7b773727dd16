"""
DataLoader advice
=================

What ``dataloader_bound`` advises, predicted from the run's facts rather than assumed: more workers help
only where a CPU is free for them (or loading waits on I/O, not on the CPU), where the epoch is long enough
to repay their start-up, and where the dataset does not depend on state the module changes.

The model, per batch of the epoch (means over the measured batches), is :mod:`~lightning_perf.diagnose.loading`'s.
Workers to add are chosen for the most time saved over the run's epochs (``RunFacts.epochs``) less their
start-up, once with persistent workers: ``WORKER_STARTUP_GUESS`` each. None are suggested where that is no
saving.

Where a number is missing or the prediction is no gain, the advice says what to measure instead of what to
set, and every suggested setting is written as one ``DataLoader(...)`` call, so that it can be applied as is.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_perf.diagnose.contention import load_is_outside
from lightning_perf.diagnose.loading import (
    CPU_BOUND,
    HANDOFF,
    LOOP_START,
    MAX_SUGGESTED_WORKERS,
    Loading,
    first_is_startup,
    own_threads,
)
from lightning_perf.diagnose.model import RunFacts, StageEpoch
from lightning_perf.diagnose.rule_helpers import cpus_per_process, on_cuda
from lightning_perf.units import cpus, ms, percent, plural, seconds_or_ms

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
# A saving below this (seconds per epoch) is written as none: "at most 0.00 ms" reads as a measurement.
NO_SAVING = 0.05e-3


@dataclass(frozen=True)
class LoaderAdvice:
    """What :func:`loader_advice` advises.

    Attributes:
        lines: The advice, sentence groups in order (empty strings are dropped by the finding).
        predicted_gain: ``False`` where no change is predicted to shorten the wait (the advice then says what
            to measure): the finding is then no more than information.
        elsewhere: The advice is to look outside the DataLoader (the windows show it small, and nothing of the
            DataLoader's own, its workers or their start-up, explains the wait): the title then says so.
    """

    lines: list[str]
    predicted_gain: bool = True
    elsewhere: bool = False


def loader_advice(ctx: StageEpoch, load: Loading, *, elsewhere: bool = False) -> LoaderAdvice:
    """Advice for a DataLoader-bound epoch, from the run's facts.

    Args:
        ctx: The stage's epoch.
        load: Its :func:`loading`.
        elsewhere: The profiler windows show the DataLoader's own spans to be a small part of the step.

    Notes:
        In this order, the first that applies: a dataset sharing state with the module (workers would load
        stale data); workers oversubscribing a busy machine; more workers than CPUs (torch warns of it too:
        they take turns with the training process whatever else the epoch shows, so this holds from epoch to
        epoch); a first batch whose start-up is most of the wait; a first batch made by the dataset's own code
        that is most of the wait (no window sees an epoch's first batch, so theirs cannot outweigh it); windows
        that show the wait is not the DataLoader's (what else to look at); then workers to add, raise or lower, or
        what to measure.
    """
    facts = ctx.facts
    if facts.shared_state:
        return LoaderAdvice(_shared_state_advice(ctx, load))
    advice = (
        _oversubscribed_advice(ctx, load)
        or too_many_workers(ctx, load)
        or _startup_advice(ctx, load)
        or _first_batch_advice(ctx, load)
    )
    if not advice and elsewhere:
        return LoaderAdvice([ELSEWHERE, *_progress_bar_advice(facts)], elsewhere=True)
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


# A TQDMProgressBar redrawn more often than every this many batches is named among what runs between batches:
# Lightning's BoringModel (1-ms steps) fitted 1.19x as long with TQDMProgressBar(refresh_rate=1), its default, as
# with no bar, and 1.03x at refresh_rate=50 (benchmarks/progress_bar.py, 2 runs of 4 rounds). A redraw takes
# about 0.2 ms: from 10 batches on, 0.02 ms a batch or less. Our judgment.
BAR_REDRAW_EVERY = 10
# ... and the rate the advice proposes.
BAR_REFRESH = 50
# RichProgressBar (Lightning's default bar where `rich` is installed) updates its task after every batch, whatever
# its refresh_rate (redraws a second, from a thread of its own): 1.09-1.13x on the same fits. The figures the
# advice quotes, against no bar (benchmarks/progress_bar.py):
TQDM_EVERY_BATCH_COST, TQDM_REFRESH_COST, RICH_COST = "1.19x", "1.03x", "1.09-1.13x"


def _progress_bar_advice(facts: RunFacts) -> list[str]:
    """The progress bar, where it works after (almost) every batch (:data:`BAR_REDRAW_EVERY`, :data:`RICH_COST`),
    in a single process: under DDP, Lightning's BoringModel on 2 CPU ranks (1,000 batches an epoch) ran its epochs
    in 2.46 s with the default bar and with none, 2.63 s at `refresh_rate=50` (median of 3): no gain measured."""
    if facts.world_size > 1:
        return []
    bar, rate = facts.progress_bar, facts.progress_bar_refresh
    fix = (
        f"pass `callbacks=[TQDMProgressBar(refresh_rate={BAR_REFRESH})]` to the Trainer, or `enable_progress_bar=False`"
    )
    if bar == "TQDMProgressBar" and rate is not None and rate < BAR_REDRAW_EVERY:
        every = "after every batch" if rate == 1 else f"every {rate} batches"
        default = ", Lightning's default" if rate == 1 else ""
        what = f" redraws {every} (`TQDMProgressBar(refresh_rate={rate})`{default}):"
        cost, alternative = TQDM_EVERY_BATCH_COST, f"at `refresh_rate={BAR_REFRESH}`"
    elif bar == "RichProgressBar":
        what = (
            ": `RichProgressBar` (Lightning's default where `rich` is installed) updates after every batch and"
            " redraws from a thread of its own;"
        )
        cost, alternative = RICH_COST, f"with `TQDMProgressBar(refresh_rate={BAR_REFRESH})`"
    else:
        return []
    return [
        f"Among them, the progress bar{what} on Lightning's BoringModel (1-ms steps) the fit took {cost} as long as"
        f" with no bar, {TQDM_REFRESH_COST} {alternative}; {fix}."
    ]


def _oversubscribed_advice(ctx: StageEpoch, load: Loading) -> list[str]:
    """Workers and the training process's threads taking turns on too few CPUs of a busy machine."""
    facts = ctx.facts
    workers, per_process, own = facts.num_workers or 0, cpus_per_process(facts), own_threads(facts)
    if not (workers and load.contended and per_process is not None and workers + own > per_process):
        return []
    if load_is_outside(ctx):
        return []  # other processes hold the CPUs, not the workers (cpu_contention says so)
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


def too_many_workers(ctx: StageEpoch, load: Loading) -> list[str]:
    """More workers than this process's CPUs, unless they wait on I/O (mostly idle while the training process is
    idle too during the wait): lowered to the free CPUs (at least 1) where they compute or their use is unknown, to
    none where they are mostly idle while the training process is busy in the wait and they start again every
    epoch (without them neither is paid). Mostly idle workers that start once are left to :func:`_with_workers`:
    the wait is then receiving their batches, and whether the training process would load them for less is not
    known (an in-memory dataset: yes; a dataset that waits on files: no, with the workers' waits overlapped)."""
    facts = ctx.facts
    workers, per_process = facts.num_workers or 0, cpus_per_process(facts)
    if per_process is None or workers <= per_process:
        return []
    capacity = min(workers, per_process)  # one CPU per worker, at most this process's share
    mostly_idle = load.worker_cpus is not None and load.worker_cpus / capacity < CPU_BOUND
    busy_here = load.cpu_share is not None and load.cpu_share >= CPU_BOUND
    if mostly_idle and load.cpu_share is not None and not busy_here:
        return []  # waiting on a disk or the network: more workers overlap more waits (_with_workers)
    restarted = load.startup_share >= 0.1 and facts.persistent_workers is False
    idle = mostly_idle and busy_here
    if idle and not restarted:
        return []  # the wait is receiving their batches: whether loading would cost less is unknown (_with_workers)
    target = 0 if idle else min(max(load.spare or 0, 1), per_process)
    why = (
        f" They are mostly idle ({cpus(load.worker_cpus or 0)} in all) while the training process is busy during"
        " the wait receiving their batches, and they start again every epoch: loading in the training process"
        " pays neither."
        if idle
        else " More than the free CPUs only add memory and start-up."
    )
    startup = (
        f" Starting them takes {ms(load.startup / load.epochs)} before each epoch's first batch." if restarted else ""
    )
    return [
        f"Set `DataLoader(num_workers={target})`: {workers} workers on {per_process} CPUs (torch warns of more"
        f" workers than CPUs too) take turns on them with the training process.{why}{startup}",
        "" if idle else cheaper_samples(ctx),
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
    if ctx.epoch.epoch > 0 or load.epochs > 1:  # persistent workers started in an earlier epoch
        return [
            f"Most of the wait is each epoch's first batch ({each} more than the others): persistent workers still"
            f" begin an epoch with no batch loaded, and these epochs of {round(load.per_epoch)} batches pay that"
            " often. Compare `DataLoader(num_workers=0)` with this run (`lightning-perf compare`): loading in the"
            " training process costs less for an in-memory dataset, not for one that waits on files or the network."
        ]
    return [
        f"Most of the wait is the workers starting ({each} before the first batch): in a run"
        f" this short they may cost more than they save. Compare `DataLoader(num_workers=0)` with this run"
        " (`lightning-perf compare`)."
    ]


def _first_batch_advice(ctx: StageEpoch, load: Loading) -> list[str]:
    """A wait that is mostly the first batch's, made by the dataset's own code with no worker (an iterable
    dataset's ``__iter__`` before its first item): every batch measured it, while no profiler window sees an epoch's
    first batch."""
    if first_is_startup(ctx.facts) or load.first < LOOP_START * load.epochs or load.batches <= 1:
        return []  # start-up (_startup_advice's), or only Lightning's own start of the DataLoader
    if load.first_share < STARTUP_DOMINANT:
        return []
    return [
        f"Most of the wait is each epoch's first batch ({ms(load.first / load.epochs)} more than the others,"
        f" {percent(load.first_share)} of the wait): the dataset's own code before its first item (an"
        " `IterableDataset`'s `__iter__`: opening files, building an index, a set-up pass). Workers would not"
        " remove it, and the profiler windows never see an epoch's first batch: make that start-up cheaper, or do"
        " it once in `setup`."
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
        f", {percent(load.first_share)} of it in each epoch's first batch, which waited {ms(load.first_wait())}"
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
        most = min(most, load.most_workers() or 0)
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
        else f"{load.spare} CPU{' is' if load.spare == 1 else 's are'} free{_borrowed(load, k)}"
    )
    return [
        f"Set `DataLoader(num_workers={k}, persistent_workers=True)`: {why}, so {k} worker"
        f"{'s' if k > 1 else ''} can load batches while the model computes; predicted data wait"
        f" {ms(after)} per batch instead of {ms(steady)} (about {seconds_or_ms(saved)} less per epoch)."
        " `persistent_workers` starts the workers once per run, not at every epoch.",
        _iterable_caveat(ctx),
    ], True


def _borrowed(load: Loading, workers: int) -> str:
    """The clause that says why more CPU-bound workers than spare CPUs pay (:meth:`Loading.borrows`)."""
    if load.spare is None or workers <= load.spare:
        return ""
    return ", and the training thread's own is idle while it waits for data"


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
    if cpu_bound is False:
        if load.cpu_share is not None and load.cpu_share >= CPU_BOUND:
            return [
                f"The {named} {are} mostly idle ({cpus(load.worker_cpus or 0)} in all) while the training"
                " process is busy during the wait: the wait is mostly receiving their batches. Loading in the"
                " training process costs less only where a batch is cheap to make (an in-memory dataset), not"
                " where it waits on files or the network (the workers overlap those waits): compare"
                " `DataLoader(num_workers=0)` with this run (`lightning-perf compare`), or send fewer bytes per"
                " batch (smaller dtypes, uint8 images converted after the transfer)."
            ]
        target = min(2 * workers, MAX_SUGGESTED_WORKERS * 2)
        return [
            f"Set `DataLoader(num_workers={target}, prefetch_factor=4)`: the {named} {are} mostly"
            f" waiting ({cpus(load.worker_cpus or 0)} in all), on a disk or the network, not computing, so"
            " more of them overlap more waits, even beyond the CPU count.",
            _iterable_caveat(ctx),
        ]
    spare, room = load.spare, load.most_workers()
    if spare is not None and room is not None and workers < room:
        target = min(room, max(load.needed(), workers + 1), MAX_SUGGESTED_WORKERS)
        after = load.predicted_wait(target, cpu_bound=True)
        if target > workers and after < load.steady_wait():
            return [
                f"Set `DataLoader(num_workers={target}, persistent_workers=True)`: the {named} {are} busy"
                f" computing and {plural(spare, 'CPU')} {'is' if spare == 1 else 'are'} free{_borrowed(load, target)};"
                f" predicted data wait {ms(after)} per batch instead of {ms(load.steady_wait())}.",
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
