"""
What the per-batch scalars cost a run at a fine logging cadence
===============================================================

``PerfCallback`` writes its per-batch scalars (step time, data wait, compute, throughput, loss) at the Trainer's
``log_every_n_steps``, as far as their cost allows (:mod:`lightning_perf.hooks.log_pace`). Each write costs
0.2-0.4 ms on a 2-CPU machine: nothing at Lightning's default of 50, but new users of small datasets set
``log_every_n_steps=1`` (Lightning warns when an epoch has fewer batches than 50). The step-time benchmarks
(``overhead.py``) cannot see this cost: the callback's work after a batch is in no step time. So this one times
whole fits.

``short_epochs.py``'s tiny MLP (Linear(16, 32), ReLU, Linear(32, 1), batch 4, a ``self.log`` of its loss each
step, ``--batches`` in-memory batches an epoch, no validation) fits ``--epochs`` epochs, bare and with a default
``PerfCallback()``, alternating in ABBA order in one process, for each ``--every`` cadence. torch runs on one
thread. It prints the median ratio of the fits, the mean with its standard error, and the share of logging points
the callback skipped.

Run it from the repository root::

    python benchmarks/log_cadence.py                     # 6 rounds at 1 and 50: about 4 min on 2 idle cores
    python benchmarks/log_cadence.py --every 1 --rounds 10
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import tempfile
import time
import warnings

import lightning
import lightning.pytorch as pl
import torch

from lightning_perf import PerfCallback
from machine import abba
from short_epochs import Tiny


def fit(every: int, perf: bool, batches: int, epochs: int) -> tuple[float, float | None]:
    """One fit's wall time, and the share of logging points the callback skipped (``None`` bare)."""
    lightning.seed_everything(0, verbose=False)
    callback = PerfCallback(verbose=0) if perf else None
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            devices=1,
            max_epochs=epochs,
            callbacks=[callback] if callback else [],
            limit_val_batches=0,
            log_every_n_steps=every,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        start = time.perf_counter()
        trainer.fit(Tiny(batches))
        wall = time.perf_counter() - start
    if callback is None:
        return wall, None
    points = batches * epochs // every
    return wall, callback._epochs.stages["train"].pace.skipped / points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, nargs="+", default=[1, 50], help="log_every_n_steps values")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, default=2048, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    fit(1, False, 64, 1)  # imports and first calls, uncounted
    fit(1, True, 64, 1)
    for every in args.every:
        ratios, bares, skipped = [], [], []
        for round_ in range(args.rounds):
            walls = {}
            for perf in abba(round_):
                walls[perf], share = fit(every, perf, args.batches, args.epochs)
                if share is not None:
                    skipped.append(share)
            bares.append(walls[False])
            ratios.append(walls[True] / walls[False])
        mean, error = statistics.mean(ratios), statistics.stdev(ratios) / math.sqrt(len(ratios))
        print(
            f"log_every_n_steps={every}: bare fit {statistics.median(bares):.2f} s, ratio"
            f" {statistics.median(ratios):.3f}x (mean {mean:.3f} +- {error:.3f}), logging points skipped"
            f" {statistics.median(skipped):.0%}"
        )


if __name__ == "__main__":
    main()
