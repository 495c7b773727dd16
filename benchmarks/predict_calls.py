"""
Many short Trainer calls
========================

What :class:`~lightning_perf.PerfCallback` costs a loop of short ``Trainer.predict`` calls, one new ``Trainer``
each, as forecasting libraries make them (one ``predict`` per forecast, the user's callbacks deep-copied into
every Trainer). Such a call is too short for the default schedule's window (skip 5 batches, warm up 1, record
3), so what it costs is the callback's fixed cost per call: setup, the epoch's summary and findings, the report
at the end, and what it writes.

A tiny MLP (Linear(16, 32) + ReLU + Linear(32, 1)) predicts ``--batches`` batches of 4 in each call; torch runs
on one thread. Each round makes ``--calls`` calls of each configuration, alternated call by call (the order of
the two swapped every round), each with a new ``Trainer`` (the default logger, TensorBoard, unless
``--logger none``; progress bar and model summary off) under a fresh directory:

    (a) a bare Trainer;
    (b) ``PerfCallback()``: its defaults; no window opens in a call this short.

One uncounted call of each comes first, so that lazy imports and first calls land in neither.

Run it from the repository root (``PYTHONPATH=.``: the checkout's package, not an installed one)::

    PYTHONPATH=. python benchmarks/predict_calls.py                 # 20 calls of 2 batches, 5 rounds
    PYTHONPATH=. python benchmarks/predict_calls.py --rounds 3 --logger none

Reading the output:

* ``per call``: the median wall time of one call (``Trainer(...)`` and ``predict``) over every round, with the
  min..max of each round's median.
* ``(b)/(a)``: each round's total time of (b)'s calls over (a)'s, as median and min..max over the rounds: the
  figure to hold to (1.25x at most).
* ``written per call``: the files and bytes one call of (b) leaves in its output directory (``perf/``), median
  over the calls.
* ``other load``: the CPU time other processes used during the rounds, as a share of all CPUs; above a few %
  the figures are disturbed.

Figures (docs/cost.md, "Many short Trainer calls"): on the project's 2-core machine, 5 rounds, (b)/(a) was 5.08x
(4.44-5.30) with 4.8 MB written per call before issue 29's changes (82342be), and 1.22x (1.15-1.44) with
9.4 kB after.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import tempfile
import time
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from machine import cpu_busy_seconds

BATCH_SIZE = 4
OTHER_LOAD_NOTE = 0.05  # above this share of the CPUs used by other processes, the timings are flagged


class Tiny(pl.LightningModule):
    """A two-layer MLP; its ``predict_step`` is one forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def predict_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])


def loader(batches: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(batches * BATCH_SIZE, 16, generator=g)), batch_size=BATCH_SIZE)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def one_call(
    model: Tiny, data: DataLoader, root: str, *, perf: bool, logger: bool, clock: str = "wall"
) -> tuple[float, str | None]:
    """One ``Trainer`` and its ``predict``: the seconds both took (``clock``: wall time, or this process's CPU
    time, which another program's load moves less), and the callback's output directory."""
    callback = PerfCallback() if perf else None
    now = CLOCKS[clock]
    start = now()
    trainer = pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback] if callback is not None else [],
    )
    trainer.predict(model, dataloaders=data)
    return now() - start, None if callback is None else callback.dirpath


def written(dirpath: str | None) -> tuple[int, int]:
    """The files under ``dirpath`` and their bytes."""
    files = [os.path.join(d, f) for d, _, names in os.walk(dirpath or os.devnull) for f in names]
    return len(files), sum(os.path.getsize(f) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20, help="calls of each configuration per round")
    parser.add_argument("--batches", type=int, default=2, help="batches per call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--logger", choices=("tensorboard", "none"), default="tensorboard")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall", help="cpu: this process's CPU time")
    args = parser.parse_args()

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # the per-call banners and our report lines
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    model, data, logger = Tiny(), loader(args.batches), args.logger == "tensorboard"
    times: dict[bool, list[list[float]]] = {False: [], True: []}
    sizes: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        counter = iter(range(10**9))
        for perf in (False, True):  # uncounted
            one_call(model, data, os.path.join(tmp, str(next(counter))), perf=perf, logger=logger)
        busy0, wall0, cpu0 = cpu_busy_seconds(), time.perf_counter(), time.process_time()
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for perf in order:
                times[perf].append([])
            for _ in range(args.calls):
                for perf in order:
                    seconds, dirpath = one_call(
                        model, data, os.path.join(tmp, str(next(counter))), perf=perf, logger=logger, clock=args.clock
                    )
                    times[perf][-1].append(seconds)
                    if perf:
                        sizes.append(written(dirpath))
        busy1, wall1, cpu1 = cpu_busy_seconds(), time.perf_counter(), time.process_time()

    def per_call(perf: bool) -> str:
        medians = [statistics.median(r) for r in times[perf]]
        pooled = statistics.median(s for r in times[perf] for s in r)
        return f"{pooled * 1e3:7.1f} ms  ({min(medians) * 1e3:.1f}..{max(medians) * 1e3:.1f})"

    ratios = [sum(b) / sum(a) for a, b in zip(times[False], times[True], strict=True)]
    files = statistics.median(n for n, _ in sizes)
    size = statistics.median(b for _, b in sizes)
    print(
        f"{args.rounds} rounds x {args.calls} calls of {args.batches} batches, logger={args.logger}, {args.clock} time"
    )
    print(f"  (a) bare Trainer      per call {per_call(False)}")
    print(f"  (b) PerfCallback()    per call {per_call(True)}")
    print(f"  (b)/(a)               {statistics.median(ratios):.2f}x  ({min(ratios):.2f}..{max(ratios):.2f})")
    print(f"  written per call      {files:g} files, {size / 1e3:.1f} kB")
    if busy0 is not None and busy1 is not None:
        other = max(busy1 - busy0 - (cpu1 - cpu0), 0.0) / ((wall1 - wall0) * (os.cpu_count() or 1))
        note = "  (timings disturbed)" if other > OTHER_LOAD_NOTE else ""
        print(f"  other load            {other:.0%}{note}")


if __name__ == "__main__":
    main()
