"""The empty_cache counter's install and uninstall, with other wrappers of ``torch.cuda.empty_cache`` around."""

from __future__ import annotations

import torch

from lightning_perf.collect.empty_cache import EmptyCacheCounter


def test_a_wrapper_put_over_ours_between_two_calls_makes_no_loop():
    # Another tool wraps torch.cuda.empty_cache while ours is installed (its wrapper calls ours); ours stays theirs
    # at the call's end; the next call installs ours again. Ours must not call theirs back (a second copy of this
    # package, benchmarks/epoch_ab.py's, did that: RecursionError at the first call).
    original = torch.cuda.empty_cache
    counter = EmptyCacheCounter()
    try:
        counter.install()
        ours = torch.cuda.empty_cache
        theirs_calls = []

        def theirs():
            theirs_calls.append(1)
            return ours()

        torch.cuda.empty_cache = theirs
        counter.uninstall()
        assert torch.cuda.empty_cache is theirs  # theirs stays
        counter.install()
        counter.reset()
        torch.cuda.empty_cache()  # CPU-only: torch's own call does nothing; ours counts it
        assert counter.calls == 1
        counter.uninstall()
    finally:
        torch.cuda.empty_cache = original
