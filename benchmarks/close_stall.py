"""
Window-close stall on a realistic model
=======================================

What the training thread loses when a profiler window ends, on the model of the Lightning-Hydra template's
MNIST example (``SimpleDenseNet``: 784-256-256-256-10 with BatchNorm and ReLU, Adam, batch 64, a
``torchmetrics`` ``Accuracy`` and ``MeanMetric`` updated and logged every step), on random in-memory
MNIST-shaped data, next to Lightning's ``PyTorchProfiler`` recording a window of the same size.

Two configurations run interleaved, round-robin, each run a fresh Trainer and model:

    (perf) ``PerfCallback(stages=["train"])``: its default schedule (skip 5 batches, warm up 1, record 3),
           one window per epoch, ``--epochs`` epochs;
    (pt)   ``Trainer(profiler=PyTorchProfiler(schedule=torch.profiler.schedule(wait=1, warmup=1,
           active=3)))``: Lightning's default schedule, one window per run (it records each stage once).

A timing callback, first in the callback list, reads ``time.perf_counter()`` at every
``on_train_batch_start``; the step of batch ``i`` runs from its ``on_train_batch_start`` to batch ``i + 1``'s.

Run it from the repository root::

    python benchmarks/close_stall.py                          # 3 rounds: about 15 s on 2 idle cores
    python benchmarks/close_stall.py --rounds 5 --threads 1   # the README's figures
    python benchmarks/close_stall.py --device-wait-ms 10      # + a 10 ms GIL-free wait in every step, as on a GPU

Reading the output, per window close (medians over windows, and their range):

* ``stall``: the training thread's stall at the close, timed directly. For (perf): ``PerfCallback``'s own
  ``on_train_batch_end`` of the batch that closes the window (two timing callbacks around it). For (pt):
  the ``torch.profiler.profile.step()`` call in which Lightning stops its profiler and exports the trace
  (the call that runs ``on_trace_ready``).
* ``closing step``: the step of the closing batch beyond the run's median step outside windows (the stall
  plus whatever else that step lost).
* ``next steps``: the extra time, beyond the run's median step, of the steps after the closing one up to
  the end of the epoch: what work left running in the background takes from training (CPU cores, the GIL).
* ``closing + next steps``: the two above together, what a window's close costs training in all.
* ``background job``: how long the window worker took over the window (read the export back, write the
  trace, the operator table, the record), on its own thread.
* ``epoch end``: ``PerfCallback``'s ``on_train_epoch_end`` (two timing callbacks around it), which waits
  for the window's post-processing if it has not finished yet.
* ``trace``: the size of a window's trace file on disk (PerfCallback's is gzipped, Lightning's is not).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings
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
from torchmetrics import MeanMetric
from torchmetrics.classification import Accuracy

from lightning_perf import PerfCallback

BATCH_SIZE = 64
RUN_WARMUP = 5  # first steps of every epoch, left out of the medians
# Lightning's PyTorchProfiler default: torch.profiler.schedule(wait=1, warmup=1, active=3), once per run; its
# schedule counts training steps from 1, so it records batches 2-4 and exports in batch 4's training_step.
PT_WAIT, PT_WARMUP, PT_ACTIVE = 1, 1, 3
PT_CLOSE_BATCH = PT_WAIT + PT_WARMUP + PT_ACTIVE - 1


class SimpleDenseNet(nn.Module):
    """The Lightning-Hydra template's ``SimpleDenseNet`` (its defaults: three hidden layers of 256)."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(28 * 28, width), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Linear(width, 10),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.view(x.size(0), -1))


class MNISTLitModule(pl.LightningModule):
    """The template's ``MNISTLitModule`` training side: cross-entropy, Adam, metrics updated and logged every step."""

    def __init__(self, num_batches: int, width: int = 256, wait_s: float = 0.0) -> None:
        super().__init__()
        self.num_batches = num_batches
        self.wait_s = wait_s
        self.net = SimpleDenseNet(width)
        self.criterion = nn.CrossEntropyLoss()
        self.train_acc = Accuracy(task="multiclass", num_classes=10)
        self.train_loss = MeanMetric()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        loss = self.criterion(logits, y)
        preds = torch.argmax(logits, dim=1)
        self.train_loss(loss)
        self.train_acc(preds, y)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        if self.wait_s:
            time.sleep(self.wait_s)  # --device-wait-ms: the training thread waits without the GIL, as on a GPU
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.001)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        n = self.num_batches * BATCH_SIZE
        x = torch.rand(n, 1, 28, 28, generator=g).sub_(0.1307).div_(0.3081)  # MNIST's normalization
        return DataLoader(TensorDataset(x, torch.randint(0, 10, (n,), generator=g)), batch_size=BATCH_SIZE)


