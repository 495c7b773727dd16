"""
Step phases
===========

Every training batch's compute split into forward, backward, optimizer and other (issue 49), always on: from the
clock reads at Lightning's own hooks, a few per batch, and no profiler, no synchronization.

The marks, in the order Lightning 2.x calls them in a training batch (automatic optimization)::

    on_train_batch_start | training_step | on_before_zero_grad | zero_grad | on_before_backward | backward
    | on_after_backward | the closure's bookkeeping | on_before_optimizer_step | gradient clipping, the update
    | the optimizer's step post-hook | Lightning's bookkeeping, the other callbacks | on_train_batch_end

Notes:
    1. **forward**: from the batch's start to its first mark: ``training_step`` (its ``self.log`` calls included)
       and the hooks of the callbacks after ours at the batch's start.
    2. **backward**: from ``on_before_backward`` to ``on_after_backward``, each pair of them (manual optimization
       may call ``manual_backward`` more than once).
    3. **optimizer**: ``zero_grad`` (from ``on_before_zero_grad`` to the next mark), and from ``on_after_backward``
       or ``on_before_optimizer_step`` to the end of the optimizer's ``step`` (:data:`STEP_END`, an
       ``Optimizer.register_step_post_hook`` of ours on the run's torch optimizers): the closure's bookkeeping,
       gradient clipping and the update. An optimizer whose ``step`` calls its base class's (``super().step()``)
       has its post-hooks run at the end of each, where torch wrapped both: the last end counts. Where every
       optimizer of the run has the post-hook, ``on_before_optimizer_step`` makes no mark (its spans are optimizer
       on both sides: one mark a batch less). An optimizer that is no ``torch.optim.Optimizer`` has no post-hook:
       its phase then runs from ``on_before_optimizer_step`` to the batch's end. A step that never runs (a
       ``GradScaler`` skipping it for an overflow) leaves the time after the backward to other.
    4. **other**: the rest of the batch's compute: Lightning's bookkeeping after the step (the learning-rate
       schedulers, the loops' progress) and the callbacks before ours at the batch's end. (What runs after our
       ``on_train_batch_end`` (the progress bar, usually) counts in the next batch's data wait, as before.)
    5. **Gradient accumulation**: a batch that steps no optimizer has no optimizer phase but its ``zero_grad`` at
       the accumulation's first batch; its time after ``on_after_backward`` is other.
    6. **Manual optimization**: ``training_step`` holds everything: the marks Lightning still calls inside it
       (``manual_backward``'s, and the ``on_before_optimizer_step`` of ``optimizer.step()``) split it, forward
       being the code before the first backward. What the user does between (a second forward, ``zero_grad``) is
       other, or forward before the first backward: :data:`~lightning_perf.records.MANUAL_NOTE` says so beside
       the phases (the epoch line, the page).
    7. **On CUDA** the clock reads are the host's: a phase is the time to queue its kernels, and the device's work
       lands wherever the host waits for it (a ``.item()``). So on CUDA the same marks are also CUDA events
       (:mod:`lightning_perf.collect.device_phases`), read once the device has passed them, and the epoch's phases
       are the device's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from lightning_perf.records import PHASES

ZERO_GRAD, BACKWARD, AFTER_BACKWARD, OPTIMIZER, STEP_END = (
    "zero_grad",
    "backward",
    "after_backward",
    "optimizer",
    "step_end",
)
"""The marks: at ``on_before_zero_grad``, ``on_before_backward``, ``on_after_backward``,
``on_before_optimizer_step``, and the optimizer's step post-hook."""

MAX_MARKS = 64
"""The most marks one batch records as CUDA events (:mod:`lightning_perf.collect.device_phases`): an automatic step
makes 4 or 5 (Notes 3), a manual one a few per optimizer."""

# Which phase the time from one mark to the next is (Notes 1-6); any other pair is other. The batch's start (no
# mark yet: ``None``) to its first mark, or to its end, is forward.
_SPANS: dict[tuple[str | None, str | None], str] = {
    (ZERO_GRAD, BACKWARD): "optimizer",
    (ZERO_GRAD, AFTER_BACKWARD): "optimizer",
    (BACKWARD, AFTER_BACKWARD): "backward",
    (AFTER_BACKWARD, OPTIMIZER): "optimizer",
    (AFTER_BACKWARD, STEP_END): "optimizer",
    (OPTIMIZER, STEP_END): "optimizer",
    (STEP_END, STEP_END): "optimizer",  # a subclass's step calling its base's: torch runs the post-hooks after each
    (OPTIMIZER, None): "optimizer",  # no post-hook: to the batch's end (Notes 3)
    **{(None, name): "forward" for name in (ZERO_GRAD, BACKWARD, AFTER_BACKWARD, OPTIMIZER, STEP_END, None)},
}
_OTHER = PHASES.index("other")
_PHASE_AFTER: dict[str | None, dict[str | None, int]] = {
    previous: {name: PHASES.index(phase) for (before, name), phase in _SPANS.items() if before == previous}
    for previous in (None, ZERO_GRAD, BACKWARD, AFTER_BACKWARD, OPTIMIZER, STEP_END)
}
"""``_SPANS`` by the earlier mark, as indices into :data:`PHASES`: a mark reads its span's phase with one lookup
in the table of the mark before it, and no key tuple made."""
_AT_START = _PHASE_AFTER[None]


