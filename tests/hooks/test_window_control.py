"""The window semantics of "Windows, exactly" (docs/schedule.md) and the schedule's, on WindowControl with a fake
window: no Trainer, no profiler. The calls come in the order PerfCallback makes them from Lightning's hooks
(a Driver plays the hooks); the real-Trainer tests of the same semantics are in callback/test_windows.py and
callback/test_lifecycle.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from lightning_perf.budget import ProfilingBudget
from lightning_perf.collect.window import WindowState
from lightning_perf.config import STAGES, Schedule
from lightning_perf.hooks.window_control import WindowControl, WindowToSave
from lightning_perf.schedule import BatchListPlan, CyclePlan
from purity import heavy_modules_loaded_by


class FakeWindow:
    """ProfilerWindow's interface and state checks, with no profiler: what it was asked to do, in order."""

    def __init__(self, stage: str, epoch: int) -> None:
        self.stage, self.epoch = stage, epoch
        self.state = WindowState.CREATED
        self.ran: set[int] = set()
        self.calls: list[str] = []
        self._span: int | None = None

    @property
    def recorded(self) -> list[int]:
        return sorted(self.ran)

    def _to(self, call: str, allowed: tuple[WindowState, ...], state: WindowState | None = None) -> None:
        assert self.state in allowed, f"{call} while {self.state.value}"
        self.calls.append(call)
        if state is not None:
            self.state = state

    def warm_up(self) -> None:
        self._to("warm_up", (WindowState.CREATED,), WindowState.WARMING_UP)

    def start(self) -> None:
        self._to("start", (WindowState.CREATED, WindowState.WARMING_UP), WindowState.RECORDING)

    def begin_step(self, batch: int) -> None:
        self._to(f"begin_step({batch})", (WindowState.RECORDING,))
        self._span = batch

    def mark_ran(self, batch: int) -> None:
        if self._span == batch:
            self.ran.add(batch)

    def end_step(self) -> None:
        self._to("end_step", (WindowState.RECORDING,))
        self._span = None

    def pause(self) -> None:
        self._to("pause", (WindowState.RECORDING,), WindowState.PAUSED)

    def resume(self) -> None:
        self._to("resume", (WindowState.PAUSED,), WindowState.RECORDING)

    def stop(self) -> None:
        self._to("stop", (WindowState.WARMING_UP, WindowState.RECORDING, WindowState.PAUSED), WindowState.STOPPED)
        self._span = None

    def export(self) -> str:
        self._to("export", (WindowState.STOPPED,))
        return f"{self.stage}-{self.epoch}.json"


@dataclass(frozen=True)
class Saved:
    """A window as the pipeline would save it."""

    stage: str
    epoch: int
    first: int
    last: int
    shortened: bool = False
    step: int = 0


def _once(said: dict[str, str], key: str, message) -> None:
    """As ErrorPolicy says a message: once per key, built (where it is a callable) only then."""
    if key not in said:
        said[key] = message if isinstance(message, str) else message()


