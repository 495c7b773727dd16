"""
Window process
==============

The child process in which a closed window is processed (:func:`~lightning_perf.hooks.window_close.process_window`:
read torch's export back, write the trace, summarize it, write the operator table), so that this work, most of
what a window costs, runs on the child's own GIL: a background thread of the training process would take the
training process's GIL back whenever the training loop gives it up, which torch does at every operator call.

One child per :class:`WindowProcess`, started as the first window with a large trace closes
(:meth:`WindowProcess.start`: the training thread does not wait for it) and kept until
:meth:`WindowProcess.close`, which the callback calls at the end of each Trainer call: one per training process
(per rank). It is a fresh interpreter
(``python -I -S -c``, importing only this module; neither torch nor Lightning, nor ``site`` and what it runs: a
``sitecustomize``), not a ``multiprocessing`` child: the
``spawn`` and ``forkserver`` start methods run the user's ``__main__`` again in the child (the training script,
with its imports of torch and Lightning, and all of it where it has no ``if __name__ == "__main__"`` guard), and
``fork`` copies a process with threads (and CUDA) running. It runs in a session of its own, out of reach of the
terminal's Ctrl-C, so that it finishes what it was given when training is interrupted; it exits when its input
pipe closes, also when the training process dies.

Only plain values cross the pipes, pickled: a :class:`~lightning_perf.hooks.window_close.ClosedWindow` and its
:class:`~lightning_perf.hooks.window_close.WindowOptions` in, a
:class:`~lightning_perf.hooks.window_close.ProcessedWindow` (or the exception :func:`process_window` raised) out.

A small trace (its export at most :data:`HERE_BYTES`) is processed in the calling thread while no child runs:
the child's start (a fresh interpreter and its imports, about 0.3 s of wall time on a 2-CPU machine) would take
longer than the work it takes over, and a short run's epoch end, which waits for its windows, waited for it.

Where the child cannot start or dies, :meth:`WindowProcess.process` processes the window in the calling thread,
as before there was a child, and :attr:`WindowProcess.broken` says why (the callback warns once); setting the
environment variable :data:`PROCESS_ENV` to ``0`` does so from the start.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from typing import IO, Any

from lightning_perf.collect.interrupts import interrupts_held
from lightning_perf.hooks.window_close import ClosedWindow, ProcessedWindow, WindowOptions, process_window

#: The environment variable that keeps windows in the training process (``0``, ``false``, ``no``): on a thread, as
#: before the window process (where starting a child is not allowed, or to compare).
PROCESS_ENV = "LIGHTNING_PERF_WINDOW_PROCESS"

# The child's command line after the interpreter: this module's `main`, imported from this very package (the
# directory passed as argv[1]), and its dependencies from the training process's own import path (argv[3]). The
# interpreter starts isolated (`-I -S`): no `site` (so no `sitecustomize` or `usercustomize`, a site's or a test
# harness's, which cost one user 7 CPU-seconds a start), no PYTHON* variables, no working directory on its path.
_INTERPRETER_FLAGS = ("-I", "-S")
_CHILD_CODE = (
    "import os, sys\n"
    "for lower in (lambda: os.nice(int(sys.argv[2])),\n"
    "              lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))):\n"
    "    try: lower()\n"
    "    except (AttributeError, OSError): pass\n"  # not on this platform, or not allowed: as it is
    "sys.path[:0] = [sys.argv[1], *sys.argv[3].split(os.pathsep)]\n"
    "from lightning_perf.hooks.window_process import main; main()"
)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The child's numpy works on one thread: no BLAS thread pools next to training's threads.
_CHILD_THREADS = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
# The child's scheduling priority, set before it imports anything: the lowest (nice 19, and Linux's SCHED_IDLE
# policy, which runs it only on a CPU nothing else wants and lets a waking training thread take that CPU at once),
# so that where it and training want the same CPU, training gets it.
CHILD_NICENESS = 19
#: The largest export (bytes of torch's JSON) processed in the calling thread while no child runs. Processing
#: reads about 30 MB/s of export on the project's 2-CPU machine (a 2.8-MB export in 92 ms, 0.43 MB in 15 ms, the
#: TFT-shaped model of ``benchmarks/forecaster.py``): 1 MB takes about a tenth of the child's start. Our judgment.
HERE_BYTES = 1_000_000
CLOSE_WAIT_SECONDS = 10.0  # for the child to exit once its input is closed (it exits at once), then it is killed


def _path() -> str:
    """The training process's import path for the child (without its working directory, ``""``)."""
    return os.pathsep.join(entry for entry in sys.path if entry and os.pathsep not in entry)


def process_enabled() -> bool:
    """Whether :data:`PROCESS_ENV` leaves windows to the window process (unset: yes)."""
    return os.environ.get(PROCESS_ENV, "").strip().lower() not in ("0", "false", "no")


class ChildLost(Exception):
    """The window process could not start, or ended (its message says which, and its exit code)."""