class StepTimer(Callback):
    """Step time of each batch, from its ``on_train_batch_start`` to the next one's, per epoch."""

    def __init__(self) -> None:
        self.steps: dict[tuple[int, int], float] = {}
        self._last: tuple[tuple[int, int], float] | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last is not None and self._last[0][0] == trainer.current_epoch:
            self.steps[self._last[0]] = now - self._last[1]
        self._last = ((trainer.current_epoch, batch_idx), now)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._last = None  # the epoch end is not the last batch's step


class Sandwich(Callback):
    """Placed before and after PerfCallback: times its ``on_train_batch_end`` and ``on_train_epoch_end``."""

    def __init__(self) -> None:
        self.batch_end: dict[tuple[int, int], float] = {}
        self.epoch_end: list[float] = []
        self._batch_start = 0.0
        self._epoch_start = 0.0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._batch_start:
            self.batch_end[(trainer.current_epoch, batch_idx)] = now - self._batch_start
            self._batch_start = 0.0
        else:
            self._batch_start = now

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        now = time.perf_counter()
        if self._epoch_start:
            self.epoch_end.append(now - self._epoch_start)
            self._epoch_start = 0.0
        else:
            self._epoch_start = now


class ExportTimer(Callback):
    """Times the ``torch.profiler.profile.step()`` calls of Lightning's ``PyTorchProfiler`` that export a trace."""

    def __init__(self) -> None:
        self.exports: list[float] = []
        self._wrapped: Any = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        prof = getattr(trainer.profiler, "profiler", None)
        if prof is None or prof is self._wrapped:
            return
        self._wrapped, step = prof, prof.step

        def timed_step() -> None:
            ready, fired = prof.on_trace_ready, []
            if ready is not None:
                prof.on_trace_ready = lambda p: (fired.append(True), ready(p))
            start = time.perf_counter()
            try:
                step()
            finally:
                if fired:
                    self.exports.append(time.perf_counter() - start)
                prof.on_trace_ready = ready

        prof.step = timed_step


