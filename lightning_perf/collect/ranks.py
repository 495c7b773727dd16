"""
Cross-rank summaries
====================

Each rank's epoch summary, packed into one small CPU tensor and gathered on a process group of our own
(gloo, created at setup): one collective per stage epoch, none per batch.

Notes:
    1. Every rank issues the gather at every stage epoch end, whatever happened to its own measurements (a
       rank that measured nothing sends NaNs), and does not wait for it: gloo runs it on a thread of its own.
    2. Rank zero alone waits for it, right away, since it reports the rows. Its wait needs nothing but every
       rank reaching the same epoch end, so no collective another callback runs on one rank alone (a
       progress bar reducing a ``sync_dist`` metric on rank zero) can hold it up for ever, whatever the
       order of the callbacks: the other ranks are never blocked in ours, they go on to meet that one.
    3. The other ranks learn that theirs is done later (:meth:`RankExchange.poll`, at an epoch start or
       end), or wait for it at the end of the run (:meth:`RankExchange.drain`). A gather that is done tells
       a rank that every rank reached that epoch end: what each attached to it (its staged traces) is
       complete on every rank.
    4. Our own group keeps our collectives out of the default group's order (and off the NCCL stream): a
       gather still in flight never stands between two of the strategy's collectives.
    5. Once, when the group is made, every rank sends its process id and its node's: each rank learns the process
       ids of the other ranks on its node (:attr:`RankExchange.node_ranks`), whose CPU time is the run's own,
       whether they are its children (Lightning's ``ddp`` launcher) or its siblings (``ddp_spawn``, torchrun).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist

from lightning_perf.records import RankSummary
from lightning_perf.summarize.ranks import rank_summaries

#: How long rank zero waits at an epoch end for the other ranks' summaries, and a rank at the end of a run
#: for the gathers it issued. The ranks of a DDP run move in lockstep (every backward pass all-reduces the
#: gradients), so they reach an epoch end within the time of the hooks in between (a checkpoint written,
#: a progress bar drawn): seconds. Five minutes leaves room for a large checkpoint on a slow disk and stays
#: well below the 30-minute default timeout of torch's (and Lightning's) collectives, so a rank that never
#: comes shows as a warning.
WAIT_SECONDS = 300.0
#: How long a rank that stops on an exception waits for its gathers: the other ranks may be gone, or
#: waiting for this one in a collective of their own, and will not come; a few seconds let those that are
#: merely behind finish.
EXCEPTION_WAIT_SECONDS = 5.0
#: A zero timedelta means "no timeout" to ``Work.wait``: the shortest wait we pass.
_MIN_WAIT = datetime.timedelta(milliseconds=1)

_Payload = TypeVar("_Payload")


@dataclass(frozen=True)
class _Gather(Generic[_Payload]):
    """A gather issued and not yet known to be done on this rank, with what waits for it."""

    work: Any  # torch.distributed's Work
    rows: list[torch.Tensor]
    payload: _Payload


class RankExchange(Generic[_Payload]):
    """Every rank's epoch values, gathered asynchronously on a gloo group of our own (see the module notes).

    Args:
        group: The process group of every rank, with the gloo backend.
        world_size: Its size.

    Example::

        exchange = RankExchange.open()  # on every rank, at setup
        exchange.issue(values, payload=staged_traces)  # on every rank, at every epoch end
        ranks = exchange.wait(WAIT_SECONDS)  # on rank zero only
        done = exchange.poll()  # payloads of the gathers every rank has joined
        done, unfinished = exchange.drain(WAIT_SECONDS)  # at the end; then exchange.close()
    """

    def __init__(self, group: Any, world_size: int, node_ranks: frozenset[int] = frozenset()) -> None:
        self._group = group
        self._world_size = world_size
        #: The process ids of the other ranks on this rank's node (module Notes 5).
        self.node_ranks = node_ranks
        self._pending: list[_Gather[_Payload]] = []
        self._drained: list[_Gather[_Payload]] = []  # handed back by drain() while still in flight

    @classmethod
    def open(cls) -> RankExchange[_Payload] | None:
        """A new exchange over every rank (a collective: every rank must call it, in the same order);
        ``None`` where ``torch.distributed`` is not initialized, or in a single process."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        group, world_size = dist.new_group(backend="gloo"), dist.get_world_size()
        return cls(group, world_size, _node_ranks(group, world_size))

    def issue(self, values: Sequence[float], payload: _Payload) -> None:
        """Starts the gather of this rank's ``values`` (one per
        :data:`~lightning_perf.summarize.ranks.FIELDS`) and returns at once.

        ``payload`` is handed back by :meth:`poll` or :meth:`drain` once the gather is done.
        """
        tensor = torch.tensor(list(values), dtype=torch.float64)
        rows = [torch.empty_like(tensor) for _ in range(self._world_size)]
        work = dist.all_gather(rows, tensor, group=self._group, async_op=True)
        self._pending.append(_Gather(work, rows, payload))

    def wait(self, timeout: float) -> tuple[RankSummary, ...] | None:
        """Every rank's values of the latest gather, by global rank, once every rank has issued it; ``None``
        if some rank has not within ``timeout`` seconds (the gather goes on, :meth:`poll` sees it end).

        Raises:
            RuntimeError: The gather failed (a rank is gone), or nothing was issued.
        """
        if not self._pending:
            raise RuntimeError("no gather was issued")
        latest = self._pending[-1]
        if not _wait(latest.work, timeout):
            return None
        return rank_summaries([row.tolist() for row in latest.rows])

    def poll(self) -> list[_Payload]:
        """The payloads of the gathers now done, oldest first, without blocking.

        A gather is done once every rank has issued it, so every rank has issued the earlier ones too:
        everything up to the latest done gather is handed back, whatever this rank knows of the earlier ones.
        """
        done = max((i + 1 for i, gather in enumerate(self._pending) if gather.work.is_completed()), default=0)
        finished, self._pending = self._pending[:done], self._pending[done:]
        return [gather.payload for gather in finished]

    def drain(self, timeout: float) -> tuple[list[_Payload], int]:
        """Waits up to ``timeout`` seconds in all for the pending gathers, then hands back every payload, done
        or not, and how many gathers were not done."""
        deadline = time.monotonic() + timeout
        for gather in self._pending:
            try:
                if not _wait(gather.work, max(0.0, deadline - time.monotonic())):
                    break
            except RuntimeError:  # failed (a rank is gone): done all the same
                continue
        drained, self._pending = self._pending, []
        unfinished = [gather for gather in drained if not gather.work.is_completed()]
        self._drained += unfinished
        return [gather.payload for gather in drained], len(unfinished)

    def close(self) -> None:
        """Destroys the group (unless the default group, and every group with it, is gone already).

        A gather still in flight (a rank that never came) would block the group's destructor, and with it this
        rank's exit, until it ends: the last reference then goes to a daemon thread that waits for it, which
        the process's exit does not wait for.
        """
        group, self._group = self._group, None
        if group is None:
            return
        in_flight = [gather.work for gather in self._drained + self._pending if not gather.work.is_completed()]
        self._pending, self._drained = [], []
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)
        if in_flight:
            holder = threading.Thread(target=_hold_until_done, args=(group, in_flight), name=HOLDER_THREAD, daemon=True)
            holder.start()


