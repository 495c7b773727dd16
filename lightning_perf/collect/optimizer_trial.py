"""
Optimizer trials
================

An advised optimizer implementation (``fused=True``, ``foreach=True``) tried on the run's own parameters, side by
side with the current one (issue 48, "What is tried" 2): what ``optimizer_heavy``'s advice reports instead of its
prediction.

Notes:
    1. Two copies of the optimizer (``copy.deepcopy``: its parameters cloned with their gradients, its state
       deep-copied and keyed by the clones), one with the advised options set on every parameter group. The
       training's optimizer, parameters, gradients and state are never touched; the copies' step hooks are
       cleared, so no callback of the user's runs for them.
    2. Where no parameter has a gradient at the epoch's end, each clone that requires one gets zeros of its shape:
       an update does the same work whatever the gradient's values. A fit that validates has none there: before a
       validation run inside a training epoch, Lightning releases the gradients (``on_validation_model_zero_grad``
       sets them to ``None``). Where some parameters have one, the others keep none, as a step skips them.
    3. :data:`TRIAL_REPETITIONS` repetitions, the two copies alternating (current first, then advised first): each
       steps :data:`TRIAL_WARMUP` times untimed (a fused kernel's first call, a foreach buffer), then times each of
       :data:`TRIAL_STEPS` steps (wall time; on CUDA the step is synchronized, since a step only launches
       kernels). The gradients stay as they were: every step does the same work.
    4. Each repetition gives a setting its median step; the medians over the repetitions, their ratio
       ``current / advised`` and the spread of the repetitions' own ratios make the record
       (:func:`~lightning_perf.trial_records.alternated`).
    5. Not tried (:func:`untriable`): an optimizer with no parameter that requires a gradient; on CUDA, where the
       free device memory does not hold a copy of the parameters, gradients and state (twice what they take, with a
       margin). An implementation the optimizer refuses (``fused=True`` on a device or dtype it does not support)
       is recorded as untried with torch's reason.
    6. An optimizer step draws no random number, so the training's random streams are left alone.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from lightning_perf.trial_records import AdviceTrial, alternated

TRIAL_STEPS = 10
"""Steps timed per implementation per repetition (Notes 3). Our judgment: an optimizer step is the same work
every time, so ten give a stable median at little cost."""

TRIAL_REPETITIONS = 3
"""Repetitions of the pair (Notes 3), for a spread."""

TRIAL_WARMUP = 2
"""Untimed steps at each repetition's start: a fused or foreach kernel's first call, and the state's creation."""

CUDA_MEMORY_MARGIN = 1.25
"""The free device memory a CUDA trial needs over the two copies' bytes (Notes 5): our judgment, room for the
allocator's rounding and the step's temporaries."""


def _stepped(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters a copy steps (Notes 2): those with a gradient, or, where none has one, those that require
    one."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with_grad = [p for p in params if p.grad is not None]
    return with_grad or [p for p in params if p.requires_grad]


def untriable(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``optimizer`` cannot be tried (Notes 5); ``None`` where it can."""
    stepped = _stepped(optimizer)
    if not stepped:
        return "no parameter of the optimizer requires a gradient, nothing to step"
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    cuda = [t for t in (*stepped, *stepped, *state) if t.is_cuda]  # each parameter and its gradient
    if cuda:
        needed = 2 * sum(t.numel() * t.element_size() for t in cuda) * CUDA_MEMORY_MARGIN
        free, _ = torch.cuda.mem_get_info(cuda[0].device)
        if free < needed:
            return (
                f"the GPU has {free / 2**30:.1f} GiB free, and two copies of the parameters, gradients and"
                f" optimizer state need {needed / 2**30:.1f} GiB"
            )
    return None


def optimizer_copy(optimizer: torch.optim.Optimizer, setting: Mapping[str, Any]) -> torch.optim.Optimizer:
    """A copy of ``optimizer`` over clones of its parameters, gradients and state (Notes 1), with ``setting`` on
    every parameter group."""
    made = copy.deepcopy(optimizer)
    originals = [p for group in optimizer.param_groups for p in group["params"]]
    clones = [p for group in made.param_groups for p in group["params"]]
    stepped = {id(p) for p in _stepped(optimizer)}
    for original, clone in zip(originals, clones, strict=True):  # a Parameter's deepcopy leaves its gradient out
        if id(original) not in stepped:
            clone.grad = None
        elif original.grad is None:  # released before a validation run (Notes 2)
            clone.grad = torch.zeros_like(clone)
        else:
            clone.grad = original.grad.detach().clone()
    for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        if isinstance(getattr(made, hooks, None), dict):
            getattr(made, hooks).clear()
    for group in made.param_groups:
        group.update(setting)
        if setting.get("fused"):
            group["foreach"] = None  # torch refuses both at once
    return made


def step_times(optimizer: torch.optim.Optimizer, steps: int, warmup: int, clock: Callable[[], float]) -> list[float]:
    """``warmup`` untimed steps, then each of ``steps`` steps' wall time (Notes 3)."""
    cuda = any(p.is_cuda for group in optimizer.param_groups for p in group["params"])
    times = []
    for i in range(warmup + steps):
        start = clock()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(clock() - start)
    return times


def try_optimizer_setting(
    optimizer: torch.optim.Optimizer,
    setting: Mapping[str, Any],
    *,
    rule: str,
    written: str,
    epoch: int,
    steps: int = TRIAL_STEPS,
    repetitions: int = TRIAL_REPETITIONS,
    clock: Callable[[], float] = time.perf_counter,
) -> AdviceTrial:
    """``setting`` tried against ``optimizer``'s current implementation (module Notes), as ``rule``'s advice
    ``written``.

    Args:
        optimizer: The training's optimizer (the torch one, not Lightning's wrapper).
        setting: The advised options (``{"fused": True}``).
        rule: The rule whose advice it is.
        written: The setting as the advice writes it.
        epoch: The training epoch it is tried at the end of.
        steps: Steps timed per implementation per repetition.
        repetitions: Repetitions of the pair.
        clock: Seconds, monotonic.
    """
    started = clock()
    why = untriable(optimizer)
    if why is not None:
        return AdviceTrial(rule=rule, setting=written, epoch=epoch, untried=why)
    copies = {"current": optimizer_copy(optimizer, {}), "advised": optimizer_copy(optimizer, setting)}
    try:
        return alternated(
            lambda name: statistics.median(step_times(copies[name], steps, TRIAL_WARMUP, clock)),
            repetitions,
            rule=rule,
            setting=written,
            epoch=epoch,
            batches=steps * repetitions,
            started=started,
            clock=clock,
        )
    except (RuntimeError, ValueError) as err:  # an implementation this optimizer, device or dtype refuses
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return AdviceTrial(rule=rule, setting=written, epoch=epoch, untried=f"torch refused it: {reason}")
