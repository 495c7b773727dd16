"""
What watching torch.compile costs
=================================

``PerfCallback`` counts what ``torch.compile`` does (``lightning_perf.collect.compile.CompileWatch``): torch
calls it at each compile's start and end, and its log handler at each graph break. Nothing of it runs per
batch; this measures what it adds to compiling: the wall time of compiling a function that recompiles and
breaks its graph, with the watch installed and without, in alternating rounds. It is the process's CPU time
(compiling is single-threaded Python), which a busy machine disturbs less than the wall clock.

Run it from the repository root::

    OMP_NUM_THREADS=1 python benchmarks/compile_watch_cost.py --rounds 5 --backend aot_eager
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from lightning_perf.collect.compile import CompileSite, CompileWatch


def compile_seconds(backend: str, *, watched: bool, recompiles: int) -> float:
    """CPU seconds to compile (and first run) an MLP whose forward breaks its graph at ``.item()`` and recompiles
    for each of ``recompiles`` Python ints."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))

    def forward(x: torch.Tensor, depth: int) -> torch.Tensor:
        for _ in range(depth):
            x = model(x)
        if x.mean().item() > 1e9:  # a graph break
            x = x * 0.5
        return x

    compiled = torch.compile(forward, backend=backend)
    watch = CompileWatch(lambda: CompileSite("train", 0))
    if watched:
        watch.install()
    x = torch.randn(8, 64)
    start = time.process_time()
    with torch._dynamo.config.patch(recompile_limit=recompiles + 2):
        for depth in range(1, recompiles + 2):
            compiled(x, depth).sum().backward()
    seconds = time.process_time() - start
    if watched:
        stats = watch.take("train")
        assert stats is not None and stats.recompiles == recompiles, stats
        watch.uninstall()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--recompiles", type=int, default=5)
    parser.add_argument("--backend", default="aot_eager")
    args = parser.parse_args()
    compile_seconds(args.backend, watched=False, recompiles=1)  # imports and first-use costs, in neither
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for watched in (False, True):
            times[watched].append(compile_seconds(args.backend, watched=watched, recompiles=args.recompiles))
    for watched, label in ((False, "without the watch"), (True, "with the watch")):
        shown = ", ".join(f"{t:.3f}" for t in times[watched])
        print(f"{label:18} median {statistics.median(times[watched]):.3f} CPU s  ({shown})")
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    print(f"with / without: {ratio:.3f} ({args.backend}, {args.recompiles} recompiles, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
