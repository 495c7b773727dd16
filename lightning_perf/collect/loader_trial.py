"""
DataLoader trials
=================

An advised DataLoader setting tried on the run's own dataset, side by side with the current settings (issue 48,
"What is tried" 1): what :mod:`~lightning_perf.diagnose.advice_tried` reports instead of the rule's prediction.

Notes:
    1. Two new ``DataLoader`` s over the same map-style dataset, ``batch_size``, ``collate_fn``, ``drop_last``,
       ``worker_init_fn``, ``timeout`` and multiprocessing context: the current settings, and the same with the
       advised ones. Their indices are a fixed sequence, the dataset's first batches in order (its warm-up,
       :func:`warmup_batches`, and :data:`TRIAL_BATCHES`; wrapping round a smaller dataset), never the training's
       sampler, whose generator must not move; each loader draws its workers' base seed from a private generator.
    2. :data:`TRIAL_REPETITIONS` repetitions, the two loaders alternating (current first, then advised first):
       each builds its loader and reads it as a training epoch starts, timing every batch's fetch (``next`` on the
       iterator, wall time) from the moment the epoch asks for its iterator, so the first batch holds the workers'
       start-up as it does in training; then it stops the workers. A loader with ``persistent_workers`` starts
       them once per fit: its workers are started by an untimed first pass, and the timed pass starts at the
       second ``iter``, as a later epoch does. After each fetch the training process spends the step's compute
       (the epoch's mean compute per batch) spinning on a CPU, as a step on one thread would: workers load the
       next batches meanwhile, as they do in training, so a fetch's time is the wait the step would see. (Timed
       against an idle consumer, one worker on a wide model read 0.99x where applied it shortened the wait 1.08x
       and the epoch 1.11x; with the compute slept instead of spun, which leaves the CPU to the workers, one worker
       over an in-memory ``TensorDataset`` read 1.24x and 1.76x where applied it made the epoch 0.89x and 0.83x as
       fast: ``benchmarks/advice_trial.py``.) A step on several threads takes more CPUs than the spin: there the
       trial is optimistic for workers that compute.
    3. A repetition's figure is the time per batch of a whole training epoch's steps (:func:`epoch_wait`, plus
       the compute spent after each fetch): its timed batches as the epoch's first ones, and the rest of the epoch
       at the mean of the last :data:`TRIAL_BATCHES` (the workers' steady pace). With workers, an epoch's first
       batch waits for their start-up, the next ones come from what they loaded meanwhile, and only then the
       steady pace holds. And the step's time, not its wait alone, is compared: a step's compute shrinks where
       its batch comes at once (a small model's step after a 20-ms wait for a sleeping dataset computed 4.7 ms,
       and 1.2 ms once 3 workers fed it), so the compute spent between fetches is an upper bound, and a wait
       measured against it is too short. Timing the workers' steady wait alone read 14.6x and 15.7x for 5-6
       workers on a dataset sleeping 5 ms a sample where applied they shortened the wait per batch 6.2x and
       7.2x, and with the epoch's start but the wait alone, 8.1x where applied 3 workers made the epoch 3.4x as
       fast (epochs of 32 batches; ``benchmarks/advice_trial.py``). Each setting's figure is the median of its
       repetitions'; the ratio is ``current / advised``; the spread is the lowest and highest of the repetitions'
       own ratios.
    4. Every random stream the dataset's ``__getitem__`` or the DataLoader could draw from is saved before the
       trial and put back after it (:func:`kept_random_state`): torch's CPU generator, CUDA's (where it was
       initialized), numpy's global one and Python's ``random``. The training goes on bit-identical.
    5. Not tried (:func:`untriable`): an ``IterableDataset`` (it is read as a stream: a trial would read other
       items than the training, or consume them), a dataset without ``__len__`` (no indices to choose), a
       DataLoader whose batches a ``batch_sampler`` makes (no ``batch_size`` to rebuild them with).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_perf.collect.interrupts import interrupts_held
from lightning_perf.trial_records import AdviceTrial, alternated

TRIAL_BATCHES = 8
"""Batches timed per setting per repetition: a few dozen in all (Notes 2). Our judgment: the median of 8 fetches
of a loader with workers covers several rounds of its workers' prefetch."""

