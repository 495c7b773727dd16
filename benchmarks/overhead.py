"""
Overhead benchmark
==================

What :class:`~lightning_perf.PerfCallback` costs a training run, next to a bare Trainer and to Lightning's
own ``PyTorchProfiler``, on a small CPU model (a 9-layer 256-wide MLP, batch 64, SGD).

Three configurations run interleaved in one process, round-robin (a, b, c, a, b, c, ...), each run a fresh
Trainer doing ``--steps`` optimizer steps in one epoch:

    (a) a bare Trainer;
    (b) ``Trainer(callbacks=[PerfCallback()])``: default schedule, one window per epoch
        (skip 5 batches, warm up 1, record 3);
    (c) ``Trainer(profiler=PyTorchProfiler(...))``: its default schedule
        (``torch.profiler.schedule(wait=1, warmup=1, active=3)``), one window per run.

A timing callback placed first in the callback list takes ``time.perf_counter()`` at every
``on_train_batch_start``; the step of batch ``i`` is the time from its ``on_train_batch_start`` to that of
batch ``i + 1``: data fetch, forward, backward, optimizer step and every callback hook. The last batch of a
run has no next start, so it has no step time.

Run it from the repository root::

    python benchmarks/overhead.py                  # 5 rounds of 120 steps, about a minute on 2 cores
    python benchmarks/overhead.py --rounds 10 --steps 300

Reading the output:

* ``median step outside windows``: the median step time of each configuration, pooled over rounds, over the
  steps that no profiler window touches. Left out: the first 5 steps of every run (the run's own warm-up);
  for (b) each window's warm-up batches, its recorded batches and the batch after it; for (c) batches
  0 to 6 (wait 1, warm-up 1, active 3, and the steps around the close).
* ``ratio to (a)``: pooled median over the bare Trainer's; 1.00 means no overhead outside windows. The
  ``per-round`` range (min..max of the ratio of each round's medians) shows the noise: a pooled ratio inside
  it is no measurable difference.
* ``stall at window close``: what the training thread loses when a window ends. For (b) the callback's own
  ``WindowRecord.close_seconds`` (stop the profiler, export the trace, build the operator table) and the
  extra time of the step in which the window closed; for (c) the extra time of its slowest step in
  batches 1..6 (where its window is stopped and exported), and the batch it fell on.
* ``whole window``: the extra time of all steps a window touches (warm-up to close), over the median step.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback

CONFIGS = ("a", "b", "c")
LABELS = {"a": "bare Trainer", "b": "PerfCallback()", "c": "PyTorchProfiler()"}

WIDTH = 256
LAYERS = 9
BATCH_SIZE = 64
RUN_WARMUP = 5  # first steps of every run left out of the medians, in every configuration

# Lightning's PyTorchProfiler default: torch.profiler.schedule(wait=1, warmup=1, active=3), one cycle per run.
PT_WAIT, PT_WARMUP, PT_ACTIVE = 1, 1, 3
PT_WINDOW_END = PT_WAIT + PT_WARMUP + PT_ACTIVE + 1  # last batch (inclusive) its window can touch


class MLP(pl.LightningModule):
    """``LAYERS`` x (Linear(WIDTH, WIDTH) + ReLU) on random in-memory data, SGD."""

    def __init__(self, num_batches: int) -> None:
        super().__init__()
        self.num_batches = num_batches
        self.net = nn.Sequential(*(m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        n = self.num_batches * BATCH_SIZE
        data = TensorDataset(torch.randn(n, WIDTH, generator=g), torch.randn(n, WIDTH, generator=g))
        return DataLoader(data, batch_size=BATCH_SIZE)


class StepTimer(Callback):
    """Step time of each batch: from its ``on_train_batch_start`` to the next batch's."""

    def __init__(self) -> None:
        self.steps: dict[int, float] = {}
        self._last: tuple[int, float] | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last is not None:
            prev_idx, prev_t = self._last
            self.steps[prev_idx] = now - prev_t
        self._last = (batch_idx, now)


@dataclass
class Run:
    """One Trainer run of one configuration: its step times and which batches the medians leave out."""

    config: str
    round: int
    steps: dict[int, float]
    excluded: set[int]
    close_seconds: list[float] = field(default_factory=list)  # (b): WindowRecord.close_seconds
    close_batches: list[int] = field(default_factory=list)  # (b): the batch whose step closed a window
    window_batches: list[range] = field(default_factory=list)  # batches each window touches, warm-up to close

    @property
    def outside(self) -> list[float]:
        return [t for i, t in self.steps.items() if i not in self.excluded]

    @property
    def median(self) -> float:
        return statistics.median(self.outside)


def make_trainer(config: str, root: str, steps: int, timer: StepTimer) -> tuple[pl.Trainer, PerfCallback | None]:
    callbacks: list[Callback] = [timer]  # first: its start time comes before every other hook of the batch
    perf = None
    profiler = None
    if config == "b":
        perf = PerfCallback()
        callbacks.append(perf)
    elif config == "c":
        profiler = PyTorchProfiler(dirpath=root, filename="prof")
    trainer = pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=1,
        callbacks=callbacks,
        profiler=profiler,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    return trainer, perf


