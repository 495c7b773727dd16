"""
CPU use
=======

What the CPUs did for the training process, for ``dataloader_bound``'s advice: whether a CPU is free for a
DataLoader worker, and whether loading computes or waits.

- :class:`RunQueue`: the seconds the process's main thread was ready to run but waited for a CPU (other
  threads or processes held them), from Linux's ``/proc/<pid>/schedstat``.
  Read around a batch's data wait (:class:`~lightning_perf.collect.steps.StepClock`), with the process's CPU
  seconds: the wait less this queueing is what loading could spend on a CPU.
- :func:`children_cpu_seconds`: CPU seconds of this process's children (its DataLoader workers; under
  Lightning's ``ddp`` launcher, rank zero's children are the other ranks too, which :class:`EpochCpu` leaves out).
- :func:`machine_busy_seconds`: CPU seconds all processes used on the CPUs this process may run on (Linux's
  ``/proc/stat``); :func:`machine_cpu_seconds`, with a virtual machine's steal time, in the same read.
- :class:`EpochCpu`: one stage epoch's wall time, its workers' CPU seconds, the share of it the main
  thread waited for a CPU, the CPUs' worth other processes used, and the share of the CPUs' time a virtual
  machine's host took (steal), read at the epoch's start and end.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Collection

from lightning_perf.collect.procfs import ProcFile


class RunQueue:
    """Seconds, cumulative, the process's main thread has waited in the kernel's run queue for a CPU.

    Calling it returns ``None`` where ``/proc/<pid>/schedstat`` cannot be read (not Linux). The file is kept
    open (:class:`~lightning_perf.collect.procfs.ProcFile`): a few microseconds a read.
    """

    def __init__(self) -> None:
        self._file = ProcFile("schedstat", 64)

    def __call__(self) -> float | None:
        data = self._file()
        if data is None:
            return None
        try:
            return int(data.split()[1]) * 1e-9
        except (IndexError, ValueError):
            return None

    def close(self) -> None:
        self._file.close()


def children_cpu_seconds() -> float | None:
    """CPU seconds (user and system) of this process's children: those alive, read from ``/proc``, and those
    ended and waited for (``os.times``). ``None`` without ``/proc`` (not Linux).

    Notes:
        DataLoader workers are this process's children; so are other subprocesses (a compile worker pool,
        a launcher's helpers), which idle in a training loop. The difference between two calls is what the
        workers computed in between. The children are listed by :class:`ChildList` (a file per thread, all of
        them at most once a second). Under Lightning's ``ddp`` launcher the other ranks of the node are rank
        zero's children too, each busy all epoch: :class:`EpochCpu` leaves them out of its workers
        (``start(ranks=...)``).
    """
    seconds = _children_cpu(())
    return None if seconds is None else seconds[0] + seconds[1]


def _children_cpu(ranks: Collection[int]) -> tuple[float, float] | None:
    """CPU seconds of the children but ``ranks`` (those ended and waited for included), and of ``ranks`` with
    their own children (a rank's DataLoader workers, which its main thread starts: alive, or ended and waited
    for), whether they are this process's children (Lightning's ``ddp`` launcher) or not (``ddp_spawn``'s and
    torchrun's ranks are siblings). ``None`` without ``/proc``."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return None
    ended, me = os.times(), os.getpid()  # (a rank that ended early counts here: no longer told apart)
    seconds = [ended.children_user + ended.children_system, 0.0]
    seconds[0] += sum(_stat_cpu(pid)[0] for pid in _children(tasks) if int(pid) not in ranks)
    for rank in ranks:
        own, reaped = _stat_cpu(str(rank))
        workers = _read_words(f"/proc/{rank}/task/{rank}/children")  # the rank's main thread starts its workers
        # (under the ddp launcher, rank zero's are the other ranks too: each counts once, this one not at all)
        seconds[1] += own + reaped + sum(_stat_cpu(w)[0] for w in workers if int(w) not in ranks and int(w) != me)
    return seconds[0], seconds[1]


def _stat_cpu(pid: str) -> tuple[float, float]:
    """A process's CPU seconds (user and system), and its children's that it waited for; 0 for a process gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        # utime, stime, cutime, cstime: fields 14-17 of proc(5)'s stat, 11-14 after the command's ")".
        return (int(fields[11]) + int(fields[12])) / ticks, (int(fields[13]) + int(fields[14])) / ticks
    except (OSError, IndexError, ValueError):  # ended between the listing and the read
        return 0.0, 0.0


def _read_words(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


# How often the children of every thread are listed; in between, only those of the calling thread and of the threads
# that had children at the last full listing. A thread's ``children`` file took 20-30 us to read on a 2-CPU VM, and
# a fit has 5-8 threads (torch's, TensorBoard's writer, the progress bar's): listing them all at each epoch start
# and end took 0.35 ms of a stage epoch's 1.2 ms of hooks in a run of 10-ms epochs. A subprocess another thread
# starts is seen within this many seconds (a DataLoader's workers, a launcher's ranks and our window process are
# started by the thread that runs the loop, read every time). Our judgment.
FULL_LISTING_SECONDS = 1.0


class ChildList:
    """The process's children's pids, from the ``children`` files of its threads (``/proc/self/task/*/``): all of
    them at most every :data:`FULL_LISTING_SECONDS`, else the calling thread's and those that had children."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._listed = -math.inf  # when every thread was last read
        self._parents: set[str] = set()  # the threads that had children then

    def __call__(self, tasks: str) -> set[str]:
        now = self._clock()
        full = now - self._listed >= FULL_LISTING_SECONDS
        threads = os.listdir(tasks) if full else {*self._parents, str(threading.get_native_id())}
        found: set[str] = set()
        parents = set()
        for task in threads:
            if pids := _read_words(f"{tasks}/{task}/children"):
                found.update(pids)
                parents.add(task)
        if full:
            self._listed, self._parents = now, parents
        return found


_children = ChildList()


def machine_busy_seconds() -> float | None:
    """CPU seconds, cumulative, every process used on the CPUs this process may run on (its affinity): all of
    ``/proc/stat``'s per-CPU time but idle and I/O wait; ``None`` without ``/proc`` (not Linux). In a container
    it is the host's, as its scheduler sees it: what competes with this process for its CPUs, counted in ticks
    of 10 ms per CPU (the rules judge it over enough wall time: ``lightning_perf.diagnose.contention``).

    Where the process may run on every online CPU (the usual case), ``/proc/stat``'s first line, their sum, is
    read alone: one line parsed, where a machine of 128 CPUs has 128 more (read at every stage epoch's start and
    end)."""
    seconds = machine_cpu_seconds()
    return None if seconds is None else seconds[0]


def machine_cpu_seconds() -> tuple[float, float, int] | None:
    """From one read of ``/proc/stat``, over the CPUs this process may run on: :func:`machine_busy_seconds`, the
    seconds, cumulative, a virtual machine's host ran something else while those CPUs had work (``steal``, the
    8th value of a ``cpu`` line: counted in the busy seconds too), and how many CPUs they are. ``None`` without
    ``/proc`` (not Linux)."""
    allowed = _allowed_cpus()
    busy = steal = 0
    try:
        with open("/proc/stat") as f:
            if allowed is None:
                values = f.readline().split()[1:]
                cpus = os.cpu_count() or 1
                busy, steal = _busy_ticks(values), _steal_ticks(values)
            else:
                cpus = len(allowed)
                for line in f:
                    if not line.startswith("cpu"):
                        break
                    name, *values = line.split()
                    if name != "cpu" and name in allowed:
                        busy += _busy_ticks(values)
                        steal += _steal_ticks(values)
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, steal / tick, cpus


def _allowed_cpus() -> set[str] | None:
    """``/proc/stat``'s names of the CPUs this process may run on (``cpu0``, ...); ``None`` for every online CPU
    (or where the affinity cannot be read)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = os.sched_getaffinity(0)
    return None if len(cpus) >= (os.cpu_count() or 0) else {f"cpu{i}" for i in cpus}


def _busy_ticks(values: list[str]) -> int:
    """A ``/proc/stat`` CPU line's ticks (its fields after the name) but idle and I/O wait."""
    fields = [int(v) for v in values[:8]]
    return sum(fields) - fields[3] - fields[4]


def _steal_ticks(values: list[str]) -> int:
    """A ``/proc/stat`` CPU line's steal ticks (its 8th field after the name; 0 where the kernel has none)."""
    return int(values[7]) if len(values) > 7 else 0


class EpochCpu:
    """One stage epoch's wall time, its DataLoader workers' CPU seconds, the share of it the training thread
    waited for a CPU, and the CPUs' worth the machine's other processes used meanwhile: :meth:`start` at the
    epoch's start, :meth:`read` at its end (a few reads of ``/proc``: about 0.5 ms per epoch)."""

    def __init__(self) -> None:
        self._run_queue = RunQueue()
        self._started = time.perf_counter()
        self._waited: float | None = None
        self._workers: float | None = None
        self._machine: tuple[float, float, int] | None = None
        self._own: float | None = None
        self._ranks: frozenset[int] = frozenset()
        #: Set while :meth:`pause` holds (a profiler window and its close): a plain attribute, read every batch.
        self.paused = False
        self._paused_at: tuple[float, float | None] = (0.0, None)
        self._left_out = (0.0, 0.0)  # wall seconds and seconds waiting for a CPU, paused

    def start(self, *, already: float = 0.0, workers: bool = False, ranks: Collection[int] = ()) -> None:
        """Starts the epoch ``already`` seconds ago (the DataLoader's start-up before the epoch-start hook);
        ``workers``: report the workers' CPU time too; ``ranks``: the process ids of the run's other ranks on
        this node, children or not: no workers, and no other processes' load (their CPU time is the run's own)."""
        self._started = time.perf_counter() - already
        self._waited = self._run_queue()
        self._ranks = frozenset(ranks)
        children = _children_cpu(self._ranks)
        self._workers = children[0] if workers and children is not None else None
        self._machine = machine_cpu_seconds()
        self._own = _own(children)
        self.paused, self._left_out = False, (0.0, 0.0)

    def pause(self) -> None:
        """Leaves what follows out of ``cpu_wait_share`` until :meth:`resume`: the callback's own windows, whose
        profiler, close and window process take CPU time from training (measured: a first window's close and its
        process's start kept the training thread waiting 25% of a demo epoch on 2 idle CPUs)."""
        if not self.paused:
            self.paused, self._paused_at = True, (time.perf_counter(), self._run_queue())

    def resume(self) -> None:
        """Ends a :meth:`pause`."""
        if self.paused:
            wall, waited = self._left_out
            since, queued = self._paused_at
            self._left_out = (wall + time.perf_counter() - since, waited + (_since(self._run_queue(), queued) or 0.0))
            self.paused = False

    def read(self) -> dict[str, float | None]:
        """``wall_time``, ``worker_cpu``, ``cpu_wait_share`` (less what :meth:`pause` left out), ``other_cpu_load``
        and ``cpu_steal_share`` since :meth:`start`, as the :class:`~lightning_perf.records.EpochSummary` fields of
        those names (``None``: not measured)."""
        self.resume()
        wall = time.perf_counter() - self._started
        waited = _since(self._run_queue(), self._waited)
        children = _children_cpu(self._ranks)
        left_wall, left_waited = self._left_out
        measured = wall - left_wall
        own = _since(_own(children), self._own)
        start, end = self._machine, machine_cpu_seconds()
        machine = stolen = None
        if start is not None and end is not None:
            machine, stolen = max(end[0] - start[0], 0.0), max(end[1] - start[1], 0.0)
        cpus = end[2] if end is not None else 1
        return {
            "wall_time": wall,
            "worker_cpu": None if self._workers is None or children is None else _since(children[0], self._workers),
            "cpu_wait_share": (
                None if waited is None or measured <= 0 else min(max(waited - left_waited, 0.0) / measured, 1.0)
            ),
            "other_cpu_load": None if machine is None or own is None or wall <= 0 else max(machine - own, 0.0) / wall,
            "cpu_steal_share": None if stolen is None or wall <= 0 else min(stolen / (wall * cpus), 1.0),
        }


def _own(children: tuple[float, float] | None) -> float | None:
    """CPU seconds, cumulative, of this process and its children, the other ranks among them: the run's own."""
    return None if children is None else time.process_time() + sum(children)


def _since(now: float | None, then: float | None) -> float | None:
    return None if now is None or then is None else max(now - then, 0.0)
