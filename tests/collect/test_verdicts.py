"""Tests of lightning_perf.collect.verdicts on one of torch's own stores (HashStore, in this process): the decider's
verdict is the follower's, an epoch the decider ended short means "no", and a verdict that never comes leaves the
follower its own, with a warning. The real two-rank run: tests/callback/test_distributed.py."""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from lightning_perf.collect.verdicts import SharedVerdicts


def pair(timeout: float = 5.0) -> tuple[SharedVerdicts, SharedVerdicts, list[str]]:
    store = dist.HashStore()
    said: list[str] = []
    warn = lambda key, message: said.append(message)  # noqa: E731
    return (
        SharedVerdicts(store, decides=True, warn=warn, timeout=timeout),
        SharedVerdicts(store, decides=False, warn=warn, timeout=timeout),
        said,
    )


def test_the_follower_takes_the_deciders_verdict_whatever_its_own():
    decider, follower, said = pair()
    assert decider.agree("train", 3, 6, True) is True
    assert follower.agree("train", 3, 6, False) is True
    assert decider.agree("train", 4, 6, False) is False
    assert follower.agree("train", 4, 6, True) is False
    assert said == []


def test_the_follower_waits_for_a_decider_that_is_behind():
    decider, follower, _ = pair()
    late = threading.Timer(0.2, decider.agree, ("validate", 1, 6, True))
    late.start()
    start = time.monotonic()
    assert follower.agree("validate", 1, 6, False) is True
    assert time.monotonic() - start >= 0.15
    late.join()


def test_a_stage_epoch_the_decider_ended_short_means_no():
    decider, follower, said = pair()
    decider.ended("validate", 2)  # its rank had fewer batches: it never asked about batch 6
    assert follower.agree("validate", 2, 6, True) is False
    assert said == []


def test_a_verdict_that_never_comes_leaves_the_follower_its_own_with_a_warning():
    _, follower, said = pair(timeout=0.05)
    assert follower.agree("train", 5, 6, True) is True
    assert follower.agree("train", 6, 6, False) is False
    assert len(said) == 2 and "did not come within 0.05 s" in said[0]  # (the callback's warn_once shows one)


def test_a_single_process_has_none():
    assert SharedVerdicts.open(0, lambda key, message: None) is None