class WindowProcess:
    """Processes closed windows in a child process, one at a time; in the calling thread where it cannot.

    Attributes:
        broken: Why windows are processed in this process (the child could not start, or ended); ``None``
            while the child works, before it is needed, and where :data:`PROCESS_ENV` keeps windows here. A copy
            (pickled, deep-copied) starts with no child and is not broken.

    Example::

        child = WindowProcess()
        processed = child.process(closed, WindowOptions.of(config))  # in the child
        child.close()
    """

    def __init__(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # one window at a time on the pipes; close() waits for the one in flight
        self.broken: str | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        return self._child.pid if self._child is not None else None

    def small(self, export_path: str) -> bool:
        """Whether the window of this export is processed in the calling thread: no child runs, and the export
        is at most :data:`HERE_BYTES` (one that cannot be read is not: the child reports why)."""
        if self._child is not None:
            return False
        try:
            return os.path.getsize(export_path) <= HERE_BYTES
        except OSError:
            return False

    def process(self, closed: ClosedWindow, options: WindowOptions, *, here: bool = False) -> ProcessedWindow:
        """:func:`process_window` ``(closed, options)`` in the child (started if needed), or here where it cannot
        run (then :attr:`broken` says why) or where ``here`` asks (:meth:`small`). Raises what
        :func:`process_window` raised."""
        with self._lock:
            if not here and self.broken is None and process_enabled():
                try:
                    return self._in_child(closed, options)
                except ChildLost as lost:
                    self.broken = str(lost)
                    self._stop()
        return process_window(closed, options)  # the export is still there: the child removes it once done

    def start(self) -> None:
        """Starts the child now, where windows go to it and it is not running, and returns at once: the child's
        start (a fresh interpreter and its imports, about 0.2 s of one CPU) then runs beside the window's close,
        whose export keeps the training thread in torch's C++ while the machine's other CPUs wait (on a 2-CPU
        machine, started later it takes the CPU training's second thread uses). Where it cannot start,
        :attr:`broken` says why. Never waits: where a window is being processed, the child is there already."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._child is None and self.broken is None and process_enabled():
                try:
                    self._start()
                except ChildLost as lost:
                    self.broken = str(lost)
        finally:
            self._lock.release()

    def close(self) -> None:
        """Lets the child go (after the window it is processing, if any); the next window starts a new one."""
        with self._lock:
            self._stop()

    def _in_child(self, closed: ClosedWindow, options: WindowOptions) -> ProcessedWindow:
        child = self._child if self._child is not None else self._start()
        assert child.stdin is not None and child.stdout is not None
        try:
            pickle.dump((closed, options), child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            child.stdin.flush()
            ok, value = pickle.load(child.stdout)  # waits without the GIL
        except (OSError, EOFError, pickle.UnpicklingError) as err:
            try:
                code: int | None = child.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
            raise ChildLost(f"the window process (pid {child.pid}) ended (exit code {code})") from err
        if ok:
            return value
        raise value

    def _start(self) -> subprocess.Popen[bytes]:
        try:
            with interrupts_held():  # a fork (lightning_perf.collect.interrupts)
                self._child = subprocess.Popen(
                    [
                        sys.executable,
                        *_INTERPRETER_FLAGS,
                        "-c",
                        _CHILD_CODE,
                        _PACKAGE_ROOT,
                        str(CHILD_NICENESS),
                        _path(),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env={**os.environ, **_CHILD_THREADS},
                    start_new_session=True,  # the terminal's Ctrl-C goes to training, not to the windows it saves
                )
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            raise ChildLost(f"the window process could not start ({type(err).__name__}: {err})") from err
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        for pipe in (child.stdin, child.stdout):
            try:
                if pipe is not None:
                    pipe.close()  # its input at EOF: the child exits
            except OSError:
                pass
        try:
            child.wait(timeout=CLOSE_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


def serve(jobs: IO[bytes], results: IO[bytes]) -> None:
    """The child's loop: each ``(ClosedWindow, WindowOptions)`` read from ``jobs`` is processed and ``(True,
    ProcessedWindow)`` or ``(False, exception)`` written to ``results``; returns when ``jobs`` ends."""
    while True:
        try:
            closed, options = pickle.load(jobs)
        except EOFError:
            return
        result: tuple[bool, Any]
        try:
            result = (True, process_window(closed, options))
        except Exception as err:
            result = (False, err)
        try:
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # an exception that does not pickle: its type and message
            failed = result[1]
            plain = RuntimeError(f"{type(failed).__name__}: {failed}")
            data = pickle.dumps((False, plain), protocol=pickle.HIGHEST_PROTOCOL)
        results.write(data)
        results.flush()


def main() -> None:
    """The child's entry point: results go to the stdout it was started with; whatever else would print there
    goes to stderr instead, so nothing comes between two results. Exits once its input ends."""
    results = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, results)
    # Every result is out (serve flushes each one). Skipping the interpreter's teardown (about 40 ms, which
    # the training thread waits for at the end of each Trainer call) leaves nothing undone.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
