"""
Overhead benchmark
==================

What :class:`~lightning_perf.PerfCallback` costs a training run, next to a bare Trainer and to Lightning's
own ``PyTorchProfiler``, on a small CPU model (9 x Linear(256, 256) + ReLU, batch 64, SGD).

Three configurations run interleaved in one process, round-robin (a, b, c, a, b, c, ...), each run a fresh
Trainer and model doing ``--steps`` optimizer steps in one epoch:

    (a) a bare Trainer;
    (b) ``Trainer(callbacks=[PerfCallback()])``: its default schedule, one window per epoch
        (skip 5 batches, warm up 1, record 1);
    (c) ``Trainer(profiler=PyTorchProfiler(...))``: its default schedule
        (``torch.profiler.schedule(wait=1, warmup=1, active=3)``), one window per run.

A timing callback, first in the callback list, reads ``time.perf_counter()`` at every
``on_train_batch_start``: the step of batch ``i`` is the time from its ``on_train_batch_start`` to batch
``i + 1``'s (data fetch, forward, backward, optimizer step and every callback hook). The last batch of a run
has no next start, so it has no step time.

Run it from the repository root (Kineto prints a few ``USDT ... profiler_start/stop`` lines on stderr)::

    python benchmarks/overhead.py                      # 5 rounds of 120 steps: under a minute on 2 idle cores
    python benchmarks/overhead.py --rounds 10 --steps 300 --threads 1

Reading the output:

* ``median step outside windows``: each configuration's median step, pooled over rounds, over the steps no
  profiler window touches. Left out in every run: its first 5 steps (the run's own warm-up). Left out for
  (b): each window from the step before its warm-up (where ``on_train_batch_end`` prepares the profiler)
  to the step after its last recorded batch. Left out for (c): batches 0 to 6 (wait 1, warm-up 1,
  active 3, and the steps around the close).
* ``(b)/(a)``, ``(c)/(a)``: ratio of the pooled medians; 1.00 is no overhead outside windows. The
  ``per-round`` range (min..max over rounds of the ratio of that round's medians) shows the noise.
* ``other load``: the CPU time other processes used during the runs, as a share of all CPUs (Linux
  ``/proc/stat``). Above a few % the step times are disturbed: trust the ratios only as far as the per-round
  ranges agree.
* ``stall at window close``: what the training thread loses when a window ends. For (b) the callback's own
  measure, ``WindowRecord.close_seconds`` (stopping the profiler, torch's trace export; the rest runs on a
  background thread, and what it takes from training shows in the steps after the close), and
  the extra time of the step whose ``on_train_batch_end`` closed the window (the window's ``last_batch``)
  over its run's median. For (c) the extra time of the step in which Lightning stops its profiler and
  exports the trace: batch 4 (Lightning steps the profiler at the end of each ``training_step``; the
  transition out of its last recorded step, RECORD_AND_SAVE -> NONE, comes at the end of batch 4's).
  ``all window steps`` adds up the extra time of every step a window touches (for (c) that includes
  batch 0, slower in every configuration).
* ``median step by batch``: the median over rounds of each early batch's step, to see where each
  configuration pays.
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
from machine import cpu_busy_seconds

CONFIGS = ("a", "b", "c")
LABELS = {"a": "bare Trainer", "b": "PerfCallback()", "c": "PyTorchProfiler()"}

WIDTH = 256
LAYERS = 9
BATCH_SIZE = 64
RUN_WARMUP = 5  # first steps of every run, left out of the medians in every configuration
EARLY_BATCHES = 12  # batches shown in the per-batch table

# Lightning's PyTorchProfiler default: torch.profiler.schedule(wait=1, warmup=1, active=3), once per run.
PT_WAIT, PT_WARMUP, PT_ACTIVE = 1, 1, 3
PT_CLOSE_BATCH = PT_WAIT + PT_WARMUP + PT_ACTIVE - 1  # step in which the trace is stopped and exported
PT_WINDOW = range(PT_WAIT + PT_WARMUP + PT_ACTIVE + 2)  # batches 0..6: every step its window can touch


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
        n = self.num_batches * BATCH_SIZE  # one epoch covers every step: one PerfCallback window per run
        data = TensorDataset(torch.randn(n, WIDTH, generator=g), torch.randn(n, WIDTH, generator=g))
        return DataLoader(data, batch_size=BATCH_SIZE)


class StepTimer(Callback):
    """Step time of each batch: from its ``on_train_batch_start`` to the next batch's."""

    def __init__(self) -> None:
        self.steps: dict[int, float] = {}
        self._last: tuple[int, float] | None = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
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
    other_load: float | None = None  # share of all CPUs other processes used during the run
    window_batches: list[range] = field(default_factory=list)  # steps each window touches
    close_batches: list[int] = field(default_factory=list)  # the step in which each window closed
    close_seconds: list[float] = field(default_factory=list)  # (b): WindowRecord.close_seconds

    @property
    def outside(self) -> list[float]:
        return [t for i, t in self.steps.items() if i not in self.excluded]

    @property
    def median(self) -> float:
        return statistics.median(self.outside)

    def extra(self, batches: range | Sequence[int]) -> float:
        """Time the steps of ``batches`` took beyond this run's median step."""
        return sum(self.steps[i] - self.median for i in batches if i in self.steps)


