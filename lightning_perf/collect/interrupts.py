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

:func:`interrupts_held` holds ``SIGINT`` back from the main thread around such a start; one that came meanwhile is
delivered as the block ends, and its ``KeyboardInterrupt`` is raised there, in our code, as Lightning expects.
Elsewhere (another thread, no ``pthread_sigmask``) it holds nothing. Not ``SIGTERM``: a child inherits the mask,
and ``multiprocessing`` ends DataLoader workers with ``SIGTERM`` at exit (held, the exit waited for them forever).
The children started in the block keep ``SIGINT`` held: the window process has a session of its own anyway, and
a trial's DataLoader workers are stopped by the trial (or by ``SIGTERM``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_HELD = {signal.SIGINT}


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """``SIGINT`` held back from the main thread inside the block, delivered at its end.

    Example::

        with interrupts_held():
            iterator = iter(loader)  # forks the DataLoader's workers
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