@dataclass
class Driver:
    """Plays Lightning's hooks as PerfCallback does, and the per-window pipeline: the windows made, those saved,
    what was said once (warnings and notes by key)."""

    schedule: dict = field(default_factory=dict)
    batches: list[int] | None = None
    max_windows: int = 5
    busy: bool = False  # the factory finds another profiler running
    made: list[FakeWindow] = field(default_factory=list)
    saved: list[Saved] = field(default_factory=list)
    warned: dict[str, str] = field(default_factory=dict)
    noted: dict[str, str] = field(default_factory=dict)
    step: int = 0  # what the stage's step axis says when a window starts recording
    budget: ProfilingBudget | None = None
    now: float = 0.0  # the budget's clock ...
    clock: Callable[[], float] | None = None  # ... unless this is given
    chosen: bool = True  # the user chose the plan (False: PerfCallback's default)

    def __post_init__(self) -> None:
        schedule = Schedule(**self.schedule)
        plan = CyclePlan(schedule) if self.batches is None else BatchListPlan(self.batches, schedule.warmup)
        self.control = WindowControl(
            plan,
            max_windows=self.max_windows,
            stages=STAGES,
            new_window=self._new_window,
            started=lambda stage, context: context.step,
            warn=lambda key, message: _once(self.warned, key, message),
            info=lambda key, message: _once(self.noted, key, message),
            budget=self.budget,
            clock=self.clock or (lambda: self.now),
            chosen=self.chosen,
            warmup=schedule.warmup,
        )

    def _new_window(self, stage: str, epoch: int) -> FakeWindow | None:
        if self.busy:
            return None
        self.made.append(FakeWindow(stage, epoch))
        return self.made[-1]

    def _save(self, to_save: WindowToSave | None) -> None:
        if to_save is None:
            return
        window, open_ = to_save.open.window, to_save.open
        if window.state is not WindowState.STOPPED:
            window.stop()
        window.export()
        self.saved.append(
            Saved(open_.stage, open_.epoch, to_save.recorded[0], to_save.recorded[-1], to_save.shortened, open_.step)
        )

    def epoch(
        self,
        stage: str,
        batches: int,
        *,
        num_batches: float | None = None,
        epoch: int | None = None,
        first_batch: int = 0,
        validate_after: dict[int, int] | None = None,
    ) -> None:
        """One stage epoch of ``batches`` batches (from ``first_batch``), its length known as ``num_batches``
        (default: ``batches``); ``validate_after``: {train batch: validation batches} run after that batch."""
        control = self.control
        control.epoch_start(
            stage, batches if num_batches is None else num_batches, epoch=epoch, first_batch=first_batch
        )
        self._save(control.before_batch(stage, self))
        for b in range(first_batch, first_batch + batches):
            assert control.stages[stage].batch == b
            if control.open is not None and control.open.stage == stage:
                control.batch_started(stage)
            self.step += stage == "train"
            if control.open is not None:
                self._save(control.end_step(stage))
            self._save(control.next_batch(stage, self))
            if validate_after and b in validate_after:
                self._save(control.validation_start())
                self.epoch("validate", validate_after[b])
                self._save(control.validation_end(self))
        self._save(control.close(stage, shortened=True))
        control.epoch_end(stage)

    def windows(self, stage: str | None = None) -> list[tuple[int, int, int]]:
        return [(s.epoch, s.first, s.last) for s in self.saved if stage in (None, s.stage)]


# ------------------------------------------------------------------ the schedule


def test_a_window_warms_up_then_records_its_batches_one_span_each():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 3})
    run.epoch("train", 8)
    assert run.windows() == [(0, 2, 4)]
    [window] = run.made
    assert window.calls == [
        "warm_up",  # batch 1
        "start",
        "begin_step(2)",
        "end_step",
        "begin_step(3)",
        "end_step",
        "begin_step(4)",
        "end_step",  # batch 4 is the cycle's last active batch: saved right after it
        "stop",
        "export",
    ]
    assert window.recorded == [2, 3, 4] and not run.saved[0].shortened


def test_batches_are_counted_from_zero_at_every_epoch():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 2})
    for epoch in range(3):
        run.epoch("train", 6, epoch=epoch)
    assert run.windows() == [(0, 2, 3), (1, 2, 3), (2, 2, 3)]


@pytest.mark.parametrize(
    ("schedule", "batches", "expected"),
    [
        # wait/warmup/active cycles after skip_first, `repeat` of them per epoch
        ({"skip_first": 0, "wait": 1, "warmup": 1, "active": 2, "repeat": 2}, 12, [(2, 3), (6, 7)]),
        ({"skip_first": 3, "wait": 0, "warmup": 1, "active": 1, "repeat": 3}, 12, [(4, 4), (6, 6), (8, 8)]),
        # repeat=0: as many full cycles as the epoch allows; one at 8 would not fit in 10 batches
        ({"skip_first": 0, "wait": 1, "warmup": 1, "active": 2, "repeat": 0}, 10, [(2, 3), (6, 7)]),
        # no warm-up: the window starts recording at once
        ({"skip_first": 2, "warmup": 0, "active": 2}, 6, [(2, 3)]),
    ],
)
def test_schedules_record_what_torch_profiler_schedule_would(schedule, batches, expected):
    run = Driver(schedule=schedule, max_windows=10)
    run.epoch("train", batches)
    assert [(first, last) for _, first, last in run.windows()] == expected
    assert not any(s.shortened for s in run.saved)


