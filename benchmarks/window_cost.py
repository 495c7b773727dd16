"""
A window's total cost on a realistic model
==========================================

What a profiler window costs a training run in all: the stall when it closes, and whatever the work that
follows (reading the export back, writing the trace, the operator table, the summary) takes from training
afterwards. It is measured the only way that catches all of it, from the wall time of whole runs::

    cost per window = (wall time of a run with windows - wall time of the same run with none) / windows

on a small transformer language model on random tokens (2 pre-norm encoder layers of width 128, 4 heads,
feed-forward 512, causal mask, vocabulary 1,000, 32 tokens x batch 16, AdamW, the loss logged every step):
steps of tens of ms on one CPU thread, with the many small operators of attention, layer norms and the
optimizer, as in real models.

Five configurations run interleaved, round-robin, each run a fresh Trainer and model in this process,
``trainer.fit`` timed from its call to its return (setup, the epochs, the last window's processing, teardown):

    (none)    ``PerfCallback(max_windows=0)``: no window, every batch measured;
    (thread)  ``PerfCallback(schedule=...)`` with ``LIGHTNING_PERF_WINDOW_PROCESS=0``: windows processed on a
              thread of the training process (the code before the window process);
    (process) ``PerfCallback(schedule=...)``: windows processed in the window process;
    (bare)    a bare Trainer (``--pt-batches`` batches);
    (pt)      ``Trainer(profiler=PyTorchProfiler(schedule=torch.profiler.schedule(wait=1, warmup=1,
              active=3)))``: Lightning's default schedule; it records one window per stage and run
              (``--pt-batches`` batches).

PerfCallback's schedule is a window of 3 recorded batches (after 1 warm-up batch) every ``--every``
batches, ``repeat=0``: about ``--batches / --every`` windows per run. The cost per window of (thread) and
(process) is set against (none), that of (pt) against (bare), within each round (so (pt)'s includes its
``record_function`` around every Lightning hook over the whole run: a PyTorchProfiler whose schedule never
records fails at teardown, in Lightning 2.6); the figures are the
medians over rounds, and their range.

Run it from the repository root::

    python benchmarks/window_cost.py                        # 3 rounds: about 3 min on 2 idle cores
    python benchmarks/window_cost.py --rounds 5 --threads 1 # docs/cost.md's figures

Reading the output, per configuration: ``wall`` (median over rounds of a run's wall time), ``windows`` (per
run), ``cost per window`` (median and range over rounds), ``cost per window, beyond the median step`` (the
same from each run's wall time less its batches times its own median step: what a window adds to the steps
it touches, the epoch end and teardown, with the machine's speed during the run taken out; steadier where
other processes load the machine) and, for PerfCallback, the median
``WindowRecord.close_seconds`` (the training thread's stall at a close, part of the cost). ``other load``
is the CPU time other processes used meanwhile, as a share of all CPUs (Linux ``/proc/stat``): above a few %
the wall times are disturbed, and only ranges that agree across rounds are to be trusted.
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.hooks.window_process import PROCESS_ENV
from machine import cpu_busy_seconds

VOCAB, WIDTH, HEADS, LAYERS, FEEDFORWARD, TOKENS, BATCH_SIZE = 1000, 128, 4, 2, 512, 32, 16
CONFIGS = ("none", "thread", "process", "bare", "pt")
LABELS = {
    "none": "PerfCallback(max_windows=0)",
    "thread": "PerfCallback(), windows on a thread",
    "process": "PerfCallback(), windows in the window process",
    "bare": "bare Trainer",
    "pt": "PyTorchProfiler(), wait 1, warmup 1, active 3",
}
BASELINE = {"thread": "none", "process": "none", "pt": "bare"}


class TinyLanguageModel(pl.LightningModule):
    """A small causal transformer language model on random tokens."""

    def __init__(self, num_batches: int) -> None:
        super().__init__()
        self.num_batches = num_batches
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(TOKENS, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FEEDFORWARD, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(TOKENS), persistent=False)

    def training_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (tokens,) = batch
        x = self.embed(tokens[:, :-1]) + self.position[: TOKENS - 1]
        x = self.encoder(x, mask=self.mask[: TOKENS - 1, : TOKENS - 1], is_causal=True)
        logits = self.head(self.norm(x))
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-4)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, VOCAB, (self.num_batches * BATCH_SIZE, TOKENS), generator=g)
        return DataLoader(TensorDataset(tokens), batch_size=BATCH_SIZE)


class StepClock(Callback):
    """The time of every ``on_train_batch_start``: a step runs from one to the next."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.starts.append(time.perf_counter())

    def median_step(self) -> float:
        return statistics.median(b - a for a, b in zip(self.starts, self.starts[1:], strict=False))


