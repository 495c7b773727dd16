"""
A compiled model after a FLOP count
===================================

Whether counting a batch's FLOPs (``lightning_perf.collect.flops.BatchFlopCounter``, what ``PerfCallback``
does once per run) leaves a ``torch.compile``'d model slower: its step time after a count against the same
model's without one, per backend, in alternating rounds.

Run it from the repository root::

    OMP_NUM_THREADS=1 python benchmarks/compiled_after_count.py aot_eager inductor
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

from lightning_perf.collect.flops import BatchFlopCounter


def step_ms(backend: str, *, count: bool, steps: int = 300) -> float:
    """Milliseconds per forward and backward of a compiled MLP, after a FLOP count or not."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(64, 256)

    def step() -> None:
        compiled(x).sum().backward()

    step()  # compiles
    if count:
        counter = BatchFlopCounter()
        counter.start(x)
        step()
        counter.stop()
    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    for backend in sys.argv[1:] or ["aot_eager"]:
        for r in range(3):
            without, after = step_ms(backend, count=False), step_ms(backend, count=True)
            print(f"{backend} round {r}: without a count {without:.3f} ms/step, after a count {after:.3f} ms/step")


if __name__ == "__main__":
    main()
