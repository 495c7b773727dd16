"""
What the default PerfCallback costs a real model's run, short and long
======================================================================

Issue 26's acceptance: a multi-module model of the TemporalFusionTransformer's shape
(:mod:`forecaster`: variable selection networks of gated residual blocks, LSTM encoder and decoder, attention,
dozens of small modules) fit for 4 short epochs and for 40, each bare and with a default ``PerfCallback()``
(its profiling budget, ``profile_budget="auto"``: 2% with the default schedule), alternating in one process,
each run a fresh seeded model and Trainer (TensorBoard logger, validation every epoch). A first uncounted run
of each takes the imports and first calls.

    fit ratio = median over rounds of (fit with PerfCallback() / the bare fit of the same round)

also their mean with its standard error (the rounds' spread over the square root of their number: how far the
mean may be off for the machine's noise alone), the ratio of the totals, and, from the callback's report
(``run.profiling``), the windows that opened, those the budget skipped, and the profiling share it measured
itself. Targets: <= 1.05x for the short run, <= 1.03x for the long one.

Run it from the repository root::

    python benchmarks/profiling_budget.py                 # 3 rounds of each: about 6 min on 2 idle cores
    python benchmarks/profiling_budget.py --rounds 5 --epochs 4 40

``other load`` is the CPU the machine's other processes used meanwhile (``/proc/stat``), in CPUs: above a tenth
of a CPU the ratios are disturbed, and only ranges that agree across rounds are to be trusted.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, ClassVar

import lightning
import lightning.pytorch as pl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from forecaster import Forecaster, loaders
from lightning_perf import PerfCallback
from machine import abba, cpu_busy_seconds


class StepTimes(pl.Callback):
    """Each training batch's wall time, from its start hook to its end hook (the callback's close included)."""

    def __init__(self) -> None:
        self.seconds: dict[int, list[float]] = {}
        self._start = 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self.seconds.setdefault(trainer.current_epoch, []).append(time.perf_counter() - self._start)


class Split(pl.Callback):
    """Where a fit's wall time goes, in parts: each hook adds the time since the previous one to its part (placed
    after the callback, so that the callback's own hooks land in the part that ends with them)."""

    PARTS: ClassVar[dict[str, str]] = {
        "on_train_batch_start": "between training batches",
        "on_train_batch_end": "training batches",
        "on_validation_batch_start": "between validation batches",
        "on_validation_batch_end": "validation batches",
        "on_validation_epoch_end": "validation epoch ends",
        "on_train_epoch_end": "training epoch ends",
        "on_fit_end": "fit's end",
    }

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(self.PARTS.values(), 0.0)
        self._last = 0.0
        for hook, part in self.PARTS.items():
            setattr(self, hook, self._adder(part))

    def on_fit_start(self, *args: object) -> None:
        self._last = time.perf_counter()

    def _adder(self, part: str) -> Any:
        def add(*args: object) -> None:
            now = time.perf_counter()
            self.seconds[part] += now - self._last
            self._last = now

        return add


def show_split(epochs: int, model_name: str, rounds: int) -> None:
    """``--split``: bare fits and fits with the callback in ABBA order, each fit's wall time in parts (:class:`Split`);
    the median of each part, and the difference: what the callback costs outside its own measure too."""
    parts: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for round_ in range(rounds):
        for perf in abba(round_):
            split = Split()
            wall, _ = fit(epochs, perf, split, model_name)
            parts[perf].append({**split.seconds, "setup and teardown": wall - sum(split.seconds.values()), "fit": wall})
    for part in parts[False][0]:
        bare, perf = (statistics.median(p[part] for p in parts[on]) for on in (False, True))
        diff = 1000 * (perf - bare)
        print(f"  {part:28s} bare {bare * 1000:8.1f} ms  PerfCallback() {perf * 1000:8.1f} ms  {diff:+7.1f} ms")


def build(model_name: str) -> tuple[pl.LightningModule, Any, Any, dict[str, Any]]:
    """A fresh model, its training and validation loaders, and its Trainer's own arguments: ``forecaster`` (this
    project's model of the TFT's shape: 30 batches an epoch) or ``tft`` (pytorch-forecasting's
    TemporalFusionTransformer itself, as issue 26 measured it, with the settings of the library's own example,
    ``examples/stallion.py``: hidden size 16, continuous hidden size 8, one attention head, batches of 64,
    ``limit_train_batches=30``, ``gradient_clip_val=0.1``; on 16 synthetic series; needs pytorch-forecasting)."""
    if model_name == "tft":
        from downstream_libraries import forecasting_case

        case = forecasting_case(series=16, hidden_size=16, hidden_continuous_size=8, batch_size=64)
        model, train, val = case.build()
        return model, train, val, {**case.trainer_kwargs, "limit_train_batches": 30}
    return Forecaster(), *loaders(), {}


