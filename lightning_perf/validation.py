"""
Validation
==========

One way to check a value a person gave: an argument of :class:`~lightning_perf.PerfCallback`, a threshold,
a field of a file read back. The kinds of values are declared once here, each with its test and the words
a message uses for what it allows, and a bad value gets one message format::

    <name> must be <what is allowed>, got <value> (<its type>)

``<name>`` is the parameter (``row_limit``, ``schedule.active``) or, in a file, ``field`` and the field's
path (``field stages.train.epochs[2].step_time_p50``); ``<value>`` is its repr, cut to
:data:`SHOWN_CHARS` characters, and ``<its type>`` the JSON name of its type (``integer``, ``string``,
``null``...: arguments come from YAML as often as from Python, reports are JSON), else its Python one.

A dataclass declares the kind of each field with :func:`declared`; :func:`field_problems` checks a mapping
of values against them. Callers collect the problems and report them all at once (:func:`problems_message`)
or raise at the first.

Pure: imports nothing from torch, Lightning or the rest of this package.

Example::

    INTEGER.problem("row_limit", "3")  # "row_limit must be an integer, got '3' (string)"
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SHOWN_CHARS = 60
"""A bad value is shown as its repr, cut to this many characters."""
INT_LIMIT = 2**63
"""Integers beyond a 64-bit range are not portable JSON, and overflow float conversions."""

_TYPE_NAMES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int to isinstance
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def cut(text: str, most: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``most`` characters, ending in ``...`` where it was cut."""
    return text if len(text) <= most else text[: most - 3] + "..."


def shown(value: Any) -> str:
    """``value`` for a message: its repr, cut to :data:`SHOWN_CHARS`, and its type: ``'8' (string)``."""
    kind = "null" if value is None else next((name for t, name in _TYPE_NAMES if isinstance(value, t)), None)
    return f"{cut(repr(value))} ({kind or type(value).__name__})"


def bad_value(name: str, value: Any, allowed: str) -> str:
    """The message for a bad value: ``"<name> must be <allowed>, got <value> (<type>)"``."""
    return f"{name} must be {allowed}, got {shown(value)}"