TRIAL_REPETITIONS = 3
"""Repetitions of the pair (Notes 2): enough for a spread, at the cost of starting the workers this many times."""

TRIAL_WARMUP = 1
"""Batches read, besides :data:`TRIAL_BATCHES`, by a loader without workers. A loader with workers reads twice as
many more as its workers hold in advance (``2 * num_workers * prefetch_factor``, :func:`warmup_batches`): those are
loaded while the first waits, and a step faster than the workers drains them at the difference of the two paces,
so the last :data:`TRIAL_BATCHES` show the steady pace that the rest of a longer epoch keeps (Notes 3)."""


def untriable(loader: Any) -> str | None:
    """Why ``loader``'s dataset cannot be tried (Notes 5); ``None`` where it can."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return "the DataLoader has no dataset"
    if isinstance(dataset, IterableDataset):
        return (
            "an `IterableDataset` is read as a stream: a trial would read other samples than the training, or use"
            " them up"
        )
    try:
        length = len(dataset)
    except (TypeError, NotImplementedError):
        return "the dataset has no `__len__`, so no indices to read in a trial"
    if length <= 0:
        return "the dataset is empty"
    if getattr(loader, "batch_size", None) is None:
        return "a `batch_sampler` makes the batches, and a trial has no `batch_size` to rebuild them with"
    return None


@contextlib.contextmanager
def kept_random_state() -> Iterator[None]:
    """Saves every random stream the trial could draw from, and puts each back after it (Notes 4)."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    py = random.getstate()
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        np = None  # type: ignore[assignment]
    npy = np.random.get_state() if np is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        if np is not None and npy is not None:
            np.random.set_state(npy)


def trial_loader(loader: DataLoader, indices: list[int], setting: Mapping[str, Any]) -> DataLoader:
    """A new DataLoader over ``loader``'s dataset and batching, reading ``indices`` in order, with ``setting`` over
    its worker settings (Notes 1)."""
    workers = int(setting.get("num_workers", loader.num_workers))
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "sampler": indices,
        "collate_fn": loader.collate_fn,
        "drop_last": loader.drop_last,
        "num_workers": workers,
        "pin_memory": bool(setting.get("pin_memory", loader.pin_memory)),
        "generator": torch.Generator().manual_seed(0),  # the workers' base seed: not torch's global generator
    }
    if workers:
        kwargs["timeout"] = loader.timeout
        kwargs["worker_init_fn"] = loader.worker_init_fn
        kwargs["multiprocessing_context"] = loader.multiprocessing_context
        kwargs["persistent_workers"] = bool(setting.get("persistent_workers", loader.persistent_workers))
        kwargs["prefetch_factor"] = setting.get("prefetch_factor", loader.prefetch_factor or 2)
    return DataLoader(loader.dataset, **kwargs)


def warmup_batches(loader: DataLoader) -> int:
    """The batches ``loader`` reads before the steady pace, besides :data:`TRIAL_BATCHES` (:data:`TRIAL_WARMUP`)."""
    return TRIAL_WARMUP + 2 * loader.num_workers * (loader.prefetch_factor or 0)


def epoch_wait(times: list[float], steady: int, epoch_batches: int) -> float:
    """The wait per batch of a training epoch of ``epoch_batches`` batches, from a pass's fetch ``times`` in order
    (the first holds the start-up): the epoch's first batches at their times, the rest at the mean of the last
    ``steady`` times (Notes 3)."""
    if not times:
        return 0.0
    n = max(epoch_batches, 1)
    if n <= len(times):
        return sum(times[:n]) / n
    pace = statistics.fmean(times[-max(min(steady, len(times)), 1) :])
    return (sum(times) + (n - len(times)) * pace) / n