def test_explicit_batches_replace_the_schedule_each_run_one_window_after_its_warm_up():
    run = Driver(schedule={"warmup": 1}, batches=[2, 3, 6])
    run.epoch("train", 10)
    assert run.windows() == [(0, 2, 3), (0, 6, 6)]
    assert [w.calls[:3] for w in run.made] == [
        ["warm_up", "start", "begin_step(2)"],
        ["warm_up", "start", "begin_step(6)"],
    ]


# ------------------------------------------------------------------ max_windows, stages, ranks


def test_max_windows_caps_each_stage_over_the_run_with_one_note_when_the_last_opens():
    run = Driver(schedule={"skip_first": 0, "warmup": 1, "active": 1, "repeat": 0}, max_windows=3)
    for epoch in range(2):
        run.epoch("train", 4, epoch=epoch)
        run.epoch("validate", 4)
    assert run.windows("train") == [(0, 1, 1), (0, 3, 3), (1, 1, 1)]
    assert run.windows("validate") == [(0, 1, 1), (0, 3, 3), (1, 1, 1)]
    assert set(run.noted) == {"max:train", "max:validate"}
    assert "this train window is the last of max_windows=3" in run.noted["max:train"]


class CountingPlan:
    """A plan that counts the looks at it (``action`` and ``next_action``), as another plan answers."""

    def __init__(self, plan):
        self.plan, self.asked = plan, 0

    def action(self, batch, num_batches=math.inf):
        self.asked += 1
        return self.plan.action(batch, num_batches)

    def next_action(self, batch, num_batches=math.inf):
        self.asked += 1
        return self.plan.next_action(batch, num_batches)

    def first_active(self):
        return self.plan.first_active()


def test_max_windows_zero_opens_nothing_and_asks_the_plan_nothing():
    run = Driver(max_windows=0)
    run.control.plan = plan = CountingPlan(run.control.plan)
    run.epoch("train", 20)
    assert run.made == [] and plan.asked == 0  # between windows, with none left: no planning per batch
    assert "short:train" not in run.warned


def test_each_stage_has_its_own_counters():
    run = Driver(schedule={"skip_first": 0, "warmup": 1, "active": 1}, max_windows=1)
    run.epoch("test", 3)
    run.epoch("predict", 3)
    run.epoch("test", 3)
    assert [(s.stage, s.epoch) for s in run.saved] == [("test", 0), ("predict", 0)]
    assert run.control.stages["test"].epoch == 1 and run.control.stages["predict"].epoch == 0


def test_a_rank_that_does_not_record_opens_no_window_and_is_not_warned():
    for schedule in ({"skip_first": 20}, {"skip_first": 1}):
        run = Driver(schedule=schedule)
        run.control.records = False
        run.epoch("train", 8)
        assert run.made == [] and run.warned == {}


def test_a_busy_profiler_skips_the_window_without_counting_it():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 1}, busy=True)
    run.epoch("train", 4)
    assert run.saved == [] and run.control.stages["train"].windows_used == 0
    run.busy = False
    run.epoch("train", 4)
    assert run.windows() == [(1, 2, 2)] and run.control.stages["train"].windows_used == 1


# ------------------------------------------------------------------ epoch ends


def test_a_window_open_when_its_epoch_ends_is_saved_there_shortened_with_one_warning():
    run = Driver(schedule={"skip_first": 2, "warmup": 1, "active": 10})
    run.epoch("train", 8, epoch=0)
    run.epoch("train", 8, epoch=1)
    assert run.windows() == [(0, 3, 7), (1, 3, 7)]
    assert all(s.shortened for s in run.saved)
    assert (
        "cut short by the end of its epoch or of the run: of its planned batches 3-12, it recorded batches 3-7;"
        in run.warned["shortened:train"]
    )


def _stop_inside(run: Driver, batch: int, *, num_batches: int = 16) -> None:
    """Plays a train epoch up to ``batch``, which starts and never ends: the run stops inside it (an exception,
    Ctrl-C), and the callback's ``on_exception`` closes the open window."""
    control = run.control
    control.epoch_start("train", num_batches, epoch=0)
    run._save(control.before_batch("train", run))
    for b in range(batch + 1):
        if control.open is not None:
            control.batch_started("train")
        if b == batch:
            break
        if control.open is not None:
            run._save(control.end_step("train"))
        run._save(control.next_batch("train", run))
    run._save(control.close(shortened=True))