def make_trainer(config: str, root: str, steps: int, timer: StepTimer) -> tuple[pl.Trainer, PerfCallback | None]:
    callbacks: list[Callback] = [timer]  # first: its time stamp comes before every other hook of the batch
    perf = PerfCallback() if config == "b" else None
    if perf is not None:
        callbacks.append(perf)
    profiler = PyTorchProfiler(dirpath=root, filename="prof") if config == "c" else None
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
    """One fresh Trainer of ``config`` on a fresh model (same seed, same data every time)."""
    gc.collect()  # every run starts from the same heap, whatever the previous run left behind
    torch.manual_seed(0)
    model = MLP(num_batches=steps)
    timer = StepTimer()
    busy0, cpu0, wall0 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lp-overhead-") as root:
        trainer, perf = make_trainer(config, root, steps, timer)
        trainer.fit(model)
    busy1, cpu1, wall1 = cpu_busy_seconds(), time.process_time(), time.perf_counter()

    run = Run(config=config, round=round_, steps=timer.steps, excluded=set(range(RUN_WARMUP)))
    if busy0 is not None and busy1 is not None:
        other = (busy1 - busy0) - (cpu1 - cpu0)
        run.other_load = max(0.0, other / ((wall1 - wall0) * (os.cpu_count() or 1)))
    if perf is not None:
        warmup = perf.config.schedule.warmup
        for w in perf.windows:
            # on_train_batch_end of the batch before the warm-up prepares the profiler; the close runs in
            # on_train_batch_end of last_batch; the step after it may still pay (caches, garbage).
            run.window_batches.append(range(w.first_batch - warmup - 1, w.last_batch + 2))
            run.close_batches.append(w.last_batch)
            run.close_seconds.append(w.close_seconds)
    elif config == "c":
        run.window_batches.append(PT_WINDOW)
        run.close_batches.append(PT_CLOSE_BATCH)
    for touched in run.window_batches:
        run.excluded.update(touched)
    return run


# ---------------------------------------------------------------------- reporting


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def pooled_median(runs: Sequence[Run]) -> float:
    return statistics.median(t for run in runs for t in run.outside)


def print_header(args: argparse.Namespace) -> None:
    print(f"torch {torch.__version__}, lightning {lightning.__version__}")
    print(f"CPUs: {os.cpu_count()}, torch threads: {torch.get_num_threads()}")
    print(
        f"model: {LAYERS} x Linear({WIDTH}, {WIDTH}) + ReLU, batch {BATCH_SIZE}, SGD;"
        f" {args.rounds} rounds x {len(CONFIGS)} configs x {args.steps} steps, interleaved"
    )
    print()


def print_medians(by_config: dict[str, list[Run]]) -> None:
    medians = {c: pooled_median(runs) for c, runs in by_config.items()}
    print("median step outside windows (pooled over rounds)")
    for c, runs in by_config.items():
        n = sum(len(run.outside) for run in runs)
        line = f"  ({c}) {LABELS[c]:<18} {ms(medians[c])}   ({n} steps)"
        if c != "a":
            per_round = [run.median / base.median for run, base in zip(runs, by_config["a"], strict=True)]
            ratio = medians[c] / medians["a"]
            line += f"   ({c})/(a): {ratio:.3f}   per-round: {min(per_round):.3f}..{max(per_round):.3f}"
        print(line)
    print()
    print("per round: median step outside windows, ratios, other processes' CPU load")
    print("  round       (a)       (b)       (c)   (b)/(a)   (c)/(a)   other load")
    for r, (a, b, c) in enumerate(zip(*by_config.values(), strict=True)):
        loads = [run.other_load for run in (a, b, c) if run.other_load is not None]
        load = f"{100 * statistics.mean(loads):5.1f} %" if loads else "    n/a"
        print(
            f"  {r:5d} {a.median * 1e3:9.3f} {b.median * 1e3:9.3f} {c.median * 1e3:9.3f}"
            f" {b.median / a.median:9.3f} {c.median / a.median:9.3f}   {load}"
        )
    all_loads = [run.other_load for runs in by_config.values() for run in runs if run.other_load is not None]
    if all_loads and max(all_loads) > 0.05:
        worst = 100 * max(all_loads)
        print(f"  note: other processes used up to {worst:.0f} % of the CPUs during a run; step times are disturbed")
    print()


