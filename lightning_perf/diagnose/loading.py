"""
DataLoader loading model
========================

What an epoch says about its loading, per batch (means over the measured batches), for
:mod:`~lightning_perf.diagnose.loader_advice` to predict from (:class:`Loading`, :func:`loading`):

- ``wait`` (W): the data wait; ``compute`` (C): the rest of the step.
- Loading is **CPU-bound** when the training process used its CPU for at least ``CPU_BOUND`` of the wait
  (``EpochSummary.loading_cpu_share``, with ``num_workers=0``: of the wait less its main thread's time queued
  for a CPU, which a busy machine adds to a sleeping loader's wait as much as to a computing one's), or when the
  workers used at least ``CPU_BOUND`` of the CPUs they could (one each, at most this process's share:
  ``EpochSummary.worker_cpu`` over the epoch's wall time).
- **Spare CPUs**: this process's share of the CPUs less those its own compute needs (torch's intra-op
  threads on a CPU run; one thread feeding the GPU on CUDA). Lightning suggests CPUs per device minus one
  (``suggested_max_num_workers``), the same on a GPU. None are spare on a busy machine: when the training
  thread waited for a CPU ``CONTENDED`` of the epoch or more (``EpochSummary.cpu_wait_share``), other
  processes hold the CPUs a worker would need. Where torch computes on one thread and a CPU is spare besides,
  CPU-bound workers beyond the spare ones use the training thread's CPU while it waits for them
  (:meth:`Loading.borrows`): the step is then at least a batch's CPU time (loading, ``HANDOFF`` to send it,
  compute, ``HANDOFF`` to receive it) over this process's CPUs. Not with several torch threads: a worker's
  turn on one of their CPUs stalls the whole parallel region.
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
  generator that runs a rollout before its first ``yield``), and stays in the wait per batch.
- An epoch of too few batches is judged with the latest ones (``StageEpoch.pooled_epochs``): the first
  batches are then one per epoch, and figures "per epoch" are over the pooled batches per epoch.

"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lightning_perf.diagnose.model import RunFacts, StageEpoch
from lightning_perf.diagnose.rule_helpers import cpus_per_process
from lightning_perf.diagnose.thresholds import CPU_CONTENTION
from lightning_perf.units import cpus, ms, percent, plural

# Advice only: the most workers we suggest. Lightning suggests up to the CPUs per device minus one
# (`suggested_max_num_workers`); beyond about 8 workers returns diminish for most pipelines while each worker
# holds a copy of the dataset object and `prefetch_factor` batches (our judgment).
MAX_SUGGESTED_WORKERS = 8
# Loading is CPU-bound when the loading process (the training process with no workers, else each worker) is
# on a CPU at least half of the time it loads (our judgment: below that, more of it is waiting, on a disk,
# the network or a lock, than computing, and more workers overlap the waits whatever the CPU count).
CPU_BOUND = 0.5
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
# The evidence names the share of the sampled waits the training thread queued for a CPU from this much: on an
# idle machine it queued under 1% of them (our judgment, above that).
QUEUE_NOTE = 0.05
EPS = 1e-9  # 0.016 / 0.004 is 4.000000000000001: not 5 workers
# Lightning's own start of a worker-less DataLoader at each epoch, in its first batch's wait (the loop's iterator
# and fetcher): a 16-item map-style dataset's validation epochs of 2 batches, 300 epochs on this project's 2-CPU
# machine, waited 2.05-2.10 ms for their first batch and 0.64-0.69 ms for the other (`dataloader_bound` called it
# critical, "the dataset's start-up"). A first batch's extra wait under this, with no worker, is no dataset's
# start-up: twice that, our judgment.
LOOP_START = 3e-3


@dataclass(frozen=True, kw_only=True)
class Loading:
    """What the epoch says about loading, per measured batch (seconds).

    Attributes:
        wait: Mean data wait.
        compute: Mean rest of the step.
        batches: Measured batches.
        startup: The part of ``first`` that is start-up (workers starting, a map-style dataset's set-up): all of
            it or none.
        cpu_share: The training process's CPU over the sampled waits' wall time less its queueing for a CPU.
        queue_share: The share of the sampled waits its main thread queued for a CPU.
        worker_cpus: CPUs' worth the workers used over the epoch.
        spare: CPUs free for workers (at least 0); ``None``: unknown.
        cpus: This process's share of the CPUs; ``None``: unknown.
        own: The CPUs the training process computes on (:func:`own_threads`).
        cpu_wait: The share of the epoch the training thread waited for a CPU; ``None``: unknown.
        workers: The DataLoader's workers.
        first: The first batch's wait beyond a steady batch's, summed over ``epochs``.
        epochs: The epochs pooled (each with its first batch).
        all_batches: Every batch of the pooled epochs, measured or not (a window's, those after its close): what
            workers would load, and so what a saving per epoch counts; ``None``: the measured ones.
    """

    wait: float
    compute: float
    batches: int
    startup: float
    cpu_share: float | None
    worker_cpus: float | None
    spare: int | None
    cpus: int | None = None
    own: int = 1
    cpu_wait: float | None = None
    queue_share: float | None = None
    workers: int = 0
    first: float = 0.0
    epochs: int = 1
    all_batches: int | None = None

    @property
    def contended(self) -> bool:
        """Other processes keep the CPUs busy."""
        return self.cpu_wait is not None and self.cpu_wait >= CONTENDED - EPS

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
        """Batches per epoch (the pooled epochs' mean), measured or not: a saving per batch applies to all."""
        return (self.all_batches or self.batches) / max(self.epochs, 1)

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
        return max(1, math.ceil(self.load_time() / self.compute - EPS))

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
        wait = max(0.0, self.load_time() / usable - self.compute) + HANDOFF
        if cpu_bound and workers > usable and self.borrows():
            wait = min(wait, self._borrowed_wait(workers))
        return wait

    def most_workers(self) -> int | None:
        """The most CPU-bound workers that can load at once: the spare CPUs, or this process's whole share where
        they may borrow the training thread's (:meth:`borrows`); ``None``: unknown."""
        return self.cpus if self.borrows() else self.spare

    def borrows(self) -> bool:
        """Whether workers beyond the spare CPUs may use the training process's own CPU while it waits for them:
        where it computes on one thread, with at least one CPU spare besides."""
        return self.own == 1 and self.spare is not None and self.spare >= 1 and self.cpus is not None

    def _borrowed_wait(self, workers: int) -> float:
        """The steady wait with more CPU-bound ``workers`` than spare CPUs: the step is the longest of the
        training process's own time (``C + HANDOFF``), one worker's time per batch over the workers (each also
        sends its batch: ``L + HANDOFF``), and all the CPU time a batch needs over this process's CPUs."""
        loader = self.load_time() + HANDOFF
        cpu_time = loader + self.own * self.compute + HANDOFF
        step = max(self.compute + HANDOFF, loader / workers, cpu_time / (self.cpus or 1))
        return max(step - self.compute, HANDOFF)


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
        startup=extra if first_is_startup(facts) and not _loop_start_only(facts, extra, epochs) else 0.0,
        cpu_share=epoch.loading_cpu_share,
        worker_cpus=worker_cpus,
        spare=spare_cpus(facts),
        cpus=cpus_per_process(facts),
        own=own_threads(facts),
        cpu_wait=epoch.cpu_wait_share,
        queue_share=epoch.loading_queue_share,
        workers=facts.num_workers or 0,
        first=extra,
        epochs=epochs,
        all_batches=max(epoch.batches, n),
    )
    return dataclasses.replace(load, spare=0) if load.contended and load.spare is not None else load


def _loop_start_only(facts: RunFacts, extra: float, epochs: int) -> bool:
    """Whether the first batches' extra wait is no more than Lightning's own start of a worker-less DataLoader
    (:data:`LOOP_START` an epoch)."""
    return facts.num_workers == 0 and extra < LOOP_START * epochs


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
    return max(per_process - own_threads(facts), 0)


def own_threads(facts: RunFacts) -> int:
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
        if load.startup > 0:
            parts.append(f"{waited} (start-up {percent(load.startup_share)} of the wait)")
        elif first_is_startup(facts):
            parts.append(
                f"{waited} ({percent(load.first_share)} of the wait, under {ms(LOOP_START)} more than the others"
                " each: Lightning's own start of the DataLoader, no dataset's start-up)"
            )
        else:
            parts.append(
                f"{waited} ({percent(load.first_share)} of the wait, the dataset's own code: no worker starts there)"
            )
    if load.cpu_share is not None:
        parts.append(
            f"the training process used a CPU {percent(min(load.cpu_share, 1.0))} of the sampled waits"
            + (
                f" (less the {percent(load.queue_share)} of them its thread queued for one)"
                if load.queue_share is not None and load.queue_share >= QUEUE_NOTE
                else ""
            )
        )
    if load.worker_cpus is not None and facts.num_workers:
        parts.append(f"the {plural(facts.num_workers or 0, 'worker')} used {cpus(load.worker_cpus)}")
    if load.contended:
        parts.append(f"the training thread waited for a CPU {percent(load.cpu_wait or 0.0)} of the epoch")
    if load.spare is not None:
        parts.append(f"{load.spare} CPU{'s' if load.spare != 1 else ''} free for workers")
    return parts
