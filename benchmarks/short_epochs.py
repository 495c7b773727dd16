"""
Runs of many short epochs
=========================

What :class:`~lightning_perf.PerfCallback` costs a run of many short epochs (Lightning's DQN example: 1000
epochs of a few batches), as a function of the epoch index. Whatever the callback does once per epoch
(summaries, the console line, ``perf_report.json`` and its page, TensorBoard text, its share of each
checkpoint) is paid every few batches here; if that work grows with the history, late epochs cost more
than early ones.

A tiny MLP (Linear(16, 32) + ReLU + Linear(32, 1), batch 4, ``--batches`` batches per epoch, and
``--val-batches`` validation batches after each (default 0: training only; Lightning's bug_report_model has 1))
runs ``--epochs`` epochs with the Trainer settings a new user has: the default logger (TensorBoard) and the
default ``ModelCheckpoint`` (a checkpoint every epoch); only the progress bar and the model summary are off.
torch runs on one thread. The same fit runs in these configurations, one after another in each round:

    (a) a bare Trainer;
    (b) ``PerfCallback(batches=[100000])``: no profiler window ever opens, so (b) - (a) is the callback's
        per-epoch cost outside windows;
    (c) ``PerfCallback()``: the default schedule (skip 5 batches, warm up 1, record 1); with 4 batches per
        epoch no window fits, so it behaves as (b) but warns once;
    (d) ``PerfCallback(schedule={"skip_first": 0, "wait": 0, "warmup": 1, "active": 1})``: one window in
        each of the first ``max_windows`` (5) epochs, none after.

A timing callback reads ``time.perf_counter()`` at every ``on_train_epoch_start`` and at ``on_train_end``:
epoch ``i`` lasts from its start to the next one's, so it includes every epoch-end hook, the checkpoint and
the logger. PerfCallback's own hooks and its ``state_dict`` (called for every checkpoint) are timed too,
by wrapping them on the instance, in CPU time of the training thread (``time.thread_time``): what they cost
whatever else runs on a shared machine.

Run it from the repository root::

    python benchmarks/short_epochs.py                  # 500 epochs x 4 configurations: about 2 minutes
    python benchmarks/short_epochs.py --quick          # 60 epochs, a smoke run
    python benchmarks/short_epochs.py --epochs 1000 --batches 4 --rounds 2
    python benchmarks/short_epochs.py --epochs 200 --val-batches 1 --configs ab --rounds 3   # bug_report_model's

Reading the output:

* ``fit``: wall time of ``trainer.fit`` and its ratio to (a)'s in the same round.
* ``extra per epoch``: median epoch time in a band of epochs minus (a)'s median in the same band, same
  round (e.g. epochs 1-20, 40-59 and the last 20). Flat from band to band: a constant per-epoch cost; growing:
  work that grows with the history.
* ``in PerfCallback``: median per epoch of the training thread's CPU time inside its hooks and ``state_dict``
  in the band; the rest of the extra is what its outputs cost others (the checkpoint's size, the logger's
  files and event-writer thread), and on a shared machine, the others' load. Its ``mean`` over the run holds
  the epoch ends that rewrote ``perf_report.json`` and its page too.
* ``last .ckpt`` / ``perf_report.json``: sizes at the end of the run; ``console lines``: the lines of
  PerfCallback's messages to Lightning's console logger or stdout (``lightning-perf |``: the per-epoch head
  lines among them; the rest are its findings and advice), and ``warnings``: the warnings it raised.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import io
import itertools
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from machine import cpu_busy_seconds

BATCH_SIZE = 4
QUICK_EPOCHS = 60
EPOCH_LINE_PREFIX = "lightning-perf |"  # report/findings.py: the head of each per-epoch console line
OUR_PREFIXES = ("lightning-perf", "PerfCallback")  # how each of PerfCallback's console messages begins
HOOK_SHOWN_MS = 0.1  # methods of PerfCallback below this per epoch (median) are left out of the breakdown
WARNING_SHOWN_CHARS = 110
OTHER_LOAD_NOTE = 0.05  # above this share of the CPUs used by other processes, the timings are flagged

CONFIGS: dict[str, tuple[str, Callable[[], PerfCallback] | None]] = {
    "a": ("bare Trainer", None),
    "b": ("PerfCallback(batches=[100000])", lambda: PerfCallback(batches=[100000])),
    "c": ("PerfCallback()", lambda: PerfCallback()),
    "d": (
        "PerfCallback(schedule=warmup 1, active 1)",
        lambda: PerfCallback(schedule={"skip_first": 0, "wait": 0, "warmup": 1, "active": 1}),
    ),
}


class Tiny(pl.LightningModule):
    """A two-layer MLP on ``num_batches`` batches of random in-memory data (and ``val_batches`` to validate on), SGD."""

    def __init__(self, num_batches: int, val_batches: int = 0) -> None:
        super().__init__()
        self.num_batches, self.val_batches = num_batches, val_batches
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)  # what a user logs; the DQN example logs a few scalars per step too
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def train_dataloader(self) -> DataLoader:
        return _loader(self.num_batches)

    def val_dataloader(self) -> DataLoader:
        return _loader(max(self.val_batches, 1))


def _loader(batches: int) -> DataLoader:
    g, n = torch.Generator().manual_seed(0), batches * BATCH_SIZE
    return DataLoader(TensorDataset(torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)), BATCH_SIZE)


class EpochTimer(Callback):
    """The ``time.perf_counter()`` of every ``on_train_epoch_start`` and of ``on_train_end``."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.end: float | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.end = time.perf_counter()

    @property
    def epochs(self) -> list[float]:
        """Seconds of each epoch, from its start to the next one's (the last one's to the end of training)."""
        marks = self.starts + ([self.end] if self.end is not None else [])
        return [b - a for a, b in itertools.pairwise(marks)]

    @property
    def epoch(self) -> int:
        """The index of the epoch now running."""
        return len(self.starts) - 1