class TimedPerfCallback(PerfCallback):
    """``PerfCallback`` noting how long each window's background job (trace file, tables, record) takes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job_seconds: list[float] = []

    def _process_window(self, closed: Any) -> None:
        start = time.perf_counter()
        super()._process_window(closed)
        self.job_seconds.append(time.perf_counter() - start)


@dataclass
class Close:
    """One window close."""

    stall: float
    closing_step: float
    next_steps: float
    trace_bytes: int


@dataclass
class Run:
    config: str
    closes: list[Close] = field(default_factory=list)
    epoch_ends: list[float] = field(default_factory=list)
    median_step: float = 0.0
    close_seconds: list[float] = field(default_factory=list)
    job_seconds: list[float] = field(default_factory=list)


def _median_outside(steps: dict[tuple[int, int], float], excluded: set[tuple[int, int]]) -> float:
    return statistics.median(t for key, t in steps.items() if key not in excluded and key[1] >= RUN_WARMUP)


def run_perf(root: str, epochs: int, batches: int, width: int, wait_s: float) -> Run:
    timer, sandwich = StepTimer(), Sandwich()
    perf = TimedPerfCallback(stages=["train"], verbose=0, max_windows=epochs)
    trainer = make_trainer(root, epochs, callbacks=[timer, sandwich, perf, sandwich])
    trainer.fit(MNISTLitModule(batches, width, wait_s))
    warmup = perf.config.schedule.warmup
    touched = {(w.epoch, i) for w in perf.windows for i in range(w.first_batch - warmup - 1, w.last_batch + 1)}
    run = Run("perf", epoch_ends=sandwich.epoch_end, close_seconds=[w.close_seconds for w in perf.windows])
    run.job_seconds = perf.job_seconds
    run.median_step = median = _median_outside(timer.steps, touched)
    for w in perf.windows:
        close = (w.epoch, w.last_batch)
        after = [t - median for (e, i), t in timer.steps.items() if e == w.epoch and i > w.last_batch]
        run.closes.append(
            Close(
                stall=sandwich.batch_end[close],
                closing_step=timer.steps[close] - median,
                next_steps=sum(after),
                trace_bytes=os.path.getsize(w.trace_path),
            )
        )
    return run


def run_pytorch_profiler(root: str, batches: int, width: int, wait_s: float) -> Run:
    timer, exports = StepTimer(), ExportTimer()
    dirpath = os.path.join(root, "pt")
    schedule = torch.profiler.schedule(wait=PT_WAIT, warmup=PT_WARMUP, active=PT_ACTIVE)
    profiler = PyTorchProfiler(dirpath=dirpath, filename="prof", schedule=schedule)
    trainer = make_trainer(root, 1, callbacks=[timer, exports], profiler=profiler)
    trainer.fit(MNISTLitModule(batches, width, wait_s))
    touched = {(0, i) for i in range(PT_CLOSE_BATCH + 1)}
    run = Run("pt")
    run.median_step = median = _median_outside(timer.steps, touched)
    traces = [os.path.join(dirpath, f) for f in os.listdir(dirpath) if ".pt.trace.json" in f]
    after = [t - median for (_, i), t in timer.steps.items() if i > PT_CLOSE_BATCH]
    for stall in exports.exports:
        run.closes.append(
            Close(
                stall=stall,
                closing_step=timer.steps[(0, PT_CLOSE_BATCH)] - median,
                next_steps=sum(after),
                trace_bytes=max(os.path.getsize(t) for t in traces),
            )
        )
    return run


def make_trainer(root: str, epochs: int, callbacks: list[Callback], profiler: Any = None) -> pl.Trainer:
    return pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        callbacks=callbacks,
        profiler=profiler,
        logger=lightning.pytorch.loggers.TensorBoardLogger(root),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )


def ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e3:7.1f} ms ({min(values) * 1e3:.1f}..{max(values) * 1e3:.1f})"


def report(runs: list[Run]) -> None:
    for config, label in (("perf", "PerfCallback()"), ("pt", "PyTorchProfiler(schedule=wait 1, warmup 1, active 3)")):
        chosen = [r for r in runs if r.config == config]
        closes = [c for r in chosen for c in r.closes]
        print(f"({config}) {label}: {len(closes)} window closes in {len(chosen)} runs")
        print(f"  median step outside windows   {ms([r.median_step for r in chosen])}")
        if not closes:
            continue
        print(f"  stall                         {ms([c.stall for c in closes])}")
        print(f"  closing step, extra           {ms([c.closing_step for c in closes])}")
        print(f"  next steps, extra (sum)       {ms([c.next_steps for c in closes])}")
        print(f"  closing + next steps, extra   {ms([c.closing_step + c.next_steps for c in closes])}")
        if config == "perf":
            print(f"  WindowRecord.close_seconds    {ms([s for r in chosen for s in r.close_seconds])}")
            print(f"  background job                {ms([s for r in chosen for s in r.job_seconds])}")
            print(f"  epoch end                     {ms([s for r in chosen for s in r.epoch_ends])}")
        print(f"  trace                         {statistics.median(c.trace_bytes for c in closes) / 1024:7.0f} KiB")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Window-close stall, PerfCallback next to PyTorchProfiler.")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds of (perf), (pt) (default: 3)")
    parser.add_argument("--epochs", type=int, default=3, help="PerfCallback's epochs per run, a window each")
    parser.add_argument("--batches", type=int, default=60, help="batches per epoch (default: 60)")
    parser.add_argument("--width", type=int, default=256, help="hidden width (default: 256, the template's)")
    parser.add_argument(
        "--device-wait-ms",
        type=float,
        default=0.0,
        help="a sleep in every training_step, as a GPU step's wait for the device (default: 0)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, lightning {lightning.__version__}; CPUs: {os.cpu_count()},"
        f" torch threads: {torch.get_num_threads()}"
    )
    w = args.width
    print(
        f"model: SimpleDenseNet 784-{w}-{w}-{w}-10 + BatchNorm, Adam, batch {BATCH_SIZE}, torchmetrics;"
        f" {args.rounds} rounds, {args.batches} batches per epoch"
        + (f", {args.device_wait_ms:g} ms device wait per step" if args.device_wait_ms else "")
        + "\n"
    )
    runs: list[Run] = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="lp-close-") as root:
            runs.append(run_perf(root, args.epochs, args.batches, args.width, args.device_wait_ms / 1e3))
        with tempfile.TemporaryDirectory(prefix="lp-close-") as root:
            runs.append(run_pytorch_profiler(root, args.batches, args.width, args.device_wait_ms / 1e3))
    report(runs)


if __name__ == "__main__":
    main()
