"""
Thread trials
=============

An advised ``torch.set_num_threads(N)`` tried on one real training step of the run, side by side with the current
count (issue 48, "What is tried" 4): what ``cpu_threads``' and ``cpu_contention``'s advice reports instead of its
prediction.

Notes:
    1. The step is :mod:`~lightning_perf.collect.step_trial`'s: a copy of the module, one batch of the run's data,
       forward and backward; where the training's DataLoader has no workers, each step reads its batch first, in
       this process, as the training does between its steps (a wait after which torch's spinning threads may hold
       the CPUs: ``cpu_contention``'s Notes 4).
    2. :data:`~lightning_perf.collect.step_trial.TRIAL_REPETITIONS` repetitions, the two counts alternating
       (current first, then advised first): each sets torch's intra-op threads, steps once untimed (the thread
       pool resized), then times :data:`~lightning_perf.collect.step_trial.TRIAL_STEPS` steps; a repetition's
       figure is their median (:func:`~lightning_perf.trial_records.alternated`).
    3. A trial past its ``limit`` stops after the repetition it is in
       (:data:`~lightning_perf.collect.step_trial.TRIAL_OVERRUN`).
    4. The thread count is put back after the trial, whatever happens: the training goes on with the threads it
       had, and so computes the same last bits.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from lightning_perf.collect.loader_trial import kept_random_state
from lightning_perf.collect.step_trial import TRIAL_REPETITIONS, TRIAL_STEPS, prepared_step
from lightning_perf.trial_records import AdviceTrial, alternated


def try_threads(
    trainer: Any,
    loader: Any,
    threads: int,
    *,
    rule: str,
    written: str,
    epoch: int,
    steps: int = TRIAL_STEPS,
    repetitions: int = TRIAL_REPETITIONS,
    limit: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> AdviceTrial:
    """``threads`` intra-op threads tried against the current count on one step of ``trainer``'s module over a
    batch of ``loader`` (module Notes), as ``rule``'s advice ``written``.

    Args:
        trainer: The run's Trainer.
        loader: The training DataLoader.
        threads: The advised ``torch.set_num_threads`` count.
        rule: The rule whose advice it is.
        written: The setting as the advice writes it (``"torch.set_num_threads(2)"``).
        epoch: The training epoch it is tried at the end of.
        steps: Steps timed per count per repetition.
        repetitions: Repetitions of the pair.
        limit: Seconds after which the trial stops at the end of a repetition (``None``: all of them).
        clock: Seconds, monotonic.
    """
    started = clock()
    before = torch.get_num_threads()
    counts = {"current": before, "advised": threads}

    with kept_random_state(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's step warned in the training already
        try:
            step = prepared_step(trainer, loader, loads=not loader.num_workers)
            if isinstance(step, str):
                return AdviceTrial(rule=rule, setting=written, epoch=epoch, untried=step)
            ready = step

            def measure(name: str) -> float:
                torch.set_num_threads(counts[name])
                return ready.median(steps, clock)

            trial = alternated(
                measure,
                repetitions,
                rule=rule,
                setting=written,
                epoch=epoch,
                batches=0,
                started=started,
                clock=clock,
                enough=None if limit is None else lambda: clock() - started > limit,
            )
            return dataclasses.replace(trial, batches=steps * trial.repetitions)
        finally:
            torch.set_num_threads(before)
