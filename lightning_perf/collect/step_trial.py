"""
Step trials
===========

One real training step of the run, on a copy of its module and one batch of its data, to try a setting that
changes how the step computes: torch's thread count (:mod:`~lightning_perf.collect.thread_trial`) or an autocast
dtype (:mod:`~lightning_perf.collect.precision_trial`). Issue 48, "What is tried" 3 and 4.

Notes:
    1. **The batch.** One batch read from the training DataLoader's dataset at fixed indices (its first
       ``batch_size`` items), through a new DataLoader without workers
       (:func:`~lightning_perf.collect.loader_trial.trial_loader`): never from the running iterator or the
       sampler, so the training's data order does not move. It goes to the device by the strategy's own transfer
       (``trainer.strategy.batch_to_device``: the module's transfer hooks run, as for a training batch).
    2. **The copy.** ``copy.deepcopy`` of the LightningModule (:func:`module_copy`). Lightning's ``__getstate__``
       leaves the trainer out of the copy (Lightning 2.6), so ``self.log`` in the copy's ``training_step`` warns and
       logs nothing: the run's logged metrics do not change. The copy keeps its submodules' train and eval modes,
       and whatever else the module holds (a dataset it keeps is copied too).
    3. **A step** is ``training_step(batch, 0)`` (``training_step(batch)`` where it takes no index) on the copy,
       under the run's precision context (or the one tried), and ``backward`` of its loss (a tensor, or a dict's
       ``"loss"``), the copy's gradients set to ``None`` first: every step does the same work. On CUDA each step
       is synchronized. Lightning's warnings are silenced. A step that ``loads`` reads its batch again first, as
       Notes 1 says (a thread trial, where the training's DataLoader has no workers: the training process loads
       each batch between its steps, on the CPUs its threads share).
    4. **What it leaves as it was.** Every random stream is saved before and put back after
       (:func:`~lightning_perf.collect.loader_trial.kept_random_state`): the copy's dropout draws no number the
       training would. The training's parameters, gradients and optimizer state are not touched.
    5. **Not tried** (:func:`untriable`, and :func:`prepared_step` for the last three): manual optimization (its
       ``training_step`` steps the optimizers itself), a ``training_step`` that reads the ``dataloader_iter``, a
       sharded strategy (FSDP, DeepSpeed: a copy would gather or duplicate the shards), a compiled module (a copy
       would compile again, at a cost no estimate foresees), a dataset the DataLoader trial cannot read
       (``IterableDataset``, no ``__len__``), CUDA without free memory for a copy; a module ``copy.deepcopy``
       refuses, a ``training_step`` that needs the trainer (``self.trainer``), or returns no loss.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

from lightning_perf.collect.loader_trial import trial_loader
from lightning_perf.collect.loader_trial import untriable as untriable_loader
from lightning_perf.collect.optimizer_trial import CUDA_MEMORY_MARGIN

TRIAL_STEPS = 3
"""Steps timed per setting per repetition. Our judgment: a training step is the same work every time, and the
median of 3 leaves out one disturbed by the machine."""

TRIAL_REPETITIONS = 3
"""Repetitions of the pair, their order alternating, for a spread."""

TRIAL_WARMUP = 1
"""Untimed steps at each repetition's start: a thread pool resized, autocast's first casts, the allocator."""

TRIAL_OVERRUN = 3.0
"""A step trial past this many times its estimate stops after the repetition it is in (at least one is done). The
advised setting can be far slower than the current one, which the estimate cannot know: on this project's shared
2-CPU machine, 2 torch threads took 372 ms a step where 1 took 28 ms, and bf16 autocast on a CPU without bf16
instructions 340 ms where fp32 took 16 ms. Our judgment."""

SHARDED = ("FSDP", "DeepSpeed", "ModelParallel")
"""Strategies whose parameters are sharded over the ranks (by the strategy's class name)."""

NEEDS_TRAINER = "is not attached to a `Trainer`"
"""What Lightning's error says where the module's ``trainer`` is read without one (Lightning 2.6)."""


def untriable(trainer: Any, loader: Any) -> str | None:
    """Why a step of ``trainer``'s module on ``loader``'s data cannot be tried (Notes 5); ``None`` where it can."""
    module = trainer.lightning_module
    if module is None:
        return "the trainer has no module"
    if is_param_in_hook_signature(module.training_step, "dataloader_iter", explicit=True):
        return "`training_step` reads the DataLoader's iterator itself (`dataloader_iter`): a trial has no batch for it"
    if not module.automatic_optimization:
        return (
            "the module optimizes manually (`automatic_optimization=False`): its `training_step` steps the optimizers"
        )
    strategy = type(trainer.strategy).__name__
    if any(name in strategy for name in SHARDED):
        return f"`{strategy}` shards the parameters: a copy of the module would gather or duplicate them"
    if getattr(module, "_compiler_ctx", None) or any(type(m).__name__ == "OptimizedModule" for m in module.modules()):
        return "the module is compiled (`torch.compile`): a copy would compile again"
    if loader is None:
        return "the training has no DataLoader to read a batch from"
    if (why := untriable_loader(loader)) is not None:
        return why
    return _cuda_room(module)


def _cuda_room(module: torch.nn.Module) -> str | None:
    """Why the GPU cannot hold a copy of ``module`` with its gradients and a step's activations; ``None`` where it
    can (or the module is not on CUDA). The copy: its parameters, buffers and the tensors its submodules keep as
    attributes (``deepcopy`` copies them too). The activations: what the allocator held above now, at most."""
    kept = [v for m in module.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    tensors = list({id(t): t for t in (*module.parameters(), *module.buffers(), *kept)}.values())
    cuda = [t for t in tensors if t.is_cuda]
    if not cuda:
        return None
    device = cuda[0].device
    state = sum(t.numel() * t.element_size() for t in cuda)
    grads = sum(p.numel() * p.element_size() for p in module.parameters() if p.is_cuda and p.requires_grad)
    activations = max(torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device), 0)
    needed = (state + grads + activations) * CUDA_MEMORY_MARGIN
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if free < needed:
        return (
            f"the GPU has {free / 2**30:.1f} GiB free (the allocator's unused cache included), and a copy of the"
            f" module with its gradients and a step's activations needs {needed / 2**30:.1f} GiB"
        )
    return None


def trial_batch(trainer: Any, loader: Any) -> Any:
    """One batch of ``loader``'s dataset at fixed indices, on the training's device (Notes 1)."""
    size = int(loader.batch_size or 1)
    length = len(loader.dataset)
    made = trial_loader(loader, [i % length for i in range(size)], {"num_workers": 0})
    batch = next(iter(made))
    return trainer.strategy.batch_to_device(batch)


@dataclass
class TrialStep:
    """A copy of the run's module and one batch of its data: one training step, timed (Notes 3).

    Attributes:
        module: The copy of the LightningModule.
        batch: The batch, on the device.
        context: The run's own precision context for the step (``precision_plugin.train_step_context``).
        load: Reads the batch again (Notes 1), at each step's start; ``None``: the step reuses :attr:`batch`.
    """

    module: Any
    batch: Any
    context: Callable[[], ContextManager[Any]]
    load: Callable[[], Any] | None = None

    @property
    def cuda(self) -> bool:
        return any(p.is_cuda for p in self.module.parameters())

    def run(self, context: Callable[[], ContextManager[Any]] | None = None) -> None:
        """One forward and backward (Notes 3), under ``context`` (the run's own where ``None``); its batch read
        first where the step :attr:`load` s."""
        if self.load is not None:
            self.batch = self.load()
        self.module.zero_grad(set_to_none=True)
        step = self.module.training_step
        with (context or self.context)():
            # As Lightning calls it: with the batch's index where the method takes one.
            output = (
                step(self.batch, 0) if is_param_in_hook_signature(step, "batch_idx", min_args=2) else step(self.batch)
            )
        loss = output.get("loss") if isinstance(output, Mapping) else output
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise NoLoss(type(output).__name__ if not isinstance(output, Mapping) else "a dict without a loss")
        loss.backward()
        if self.cuda:
            torch.cuda.synchronize()

    def times(
        self,
        steps: int,
        clock: Callable[[], float],
        context: Callable[[], ContextManager[Any]] | None = None,
        warmup: int = TRIAL_WARMUP,
    ) -> list[float]:
        """``warmup`` untimed steps, then each of ``steps`` steps' wall time (seconds)."""
        times = []
        for i in range(warmup + steps):
            start = clock()
            self.run(context)
            if i >= warmup:
                times.append(clock() - start)
        return times

    def median(
        self, steps: int, clock: Callable[[], float], context: Callable[[], ContextManager[Any]] | None = None
    ) -> float:
        """The median of :meth:`times`."""
        return statistics.median(self.times(steps, clock, context))


class NoLoss(Exception):
    """The copy's ``training_step`` returned no loss to call ``backward`` on."""


def prepared_step(trainer: Any, loader: Any, *, loads: bool = False) -> TrialStep | str:
    """The module's copy and a batch, stepped once (untimed); or why it cannot be tried (Notes 5). With ``loads``,
    each step reads its batch again (Notes 3). Call it under
    :func:`~lightning_perf.collect.loader_trial.kept_random_state` with warnings silenced."""
    why = untriable(trainer, loader)
    if why is not None:
        return why
    try:
        made = module_copy(trainer.lightning_module)
    except Exception as err:  # a module copy.deepcopy cannot copy: said, not raised
        reason = str(err).splitlines()[0] if str(err) else ""
        return f"`copy.deepcopy` cannot copy the module ({type(err).__name__}: {reason})"
    step = TrialStep(
        module=made,
        batch=trial_batch(trainer, loader),
        context=_run_context(trainer),
        load=(lambda: trial_batch(trainer, loader)) if loads else None,
    )
    try:
        step.run()
    except NoLoss as err:
        return f"`training_step` returned no loss to step ({err})"
    except RuntimeError as err:
        if NEEDS_TRAINER not in str(err):
            raise
        return "`training_step` needs the trainer (`self.trainer`), which a copy of the module has not"
    return step


def module_copy(module: Any) -> Any:
    """``copy.deepcopy`` of ``module``, without its trainer (Notes 2). A tensor attribute of a submodule that is an
    autograd graph's output (a torchmetrics loss's ``_forward_cache``), which ``deepcopy`` refuses, is copied
    detached."""
    memo: dict[int, Any] = {}
    for submodule in module.modules():
        for value in vars(submodule).values():
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach()
    made = copy.deepcopy(module, memo)
    made.trainer = None  # Lightning's __getstate__ leaves it out already: said here, not assumed
    return made


def _run_context(trainer: Any) -> Callable[[], ContextManager[Any]]:
    """The run's precision context for a training step (``32-true``: none)."""
    plugin = getattr(trainer, "precision_plugin", None)
    return plugin.train_step_context if plugin is not None else contextlib.nullcontext