def run_once(config: str, round_: int, steps: int) -> Run:
    """One fresh Trainer of ``config`` on a fresh model (same seed every time)."""
    gc.collect()  # every run starts from the same heap, whatever the previous run left behind
    torch.manual_seed(0)
    model = MLP(num_batches=steps)
    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="lp-overhead-") as root:
        trainer, perf = make_trainer(config, root, steps, timer)
        trainer.fit(model)
    run = Run(config=config, round=round_, steps=timer.steps, excluded=set(range(RUN_WARMUP)))
    if perf is not None:
        warmup = perf.config.schedule.warmup
        for w in perf.windows:
            touched = range(w.first_batch - warmup, w.last_batch + 2)  # warm-up .. the batch after the close
            run.window_batches.append(touched)
            run.excluded.update(touched)
            run.close_seconds.append(w.close_seconds)
            run.close_batches.append(w.last_batch)
    elif config == "c":
        touched = range(0, PT_WINDOW_END + 1)
        run.window_batches.append(touched)
        run.excluded.update(touched)
    return run


# ---------------------------------------------------------------------- reporting


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def pooled_median(runs: Sequence[Run]) -> float:
    return statistics.median(t for run in runs for t in run.outside)


def window_extra(run: Run, median: float) -> float:
    """Extra time over ``median`` of all steps the run's windows touch."""
    return sum(run.steps[i] - median for touched in run.window_batches for i in touched if i in run.steps)


def print_header(args: argparse.Namespace) -> None:
    print(f"torch {torch.__version__}, lightning {lightning.__version__}, lightning_perf (this checkout)")
    print(f"CPUs: {os.cpu_count()}, torch threads: {torch.get_num_threads()}")
    print(
        f"model: {LAYERS} x Linear({WIDTH}, {WIDTH}) + ReLU, batch {BATCH_SIZE}, SGD;"
        f" {args.rounds} rounds x {len(CONFIGS)} configs x {args.steps} steps, interleaved"
    )
    print()


def print_medians(by_config: dict[str, list[Run]]) -> dict[str, float]:
    medians = {c: pooled_median(runs) for c, runs in by_config.items()}
    print("median step outside windows (pooled over rounds)")
    for c, runs in by_config.items():
        n = sum(len(run.outside) for run in runs)
        line = f"  ({c}) {LABELS[c]:<18} {ms(medians[c])}   ({n} steps)"
        if c != "a":
            per_round = [run.median / base.median for run, base in zip(runs, by_config["a"])]
            line += (
                f"   ratio to (a): {medians[c] / medians['a']:.3f}"
                f"   per-round: {min(per_round):.3f}..{max(per_round):.3f}"
            )
        print(line)
    print("  per-round medians:")
    for c, runs in by_config.items():
        print(f"    ({c}) " + " ".join(f"{run.median * 1e3:7.3f}" for run in runs) + "  ms")
    print()
    return medians


def print_stalls(by_config: dict[str, list[Run]], medians: dict[str, float]) -> None:
    print("stall at window close (median over rounds)")
    b_runs, c_runs = by_config["b"], by_config["c"]

    close_seconds = [s for run in b_runs for s in run.close_seconds]
    close_steps = [run.steps[i] - medians["b"] for run in b_runs for i in run.close_batches if i in run.steps]
    b_extra = [window_extra(run, medians["b"]) for run in b_runs]
    closed_at = sorted({i for run in b_runs for i in run.close_batches})
    print(f"  (b) WindowRecord.close_seconds       {ms(statistics.median(close_seconds))}")
    print(f"  (b) closing step (batch {','.join(map(str, closed_at))}) - median {ms(statistics.median(close_steps))}")
    print(f"  (b) whole window, warm-up to close  {ms(statistics.median(b_extra))}")

    # Which step carries (c)'s close is not documented; take its slowest step past batch 0, and show where it fell.
    slowest = [max(range(1, PT_WINDOW_END + 1), key=lambda i: run.steps[i]) for run in c_runs]
    c_steps = [run.steps[i] - medians["c"] for run, i in zip(c_runs, slowest)]
    c_extra = [window_extra(run, medians["c"]) for run in c_runs]
    where = ", ".join(f"batch {i}: {n}x" for i, n in sorted(Counter(slowest).items()))
    print(f"  (c) slowest step of batches 1..{PT_WINDOW_END} - median {ms(statistics.median(c_steps))}   ({where})")
    print(f"  (c) whole window, batches 0..{PT_WINDOW_END}     {ms(statistics.median(c_extra))}")
    print()


def print_slowest(by_config: dict[str, list[Run]], medians: dict[str, float]) -> None:
    print("slowest step of each run (batch: ms), and its steps around the window")
    for c, runs in by_config.items():
        cells = []
        for run in runs:
            i = max(run.steps, key=run.steps.__getitem__)
            cells.append(f"{i}: {run.steps[i] * 1e3:.1f}")
        print(f"  ({c}) " + "   ".join(cells))
    for c in ("b", "c"):
        run = by_config[c][0]
        last = max(run.steps) if not run.window_batches else max(max(t) for t in run.window_batches) + 1
        shown = " ".join(f"{i}:{run.steps[i] * 1e3:.1f}" for i in range(0, last + 1) if i in run.steps)
        print(f"  ({c}) round 0, batches 0..{last}: {shown}")
    print()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds of (a), (b), (c) (default: 5)")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps per run, one epoch (default: 120)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.steps < 20:
        parser.error("--steps must be >= 20: the windows and the run warm-up take the first 10 steps")
    return args


def quiet() -> None:
    """Only warnings and errors from Lightning; none about data loader workers on this tiny in-memory set."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    quiet()
    print_header(args)
    by_config: dict[str, list[Run]] = {c: [] for c in CONFIGS}
    start = time.perf_counter()
    for r in range(args.rounds):
        for c in CONFIGS:
            by_config[c].append(run_once(c, r, args.steps))
    elapsed = time.perf_counter() - start
    medians = print_medians(by_config)
    print_stalls(by_config, medians)
    print_slowest(by_config, medians)
    print(f"total time: {elapsed:.1f} s")


if __name__ == "__main__":
    main()
