"""
Configuration
=============

Plain, frozen records for every option of :class:`~lightning_perf.PerfCallback`, and the checks that
turn a bad value into one error message naming each parameter, the value given and what is allowed.

Nothing here imports torch or lightning: a config can be built and checked anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.validation import (
    BOOLEAN,
    CALLABLE,
    INDICES,
    PATH,
    Kind,
    bad_value,
    choice,
    declared,
    field_problems,
    integer,
    is_int,
    number,
    one_of,
    problems_message,
)

Stage = Literal["train", "validate", "test", "predict"]
STAGES: tuple[Stage, ...] = ("train", "validate", "test", "predict")

SortKey = Literal[
    "self_cpu_time",
    "cpu_time",
    "self_device_time",
    "device_time",
    "calls",
    "self_cpu_memory",
    "self_device_memory",
]
SORT_KEYS: tuple[str, ...] = SortKey.__args__  # type: ignore[attr-defined]

# Default cap on trace windows per stage per run. A window of a mid-sized model's batch is a MB or so of
# gzipped trace on CPU and several MB on GPU; 5 per stage keeps a long run's traces in the tens of MB, while
# still covering the first epochs, where most set-up problems show.
DEFAULT_MAX_WINDOWS = 5

# Default cap on one window's trace, in MB of uncompressed JSON (about a tenth of that gzipped). A 3-batch
# window of a large model on a busy GPU is tens of MB; 256 leaves room for such windows and stacks while
# keeping every trace openable in TensorBoard's trace viewer and Perfetto (both load the whole file).
DEFAULT_MAX_TRACE_MB = 256.0


# Default profiling budget: the share of a run's wall time its profiler windows and FLOP count may cost
# (lightning_perf.budget). Our judgment, for a callback cheap enough to leave on: issue 26's target is 1.03x of a
# bare fit over a long run, and the epochs' own bookkeeping takes some of that.
DEFAULT_PROFILE_BUDGET = 0.02


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """When to open profiler windows, in batches of one stage, counted from 0 at every epoch start.

    The fields mean what they mean in :func:`torch.profiler.schedule`: the first ``skip_first`` batches are
    ignored, then cycles of ``wait`` idle batches, ``warmup`` batches with the profiler started but not
    recording, and ``active`` recorded batches repeat ``repeat`` times (``0``: as many full cycles as the
    epoch allows). Each cycle's ``active`` batches are one window, saved as one trace.

    Args:
        skip_first: Batches to ignore at the start of every epoch (lets data loader workers, caches and
            cudnn autotuning settle).
        wait: Idle batches at the start of each cycle.
        warmup: Batches the profiler runs without recording before each window; torch recommends at least
            one, because the first profiled batch carries the profiler's own start-up cost.
        active: Batches recorded in each window. One by default: a window's cost grows with the operator
            events it records (torch's stop and export take about 3-6 us an event, on the training thread),
            the always-on timings of every batch show how steps vary, and a budget spreads one-batch windows
            over the run where a window of several would sample a few neighbouring batches (torchtitan's
            profiler records one step a window likewise).
        repeat: Cycles per epoch; ``0`` means as many as fit in the epoch.

    Raises:
        ValueError: If a field is not an integer, is negative, or ``active`` is below 1.

    Example::

        Schedule(skip_first=10, wait=5, warmup=1, active=2, repeat=2)
    """

    skip_first: int = declared(integer(0), 5)
    wait: int = declared(integer(0), 0)
    warmup: int = declared(integer(0), 1)
    active: int = declared(integer(1), 1)
    repeat: int = declared(integer(0), 1)

    def __post_init__(self) -> None:
        problems = schedule_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            raise ValueError(problems_message("PerfCallback's Schedule", problems))

    @property
    def cycle(self) -> int:
        """Batches in one wait + warmup + active cycle."""
        return self.wait + self.warmup + self.active


def schedule_warning(schedule: Schedule) -> str | None:
    """The warning a legal but risky schedule gets (``torch.profiler.schedule`` warns likewise); ``None``."""
    if schedule.warmup == 0:
        return (
            "PerfCallback: schedule.warmup=0: the first recorded batch of each window will carry the"
            " profiler's own start-up cost. torch.profiler recommends warmup >= 1."
        )
    return None


def schedule_problems(values: Mapping[str, Any]) -> list[str]:
    """The problems with a schedule's field values, one line each; empty if they are valid."""
    return field_problems(Schedule, values, prefix="schedule.")


_SCHEDULE = Kind(
    "a Schedule, a mapping of its fields, or None",
    lambda value: value is None or isinstance(value, (Schedule, Mapping)),
)


DEFAULT_SCHEDULE = Schedule()
"""``PerfCallback``'s default ``schedule``, one shared frozen instance: a schedule the user passed is never this
object, so the callback can tell a plan the user chose from its default."""


def _to_schedule(value: Schedule | Mapping[str, Any] | None) -> tuple[Schedule, list[str]]:
    """A :class:`Schedule` from itself, a plain mapping (YAML) of its fields, or ``None`` (the default); and
    the problems with ``value``, one line each (the default schedule stands in while there are any)."""
    if (problem := _SCHEDULE.problem("schedule", value)) is not None:
        return Schedule(), [problem]
    if value is None:
        return Schedule(), []
    if isinstance(value, Schedule):
        return value, []
    known = {f.name for f in fields(Schedule)}
    unknown = sorted(set(value) - known)
    if unknown:
        return Schedule(), [f"schedule has unknown keys {unknown}: allowed keys are {sorted(known)}"]
    problems = schedule_problems(value)
    return (Schedule(), problems) if problems else (Schedule(**value), [])


# The kinds of PerfCallback's arguments that build converts (a list of batches to a sorted tuple...).
_BATCHES = INDICES.said("a non-empty list of batch indices (integers >= 0), or None")


def _are_stages(value: Any) -> bool:
    """A stage, or a non-empty list of stages."""
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return bool(items) and all(isinstance(s, str) and s in STAGES for s in items)


_STAGES = Kind(f"a stage or a non-empty list of stages, each one of {list(STAGES)}", _are_stages)
_RANKS = INDICES.said("a list of global ranks >= 0, or None (all ranks)")
_THRESHOLDS = Kind("a mapping of threshold names to numbers", lambda value: isinstance(value, Mapping))
# The kinds of the others, declared on PerfConfig's fields.
_FLAG = BOOLEAN.said("True or False")
_SORT_BY = choice(SORT_KEYS).or_none().said(f"None (automatic) or one of {list(SORT_KEYS)}")
_BATCH_SIZE_FN = CALLABLE.said("a callable (batch -> int)").or_none()
_VERBOSE = Kind("0 (silent), 1 (warnings and critical) or 2 (everything)", lambda v: is_int(v) and 0 <= v <= 2)
_MAX_TRACE_MB = number(above=0).said("a number of MB > 0")
_STRICT = Kind("True, False or None (from the environment)", lambda v: v is None or isinstance(v, bool))
_PEAK_FLOPS = number(above=0).said("a number of FLOP/s > 0").or_none("None (from the device's datasheet)")
_PROFILE_BUDGET = one_of(
    number(above=0, at_most=1).said("a share of the run's time (> 0 and <= 1)"),
    choice(["auto"], "'auto'"),
).or_none("None (no budget)")


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    """Every option of :class:`~lightning_perf.PerfCallback`, checked. See that class for their meaning.

    The fields given as they are (not converted by :meth:`build`) declare the kind of value they take."""

    schedule: Schedule
    batches: tuple[int, ...] | None
    stages: tuple[Stage, ...]
    max_windows: int = declared(integer(0))
    dirpath: str | None = declared(PATH.or_none())
    record_shapes: bool = declared(_FLAG)
    profile_memory: bool = declared(_FLAG)
    with_stack: bool = declared(_FLAG)
    with_flops: bool = declared(_FLAG)
    row_limit: int = declared(integer(1))
    sort_by: SortKey | None = declared(_SORT_BY)
    tensorboard_compat: bool = declared(_FLAG)
    log_loss: bool = declared(_FLAG, True)
    batch_size_fn: Callable[[Any], int] | None = declared(_BATCH_SIZE_FN, None)
    thresholds: Thresholds = field(default_factory=Thresholds)
    verbose: int = declared(_VERBOSE, 1)
    ranks: tuple[int, ...] | None = None
    max_trace_mb: float = declared(_MAX_TRACE_MB, DEFAULT_MAX_TRACE_MB)
    strict: bool | None = declared(_STRICT, None)
    peak_flops: float | None = declared(_PEAK_FLOPS, None)
    profile_budget: float | None = None  # resolved by build: "auto" is a number or None
    memory_history: bool = declared(_FLAG, False)
    try_advice: bool = declared(_FLAG, True)
    live: bool = declared(_FLAG, True)
    #: The user chose the plan (a ``schedule`` or ``batches`` of their own), not the default schedule.
    chosen_plan: bool = False

    @classmethod
    def build(cls, **kwargs: Any) -> PerfConfig:
        """Checks every argument and reports all problems at once.

        Raises:
            ValueError: Naming each bad parameter, the value given and what is allowed.
        """
        schedule, problems = _to_schedule(kwargs["schedule"])
        batches = _indices("batches", kwargs["batches"], _BATCHES, problems, non_empty=True)

        stages = kwargs["stages"]
        if (problem := _STAGES.problem("stages", _listed(stages))) is not None:
            problems.append(problem)
            stages = ()
        else:
            stages = (stages,) if isinstance(stages, str) else tuple(stages)
            stages = tuple(s for s in STAGES if s in stages)

        problems += field_problems(cls, kwargs)

        thresholds = Thresholds()
        overrides = kwargs.get("thresholds")
        if overrides is not None:
            if (problem := _THRESHOLDS.problem("thresholds", overrides)) is not None:
                problems.append(problem)
            else:
                try:
                    thresholds = Thresholds.with_overrides(overrides)
                except ValueError as err:
                    problems.append(f"thresholds: {err}")

        ranks = _indices("ranks", kwargs.get("ranks"), _RANKS, problems)
        chosen = batches is not None or kwargs["schedule"] not in (None, DEFAULT_SCHEDULE)
        budget = kwargs.get("profile_budget", "auto")
        if budget == "auto" and chosen:  # a plan of the user's keeps its meaning: every window planned opens
            budget = None
        if (problem := _PROFILE_BUDGET.problem("profile_budget", budget)) is not None:
            problems.append(problem)

        if problems:
            raise ValueError(problems_message("PerfCallback", problems))
        dirpath = kwargs["dirpath"]
        return cls(
            schedule=schedule,
            batches=batches,
            stages=stages,
            max_windows=kwargs["max_windows"],
            dirpath=None if dirpath is None else str(dirpath),
            record_shapes=kwargs["record_shapes"],
            profile_memory=kwargs["profile_memory"],
            with_stack=kwargs["with_stack"],
            with_flops=kwargs["with_flops"],
            row_limit=kwargs["row_limit"],
            sort_by=kwargs["sort_by"],
            tensorboard_compat=kwargs["tensorboard_compat"],
            log_loss=kwargs.get("log_loss", True),
            batch_size_fn=kwargs.get("batch_size_fn"),
            thresholds=thresholds,
            verbose=kwargs.get("verbose", 1),
            ranks=ranks,
            max_trace_mb=float(kwargs.get("max_trace_mb", DEFAULT_MAX_TRACE_MB)),
            strict=kwargs.get("strict"),
            peak_flops=None if kwargs.get("peak_flops") is None else float(kwargs["peak_flops"]),
            profile_budget=None if budget is None else DEFAULT_PROFILE_BUDGET if budget == "auto" else float(budget),
            chosen_plan=chosen,
            memory_history=kwargs.get("memory_history", False),
            try_advice=kwargs.get("try_advice", True),
            live=kwargs.get("live", True),
        )


def _listed(value: Any) -> Any:
    """An iterable other than a string as a list (a tuple or generator shown as the items it holds)."""
    return list(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else value


def _indices(
    name: str, value: Any, kind: Kind, problems: list[str], *, non_empty: bool = False
) -> tuple[int, ...] | None:
    """``value``, a list of integers >= 0 or None, sorted and without repeats; None, with a problem added that
    names it, where it is not of ``kind`` (or, where ``non_empty``, is empty)."""
    if value is None:
        return None
    value = _listed(value)
    problem = kind.problem(name, value)
    if problem is None and non_empty and not value:
        problem = bad_value(name, value, kind.allowed)
    if problem is not None:
        problems.append(problem)
        return None
    return tuple(sorted(set(value)))