def time_hooks(perf: PerfCallback, timer: EpochTimer) -> dict[str, dict[int, float]]:
    """Wraps PerfCallback's own hooks and ``state_dict`` on the instance; returns, by method name, the seconds
    spent in it in each epoch."""
    spent: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name][max(timer.epoch, 0)] += time.thread_time() - t0

        return timed

    for name in dir(type(perf)):
        if name.startswith("on_") or name == "state_dict":
            own, base = getattr(type(perf), name, None), getattr(Callback, name, None)
            if callable(own) and own is not base:
                setattr(perf, name, wrap(name, getattr(perf, name)))
    return spent


class ConsoleCounter(logging.Handler):
    """Keeps the messages Lightning's console logger would print, line by line, instead of printing them."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.messages: list[list[str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(self.format(record).splitlines())

    def ours(self, printed: str) -> list[str]:
        """The lines of PerfCallback's messages (those whose first line names it), logged or ``printed``."""
        messages = self.messages + [[line] for line in printed.splitlines()]
        return [line for m in messages if m and m[0].startswith(OUR_PREFIXES) for line in m]


@dataclass
class Run:
    """One fit of one configuration."""

    config: str
    fit_seconds: float
    epochs: list[float]
    by_hook: dict[str, dict[int, float]] = field(default_factory=dict)  # seconds in each of its methods, by epoch
    ckpt_bytes: int | None = None
    report_bytes: int | None = None
    console_lines: int = 0
    epoch_lines: int = 0
    warnings: int = 0
    warning_texts: list[str] = field(default_factory=list)  # the distinct ones, in order
    windows: int = 0
    other_load: float | None = None  # share of all CPUs other processes used during the fit

    @property
    def in_callback(self) -> dict[int, float]:
        """Seconds spent in PerfCallback's methods, by epoch."""
        total: dict[int, float] = defaultdict(float)
        for per_epoch in self.by_hook.values():
            for epoch, seconds in per_epoch.items():
                total[epoch] += seconds
        return total