def fit(
    epochs: int, perf: bool, steps: pl.Callback | None = None, model_name: str = "forecaster"
) -> tuple[float, dict | None]:
    """One fit's wall time, and the callback's ``run.profiling`` with its windows (``None`` bare); ``steps``
    (after the callback: :class:`StepTimes`, :class:`Split`) times its parts."""
    lightning.seed_everything(0, verbose=False)
    model, train, val, trainer_kwargs = build(model_name)
    callback = PerfCallback(verbose=0) if perf else None
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            devices=1,
            max_epochs=epochs,
            callbacks=([callback] if callback else []) + ([steps] if steps else []),
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            **trainer_kwargs,
        )
        gc.collect()
        start = time.perf_counter()
        trainer.fit(model, train, val)
        wall = time.perf_counter() - start
        if callback is None or callback.report_path is None:
            return wall, None
        with open(callback.report_path) as f:
            report = json.load(f)
        costs = [(w["name"], w["close_seconds"], w["cost_seconds"]) for w in report["windows"]]
        return wall, {
            **report["run"]["profiling"],
            "opened": [(w["stage"], w["epoch"]) for w in report["windows"]],
            "costs": costs,
        }


def show_steps(epochs: int, model_name: str) -> None:
    """``--steps``: a bare fit and one with the callback; training epoch 0's steps of each, and each window's
    close and cost: where a short run's profiling goes."""
    for perf in (False, True):
        steps = StepTimes()
        wall, profiling = fit(epochs, perf, steps, model_name)
        print(f"{'PerfCallback()' if perf else 'bare'}: fit {wall:.2f} s; epoch 0's steps (ms):")
        print("  " + " ".join(f"{s * 1000:.0f}" for s in steps.seconds[0]))
        if profiling is not None:
            for name, close, cost in profiling["costs"]:
                print(f"  {name}: close {close * 1000:.0f} ms, cost {cost * 1000:.0f} ms")
            print(f"  in all: {profiling['seconds']:.2f} s of {profiling['run_seconds']:.2f} s")


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, nargs="+", default=[4, 40])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--steps", action="store_true", help="one fit of the first --epochs each: steps, costs")
    parser.add_argument("--split", action="store_true", help="--rounds fits of the first --epochs: wall time by part")
    parser.add_argument("--model", choices=["forecaster", "tft"], default="forecaster")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    fit(1, False, model_name=args.model)
    fit(1, True, model_name=args.model)
    if args.steps:
        show_steps(args.epochs[0], args.model)
        return
    if args.split:
        show_split(args.epochs[0], args.model, args.rounds)
        return
    for epochs in args.epochs:
        ratios, bares, perfs, shares = [], [], [], []
        last: dict | None = None
        busy_before, clock_before, ours_before = cpu_busy_seconds(), time.perf_counter(), _own_cpu()
        for round_ in range(args.rounds):
            walls = {}
            for perf in abba(round_):
                walls[perf], profiling = fit(epochs, perf, model_name=args.model)
                last = profiling or last
            bares.append(walls[False])
            perfs.append(walls[True])
            ratios.append(walls[True] / walls[False])
            if last is not None and last["share"] is not None:
                shares.append(last["share"])
        busy_after, clock_after = cpu_busy_seconds(), time.perf_counter()
        other = None
        if busy_before is not None and busy_after is not None:
            own = _own_cpu() - ours_before  # this process and its children (the window process)
            other = max(busy_after - busy_before - own, 0.0) / (clock_after - clock_before)
        print(f"{epochs} epochs x 30 batches, {args.rounds} rounds")
        print(f"  bare fit          {statistics.median(bares):7.2f} s  ({min(bares):.2f}..{max(bares):.2f})")
        print(f"  PerfCallback()    {statistics.median(perfs):7.2f} s  ({min(perfs):.2f}..{max(perfs):.2f})")
        print(f"  ratio             {statistics.median(ratios):7.3f}x ({min(ratios):.3f}..{max(ratios):.3f})")
        print(f"  ratio of totals   {sum(perfs) / sum(bares):7.3f}x (ABBA order: even rounds cancel a steady drift)")
        if len(ratios) > 1:
            mean, error = statistics.mean(ratios), statistics.stdev(ratios) / math.sqrt(len(ratios))
            print(f"  mean ratio        {mean:7.3f}x +- {error:.3f} (standard error: the rounds' noise, averaged)")
        if last is not None:
            print(
                f"  its own measure   {statistics.median(shares) * 100:.1f}% of the run profiling;"
                f" windows {last['opened']}, skipped {last['skipped']}"
            )
        if other is not None:
            print(f"  other load        about {other:.2f} CPUs")


if __name__ == "__main__":
    main()