@dataclass
class Run:
    config: str
    wall: float
    windows: int
    close_seconds: list[float]
    excess: float  # the wall time beyond batches x the run's median step


def run(config: str, root: str, batches: int, every: int) -> Run:
    clock = StepClock()
    callbacks: list[Any] = [clock]
    profiler: Any = None
    perf: PerfCallback | None = None
    if config in ("none", "thread", "process"):
        schedule = {"skip_first": 5, "wait": every - 4, "warmup": 1, "active": 3, "repeat": 0}
        max_windows = 0 if config == "none" else 10**6
        perf = PerfCallback(stages=["train"], schedule=schedule, max_windows=max_windows, verbose=0)
        callbacks.append(perf)
    elif config == "pt":
        profiler = PyTorchProfiler(
            dirpath=os.path.join(root, "pt"),
            filename="prof",
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),
        )
    if config == "thread":
        os.environ[PROCESS_ENV] = "0"
    else:
        os.environ.pop(PROCESS_ENV, None)
    trainer = pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=callbacks,
        profiler=profiler,
        logger=lightning.pytorch.loggers.TensorBoardLogger(root),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    model = TinyLanguageModel(batches)
    gc.collect()
    start = time.perf_counter()
    trainer.fit(model)
    wall = time.perf_counter() - start
    os.environ.pop(PROCESS_ENV, None)
    excess = wall - batches * clock.median_step()
    if perf is not None:
        return Run(config, wall, len(perf.windows), [w.close_seconds for w in perf.windows], excess)
    traces = [f for f in os.listdir(os.path.join(root, "pt")) if ".pt.trace.json" in f] if config == "pt" else []
    return Run(config, wall, len(traces), [], excess)


def ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e3:7.1f} ms ({min(values) * 1e3:.1f}..{max(values) * 1e3:.1f})"


def report(rounds: list[dict[str, Run]], other_load: float | None) -> None:
    for config in CONFIGS:
        runs = [r[config] for r in rounds]
        line = f"({config}) {LABELS[config]}\n  wall {ms([r.wall for r in runs])}, windows per run: "
        line += ", ".join(sorted({str(r.windows) for r in runs}))
        if config in BASELINE:
            costs = [(r[config].wall - r[BASELINE[config]].wall) / max(r[config].windows, 1) for r in rounds]
            line += f"\n  cost per window {ms(costs)}"
            beyond = [(r[config].excess - r[BASELINE[config]].excess) / max(r[config].windows, 1) for r in rounds]
            line += f"\n  cost per window, beyond the median step {ms(beyond)}"
        closes = [s for r in runs for s in r.close_seconds]
        if closes:
            line += f"\n  stall at close (close_seconds) {statistics.median(closes) * 1e3:.1f} ms"
        print(line)
    if other_load is not None:
        print(f"other load: {other_load:.0%} of all CPUs")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A window's total cost: PerfCallback next to PyTorchProfiler.")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds of every configuration")
    parser.add_argument("--batches", type=int, default=200, help="batches of PerfCallback's runs (default: 200)")
    parser.add_argument("--every", type=int, default=20, help="a PerfCallback window every N batches (default: 20)")
    parser.add_argument("--pt-batches", type=int, default=60, help="batches of PyTorchProfiler's runs (default: 60)")
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
    print(
        f"model: causal transformer LM, {LAYERS} layers of {WIDTH}, {HEADS} heads, feed-forward {FEEDFORWARD},"
        f" vocabulary {VOCAB}, {TOKENS} tokens x batch {BATCH_SIZE}, AdamW; {args.rounds} rounds;"
        f" PerfCallback: {args.batches} batches, a window every {args.every};"
        f" PyTorchProfiler: {args.pt_batches} batches\n"
    )
    rounds: list[dict[str, Run]] = []
    busy_before, wall_before = cpu_busy_seconds(), time.perf_counter()
    ours = time.process_time()
    for i in range(args.rounds):
        results: dict[str, Run] = {}
        for config in CONFIGS:
            batches = args.pt_batches if config in ("bare", "pt") else args.batches
            with tempfile.TemporaryDirectory(prefix="lp-window-cost-") as root:
                results[config] = run(config, root, batches, args.every)
        rounds.append(results)
        print(f"round {i + 1}: " + ", ".join(f"{c} {r.wall:.2f} s" for c, r in results.items()), flush=True)
    busy_after = cpu_busy_seconds()
    other_load = None
    if busy_before is not None and busy_after is not None:
        # ours: this process and its children (the window process) since the start
        children = os.times().children_user + os.times().children_system
        other = busy_after - busy_before - (time.process_time() - ours) - children
        other_load = max(other, 0.0) / ((time.perf_counter() - wall_before) * (os.cpu_count() or 1))
    print()
    report(rounds, other_load)


if __name__ == "__main__":
    main()
