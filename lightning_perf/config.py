"""
Configuration
=============

Plain, frozen records for every option of :class:`~lightning_perf.PerfCallback`, and the checks that
turn a bad value into one error message naming each parameter, the value given and what is allowed.

Nothing here imports torch or lightning: a config can be built and checked anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from lightning_perf.diagnose.thresholds import Thresholds

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

# Default cap on trace windows per stage per run. A window of 3 recorded batches of a mid-sized model is
# a few MB of gzipped trace on CPU and tens of MB on GPU; 5 per stage keeps a long run's traces in the
# hundreds of MB at worst, while still covering the first epochs, where most set-up problems show.
DEFAULT_MAX_WINDOWS = 5

# Default cap on one window's trace, in MB of uncompressed JSON (about a tenth of that gzipped). A 3-batch
# window of a large model on a busy GPU is tens of MB; 256 leaves room for longer windows and stacks while
# keeping every trace openable in TensorBoard's trace viewer and Perfetto (both load the whole file).
DEFAULT_MAX_TRACE_MB = 256.0


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
        active: Batches recorded in each window.
        repeat: Cycles per epoch; ``0`` means as many as fit in the epoch.

    Raises:
        ValueError: If a field is not an integer, is negative, or ``active`` is below 1.

    Example::

        Schedule(skip_first=10, wait=5, warmup=1, active=2, repeat=2)
    """

    skip_first: int = 5
    wait: int = 0
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        problems = schedule_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            raise ValueError(_format_problems("PerfCallback's Schedule", problems))

    @property
    def cycle(self) -> int:
        """Batches in one wait + warmup + active cycle."""
        return self.wait + self.warmup + self.active


def schedule_problems(values: Mapping[str, Any]) -> list[str]:
    """The problems with a schedule's field values, one line each; empty if they are valid."""
    problems = []
    for f in fields(Schedule):
        value = values.get(f.name, f.default)
        minimum = 1 if f.name == "active" else 0
        if not _is_int(value) or value < minimum:
            problems.append(f"schedule.{f.name}={value!r}: must be an integer >= {minimum}")
    return problems


