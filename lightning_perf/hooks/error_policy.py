"""
Error policy
============

What :class:`~lightning_perf.PerfCallback` does when its own collection or reporting fails: drop what it was
measuring, say so once and let training go on, or, when ``strict``, re-raise. Every part of the callback says
what it has to say through one :class:`ErrorPolicy`, so that each message is shown once per run whoever says
it.

A warning's location is the user's code: the first frame of the stack outside this package, Lightning, torch and
Python's own library (the line that called ``fit`` or built the callback), not the line of ours that warned.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_perf.hooks.window_control import Message

#: The environment variable that turns ``strict`` on where the callback leaves it unset (``1``, ``true``, ``yes``).
STRICT_ENV = "LIGHTNING_PERF_STRICT"


# The packages whose frames a warning's location skips: ours, and those that call our hooks.
_CALLERS = ("lightning_perf", "lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "torch")
# rank_zero_warn's frames above the one that calls it: warnings.warn's caller, rank_zero_warn and its decorator.
_RANK_ZERO_FRAMES = 3


@functools.cache
def _not_users() -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """The folders of :data:`_CALLERS`, Python's library, and the site-packages folders (which may lie in it)."""
    callers: list[str] = []
    for name in _CALLERS:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            callers.extend(os.path.join(os.path.realpath(p), "") for p in spec.submodule_search_locations)
    paths = sysconfig.get_paths()
    site = tuple({os.path.join(os.path.realpath(paths[key]), "") for key in ("purelib", "platlib")})
    return tuple(callers), os.path.join(os.path.realpath(paths["stdlib"]), ""), site


def _users(filename: str) -> bool:
    """Whether a frame of this file is the user's code (or a library's of theirs)."""
    if filename.startswith("<"):  # <frozen ...>, <string>: Python's own
        return False
    callers, stdlib, site = _not_users()
    path = os.path.realpath(filename)
    if path.startswith(callers):
        return False
    return not path.startswith(stdlib) or path.startswith(site)


def user_stacklevel() -> int:
    """The ``stacklevel`` (of a ``warnings.warn`` called by this function's caller) of the first frame of the
    user's code; past the stack's end (Python then says ``sys:1``) where there is none (a thread of ours)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and not _users(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def warn(message: str) -> None:
    """``rank_zero_warn(message)``, located at the user's code (:func:`user_stacklevel`)."""
    rank_zero_warn(message, stacklevel=user_stacklevel() + _RANK_ZERO_FRAMES)


def strict_from_environment() -> bool:
    """Whether :data:`STRICT_ENV` asks for strict mode."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


class ErrorPolicy:
    """Warnings and notes shown once each (on rank zero), and what a failure of our own does.

    Args:
        strict: Re-raise our own failures instead of warning once; ``None``: :func:`strict_from_environment`.

    Attributes:
        drop: ``stage -> None``: drops the stage's open profiler window after a failure (set by the callback).

    Example::

        policy = ErrorPolicy(strict=False)
        policy.warn_once("cut:train", "a train window's trace was cut")  # shown
        policy.warn_once("cut:train", "a train window's trace was cut")  # not again
    """

    def __init__(self, strict: bool | None) -> None:
        self.strict = strict if strict is not None else strict_from_environment()
        self._said: set[str] = set()
        self.drop: Callable[[str], None] | None = None

    def warn_once(self, key: str, message: Message) -> None:
        """``rank_zero_warn(message)``, the first time ``key`` is said (a callable message is built then)."""
        if key not in self._said:
            self._said.add(key)
            warn(message if isinstance(message, str) else message())

    def info_once(self, key: str, message: Message) -> None:
        """``rank_zero_info(message)``, the first time ``key`` is said (a callable message is built then)."""
        if key not in self._said:
            self._said.add(key)
            rank_zero_info(message if isinstance(message, str) else message())

    def safely(self, stage: str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``fn(*args, **kwargs)``, its failure handled by :meth:`fail` (``stage``: what it was measuring)."""
        try:
            fn(*args, **kwargs)
        except Exception as err:
            self.fail(stage, err)

    def fail(self, stage: str | None, err: Exception) -> None:
        """Our own collection or reporting failed: re-raised when :attr:`strict`; else the stage's window is
        dropped (``None``: saving the output failed) and the failure said once per kind of error."""
        if self.strict:
            raise err
        if stage is not None and self.drop is not None:
            self.drop(stage)
        self.warn_once(
            f"error:{type(err).__name__}",
            f"PerfCallback: {f'measuring the {stage} stage' if stage else 'saving its output'} failed"
            f" ({type(err).__name__}: {err}); what it was measuring is lost, training goes on, and later epochs"
            " and windows are still measured.",
        )

    def rule_failed(self, rule_id: str, err: Exception) -> None:
        """A bottleneck rule raised: re-raised when :attr:`strict`, else warned once and the rule skipped."""
        if self.strict:
            raise err
        self.warn_once(
            f"rule:{rule_id}", f"PerfCallback: the {rule_id} rule failed ({type(err).__name__}: {err}); it is skipped."
        )
