"""
Shared verdicts
===============

A yes or no that the ranks of a distributed run must agree on: whether the profiling budget opens a later window
(:class:`~lightning_perf.budget.ProfilingBudget`). Each rank measures its own profiling cost, and the ranks' costs
differ (rank zero writes the reports), so where each decided for itself a later window opened on some ranks and
not on others: on 2 gloo ranks with ``profile_budget=0.04`` over 30 short epochs, rank 0 recorded epochs 14-17 and
rank 1 epochs 16-19, and four windows held one rank's trace only. One rank decides (the lowest that records
windows) and the others follow.

Notes:
    1. **Through the store, not a collective.** The verdicts go through the key-value store that
       ``torch.distributed``'s default group was set up with: the deciding rank writes each verdict under a key of
       its question (stage, epoch, batch) and goes on at once; a following rank reads it, waiting where the
       decider has not come that far. No collective, so nothing to order against the strategy's collectives or
       our own gathers (:mod:`lightning_perf.collect.ranks`).
    2. **Waits are short and bounded.** A question is asked only where the plan opens a later window, at most once
       per stage epoch. The ranks of a training epoch move in lockstep (every backward pass all-reduces the
       gradients), so a follower waits at most about a step; in validation it waits for the decider to reach the
       same batch. A decider that ends the stage epoch without asking (fewer batches on its rank) writes that it
       ended: the follower takes "no". After :data:`~lightning_perf.collect.ranks.WAIT_SECONDS`, or where the
       store fails, the follower takes its own verdict and says so once.
    3. **Keys are unique per setup.** Every rank sets up the same callbacks in the same order, so the n-th
       :meth:`SharedVerdicts.open` of each process shares its keys with the n-th of the others, and with no other.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from lightning_perf.collect.ranks import WAIT_SECONDS

#: How often a following rank looks for the decider's verdict while it waits (a store round trip each).
POLL_SECONDS = 0.001

_OPENED = itertools.count()  # SharedVerdicts.open calls in this process (Notes 3)


class SharedVerdicts:
    """One rank's verdicts, followed by the others (see the module's notes).

    Args:
        store: The store the ranks share (``torch.distributed``'s ``Store``).
        decides: This rank decides; else it follows.
        warn: ``(key, message)``, shown once per key: a follower that could not learn a verdict.
        timeout: Seconds a follower waits for a verdict.

    Example::

        verdicts = SharedVerdicts.open(decider=0, warn=policy.warn_once)  # every rank, at setup
        if verdicts.agree("train", 3, 6, budget.allows(now)):  # every rank that records windows, at batch 6
            ...
        verdicts.ended("train", 3)  # every rank, at the stage epoch's end
    """

    def __init__(self, store: Any, *, decides: bool, warn: Callable[[str, str], None], timeout: float = WAIT_SECONDS):
        self._store = store
        self.decides = decides
        self._warn = warn
        self._timeout = timeout

    @classmethod
    def open(cls, decider: int, warn: Callable[[str, str], None]) -> SharedVerdicts | None:
        """The verdicts of this setup (call it on every rank, at every setup: Notes 3); ``None`` in a single
        process, or where ``torch.distributed`` is not initialized or has no store."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        store = dist.distributed_c10d._get_default_store()
        prefixed = dist.PrefixStore(f"lightning_perf/verdicts/{next(_OPENED)}/", store)
        return cls(prefixed, decides=dist.get_rank() == decider, warn=warn)

    def agree(self, stage: str, epoch: int, batch: int, verdict: bool) -> bool:
        """The verdict every rank takes at batch ``batch`` of the stage's epoch ``epoch``: this rank's ``verdict``
        where it decides, else the decider's (Notes 2)."""
        question = f"{stage}/{epoch}/{batch}"
        try:
            if self.decides:
                self._store.set(question, b"1" if verdict else b"0")
                return verdict
            return self._follow(question, _end_key(stage, epoch), verdict)
        except Exception as err:  # a store that fails: as if alone
            message = f"PerfCallback: the ranks could not share a budget verdict ({err}); this rank decides alone."
            self._warn("verdicts", message)
            return verdict

    def ended(self, stage: str, epoch: int) -> None:
        """The decider has ended the stage's epoch ``epoch``: a question of it not asked by now will not be."""
        if self.decides:
            try:
                self._store.set(_end_key(stage, epoch), b"1")
            except Exception as err:
                self._warn("verdicts", f"PerfCallback: the ranks could not share a budget verdict ({err}).")

    def _follow(self, question: str, scope_end: str, verdict: bool) -> bool:
        deadline = time.monotonic() + self._timeout
        while True:
            if self._store.check([question]):
                return bool(self._store.get(question) == b"1")
            if self._store.check([scope_end]):
                return False  # the decider's epoch ended short of this batch: no window there
            if time.monotonic() > deadline:
                self._warn(
                    "verdicts",
                    f"PerfCallback: the deciding rank's budget verdict for {question} did not come within"
                    f" {self._timeout:g} s; this rank decides alone, and its windows may differ from the other ranks'.",
                )
                return verdict
            time.sleep(POLL_SECONDS)


def _end_key(stage: str, epoch: int) -> str:
    """The key under which the decider says it ended the stage's epoch ``epoch``."""
    return f"{stage}/{epoch}/end"