def _node_ranks(group: Any, world_size: int) -> frozenset[int]:
    """The process ids of the other ranks on this node: every rank's process id and node (its host name, hashed to
    48 bits, exact in a float64) gathered once, on ``group`` (module Notes 5)."""
    node = int.from_bytes(hashlib.blake2b(socket.gethostname().encode(), digest_size=6).digest(), "big")
    mine = torch.tensor([float(os.getpid()), float(node)], dtype=torch.float64)
    rows = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(rows, mine, group=group)
    pids = (int(pid) for pid, host in (row.tolist() for row in rows) if int(host) == node)
    return frozenset(pid for pid in pids if pid != os.getpid())


HOLDER_THREAD = "lightning_perf-gather-holder"
"""The name of the daemon thread :meth:`RankExchange.close` leaves holding a group whose gathers are in flight."""


def _hold_until_done(group: Any, works: Sequence[Any]) -> None:
    """Keeps ``group`` until its ``works`` end (``Work.wait`` lets the GIL go meanwhile), then drops it."""
    for work in works:
        with contextlib.suppress(RuntimeError):  # failed: ended all the same
            work.wait()
    del group


def _wait(work: Any, timeout: float) -> bool:
    """Whether ``work`` is done within ``timeout`` seconds (``False``: not yet); its failure raises."""
    try:
        work.wait(timeout=max(datetime.timedelta(seconds=timeout), _MIN_WAIT))
    except RuntimeError:
        if not work.is_completed():
            return False
        work.wait()  # done since: returns, or raises why it failed
    return True