def print_stalls(by_config: dict[str, list[Run]]) -> None:
    print("stall at window close (median over rounds; extra = beyond the run's own median step)")
    b_runs, c_runs = by_config["b"], by_config["c"]
    close_seconds = [s for run in b_runs for s in run.close_seconds]
    b_batches = sorted({i for run in b_runs for i in run.close_batches})
    b_touched = sorted({i for run in b_runs for w in run.window_batches for i in w})
    b_close = statistics.median(run.extra(run.close_batches) for run in b_runs)
    b_all = statistics.median(run.extra([i for w in run.window_batches for i in w]) for run in b_runs)
    print(f"  (b) WindowRecord.close_seconds                 {ms(statistics.median(close_seconds))}")
    print(f"  (b) closing step (batch {_span(b_batches)}), extra            {ms(b_close)}")
    print(f"  (b) all window steps (batches {_span(b_touched)}), extra   {ms(b_all)}")

    c_close = statistics.median(run.extra(run.close_batches) for run in c_runs)
    c_all = statistics.median(run.extra(PT_WINDOW) for run in c_runs)
    slowest = Counter(max(PT_WINDOW[1:], key=run.steps.__getitem__) for run in c_runs)
    where = ", ".join(f"batch {i} in {n} of {len(c_runs)} runs" for i, n in slowest.most_common())
    print(f"  (c) closing step (batch {PT_CLOSE_BATCH}), extra            {ms(c_close)}")
    print(f"  (c) all window steps (batches {_span(PT_WINDOW)}), extra   {ms(c_all)}")
    print(f"  (c) slowest of batches 1..{PT_WINDOW[-1]}: {where}")
    print()


def print_early_batches(by_config: dict[str, list[Run]]) -> None:
    print("median step by batch over rounds (ms); slowest step of each run (batch: ms)")
    print("  batch  " + " ".join(f"{i:6d}" for i in range(EARLY_BATCHES)))
    for c, runs in by_config.items():
        cells = []
        for i in range(EARLY_BATCHES):
            times = [run.steps[i] for run in runs if i in run.steps]
            cells.append(f"{statistics.median(times) * 1e3:6.1f}" if times else "     -")
        slowest = [max(run.steps, key=run.steps.__getitem__) for run in runs]
        worst = "  ".join(f"{i}: {run.steps[i] * 1e3:.1f}" for i, run in zip(slowest, runs, strict=True))
        print(f"  ({c})    " + " ".join(cells) + f"   slowest: {worst}")
    print()


def _span(batches: Sequence[int]) -> str:
    return f"{batches[0]}..{batches[-1]}" if len(batches) > 1 else ",".join(map(str, batches))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="PerfCallback overhead next to a bare Trainer and Lightning's PyTorchProfiler.",
        epilog="See the module docstring for how to read the output.",
    )
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds of (a), (b), (c) (default: 5)")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps per run, in one epoch (default: 120)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.steps < 20:
        parser.error("--steps must be >= 20: the run warm-up and the windows take the first 10 steps")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    return args


def quiet() -> None:
    """Only Lightning's warnings and errors; none about data loader workers on a tiny in-memory data set."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print_header(args)
    by_config: dict[str, list[Run]] = {c: [] for c in CONFIGS}
    start = time.perf_counter()
    for r in range(args.rounds):
        for c in CONFIGS:
            by_config[c].append(run_once(c, r, args.steps))
    elapsed = time.perf_counter() - start
    print_medians(by_config)
    print_stalls(by_config)
    print_early_batches(by_config)
    print(f"total time: {elapsed:.1f} s")


if __name__ == "__main__":
    main()
