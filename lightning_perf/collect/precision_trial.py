"""
Precision trials
================

An advised autocast dtype (``Trainer(precision="bf16-mixed")``, ``"16-mixed"``) tried on one real training step
of the run, side by side with its current precision (issue 48, "What is tried" 3): what ``precision``'s advice
reports instead of its prediction.

Notes:
    1. The step is :mod:`~lightning_perf.collect.step_trial`'s: a copy of the module, one batch of the run's data,
       forward and backward. Current: under the run's own precision context. Advised: the forward under
       ``torch.autocast(<device>, dtype)``, as Lightning's mixed precision runs it (the backward outside it; no
       loss scaler for ``"16-mixed"``: its cost is a multiplication of the loss and an unscale of the gradients).
    2. :data:`~lightning_perf.collect.step_trial.TRIAL_REPETITIONS` repetitions, alternating (current first,
       then advised first): one untimed step, then :data:`~lightning_perf.collect.step_trial.TRIAL_STEPS` timed
       ones, their median the repetition's figure (:func:`~lightning_perf.trial_records.alternated`). A trial past
       its ``limit`` stops after the repetition it is in (:data:`~lightning_perf.collect.step_trial.TRIAL_OVERRUN`).
    3. **Peak memory, on CUDA.** Each timed step's peak of allocated memory above what was allocated before it
       (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``): the step's activations, its
       gradients and autocast's copies of the weights; a setting's figure is its highest. The callback's own
       peaks are kept: the trial runs set apart (:meth:`~lightning_perf.collect.memory.CudaPeaks.apart`), so no
       epoch or window reports the trial's memory. On CPU the peak is not measured (``None``).
    4. A step that raises a ``RuntimeError`` under autocast (a kernel the dtype has none of on this device) leaves
       the setting untried, with torch's reason: the advice stays a prediction and says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from lightning_perf.collect.loader_trial import kept_random_state
from lightning_perf.collect.step_trial import TRIAL_REPETITIONS, TRIAL_STEPS, TrialStep, prepared_step
from lightning_perf.trial_records import AdviceTrial, alternated

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
"""The autocast dtypes a trial can try, by name."""


def try_precision(
    trainer: Any,
    loader: Any,
    dtype: str,
    *,
    rule: str,
    written: str,
    epoch: int,
    apart: Callable[[], ContextManager[Any]] | None = None,
    steps: int = TRIAL_STEPS,
    repetitions: int = TRIAL_REPETITIONS,
    limit: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> AdviceTrial:
    """Autocast to ``dtype`` tried against the run's precision on one step of ``trainer``'s module over a batch of
    ``loader`` (module Notes), as ``rule``'s advice ``written``.

    Args:
        trainer: The run's Trainer.
        loader: The training DataLoader.
        dtype: ``"bfloat16"`` or ``"float16"`` (:data:`DTYPES`).
        rule: The rule whose advice it is.
        written: The setting as the advice writes it (``'precision="bf16-mixed"'``).
        epoch: The training epoch it is tried at the end of.
        apart: On CUDA, sets the trial's memory apart from the callback's peaks (Notes 3); ``None``: none to keep.
        steps: Steps timed per setting per repetition.
        repetitions: Repetitions of the pair.
        limit: Seconds after which the trial stops at the end of a repetition (``None``: all of them).
        clock: Seconds, monotonic.
    """
    started = clock()
    with kept_random_state(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's step warned in the training already; autocast's notes
        step = prepared_step(trainer, loader)
        if isinstance(step, str):
            return AdviceTrial(rule=rule, setting=written, epoch=epoch, untried=step)
        device = next((p.device.type for p in step.module.parameters()), "cpu")
        contexts: dict[str, Callable[[], ContextManager[Any]]] = {
            "current": step.context,
            "advised": lambda: torch.autocast(device, dtype=DTYPES[dtype]),
        }
        peaks: dict[str, int] = {}

        def measure(name: str) -> float:
            timed = _peak_times(step, steps, clock, contexts[name]) if step.cuda else None
            if timed is None:
                return step.median(steps, clock, contexts[name])
            seconds, peak = timed
            peaks[name] = max(peaks.get(name, 0), peak)
            return seconds

        with apart() if apart is not None and step.cuda else contextlib.nullcontext():
            try:
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
            except RuntimeError as err:  # a kernel the dtype has none of here (oneDNN's bf16 LSTM on some CPUs)
                reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                return AdviceTrial(rule=rule, setting=written, epoch=epoch, untried=f"the step failed: {reason}")
    return dataclasses.replace(
        trial,
        batches=steps * trial.repetitions,
        current_peak=peaks.get("current"),
        advised_peak=peaks.get("advised"),
    )


def _peak_times(
    step: TrialStep, steps: int, clock: Callable[[], float], context: Callable[[], ContextManager[Any]]
) -> tuple[float, int]:
    """On CUDA: the median of ``steps`` timed steps after an untimed one, and their highest peak above what was
    allocated before each (Notes 3)."""
    step.run(context)
    times, peak = [], 0
    device = next(p.device for p in step.module.parameters())
    for _ in range(steps):
        step.module.zero_grad(set_to_none=True)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = clock()
        step.run(context)
        times.append(clock() - start)
        peak = max(peak, torch.cuda.max_memory_allocated(device) - base)
    return statistics.median(times), peak