def run_once(config: str, epochs: int, batches: int, val_batches: int = 0) -> Run:
    """A fresh Trainer and model of ``config``, in a fresh directory."""
    torch.manual_seed(0)
    timer = EpochTimer()
    make = CONFIGS[config][1]
    perf = make() if make is not None else None
    spent = time_hooks(perf, timer) if perf is not None else {}
    callbacks: list[Callback] = [timer] + ([perf] if perf is not None else [])
    console, printed = ConsoleCounter(), io.StringIO()  # what Lightning's logger and print() would show
    pl_logger = logging.getLogger("lightning.pytorch")
    saved_handlers, saved_level = pl_logger.handlers[:], pl_logger.level
    pl_logger.handlers = [console]
    pl_logger.setLevel(logging.INFO)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="lp-short-") as root,
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(printed),
        ):
            warnings.simplefilter("always")
            trainer = pl.Trainer(
                default_root_dir=root,
                accelerator="cpu",
                devices=1,
                max_epochs=epochs,
                limit_val_batches=val_batches,  # 0: no validation
                callbacks=callbacks,
                enable_progress_bar=False,
                enable_model_summary=False,  # with rich installed, a table on stdout in every fit
            )
            model = Tiny(batches, val_batches)
            busy0, cpu0, t0 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
            trainer.fit(model)
            busy1, cpu1, t1 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
            fit_seconds = t1 - t0
            ckpts = glob.glob(os.path.join(root, "**", "*.ckpt"), recursive=True)
            run = Run(config=config, fit_seconds=fit_seconds, epochs=timer.epochs, by_hook=spent)
            if busy0 is not None and busy1 is not None:
                other = (busy1 - busy0) - (cpu1 - cpu0)
                run.other_load = max(0.0, other / (fit_seconds * (os.cpu_count() or 1)))
            if ckpts:
                run.ckpt_bytes = os.path.getsize(max(ckpts, key=os.path.getmtime))
            if perf is not None:
                if perf.report_path is not None and os.path.exists(perf.report_path):
                    run.report_bytes = os.path.getsize(perf.report_path)
                run.windows = len(perf.windows)
                ours = [w for w in caught if "PerfCallback" in str(w.message) or "lightning-perf" in str(w.message)]
                run.warnings = len(ours)
                run.warning_texts = list(dict.fromkeys(str(w.message) for w in ours))
    finally:
        pl_logger.handlers = saved_handlers
        pl_logger.setLevel(saved_level)
    if perf is not None:
        ours = console.ours(printed.getvalue())
        run.console_lines = len(ours)
        run.epoch_lines = sum(line.startswith(EPOCH_LINE_PREFIX) for line in ours)
    return run


# ---------------------------------------------------------------------- reporting


