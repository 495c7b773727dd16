"""A Ctrl-C that comes while we start a process (lightning_perf.collect.interrupts): its handler deferred, then run
in our code, never lost in ``os.fork``'s callbacks. In a subprocess: the test arms a signal at one precise point, a
callback that ``os.fork`` runs in the parent after the fork."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_perf.collect.interrupts import interrupts_held

ROOT = Path(__file__).resolve().parents[2]

# A SIGINT that reaches the process while os.fork runs its callbacks in the parent (as logging's lock release):
# Python runs the handler there, and an exception in such a callback is printed and dropped.
FORK = textwrap.dedent(
    """
    import os, signal, sys
    from lightning_perf.collect.interrupts import interrupts_held

    pid, armed = os.getpid(), []

    def interrupt():
        if armed:
            armed.pop()
            os.kill(pid, signal.SIGINT)

    os.register_at_fork(after_in_parent=interrupt)

    def fork():
        armed.append(True)
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)

    try:
        if sys.argv[1] == "held":
            with interrupts_held():
                fork()
        else:
            fork()
        for _ in range(1000):
            pass
        print("lost", flush=True)
    except KeyboardInterrupt:
        print("raised", flush=True)
    """
)


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.fork")
def test_a_ctrl_c_during_a_fork_is_raised_after_it_instead_of_lost():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    said = {
        mode: subprocess.run(
            [sys.executable, "-c", FORK, mode], capture_output=True, text=True, env=env, timeout=60
        ).stdout.strip()
        for mode in ("bare", "held")
    }
    assert said == {"bare": "lost", "held": "raised"}, said


def test_a_signal_held_back_is_delivered_as_the_block_ends_and_the_handler_is_put_back():
    before = signal.getsignal(signal.SIGINT)
    reached = []

    def interrupted_inside() -> None:
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # Python's checks, where a handler runs
                pass
            reached.append("after the signal")  # still here: held back

    with pytest.raises(KeyboardInterrupt):
        interrupted_inside()
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is before