def split(start: float, marks: Sequence[tuple[str, float]], end: float) -> tuple[float, float, float, float]:
    """A batch's compute from ``start`` to ``end`` split into :data:`PHASES` by its ``marks`` (name, time), in
    time order (module Notes). The four add up to ``end - start``. :class:`PhaseMarks` adds the same spans up as
    its marks come."""
    spent = [0.0, 0.0, 0.0, 0.0]
    previous: str | None = None
    at = start
    for name, t in (*marks, (None, end)):
        spent[_PHASE_AFTER[previous].get(name, _OTHER)] += max(t - at, 0.0)
        previous, at = name, t
    return spent[0], spent[1], spent[2], spent[3]


class PhaseMarks:
    """A stage's marks within the current batch, and each of the epoch's batches' phases (:func:`split`).

    Args:
        clock: Seconds, monotonic: the step clock's own.

    Attributes:
        phases: Per batch of the epoch, its :data:`PHASES` in seconds by the host's clock, in the order of the step
            clock's lists.
        marked: Whether any batch of the epoch had a mark (a training stage; a validation batch has none).
        device: On CUDA, the same marks as CUDA events
            (:class:`~lightning_perf.collect.device_phases.DeviceTimeline`), whose phases :meth:`epoch_phases`
            gives instead of the host's; ``None`` elsewhere.
        step_ends: Every optimizer of the Trainer call marks its step's end (:class:`StepEndHooks`): the hook
            before the step need not mark (Notes 3).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._spent = [0.0, 0.0, 0.0, 0.0]  # the batch's phases so far
        self._after = _AT_START  # the phase of a span by its end mark, after the batch's last mark (_PHASE_AFTER)
        self._at = 0.0  # the last mark's time
        self.phases: list[tuple[float, float, float, float]] = []
        self.marked = False
        self.device: Any = None
        self.step_ends = False

    def mark(self, name: str, *_: object) -> None:
        """A hook of the batch under way (module Notes): the span since the batch's last mark is added to its phase
        here, so that a batch keeps no list of marks and its end has one span left to add (a mark between batches,
        such as an optimizer step outside the loop, is forgotten at the next batch's start). What follows ``name``
        is ignored: the optimizer's post-hook is ``mark`` itself, given ``STEP_END`` first (one call, not two)."""
        now = self._clock()
        self._spent[self._after.get(name, _OTHER)] += now - self._at
        self._after, self._at = _PHASE_AFTER[name], now
        if self.device is not None:
            self.device.mark(name)

    def batch_start(self, now: float) -> None:
        spent = self._spent  # zeroed in place: no list made per batch
        spent[0] = spent[1] = spent[2] = spent[3] = 0.0
        self._after, self._at = _AT_START, now
        if self.device is not None:
            self.device.batch_start(len(self.phases))

    def batch_end(self, now: float) -> None:
        spent, after = self._spent, self._after
        spent[after.get(None, _OTHER)] += now - self._at
        self.phases.append((spent[0], spent[1], spent[2], spent[3]))
        if after is not _AT_START:
            self.marked = True
        if self.device is not None:
            self.device.batch_end()

    def reset(self) -> None:
        """A new epoch's batches."""
        self.phases = []
        self.marked = False
        if self.device is not None:
            self.device.reset()

    def epoch_phases(self) -> list[tuple[float, float, float, float] | None]:
        """Per batch of the epoch, its phases: the device's where a timeline works (``None`` for a batch not read
        yet), else the host's; empty where no batch had a mark."""
        if not self.marked:
            return []
        if self.device is None or self.device.broken is not None:
            return list(self.phases)
        read = self.device.read()
        return [read.get(i) for i in range(len(self.phases))]


class StepEndHooks:
    """The optimizer's step post-hook of Notes 3 on each of the run's torch optimizers, for a Trainer call; taken
    off at its end. A hook is one call per optimizer step, made by torch after the update."""

    def __init__(self) -> None:
        self._handles: list[object] = []
        self._marks: PhaseMarks | None = None  # whose step_ends the hooks set

    def install(self, optimizers: Sequence[object], marks: PhaseMarks) -> None:
        """Marks ``STEP_END`` in ``marks`` at the end of each of the ``optimizers``' steps (a torch optimizer's),
        and sets its :attr:`~PhaseMarks.step_ends` where every one of them has the hook."""
        import torch  # here: the rest of this module is plain Python

        self.uninstall()
        step_end = functools.partial(marks.mark, STEP_END)  # called (optimizer, args, kwargs) after the step
        for optimizer in optimizers:
            if isinstance(optimizer, torch.optim.Optimizer):
                self._handles.append(optimizer.register_step_post_hook(step_end))
        marks.step_ends = bool(optimizers) and len(self._handles) == len(optimizers)
        self._marks = marks

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()  # type: ignore[attr-defined]
        self._handles = []
        if self._marks is not None:
            self._marks.step_ends = False
            self._marks = None

    def __getstate__(self) -> dict[str, object]:
        # A copy (a library pickles or deep-copies the callback during a run) holds none of the run's optimizers'
        # hooks: those are the original's, and the copy installs its own at its fit's start.
        return {**self.__dict__, "_handles": [], "_marks": None}
