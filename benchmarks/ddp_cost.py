"""
What the default PerfCallback costs a DDP run on CPU ranks
==========================================================

Issue 46's third cost figure: the forecaster of :mod:`forecaster` fit with ``strategy="ddp"`` on ``--ranks`` CPU
ranks (gloo; Lightning's own launcher starts the other ranks by running this script again), bare and with a
default ``PerfCallback()``, alternating in ABBA order, each fit in a fresh process (so each pays its imports and
process starts alike; only ``fit`` itself is timed, on rank 0, after a barrier). Reported:

    fit ratio = median over rounds of (fit with PerfCallback() / the bare fit of the same round)

with the ratio of the totals, the mean ratio with its standard error, and the callback's own measure from its
report (``run.profiling``: what its windows cost against ``profile_budget``, 2% by default; a stage's first
window opens whatever it costs, as the findings need one, so a short run's share is above the budget).

Run it from the repository root::

    PYTHONPATH=. python benchmarks/ddp_cost.py                     # 6 rounds of 4-epoch fits on 2 ranks
    PYTHONPATH=. python benchmarks/ddp_cost.py --rounds 8 --epochs 12
    PYTHONPATH=. python benchmarks/ddp_cost.py --options '{"max_windows": 0}'   # no window: the rest's cost

Run it on an idle machine: the ranks fill the CPUs, so another program's load lands in the ratios (the load
average at the end is printed as a rough check; the ranks themselves make about ``--ranks`` of it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import abba


def child(perf: bool, epochs: int, ranks: int, out: str, options: dict) -> None:
    """One DDP fit (this process is one rank); rank 0 writes its wall time and ``run.profiling`` to ``out``."""
    import lightning
    import lightning.pytorch as pl
    import torch.distributed as dist

    from forecaster import Forecaster, loaders
    from lightning_perf import PerfCallback

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    lightning.seed_everything(0, verbose=False)
    callback = PerfCallback(**{"verbose": 0, **options}) if perf else None
    root = os.path.join(os.path.dirname(out), "root")  # the same on every rank: the launcher passes argv on
    trainer = pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=ranks,
        strategy="ddp",
        max_epochs=epochs,
        callbacks=[callback] if callback else [],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    model = Forecaster()
    train, val = loaders()

    class Timer(pl.Callback):
        start = 0.0

        def setup(self, trainer: pl.Trainer, *args: object, **kwargs: object) -> None:
            dist.barrier()
            Timer.start = time.perf_counter()

        def teardown(self, trainer: pl.Trainer, *args: object, **kwargs: object) -> None:
            dist.barrier()
            Timer.wall = time.perf_counter() - Timer.start

    trainer.callbacks.append(Timer())
    trainer.fit(model, train, val)
    if trainer.global_rank != 0:
        return
    profiling = None
    if callback is not None and callback.report_path is not None:
        with open(callback.report_path) as f:
            profiling = json.load(f)["run"]["profiling"]
    with open(out, "w") as f:
        json.dump({"wall": Timer.wall, "profiling": profiling}, f)


def one_fit(perf: bool, epochs: int, ranks: int, options: str) -> tuple[float, dict | None]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fit.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "perf" if perf else "bare"]
        cmd += ["--epochs", str(epochs), "--ranks", str(ranks), "--out", out, "--options", options]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            result = json.load(f)
    return result["wall"], result["profiling"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--options", default="{}", help="PerfCallback's arguments as JSON: '{\"max_windows\": 0}'")
    parser.add_argument("--child", choices=("bare", "perf"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child == "perf", args.epochs, args.ranks, args.out, json.loads(args.options))
        return
    walls: dict[bool, list[float]] = {False: [], True: []}
    shares: list[float] = []
    for round_ in range(args.rounds):
        for perf in abba(round_):
            wall, profiling = one_fit(perf, args.epochs, args.ranks, args.options)
            walls[perf].append(wall)
            if profiling is not None and profiling.get("run_seconds"):
                shares.append(profiling["seconds"] / profiling["run_seconds"])
    ratios = [b / a for a, b in zip(walls[False], walls[True], strict=True)]
    mean = statistics.mean(ratios)
    error = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
    print(f"{args.epochs} epochs x 30 batches on {args.ranks} DDP CPU ranks, {args.rounds} rounds")
    for perf, label in ((False, "bare fit"), (True, "PerfCallback()")):
        w = walls[perf]
        print(f"  {label:18s} {statistics.median(w):.2f} s  ({min(w):.2f}..{max(w):.2f})")
    print(f"  ratio              {statistics.median(ratios):.3f}x ({min(ratios):.3f}..{max(ratios):.3f})")
    print(f"  ratio of totals    {sum(walls[True]) / sum(walls[False]):.3f}x")
    print(f"  mean ratio         {mean:.3f}x +- {error:.3f} (standard error)")
    if shares:
        print(f"  its own measure    {min(shares):.1%}..{max(shares):.1%} of the run profiling (rank 0)")
    print(f"  load average       {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
