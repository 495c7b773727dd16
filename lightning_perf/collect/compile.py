"""
torch.compile events
====================

What ``torch.compile`` did while the run went on, however the code was compiled (``torch.compile(model)``
passed to ``fit``, compiled submodules or functions inside the LightningModule, ``model.compile()``): graphs
compiled, graph breaks with their reason and the user's line, recompiles with the guard that failed, the
recompile limit, and the seconds spent compiling, attributed to the stage epoch and batch they happened in.

Nothing runs per batch: a :class:`CompileWatch` is called by torch only when something compiles. Its sources
are private APIs of torch that move between releases, so each is read defensively: one that is missing or
changed gives no numbers (and so no finding), never an error in training.

1. Dynamo's compile callbacks (``torch._dynamo.callback.callback_handler``): the start and end of every
   compile (Dynamo's, and a backward compiled at its first call), with its compile id ``F/N`` (``N > 0``: a
   recompile of frame ``F``). Timed here with ``time.perf_counter``.
2. ``torch._dynamo.utils.counters``: ``stats.unique_graphs`` (graphs compiled) and ``graph_break`` (breaks by
   reason), read at a compile's start and end.
3. Log records: Dynamo's ``graph_breaks`` artifact logger says where each break is (``Graph break in user code
   at FILE:LINE``): while watched it is enabled at ``DEBUG`` with propagation off, so that nothing more is
   printed (left as it is where the user enabled it, e.g. ``TORCH_LOGS=graph_breaks``); the warning Dynamo
   logs when a function hits ``torch._dynamo.config.recompile_limit`` says which function now runs eager.
4. Dynamo's compilation metrics (``torch._dynamo.utils.get_compilation_metrics()``, the latest 64 compiles):
   each recompile's ``recompile_reason`` (the guard that failed), looked up by compile id at the epoch's end.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lightning_perf.collect.dynamo_text import (
    BREAK_AT,
    LIMIT,
    LIMIT_FUNCTION,
    LIMIT_REASON,
    break_reason,
    first_line,
    guard_text,
    in_library,
    shown_path,
    user_line,
)
from lightning_perf.records import CompileStats, GraphBreak, Recompile

# Dynamo's loggers (torch 2.13): where it says where a graph break is, and where it warns about the limit.
GRAPH_BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
RECOMPILE_LIMIT_LOGGER = "torch._dynamo.convert_frame"
# A stage epoch keeps at most this many recompiles' ids and break sites: a bound on what a run that compiles
# without end (a new shape every batch, ``recompile_limit`` raised) holds between two epoch ends.
MAX_KEPT = 256

_COMPILE_ID = re.compile(r"(\d+)/(\d+)")


class CompileSite(NamedTuple):
    """Where the run is when something compiles: the stage, its batch (``None``: between batches), and whether
    the stage's epoch has not started yet (the sanity check's compiles count in the first validation epoch)."""

    stage: str
    batch: int | None
    before_epoch: bool = False


@dataclass
class _Tally:
    """One stage's compile events since its last epoch end."""

    graphs: int = 0
    recompiles: int = 0
    seconds: float = 0.0
    seconds_before: float = 0.0
    sites: Counter[tuple[str, str | None]] = field(default_factory=Counter)
    recompile_ids: list[tuple[str, int]] = field(default_factory=list)  # with the wall clock at its start, in us
    limit_function: str | None = None
    limit_reason: str | None = None
    limit_reached: bool = False
    steps: set[int] = field(default_factory=set)


@dataclass
class _Compiling:
    """The compile under way (torch runs only the outermost one's callbacks)."""

    site: CompileSite | None
    started: float
    graphs: int | None
    breaks: dict[str, int] | None
    sites: list[tuple[str, str | None]] = field(default_factory=list)