@pytest.mark.parametrize(
    ("stop_in", "said"),
    [
        (4, "of its planned batches 2-4, it recorded batches 2-3 and batch 4 up to where the run stopped in it;"),
        (3, "of its planned batches 2-4, it recorded batch 2 and batch 3 up to where the run stopped in it;"),
        (2, "of its planned batches 2-4, it recorded batch 2 up to where the run stopped in it;"),
    ],
)
def test_a_run_stopped_inside_a_window_says_what_it_planned_and_which_batch_it_stopped_in(stop_in, said):
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 3})
    _stop_inside(run, stop_in)
    assert run.windows() == [(0, 2, stop_in)] and run.saved[0].shortened
    assert said in run.warned["shortened:train"]


def test_a_window_cut_by_its_epochs_end_is_saved_before_the_validation_run_at_that_end():
    # Lightning runs the epoch-end validation before on_train_epoch_end: the window must be closed already.
    run = Driver(schedule={"skip_first": 2, "warmup": 1, "active": 10})
    run.epoch("train", 8, validate_after={7: 4})
    assert run.windows("train") == [(0, 3, 7)] and run.windows("validate") == [(0, 3, 3)]
    assert "overlap:validate" not in run.noted


def test_an_epoch_of_unknown_length_saves_its_open_window_at_its_end():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 4})
    run.epoch("train", 4, num_batches=math.inf)
    assert run.windows() == [(0, 2, 3)] and run.saved[0].shortened


def test_a_stage_too_short_for_the_schedule_gets_no_window_and_one_warning():
    run = Driver(schedule={"skip_first": 20})
    for epoch in range(3):
        run.epoch("train", 8, epoch=epoch)
    assert run.made == []
    assert list(run.warned) == ["short:train"]
    message = run.warned["short:train"]
    assert "the train epoch had 8 batches, too few for the schedule (its first recorded batch is 21)" in message


@pytest.mark.parametrize("why", ["too short", "no window left", "records none"])
def test_an_epoch_that_may_record_no_window_is_quiet_from_its_start(why):
    # Notes 8: at every epoch of a run of short epochs, no look at the plan for any of its batches, nor for the
    # training batch after a validation run inside it.
    run = Driver(max_windows=0 if why == "no window left" else 5)
    plan = CountingPlan(CyclePlan(Schedule(skip_first=20 if why == "too short" else 1)))
    run.control.plan = plan
    run.control.records = why != "records none"
    assert run.control.epoch_start("train", 8, epoch=0) is False
    run.control.before_batch("train", run)
    for _ in range(4):
        run.control.next_batch("train", run)
    assert run.control.validation_start() is None and run.control.validation_end(run) is None
    for _ in range(4):
        run.control.next_batch("train", run)  # the last one ends the epoch
    assert plan.asked == 0 and run.made == []
    assert run.control.epoch_start("train", 64, epoch=1) is (why == "too short")  # long enough, where that was all
    run.control.before_batch("train", run)
    assert plan.asked == (1 if why == "too short" else 0)


def test_the_default_plan_moves_into_short_epochs_from_the_second_until_a_window_saves():
    run = Driver(chosen=False)  # PerfCallback's default: warm up on batch 5, record batch 6
    run.control.epoch_start("train", 4, epoch=0)
    assert not run.control.may_record("train")  # the FLOP count need not wait for a window here
    run.control.epoch_end("train")
    for epoch in range(1, 5):
        run.epoch("train", 4, epoch=epoch)
    assert run.windows("train") == [(1, 1, 1)]  # the next epoch's batch 1, warmed up on batch 0
    assert run.made[0].calls[:2] == ["warm_up", "start"]
    assert run.warned == {} and "records one of its batches instead" in run.noted["short:train"]


def test_a_single_short_epoch_and_a_users_plan_keep_the_plan():
    single = Driver(chosen=False)
    single.epoch("predict", 2)  # a forecasting library's predict call on a copy of the callback
    assert single.made == []
    chosen = Driver(schedule={"skip_first": 20}, chosen=True)
    for epoch in range(3):
        chosen.epoch("train", 4, epoch=epoch)
    assert chosen.made == []


