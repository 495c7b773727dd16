"""A training batch's compute split by the marks of Lightning's hooks (lightning_perf.collect.phases): pure
arithmetic over hand-made marks, in the orders Lightning calls them, by :func:`split` (the CUDA events' reader)
and by :class:`PhaseMarks` as the marks come (the host's clock), which must agree to the bit."""

from __future__ import annotations

import pytest
import torch

from lightning_perf.collect.phases import (
    AFTER_BACKWARD,
    BACKWARD,
    OPTIMIZER,
    STEP_END,
    ZERO_GRAD,
    PhaseMarks,
    StepEndHooks,
    split,
)


def phases(start: float, marks: list[tuple[str, float]], end: float) -> tuple[float, float, float, float]:
    """The batch's phases by :func:`split`, checked equal to :class:`PhaseMarks`' for the same clock reads."""
    times = iter([*(t for _, t in marks), end])
    recorder = PhaseMarks(clock=lambda: next(times))
    recorder.batch_start(start)
    for name, _ in marks:
        recorder.mark(name)
    recorder.batch_end(next(times))
    assert recorder.phases == [split(start, marks, end)] and recorder.marked == bool(marks)
    return recorder.phases[0]


def test_an_automatic_step_splits_into_its_four_phases() -> None:
    marks = [(ZERO_GRAD, 3.0), (BACKWARD, 3.5), (AFTER_BACKWARD, 5.5), (OPTIMIZER, 5.7), (STEP_END, 7.0)]
    forward, backward, optimizer, other = phases(1.0, marks, 7.5)
    assert (forward, backward, optimizer, other) == pytest.approx((2.0, 2.0, 0.5 + 0.2 + 1.3, 0.5))
    assert forward + backward + optimizer + other == pytest.approx(6.5)


def test_the_mark_before_the_step_adds_nothing_where_the_step_marks_its_end() -> None:
    # Where every optimizer has the post-hook, on_before_optimizer_step makes no mark (Notes 3): the same phases.
    marks = [(ZERO_GRAD, 3.0), (BACKWARD, 3.5), (AFTER_BACKWARD, 5.5), (OPTIMIZER, 5.7), (STEP_END, 7.0)]
    without = [mark for mark in marks if mark[0] != OPTIMIZER]
    assert phases(1.0, without, 7.5) == phases(1.0, marks, 7.5)


def test_the_step_ends_are_marked_where_every_optimizer_is_a_torch_one() -> None:
    seen: list[str] = []
    marks = PhaseMarks()
    marks.mark = lambda name, *_: seen.append(name)  # type: ignore[method-assign]
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    hooks = StepEndHooks()
    hooks.install([sgd], marks)
    assert marks.step_ends
    sgd.step()
    assert seen == [STEP_END]
    hooks.install([sgd, object()], marks)  # one optimizer without the hook: the mark before the step is needed
    assert not marks.step_ends
    hooks.uninstall()
    assert not marks.step_ends
    sgd.step()
    assert seen == [STEP_END]  # taken off


def test_an_accumulating_batch_has_no_optimizer_step() -> None:
    # The accumulation's later batches: no zero_grad, no step; what follows the backward is other.
    assert phases(0.0, [(BACKWARD, 1.0), (AFTER_BACKWARD, 3.0)], 3.5) == pytest.approx((1.0, 2.0, 0.0, 0.5))


def test_without_a_post_hook_the_optimizer_runs_to_the_batch_end() -> None:
    assert phases(0.0, [(BACKWARD, 1.0), (AFTER_BACKWARD, 2.0), (OPTIMIZER, 2.5)], 4.0) == pytest.approx(
        (1.0, 1.0, 2.0, 0.0)
    )


def test_manual_optimization_two_backwards_and_code_between() -> None:
    marks = [
        (BACKWARD, 1.0),
        (AFTER_BACKWARD, 2.0),
        (OPTIMIZER, 2.2),
        (STEP_END, 3.0),
        (BACKWARD, 4.0),  # a second loss's forward ran from 3.0: other
        (AFTER_BACKWARD, 5.0),
        (OPTIMIZER, 5.0),
        (STEP_END, 6.0),
    ]
    assert phases(0.0, marks, 6.5) == pytest.approx((1.0, 2.0, 0.2 + 0.8 + 1.0, 1.0 + 0.5))


def test_a_batch_without_marks_is_all_forward() -> None:
    assert phases(2.0, [], 5.0) == (3.0, 0.0, 0.0, 0.0)


def test_a_subclassed_step_ends_at_its_outer_end() -> None:
    # torch runs the post-hooks at the end of the base class's step and again at the subclass's.
    marks = [(BACKWARD, 1.0), (AFTER_BACKWARD, 2.0), (OPTIMIZER, 2.0), (STEP_END, 2.5), (STEP_END, 4.0)]
    assert phases(0.0, marks, 4.5) == pytest.approx((1.0, 1.0, 2.0, 0.5))


def test_a_mark_between_batches_is_forgotten_at_the_next_start() -> None:
    # An optimizer stepped outside the loop (a library's own step, our optimizer trial's copy) calls the post-hook.
    times = iter([0.5, 11.0, 12.0])
    recorder = PhaseMarks(clock=lambda: next(times))
    recorder.mark(STEP_END)
    recorder.batch_start(10.0)
    recorder.mark(BACKWARD)
    recorder.mark(AFTER_BACKWARD)
    recorder.batch_end(13.0)
    assert recorder.phases == [(1.0, 1.0, 0.0, 1.0)]
