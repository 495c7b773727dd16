"""
Training-thread stalls
======================

How long ``PerfCallback`` holds the training thread at the two moments it does real work: when a profiler
window closes (stop the profiler, torch's trace export: ``WindowRecord.close_seconds``; the rewrite, the
operator table and the trace summary follow on a background thread) and at an epoch's end (waiting for that
thread if it is still busy, epoch summary, the bottleneck rules, TensorBoard text and image,
``perf_report.json``). ``benchmarks/window_cost.py`` measures the window close on a realistic model, next to
Lightning's ``PyTorchProfiler``.

Run it from the repository root::

    python benchmarks/stall.py [--epochs 5] [--width 256] [--active 3] [--threads 1]

It trains a small MLP on random data on the CPU with ``PerfCallback()`` (a window of ``--active`` batches
every epoch) and prints the median and max of each stall, and the trace size of a window.
"""

from __future__ import annotations

import argparse
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


class MLP(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        layers = [nn.Linear(64, width), nn.ReLU()]
        for _ in range(8):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        x = torch.randn(64 * 40, 64)
        return DataLoader(TensorDataset(x, torch.randint(0, 10, (len(x),))), batch_size=64)


class EpochEndTimer(pl.Callback):
    """Placed around PerfCallback: the time between its two on_train_epoch_end calls is PerfCallback's."""

    def __init__(self) -> None:
        self.start = 0.0
        self.durations: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module):
        now = time.perf_counter()
        if self.start:
            self.durations.append(now - self.start)
            self.start = 0.0
        else:
            self.start = now


def main() -> None:
    parser = argparse.ArgumentParser(description="PerfCallback's training-thread stalls.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--with-stack", action="store_true")
    parser.add_argument("--profile-memory", action="store_true")
    parser.add_argument("--record-shapes", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")

    timer = EpochEndTimer()
    perf = PerfCallback(
        schedule={"active": args.active},
        stages=["train"],
        verbose=0,
        max_windows=args.epochs,
        with_stack=args.with_stack,
        profile_memory=args.profile_memory,
        record_shapes=args.record_shapes,
    )
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            max_epochs=args.epochs,
            callbacks=[timer, perf, timer],
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        trainer.fit(MLP(args.width))
        sizes = [os.path.getsize(w.trace_path) for w in perf.windows]
    closes = [w.close_seconds for w in perf.windows]
    events = len(perf.windows[0].operators)
    steps = [w.summary.step_time for w in perf.windows if w.summary]
    options = [name for name in ("with_stack", "profile_memory", "record_shapes") if getattr(args, name)]
    print(
        f"torch {torch.__version__}, lightning {pl.__version__}; {args.epochs} epochs, 40 batches each;"
        f" {', '.join(options) or 'default options'}"
    )
    print(f"  recorded step inside a window: median {statistics.median(steps) * 1e3:.2f} ms")
    print(
        f"  window close, training thread ({args.active} batches,"
        f" {statistics.median(sizes) / 1024:.0f} KiB gzipped, {events} operators):"
        f" median {statistics.median(closes) * 1e3:.1f} ms, max {max(closes) * 1e3:.1f} ms"
    )
    print(
        f"  epoch end (summary, rules, TensorBoard, perf_report.json):"
        f" median {statistics.median(timer.durations) * 1e3:.1f} ms, max {max(timer.durations) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