def test_epochs_of_unknown_length_are_expected_as_long_as_the_last():
    run = Driver(chosen=False)  # an IterableDataset of 3 batches an epoch
    for epoch in range(3):
        run.epoch("train", 3, num_batches=math.inf, epoch=epoch)
    assert run.windows("train") == [(1, 1, 1)]
    shorter = Driver(chosen=False)  # an epoch ends sooner than the last: its warm-up is dropped, uncounted ...
    shorter.epoch("train", 3, num_batches=math.inf, epoch=0)
    shorter.epoch("train", 1, num_batches=math.inf, epoch=1)
    shorter.epoch("train", 3, num_batches=math.inf, epoch=2)
    assert shorter.windows("train") == [(2, 0, 0)]  # ... and the next expects its one batch


def test_one_batch_epochs_get_a_moved_window_without_warm_up():
    run = Driver(chosen=False)
    for epoch in range(3):
        run.epoch("train", 1, epoch=epoch)
    assert run.windows("train") == [(1, 0, 0)] and run.made[0].calls[0] == "start"


def test_an_epoch_too_short_for_its_window_gets_it_shortened_and_no_short_warning():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 5})
    run.epoch("train", 4)
    assert run.windows() == [(0, 2, 3)] and run.saved[0].shortened
    assert "short:train" not in run.warned


def test_a_window_that_recorded_nothing_is_dropped_and_does_not_count():
    # Cycles of 4 in an epoch of unknown length: the third opens at batch 9 (warm-up) and the epoch ends.
    run = Driver(schedule={"skip_first": 0, "wait": 1, "warmup": 1, "active": 2, "repeat": 0}, max_windows=10)
    run.epoch("train", 10, num_batches=math.inf)
    assert run.windows() == [(0, 2, 3), (0, 6, 7)]
    assert len(run.made) == 3 and run.made[2].calls == ["warm_up", "start", "begin_step(10)", "stop"]
    assert run.control.stages["train"].windows_used == 2
    assert run.control.stages["train"].windows_this_epoch == 2


# ------------------------------------------------------------------ validation inside training


def test_a_validation_run_inside_a_recording_training_window_pauses_it():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 5})
    # validation after batch 3: inside the window (2..6); validation's own window is skipped meanwhile
    run.epoch("train", 12, validate_after={3: 4})
    assert run.windows("train") == [(0, 2, 6)]
    assert run.windows("validate") == []
    [train] = run.made
    pause = train.calls.index("pause")
    assert train.calls[pause - 1 : pause + 4] == ["begin_step(4)", "pause", "resume", "end_step", "begin_step(5)"]
    assert train.recorded == [2, 3, 4, 5, 6]
    assert "a validate window was skipped: it fell inside a train window" in run.noted["overlap:validate"]
    assert "short:validate" not in run.warned  # skipped for the overlap, not for a short epoch


def test_a_validation_run_during_a_training_warm_up_drops_it_and_it_is_set_up_again_after():
    run = Driver(schedule={"skip_first": 1, "warmup": 2, "active": 2})
    # warm-up at batches 1 and 2, records 3 and 4; validation after batch 1 (the window warming up)
    run.epoch("train", 8, validate_after={1: 4})
    assert run.windows("validate") == [(0, 3, 3)]  # warm-up 1-2, records 3, cut short by its end (4 batches)
    assert run.windows("train") == [(0, 3, 4)]
    dropped, _, train = run.made
    assert (dropped.stage, dropped.calls) == ("train", ["warm_up", "stop"])
    assert train.calls[:2] == ["warm_up", "start"]  # set up again at batch 2, warming up
    assert run.control.stages["train"].windows_used == 1 and run.control.stages["validate"].windows_used == 1


def test_a_validation_run_right_after_a_window_starts_drops_it_and_records_the_batch_after():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 2})
    # after batch 1 the window starts recording batch 2; validation comes before batch 2 runs
    run.epoch("train", 6, validate_after={1: 2})
    assert run.windows("train") == [(0, 2, 3)]
    first, second = run.made[0], run.made[-1]
    assert first.calls == ["warm_up", "start", "begin_step(2)", "stop"]
    assert second.calls[:2] == ["start", "begin_step(2)"]  # no warm-up left to do: starts at once


def test_validation_outside_a_training_window_gets_its_own():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 1})
    run.epoch("train", 8, validate_after={5: 3})
    assert run.windows("train") == [(0, 2, 2)] and run.windows("validate") == [(0, 2, 2)]


