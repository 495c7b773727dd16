"""
What Lightning's progress bar costs a run of short steps
========================================================

``dataloader_bound``'s advice for time spent between batches, outside the DataLoader, names the progress bar
where it redraws after (almost) every batch (:mod:`lightning_perf.diagnose.loader_advice`): Lightning's
``TQDMProgressBar`` redraws every ``refresh_rate`` batches (default 1), and ``RichProgressBar`` (Lightning's
default bar where ``rich`` is installed) updates its task after every batch and redraws ``refresh_rate`` times a
second (default 100) from a thread of its own. Both run in ``on_train_batch_end``, between batches. This benchmark
applies that advice and times it.

Lightning's own ``BoringModel`` (``lightning.pytorch.demos.boring_classes``: a Linear(32, 2) on batches of 4
random vectors, about 1 ms a step here) fits ``--epochs`` epochs of 256 batches with each bar, and with none,
in ABBA order in one process, each with ``PerfCallback(max_windows=0)``; torch runs on one thread and the bars
draw into a discarded stream. It prints each configuration's fit times and their median.

Run it from the repository root::

    python benchmarks/progress_bar.py                    # 4 rounds: about 1 minute on 2 idle cores
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from lightning_perf import PerfCallback

# name -> (the bar callbacks, enable_progress_bar)
CONFIGS: dict[str, Callable[[], tuple[list[pl.Callback], bool]]] = {
    "TQDMProgressBar(refresh_rate=1)": lambda: ([TQDMProgressBar(refresh_rate=1)], True),
    "TQDMProgressBar(refresh_rate=50)": lambda: ([TQDMProgressBar(refresh_rate=50)], True),
    "RichProgressBar()": lambda: ([RichProgressBar()], True),
    "no bar": lambda: ([], False),
}


def fit(bars: list[pl.Callback], enabled: bool, epochs: int) -> float:
    """One fit's wall time, in seconds."""
    trainer = pl.Trainer(
        default_root_dir=tempfile.mkdtemp(prefix="progress_bar_"),
        max_epochs=epochs,
        callbacks=[PerfCallback(verbose=0, max_windows=0), *bars],
        enable_progress_bar=enabled,
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=False,
        limit_val_batches=0,
    )
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.fit(BoringModel(), DataLoader(RandomDataset(32, 1024), batch_size=4))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds of the configurations (default: 4)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of 256 batches per fit (default: 10)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    names = list(CONFIGS)
    walls: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            walls[name].append(fit(*CONFIGS[name](), args.epochs))
    none = statistics.median(walls["no bar"])
    for name in names:
        median = statistics.median(walls[name])
        fits = [round(w, 2) for w in walls[name]]
        print(f"{name:<34} median {median:5.2f} s ({median / none:.2f}x no bar)   fits {fits}")


if __name__ == "__main__":
    main()
