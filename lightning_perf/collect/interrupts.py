"""
Ctrl-C while we start a process or a thread
===========================================

Python runs a signal's handler in the main thread at its next check, wherever that is. Two places in our own work
lose a Ctrl-C there, or the run's end:

- a fork (a DataLoader trial's workers, the window process): the handler may run inside the callbacks that
  ``os.fork`` calls after it in the parent (``logging``'s lock release), where an exception is printed as
  "Exception ignored in ..." and dropped: the ``KeyboardInterrupt`` is lost and training goes on (seen once in 20
  runs of `lightning-perf run` under two CPU burners, Ctrl-C at a random point, and once in CI);
- a thread's start (the windows' worker): a ``KeyboardInterrupt`` between ``Thread.start`` and the executor's
  note of that thread leaves a thread that nothing stops, and the interpreter waits for it at exit (a hang in a
  ``ThreadPoolExecutor``'s worker was seen once in the same 20 runs).

:func:`interrupts_held` defers ``SIGINT``'s Python handler around such a start: meanwhile a handler that only
notes the signal stands in (wherever Python runs it, nothing is lost), and once the start is done the handler that
was there runs for it (Python's raises ``KeyboardInterrupt`` there, in our code, as Lightning expects). Not a
signal mask: ``pthread_sigmask`` holds a signal back from one thread only, and the kernel hands a process's
signal to another (torch's OpenMP threads, a logger's writer), whose C handler trips the main thread's check all
the same (seen: a mask on the main thread let the signal through in a test process with a few threads). Elsewhere
(another thread, a ``SIGINT`` that Python does not handle: ignored, or not installed) it changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """``SIGINT``'s handler deferred to the block's end (module notes).

    Example::

        with interrupts_held():
            iterator = iter(loader)  # forks the DataLoader's workers
    """
    handler = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if not callable(handler):
        yield
        return
    came: list[tuple[int, Any]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: came.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if came:
            handler(*came[0])
