"""
Per-sample loading advice, applied to pytorch-forecasting
=========================================================

``dataloader_bound`` on pytorch-forecasting's TemporalFusionTransformer (``downstream_libraries.py``'s
``forecasting`` case) says the ``TimeSeriesDataSet`` makes its samples one at a time, in the library's code, and
advises making them once and training from the list. This applies that advice and times it: in each round, two
fresh Trainers fit the same seeded model, bare (no callback), one after another:

    (a) ``to_dataloader(train=True, batch_size=32)``, as the library's quick-start has it;
    (b) ``samples = [dataset[i] for i in range(len(dataset))]``, then ``DataLoader(samples, batch_size=32,
        shuffle=True, drop_last=..., collate_fn=...)`` with the library's own settings; making the samples is
        inside the timed part.

It prints each fit's wall time and final ``train_loss`` (the same in both: the samples are the same), and the
medians. Needs pytorch-forecasting (not a dependency of this project). Run it from the repository root::

    python benchmarks/forecasting_cached.py --epochs 4 --rounds 6
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings

import lightning
import lightning.pytorch as pl
from torch.utils.data import DataLoader

from downstream_libraries import forecasting_case


def fit(case, epochs: int, *, cached: bool) -> tuple[float, float]:
    """One bare fit: its wall time (making the samples included) and final training loss."""
    lightning.seed_everything(0, verbose=False)
    model, train, val = case.build()
    start = time.perf_counter()
    if cached:
        samples = [train.dataset[i] for i in range(len(train.dataset))]
        train = DataLoader(
            samples, batch_size=train.batch_size, shuffle=True, drop_last=train.drop_last, collate_fn=train.collate_fn
        )
    trainer = pl.Trainer(
        default_root_dir=tempfile.mkdtemp(),
        max_epochs=epochs,
        gradient_clip_val=0.1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, train, val)
    return time.perf_counter() - start, float(trainer.callback_metrics["train_loss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    case = forecasting_case()
    times: dict[str, list[float]] = {"library's loader": [], "samples made once": []}
    for round_ in range(args.rounds):
        for name, cached in (("library's loader", False), ("samples made once", True)):
            seconds, loss = fit(case, args.epochs, cached=cached)
            times[name].append(seconds)
            print(f"round {round_}: {name:18} {seconds:6.2f} s  train_loss {loss:.4f}", flush=True)
    for name, values in times.items():
        print(f"{name:18} median {statistics.median(values):.2f} s ({min(values):.2f}..{max(values):.2f})")


if __name__ == "__main__":
    main()