def test_validation_runs_are_numbered_in_order():
    run = Driver(schedule={"skip_first": 0, "warmup": 1, "active": 1}, max_windows=10)
    run.epoch("train", 6, validate_after={1: 2, 3: 2, 5: 2})
    assert run.windows("validate") == [(0, 1, 1), (1, 1, 1), (2, 1, 1)]


# ------------------------------------------------------------------ resuming


def test_resuming_mid_epoch_does_not_repeat_a_finished_window():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 2})
    run.epoch("train", 3, num_batches=8, epoch=0, first_batch=5)  # resumed after batch 4: window 2-3 done
    run.epoch("train", 8, epoch=1)
    assert run.windows() == [(1, 2, 3)]
    assert run.warned == {}  # the resumed epoch was long enough; its window came before the checkpoint


def test_resuming_inside_a_window_records_the_rest_of_it():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 3})
    run.epoch("train", 5, num_batches=8, epoch=0, first_batch=3)
    assert run.windows() == [(0, 3, 4)]
    assert run.made[0].calls[:2] == ["start", "begin_step(3)"]


def test_checkpointed_counters_continue_max_windows():
    run = Driver(schedule={"skip_first": 1, "warmup": 1, "active": 1}, max_windows=3)
    position = run.control.stages["train"]
    position.epoch, position.windows_used = 1, 2  # what a checkpoint after two windows restores
    run.epoch("train", 4, epoch=2)
    run.epoch("train", 4, epoch=3)
    assert run.windows() == [(2, 2, 2)]


# ------------------------------------------------------------------ steps, failures, purity


def test_a_window_keeps_the_step_at_which_it_started_recording():
    run = Driver(schedule={"skip_first": 3, "warmup": 1, "active": 2})
    run.epoch("train", 8)
    assert run.saved[0].step == 4  # started after training batch 3's end (4 batches done)


def test_dropping_a_failed_stages_window_stops_it_and_leaves_other_stages_alone():
    run = Driver(schedule={"skip_first": 0, "warmup": 1, "active": 3})
    control = run.control
    control.epoch_start("train", 8)
    control.before_batch("train", run)
    control.next_batch("train", run)
    control.drop("validate")
    assert control.open is not None
    control.drop("train")
    assert control.open is None and run.made[0].state is WindowState.STOPPED


def test_the_controller_imports_neither_lightning_nor_torch():
    assert heavy_modules_loaded_by("lightning_perf.hooks.window_control") == []


# ------------------------------------------------------------------ the profiling budget


def test_a_stages_first_window_opens_as_planned_and_later_ones_within_the_budget():
    budget = ProfilingBudget(0.05)
    budget.call_started(0.0)
    d = Driver(budget=budget)
    d.now = 1.0
    d.epoch("train", 10)  # the stage's first window: opens whatever it costs
    budget.charge(1.0)  # ... 1 s: 1 + 1 <= 0.05 * (t + 1) from t = 39 s
    d.now = 20.0
    d.epoch("train", 10)
    d.epoch("validate", 10)  # another stage's first window: opens
    assert [(s.stage, s.epoch) for s in d.saved] == [("train", 0), ("validate", 0)]
    assert budget.cost(d.now).skipped == 1 and "profile_budget=5%" in d.noted["budget:train"]
    d.now = 40.0
    d.epoch("train", 10)
    assert [(s.stage, s.epoch) for s in d.saved][-1] == ("train", 2) and budget.cost(d.now).windows == 3


def test_a_window_the_budget_kept_closed_is_skipped_whole():
    budget = ProfilingBudget(0.05)
    budget.call_started(0.0)
    asked = iter([0.0, 0.0])  # the second window opens; the third is asked at its warm-up batch ...
    d = Driver(
        budget=budget,
        schedule={"skip_first": 0, "warmup": 1, "active": 2, "repeat": 2},
        clock=lambda: next(asked, 1_000.0),  # ... and there is room again from its next batch
    )
    d.epoch("train", 6)  # windows at batches 1-2 and 4-5
    budget.charge(10.0)
    d.epoch("train", 6)  # the first kept closed whole; the second opens
    assert [(s.epoch, s.first) for s in d.saved] == [(0, 1), (0, 4), (1, 4)]
    assert budget.cost(1_000.0).skipped == 1