class CompileWatch:
    """Counts what ``torch.compile`` does, per stage epoch, from torch's compile callbacks and log records.

    Args:
        where: Where the run is (:class:`CompileSite`), or ``None`` outside every measured stage: called at
            each compile's start and at the recompile-limit warning, never per batch.
        clock: Seconds, monotonic.

    Example::

        watch = CompileWatch(where=lambda: CompileSite("train", batch_idx))
        watch.install()  # False: this torch has none of the hooks (no numbers, no error)
        ...
        stats = watch.take("train")  # at the epoch's end; None while nothing ever compiled
        watch.uninstall()
    """

    def __init__(self, where: Callable[[], CompileSite | None], clock: Callable[[], float] = time.perf_counter):
        self._where = where
        self._clock = clock
        self._lock = threading.Lock()
        self._tallies: dict[str, _Tally] = {}
        self._compiling: _Compiling | None = None
        self._handler = _Records(self)
        # A library line a graph break was found at -> the user's line that called it, and the library function.
        self._user_lines: dict[str, tuple[str, str]] = {}
        self._restore: list[tuple[logging.Logger, int, bool]] = []
        self._handler_on: list[logging.Logger] = []
        self._installed = False
        #: Something compiled since the watch was installed (in this process).
        self.seen = False

    def install(self) -> bool:
        """Registers the callbacks and log handlers; whether torch has the compile callbacks. Idempotent."""
        if self._installed:
            return True
        handler = _callback_handler()
        if handler is None:
            return False
        handler.register_start_callback(self._started)
        handler.register_end_callback(self._ended)
        for name in (GRAPH_BREAK_LOGGER, RECOMPILE_LIMIT_LOGGER):
            logger = logging.getLogger(name)
            logger.addHandler(self._handler)
            self._handler_on.append(logger)
        breaks = logging.getLogger(GRAPH_BREAK_LOGGER)
        if not breaks.isEnabledFor(logging.DEBUG):  # the user did not ask for it: on for us alone, printing nothing
            self._restore.append((breaks, breaks.level, breaks.propagate))
            breaks.setLevel(logging.DEBUG)
            breaks.propagate = False
        self._installed = True
        return True

    def keep_installed(self) -> None:
        """Registers the callbacks again where torch dropped them (``torch._dynamo.reset()`` clears them), for an
        installed watch: at each epoch's start, never per batch."""
        handler = _callback_handler()
        if not self._installed or handler is None or self._started in handler.start_callbacks:
            return
        handler.register_start_callback(self._started)
        handler.register_end_callback(self._ended)

    def uninstall(self) -> None:
        """Removes what :meth:`install` added and restores the loggers it changed."""
        if not self._installed:
            return
        handler = _callback_handler()
        if handler is not None:
            for remove, callback in (
                (handler.remove_start_callback, self._started),
                (handler.remove_end_callback, self._ended),
            ):
                with contextlib.suppress(ValueError):  # torch's callbacks were cleared (torch._dynamo.reset())
                    remove(callback)
        for logger in self._handler_on:
            logger.removeHandler(self._handler)
        for logger, level, propagate in self._restore:
            logger.setLevel(level)
            logger.propagate = propagate
        self._handler_on, self._restore = [], []
        self._installed = False

    def take(self, stage: str) -> CompileStats | None:
        """The stage's compile numbers since its last :meth:`take` (its epoch), which start again from zero;
        ``None`` while nothing has compiled in the run (a run without ``torch.compile`` reports nothing)."""
        with self._lock:
            tally = self._tallies.pop(stage, None)
            if not self.seen:
                return None
        tally = tally or _Tally()
        guards = _recompile_guards(tally.recompile_ids)
        if tally.limit_reached and tally.limit_reason and not guards:
            guards = [Recompile(function=tally.limit_function, guard=tally.limit_reason, count=1)]
        return CompileStats(
            graphs=tally.graphs,
            breaks=len(tally.sites),
            recompiles=tally.recompiles,
            limit_reached=tally.limit_reached,
            seconds=tally.seconds,
            seconds_before=tally.seconds_before,
            break_sites=tuple(
                GraphBreak(reason=reason, location=location, count=n)
                for (reason, location), n in tally.sites.most_common()
            ),
            recompile_guards=tuple(guards),
            limit_function=tally.limit_function,
            steps=tuple(sorted(tally.steps)),
        )

    # ------------------------------------------------------------------ torch's callbacks (any thread)

    def _started(self, args: Any) -> None:
        try:
            site = self._where()
            graphs, breaks = _counters()
            self._compiling = _Compiling(site=site, started=self._clock(), graphs=graphs, breaks=breaks)
            if getattr(getattr(args, "callback_trigger", None), "name", None) == "DYNAMO" and site is not None:
                match = _COMPILE_ID.search(str(getattr(args, "compile_id", "")))
                if match and int(match.group(2)) > 0:
                    with self._lock:
                        tally = self._tally(site.stage)
                        tally.recompiles += 1
                        if len(tally.recompile_ids) < MAX_KEPT:
                            tally.recompile_ids.append((match.group(0), time.time_ns() // 1000))
        except Exception:  # never in the way of a compile
            self._compiling = None

    def _ended(self, args: Any) -> None:
        compiling, self._compiling = self._compiling, None
        if compiling is None:
            return
        try:
            seconds = self._clock() - compiling.started
            graphs, breaks = _counters()
            site = compiling.site
            with self._lock:
                self.seen = True
                if site is None:
                    return
                tally = self._tally(site.stage)
                tally.seconds += seconds
                if site.before_epoch:
                    tally.seconds_before += seconds
                elif site.batch is not None:
                    tally.steps.add(site.batch)
                if graphs is not None and compiling.graphs is not None:
                    tally.graphs += max(graphs - compiling.graphs, 0)
                # Dynamo meets a break again as it restarts tracing, and once per inlined frame around it: one
                # compile counts each place once.
                found = _new_breaks(compiling.breaks, breaks)
                if compiling.sites:
                    sites: Counter[tuple[str, str | None]] = Counter(set(compiling.sites))
                elif found:
                    sites = Counter({(first_line(reason), None): 1 for reason in found})
                else:
                    sites = Counter()
                for key, n in sites.items():
                    if key in tally.sites or len(tally.sites) < MAX_KEPT:
                        tally.sites[key] += n
        except Exception:
            pass

    def _break_logged(self, message: str) -> None:
        """A graph break's log record: its place and reason, for the compile under way."""
        match = BREAK_AT.match(message)
        compiling = self._compiling
        if match is None or compiling is None:
            return
        text = message[match.end() :]
        reason, location = break_reason(text), match.group("location")
        if in_library(location):
            # The break is inside a library (Lightning's `self.log`, a torch module): the user's line is the
            # innermost frame of theirs in the traceback, which Dynamo prints once per place.
            user = self._user_lines.get(location) or user_line(text, location)
            if user is not None:
                self._user_lines.setdefault(location, user)
                reason, location = f"{reason} (inside {user[1]})", user[0]
        compiling.sites.append((reason, shown_path(location)))

    def _limit_logged(self, message: str) -> None:
        """Dynamo's warning that a function hit the recompile limit: it runs eager from now on."""
        limit = LIMIT.search(message)
        if limit is None:
            return
        function = LIMIT_FUNCTION.search(message)
        reason = LIMIT_REASON.search(message)
        site = self._where()
        with self._lock:
            self.seen = True
            if site is None:
                return
            tally = self._tally(site.stage)
            tally.limit_reached = True
            if function is not None:
                tally.limit_function = f"{function.group('name')} ({shown_path(function.group('where'))})"
            if reason is not None:
                tally.limit_reason = guard_text(reason.group("reason"))

    def __getstate__(self) -> dict[str, Any]:
        """What a pickled watch keeps (``Trainer(strategy="ddp_spawn")`` pickles the callbacks into each process):
        its numbers, not its lock, handler or installation, which the new process makes at its own setup."""
        state = self.__dict__.copy()
        for name in ("_lock", "_handler", "_restore", "_handler_on", "_installed", "_compiling"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._handler = _Records(self)
        self._restore, self._handler_on, self._installed, self._compiling = [], [], False, None

    def _tally(self, stage: str) -> _Tally:
        tally = self._tallies.get(stage)
        if tally is None:
            tally = self._tallies[stage] = _Tally()
        return tally


class _Records(logging.Handler):
    """Hands Dynamo's graph-break and recompile-limit log records to the watch (never raises)."""

    def __init__(self, watch: CompileWatch) -> None:
        super().__init__(logging.DEBUG)
        self._watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.name == GRAPH_BREAK_LOGGER:
                self._watch._break_logged(record.getMessage())
            elif record.levelno >= logging.WARNING:
                self._watch._limit_logged(record.getMessage())
        except Exception:
            pass


def compile_requested(module: Any, *, most: int = 3) -> str | None:
    """The modules ``nn.Module.compile()`` was called on (it sets their ``_compiled_call_impl``), by name
    (``"LightningModule"`` for ``module`` itself), the first ``most`` of them; ``None`` for none. Such a module
    compiles only when it is *called*: Lightning calls a LightningModule's steps, not the module."""
    names = [
        name or "LightningModule"
        for name, child in module.named_modules()
        if getattr(child, "_compiled_call_impl", None) is not None
    ]
    if not names:
        return None
    shown = ", ".join(f"`{name}`" for name in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _callback_handler() -> Any:
    try:
        from torch._dynamo.callback import callback_handler
    except Exception:
        return None
    has = all(
        hasattr(callback_handler, name)
        for name in ("register_start_callback", "register_end_callback", "remove_start_callback", "remove_end_callback")
    )
    return callback_handler if has else None


def _counters() -> tuple[int | None, dict[str, int] | None]:
    """Dynamo's count of graphs compiled and its graph breaks by reason (``None`` where missing)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return None, None
    found: Any = counters  # a defaultdict of Counters, each made at its first count (`get` makes none)
    graphs = (found.get("stats") or {}).get("unique_graphs", 0)
    breaks = found.get("graph_break") or {}
    return (graphs if isinstance(graphs, int) else None, dict(breaks))


def _new_breaks(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """Graph breaks by reason counted between two reads (``None`` where either is missing; a reset counter
    counts from zero)."""
    if before is None or after is None:
        return None
    return {reason: n - before.get(reason, 0) for reason, n in after.items() if n > before.get(reason, 0)}


def _recompile_guards(recompiles: list[tuple[str, int]]) -> list[Recompile]:
    """The recompiles' failed guards, by function, from Dynamo's compilation metrics (the latest 64), each the
    record of its compile id that ended after the compile started (an id comes again after
    ``torch._dynamo.reset()``, and the metrics outlive it)."""
    if not recompiles:
        return []
    try:
        from torch._dynamo.utils import get_compilation_metrics

        metrics = get_compilation_metrics()
    except Exception:
        return []
    latest = {
        str(getattr(entry, "compile_id", "")): entry
        for entry in metrics
        if getattr(entry, "is_forward", True) is not False
    }
    found: Counter[tuple[str | None, str]] = Counter()
    example: dict[tuple[str | None, str], str | None] = {}
    for compile_id, started in recompiles:
        entry = latest.get(compile_id)
        ended = getattr(entry, "end_time_us", None)
        if entry is None or (isinstance(ended, int) and ended < started):
            continue
        reason = getattr(entry, "recompile_reason", None)
        name, filename, line = (getattr(entry, attr, None) for attr in ("co_name", "co_filename", "co_firstlineno"))
        function = f"{name} ({shown_path(f'{filename}:{line}')})" if name and filename else None
        guard = guard_text(reason) if isinstance(reason, str) else None
        # `n == 1`, `n == 2`...: one guard whose value changes (the source it guards is no part of the key: Dynamo
        # words it differently from one recompile to the next)
        key = (function, re.sub(r"\d+", "N", (guard or "").split(" (", 1)[0]))
        found[key] += 1
        example[key] = guard  # the latest
    return [Recompile(function=key[0], guard=example[key], count=n) for key, n in found.most_common()]