def _compute(seconds: float, clock: Callable[[], float]) -> None:
    """The step's compute, as the training process would spend it: on a CPU (a spin), not asleep (Notes 2)."""
    end = clock() + seconds
    while clock() < end:
        pass


def fetch_times(
    loader: DataLoader, compute: float = 0.0, clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """Each batch's fetch (seconds), ``loader`` read to its end as a training epoch reads it, the first from the
    ``iter`` that starts the epoch; ``compute`` seconds spent on the CPU after each fetch (the step's compute,
    Notes 2); its workers stopped. A loader with ``persistent_workers`` is timed from its second ``iter``, the
    first one's workers started by a batch read untimed (Notes 2)."""
    persistent = bool(loader.num_workers and loader.persistent_workers)
    times: list[float] = []
    iterator: Any = None

    def started() -> Any:
        with interrupts_held():  # the first iter forks the workers (lightning_perf.collect.interrupts)
            return iter(loader)

    try:
        if persistent:  # a later epoch's start: the workers are up (the reset waits for what they still load)
            iterator = started()
            next(iterator)
            iterator = iter(loader)
        start = clock()
        iterator = iterator if persistent else started()
        while True:
            try:
                next(iterator)
            except StopIteration:
                break
            times.append(clock() - start)
            _compute(compute, clock)
            start = clock()
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)  # persistent workers stay up until told
        if shutdown is not None:
            shutdown()
    return times


def try_loader_setting(
    loader: DataLoader,
    setting: Mapping[str, Any],
    *,
    rule: str,
    written: str,
    epoch: int,
    compute: float = 0.0,
    epoch_batches: int = 0,
    batches: int = TRIAL_BATCHES,
    repetitions: int = TRIAL_REPETITIONS,
    clock: Callable[[], float] = time.perf_counter,
) -> AdviceTrial:
    """``setting`` tried against ``loader``'s current settings (module Notes), as ``rule``'s advice ``written``.

    Args:
        loader: The training DataLoader.
        setting: The advised arguments (``{"num_workers": 2, "persistent_workers": True}``).
        rule: The rule whose advice it is.
        written: The setting as the advice writes it.
        epoch: The training epoch it is tried at the end of.
        compute: The step's compute per batch (seconds), spent after each fetch (Notes 2).
        epoch_batches: The training epoch's batches, whose wait per batch each setting's figure is (Notes 3); 0:
            as many as the trial reads.
        batches: Batches timed per setting per repetition.
        repetitions: Repetitions of the pair.
        clock: Seconds, monotonic.
    """
    started = clock()
    why = untriable(loader)
    if why is not None:
        return AdviceTrial(rule=rule, setting=written, epoch=epoch, untried=why)
    length = len(loader.dataset)  # type: ignore[arg-type]
    size = int(loader.batch_size or 1)
    counted = 0

    def measure(name: str) -> float:
        """One repetition of one setting: its steps' time per batch over a training epoch (Notes 3)."""
        nonlocal counted
        arguments = setting if name == "advised" else {}
        read = warmup_batches(trial_loader(loader, [], arguments)) + batches
        indices = [i % length for i in range(read * size)]
        made = trial_loader(loader, indices, arguments)
        times = fetch_times(made, compute, clock)
        del made
        counted += len(times) if name == "advised" else 0
        return epoch_wait(times, batches, epoch_batches or len(times)) + compute

    with kept_random_state(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's DataLoader warnings were said by the training's own loader
        trial = alternated(
            measure,
            repetitions,
            rule=rule,
            setting=written,
            epoch=epoch,
            batches=0,
            started=started,
            clock=clock,
            compute=compute,
        )
    return dataclasses.replace(trial, batches=counted, epoch_batches=epoch_batches or counted // repetitions)