def _to_schedule(value: Schedule | Mapping[str, Any] | None) -> tuple[Schedule, list[str]]:
    """A :class:`Schedule` from itself, a plain mapping (YAML) of its fields, or ``None`` (the default); and
    the problems with ``value``, one line each (the default schedule stands in while there are any)."""
    if value is None:
        return Schedule(), []
    if isinstance(value, Schedule):
        return value, []
    if not isinstance(value, Mapping):
        return Schedule(), [f"schedule={value!r}: must be a Schedule, a mapping of its fields, or None"]
    known = {f.name for f in fields(Schedule)}
    unknown = sorted(set(value) - known)
    if unknown:
        return Schedule(), [f"schedule has unknown keys {unknown}: allowed keys are {sorted(known)}"]
    problems = schedule_problems(value)
    return (Schedule(), problems) if problems else (Schedule(**value), [])


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    """Every option of :class:`~lightning_perf.PerfCallback`, checked. See that class for their meaning."""

    schedule: Schedule
    batches: tuple[int, ...] | None
    stages: tuple[Stage, ...]
    max_windows: int
    dirpath: str | None
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    with_flops: bool
    row_limit: int
    sort_by: SortKey | None
    tensorboard_compat: bool
    log_loss: bool = True
    batch_size_fn: Callable[[Any], int] | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    verbose: int = 1
    ranks: tuple[int, ...] | None = None
    max_trace_mb: float = DEFAULT_MAX_TRACE_MB
    strict: bool | None = None

    @classmethod
    def build(cls, **kwargs: Any) -> PerfConfig:
        """Checks every argument and reports all problems at once.

        Raises:
            ValueError: Naming each bad parameter, the value given and what is allowed.
        """
        schedule, problems = _to_schedule(kwargs["schedule"])

        batches = _indices(
            "batches",
            kwargs["batches"],
            problems,
            not_a_list="must be a list of batch indices >= 0, or None",
            bad="must be a non-empty list of integers >= 0",
            non_empty=True,
        )

        stages = kwargs["stages"]
        if isinstance(stages, str):
            stages = (stages,)
        if not isinstance(stages, Iterable) or not stages:
            problems.append(f"stages={stages!r}: must be a non-empty list of {list(STAGES)}")
            stages = ()
        else:
            stages = tuple(stages)
            bad = [s for s in stages if s not in STAGES]
            if bad:
                problems.append(f"stages={list(stages)!r}: {bad} not allowed, each must be one of {list(STAGES)}")
            stages = tuple(s for s in STAGES if s in stages)

        for name, minimum in (("max_windows", 0), ("row_limit", 1)):
            value = kwargs[name]
            if not _is_int(value) or value < minimum:
                problems.append(f"{name}={value!r}: must be an integer >= {minimum}")

        dirpath = kwargs["dirpath"]
        if dirpath is not None and not isinstance(dirpath, (str,)) and not hasattr(dirpath, "__fspath__"):
            problems.append(f"dirpath={dirpath!r}: must be a path or None")

        batch_size_fn = kwargs.get("batch_size_fn")
        if batch_size_fn is not None and not callable(batch_size_fn):
            problems.append(f"batch_size_fn={batch_size_fn!r}: must be a callable (batch -> int) or None")

        for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "tensorboard_compat", "log_loss"):
            if not isinstance(kwargs.get(name, True), bool):
                problems.append(f"{name}={kwargs.get(name)!r}: must be True or False")

        thresholds = Thresholds()
        overrides = kwargs.get("thresholds")
        if overrides is not None:
            if not isinstance(overrides, Mapping):
                problems.append(f"thresholds={overrides!r}: must be a mapping of threshold names to numbers")
            else:
                try:
                    thresholds = Thresholds.with_overrides(overrides)
                except ValueError as err:
                    problems.append(f"thresholds: {err}")

        verbose = kwargs.get("verbose", 1)
        if not _is_int(verbose) or not 0 <= verbose <= 2:
            problems.append(f"verbose={verbose!r}: must be 0 (silent), 1 (warnings and critical) or 2 (everything)")

        allowed = "must be a list of global ranks >= 0, or None (all ranks)"
        ranks = _indices("ranks", kwargs.get("ranks"), problems, not_a_list=allowed, bad=allowed)

        max_trace_mb = kwargs.get("max_trace_mb", DEFAULT_MAX_TRACE_MB)
        if isinstance(max_trace_mb, bool) or not isinstance(max_trace_mb, (int, float)) or not max_trace_mb > 0:
            problems.append(f"max_trace_mb={max_trace_mb!r}: must be a number of MB > 0")

        strict = kwargs.get("strict")
        if strict is not None and not isinstance(strict, bool):
            problems.append(f"strict={strict!r}: must be True, False or None (from the environment)")

        sort_by = kwargs["sort_by"]
        if sort_by is not None and sort_by not in SORT_KEYS:
            problems.append(f"sort_by={sort_by!r}: must be None (automatic) or one of {list(SORT_KEYS)}")

        if problems:
            raise ValueError(_format_problems("PerfCallback", problems))
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
            sort_by=sort_by,
            tensorboard_compat=kwargs["tensorboard_compat"],
            log_loss=kwargs.get("log_loss", True),
            batch_size_fn=batch_size_fn,
            thresholds=thresholds,
            verbose=verbose,
            ranks=ranks,
            max_trace_mb=float(max_trace_mb),
            strict=strict,
        )


def _indices(
    name: str, value: Any, problems: list[str], *, not_a_list: str, bad: str, non_empty: bool = False
) -> tuple[int, ...] | None:
    """``value``, a list of integers >= 0 or None, sorted and without repeats; None, with a problem added that
    names it (``not_a_list``: it is no list; ``bad``: an item is no integer >= 0, or, where ``non_empty``, the
    list is empty)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        problems.append(f"{name}={value!r}: {not_a_list}")
        return None
    values = tuple(value)
    if not all(_is_int(v) and v >= 0 for v in values) or (non_empty and not values):
        problems.append(f"{name}={list(values)!r}: {bad}")
        return None
    return tuple(sorted(set(values)))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_HEADER = "{owner} got invalid arguments:"


def _format_problems(owner: str, problems: Sequence[str]) -> str:
    return "\n".join([_HEADER.format(owner=owner), *(f"  - {p}" for p in problems)])