def is_int(value: Any) -> bool:
    """An integer, not a boolean (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An integer or a float, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """A number that is neither infinite nor NaN."""
    return is_number(value) and math.isfinite(value)


@dataclass(frozen=True)
class Kind:
    """A kind of value: its test, and what a message says it allows.

    Attributes:
        allowed: The words after "must be": ``"an integer >= 1"``.
        accepts: The test.
    """

    allowed: str
    accepts: Callable[[Any], bool]

    def problem(self, name: str, value: Any) -> str | None:
        """The message for ``value`` given as ``name``, or ``None`` if this kind accepts it."""
        return None if self.accepts(value) else bad_value(name, value, self.allowed)

    def or_none(self, none: str = "None") -> Kind:
        """This kind, or ``None`` (called ``none`` in messages: ``"null"`` in a JSON file)."""
        accepts = self.accepts
        return Kind(f"{self.allowed} or {none}", lambda value: value is None or accepts(value))

    def said(self, allowed: str) -> Kind:
        """This kind with other words for what it allows (to say what a value means, or its unit)."""
        return dataclasses.replace(self, allowed=allowed)


def one_of(*kinds: Kind) -> Kind:
    """A value of any of ``kinds``: ``"a number or a string"``."""
    return Kind(" or ".join(k.allowed for k in kinds), lambda value: any(k.accepts(value) for k in kinds))


def integer(minimum: int) -> Kind:
    """An integer (a Python ``int``, not ``3.0``) of at least ``minimum``."""
    return Kind(f"an integer >= {minimum}", lambda value: is_int(value) and value >= minimum)


def whole(minimum: int, allowed: str | None = None) -> Kind:
    """A whole number of at least ``minimum``, ``3.0`` included (as a YAML or JSON file may give it)."""
    return Kind(
        allowed or f"an integer >= {minimum}",
        lambda value: is_finite(value) and value >= minimum and float(value).is_integer(),
    )


def number(*, above: float | None = None, at_least: float | None = None, at_most: float | None = None) -> Kind:
    """A finite number within the bounds given (``above``: strictly)."""
    words = [f"> {above}" if above is not None else "", f">= {at_least}" if at_least is not None else ""]
    words.append(f"<= {at_most}" if at_most is not None else "")

    def accepts(value: Any) -> bool:
        return (
            is_finite(value)
            and (above is None or value > above)
            and (at_least is None or value >= at_least)
            and (at_most is None or value <= at_most)
        )

    return Kind(" ".join(["a number", *(w for w in words if w)]), accepts)


def choice(values: Collection[Any], allowed: str | None = None) -> Kind:
    """One of ``values``: ``"one of ['a', 'b']"``."""
    return Kind(allowed or f"one of {list(values)}", lambda value: _is_in(value, values))


def _is_in(value: Any, values: Collection[Any]) -> bool:
    try:
        return value in values
    except TypeError:  # an unhashable value tested against a set
        return False


# --- The kinds -----------------------------------------------------------------------------------------------
# JSON's types, as a file read back holds them.
INTEGER = Kind("an integer", is_int)
NUMBER = Kind("a number", is_number)  # an integer is a number too
BOOLEAN = Kind("a boolean", lambda value: isinstance(value, bool))
STRING = Kind("a string", lambda value: isinstance(value, str))
FINITE = Kind("a finite number", is_finite)
INT64 = Kind("a number between -2**63 and 2**63", lambda value: -INT_LIMIT <= value < INT_LIMIT)
# Settings.
FRACTION = Kind("a fraction between 0 and 1", lambda value: is_finite(value) and 0 <= value <= 1)
RATIO = Kind("a ratio >= 1", lambda value: is_finite(value) and value >= 1)
SECONDS = number(at_least=0).said("a number of seconds >= 0")
NON_NEGATIVE = number(at_least=0)
COUNT = whole(1)
BYTES = whole(0, "a number of bytes, an integer >= 0")
PATH = Kind("a path", lambda value: isinstance(value, str) or hasattr(value, "__fspath__"))
CALLABLE = Kind("a callable", callable)
INDICES = Kind(
    "a list of integers >= 0",
    lambda value: (
        isinstance(value, Iterable) and not isinstance(value, (str, bytes)) and all(is_int(v) and v >= 0 for v in value)
    ),
)


# --- Dataclass fields ----------------------------------------------------------------------------------------

KIND_KEY = "lightning_perf.kind"
"""The key of a field's kind in its ``metadata``."""


def declared(kind: Kind, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field of ``kind`` (and ``default``, if given), for :func:`field_problems`.

    Example::

        @dataclass(frozen=True)
        class Window:
            active: int = declared(integer(1), 3)
    """
    return dataclasses.field(default=default, metadata={KIND_KEY: kind})


def kinds_of(cls: type) -> dict[str, Kind]:
    """The declared kind of each field of the dataclass ``cls`` that has one, by name."""
    return {f.name: f.metadata[KIND_KEY] for f in dataclasses.fields(cls) if KIND_KEY in f.metadata}


def field_problems(
    cls: type, values: Mapping[str, Any], *, prefix: str = "", only: Collection[str] | None = None
) -> list[str]:
    """The problems with ``values`` for the declared fields of ``cls``, in declaration order, one line each.

    Args:
        cls: A dataclass whose fields were made with :func:`declared`.
        values: Values by field name; names absent here (or from ``only``, if given) are not checked.
        prefix: Put before each name in messages (``"schedule."``).
        only: The names to check.
    """
    problems = []
    for name, kind in kinds_of(cls).items():
        if name in values and (only is None or name in only):
            problem = kind.problem(prefix + name, values[name])
            if problem is not None:
                problems.append(problem)
    return problems


def problems_message(owner: str, problems: Sequence[str]) -> str:
    """All of ``owner``'s problems in one message: a line naming it, then one line per problem."""
    return "\n".join([f"{owner} got invalid arguments:", *(f"  - {p}" for p in problems)])


class class_or_instance_method:
    """A method that receives the instance when called on one, and the class's defaults when called on it."""

    def __init__(self, func: Any) -> None:
        self.func = func
        self.__doc__ = func.__doc__

    def __get__(self, instance: Any, owner: type) -> Any:
        def bound(*args: Any, **kwargs: Any) -> Any:
            return self.func(owner() if instance is None else instance, *args, **kwargs)

        bound.__doc__ = self.func.__doc__
        return bound
