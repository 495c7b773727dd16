"""
Compile records
===============

What ``torch.compile`` did in one stage epoch, as plain frozen records (re-exported by
:mod:`lightning_perf.records`, where the other records are).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GraphBreak:
    """A place where ``torch.compile`` split a graph, as found while compiling in one stage epoch.

    Attributes:
        reason: Dynamo's reason, its first line (e.g. ``"Unsupported Tensor.item() call with
            capture_scalar_outputs=False"``).
        location: The user's line that caused it, ``"path/to/file.py:42"``; ``None`` where torch did not say.
        count: The compiles in the epoch that met it: one break splits the frame it is in and each frame that
            called it (Dynamo compiles each), and a recompile meets it again.
    """

    reason: str
    location: str | None
    count: int


@dataclass(frozen=True)
class Recompile:
    """A function ``torch.compile`` compiled again in one stage epoch, and why.

    Attributes:
        function: The compiled function, ``"forward (model.py:30)"``; ``None`` where torch did not say.
        guard: The guard that failed (e.g. ``"L['n'] == 3"``, or a tensor's size mismatch); ``None`` where
            torch did not say.
        count: Recompiles of that function for that guard in the epoch.
    """

    function: str | None
    guard: str | None
    count: int


@dataclass(frozen=True, kw_only=True)
class CompileStats:
    """What ``torch.compile`` did during one stage epoch (deltas over the epoch, read at compile events only).

    Attributes:
        graphs: Graphs Dynamo compiled (a function's first compile, each piece a graph break leaves, each
            recompile).
        breaks: Places in the code where compiling found a graph break (distinct reason and line).
        recompiles: Compiles of a function already compiled, because a guard failed.
        limit_reached: A function hit ``torch._dynamo.config.recompile_limit``: it runs eager from then on.
        seconds: Wall seconds spent compiling (Dynamo, the backend, a backward compiled at its first call).
        seconds_before: Of ``seconds``, those before the epoch's first batch (the sanity check's compiles,
            counted in the first validation epoch).
        break_sites: The breaks by reason and place, most frequent first.
        recompile_guards: The recompiles by function and failed guard, most frequent first.
        limit_function: The function that hit the recompile limit (``"forward (model.py:30)"``), where known.
        steps: The epoch's batches (0-based) during which something compiled: their step times hold it.
    """

    graphs: int
    breaks: int
    recompiles: int
    limit_reached: bool
    seconds: float
    seconds_before: float = 0.0
    break_sites: tuple[GraphBreak, ...] = ()
    recompile_guards: tuple[Recompile, ...] = ()
    limit_function: str | None = None
    steps: tuple[int, ...] = ()