def bands(epochs: int) -> list[range]:
    """Bands of epochs: the first (from 1), around epoch 50 (or a quarter of the run), evenly spaced, the last."""
    width = max(4, min(20, epochs // 10))
    early = min(50, epochs // 4)
    starts = [1, early - width // 2] + [epochs * k // 4 - width // 2 for k in (1, 2, 3)] + [epochs - width]
    out: list[range] = []
    for s in sorted({max(1, s) for s in starts}):  # epoch 0 carries the run's own start-up
        band = range(s, min(s + width, epochs))
        if band and (not out or band.start >= out[-1].stop):
            out.append(band)
    return out


def band_median(values: Sequence[float] | dict[int, float], band: range) -> float:
    return statistics.median(values[i] if isinstance(values, list) else values.get(i, 0.0) for i in band)


def size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def print_round(r: int, runs: dict[str, Run], epochs: int) -> None:
    base = runs["a"]
    print(f"round {r}")
    print(
        f"  {'configuration':<46} {'fit':>8} {'ratio':>6} {'windows':>7} {'last .ckpt':>11} {'report':>9}"
        f" {'console lines':>13} {'lightning-perf |':>16} {'warnings':>8} {'other load':>10}"
    )
    for c, run in runs.items():
        label = f"({c}) {CONFIGS[c][0]}"
        load = f"{100 * run.other_load:8.0f} %" if run.other_load is not None else "n/a"
        print(
            f"  {label:<46} {run.fit_seconds:7.1f}s {run.fit_seconds / base.fit_seconds:6.2f}"
            f" {run.windows if c != 'a' else '-':>7} {size(run.ckpt_bytes):>11} {size(run.report_bytes):>9}"
            f" {run.console_lines if c != 'a' else '-':>13} {run.epoch_lines if c != 'a' else '-':>16}"
            f" {run.warnings if c != 'a' else '-':>8} {load:>10}"
        )
    loads = [run.other_load for run in runs.values() if run.other_load is not None]
    if loads and max(loads) > OTHER_LOAD_NOTE:
        worst = 100 * max(loads)
        print(f"  note: other processes used up to {worst:.0f} % of the CPUs during a fit: times are disturbed")
    for c, run in runs.items():
        for text in run.warning_texts:
            print(f"  ({c}) warned: {text[:WARNING_SHOWN_CHARS]}{'...' if len(text) > WARNING_SHOWN_CHARS else ''}")
    print()
    print("  epoch time by band of epochs (median, ms); extra = minus (a)'s; in PerfCallback = inside its hooks")
    header = "  epochs      (a)"
    for c in runs:
        if c != "a":
            header += f"  |  ({c}) extra  in-cb"
    print(header)
    for band in bands(epochs):
        a = band_median(base.epochs, band)
        line = f"  {band.start:4d}-{band.stop - 1:<4d} {a * 1e3:6.1f}"
        for c, run in runs.items():
            if c != "a":
                extra = band_median(run.epochs, band) - a
                line += f"  |  {extra * 1e3:9.1f} {band_median(run.in_callback, band) * 1e3:6.1f}"
        print(line)
    print()
    print_hooks(runs, epochs)


def print_hooks(runs: dict[str, Run], epochs: int) -> None:
    """Where the time inside PerfCallback goes: its methods that take measurable time, in the first and last bands."""
    early, late = bands(epochs)[0], bands(epochs)[-1]
    print(
        f"  inside PerfCallback by method (median ms per epoch at epochs {early.start}-{early.stop - 1}"
        f" -> {late.start}-{late.stop - 1})"
    )
    for c, run in runs.items():
        cells = []
        for name, per_epoch in sorted(run.by_hook.items()):
            e, l_ = band_median(per_epoch, early) * 1e3, band_median(per_epoch, late) * 1e3
            if max(e, l_) >= HOOK_SHOWN_MS:
                cells.append(f"{name} {e:.1f} -> {l_:.1f}")
        if c != "a":
            print(f"  ({c}) " + ("; ".join(cells) if cells else "nothing measurable"))
    print()


def print_summary(rounds: list[dict[str, Run]], epochs: int) -> None:
    """Ranges over rounds of the figures the issue quotes."""
    early, late = bands(epochs)[0], bands(epochs)[-1]
    print(
        f"summary over {len(rounds)} round(s) (min..max); extra per epoch at epochs"
        f" {early.start}-{early.stop - 1} and {late.start}-{late.stop - 1}"
    )
    for c in rounds[0]:
        if c == "a":
            fits = [r["a"].fit_seconds for r in rounds]
            print(f"  (a) {CONFIGS['a'][0]:<42} fit {_range(fits, '.1f')} s")
            continue
        fits = [r[c].fit_seconds for r in rounds]
        ratios = [r[c].fit_seconds / r["a"].fit_seconds for r in rounds]
        e = [(band_median(r[c].epochs, early) - band_median(r["a"].epochs, early)) * 1e3 for r in rounds]
        l_ = [(band_median(r[c].epochs, late) - band_median(r["a"].epochs, late)) * 1e3 for r in rounds]
        cb_e = [band_median(r[c].in_callback, early) * 1e3 for r in rounds]
        cb_l = [band_median(r[c].in_callback, late) * 1e3 for r in rounds]
        cb_mean = [statistics.mean(r[c].in_callback.get(i, 0.0) for i in range(1, epochs)) * 1e3 for r in rounds]
        print(
            f"  ({c}) {CONFIGS[c][0]:<42} fit {_range(fits, '.1f')} s, x{_range(ratios, '.2f')};"
            f" extra/epoch {_range(e, '.1f')} ms -> {_range(l_, '.1f')} ms; in PerfCallback (CPU)"
            f" {_range(cb_e, '.2f')} ms -> {_range(cb_l, '.2f')} ms, mean {_range(cb_mean, '.2f')} ms"
        )
    print()


def _range(values: Sequence[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}..{format(hi, fmt)}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="PerfCallback's per-epoch cost in a run of many short epochs.",
        epilog="See the module docstring for how to read the output.",
    )
    parser.add_argument("--epochs", type=int, default=500, help="epochs per fit (default: 500)")
    parser.add_argument("--batches", type=int, default=4, help="batches per epoch (default: 4)")
    parser.add_argument("--val-batches", type=int, default=0, help="validation batches per epoch (default: 0)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of all configurations (default: 1)")
    parser.add_argument("--configs", default="".join(CONFIGS), help="which configurations, e.g. 'ab' (default: abcd)")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_EPOCHS} epochs")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = QUICK_EPOCHS
    if args.epochs < 20:
        parser.error("--epochs must be >= 20")
    if args.batches < 1 or args.rounds < 1:
        parser.error("--batches and --rounds must be >= 1")
    if "a" not in args.configs or set(args.configs) - set(CONFIGS):
        parser.error(f"--configs: letters of {''.join(CONFIGS)}, with 'a' (the baseline)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, lightning {lightning.__version__}, CPUs: {os.cpu_count()}, torch threads: 1")
    print(
        f"model: Linear(16, 32) + ReLU + Linear(32, 1), batch {BATCH_SIZE}, {args.batches} batches x"
        f" {args.epochs} epochs, {args.val_batches} validation batch(es) each; default logger and ModelCheckpoint;"
        f" {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    print()
    configs = [c for c in CONFIGS if c in args.configs]
    start = time.perf_counter()
    rounds = []
    for r in range(args.rounds):
        runs = {c: run_once(c, args.epochs, args.batches, args.val_batches) for c in configs}
        print_round(r, runs, args.epochs)
        rounds.append(runs)
    print_summary(rounds, args.epochs)
    print(f"total time: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
