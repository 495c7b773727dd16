"""
The DataLoader trial on pytorch-forecasting, against the advice applied
=======================================================================

A library's own dataset, model and optimizer (a TemporalFusionTransformer on 8 noisy sine series, its
``TimeSeriesDataSet`` making each sample in ``__getitem__``), torch on one thread so that a CPU is free for a worker.
``--mode trial`` fits with ``PerfCallback(profile_budget=None)`` and prints the trial's record and the advice;
``--mode bare`` and ``--mode applied --workers N`` fit without trials, with the DataLoader as it is and with
``to_dataloader(..., num_workers=N, persistent_workers=True)``; each prints the step and data wait per batch and the
median epoch over the epochs after the first. Alternate bare and applied runs to compare (a fit moves by 10-15% on a
shared machine).

Run it from the repository root::

    PYTHONPATH=. python benchmarks/loader_trial_tft.py --mode trial
    PYTHONPATH=. python benchmarks/loader_trial_tft.py --mode bare
    PYTHONPATH=. python benchmarks/loader_trial_tft.py --mode applied --workers 1
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings

import numpy as np
import pandas as pd
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("trial", "bare", "applied"), default="trial")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    from lightning.pytorch import Trainer, seed_everything
    from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet

    from lightning_perf import PerfCallback

    seed_everything(0, verbose=False)
    t, rng = np.arange(400), np.random.default_rng(0)
    frames = [
        pd.DataFrame({"time_idx": t, "series": str(s), "value": np.sin(t / (5 + s)) + 0.1 * rng.standard_normal(400)})
        for s in range(8)
    ]
    df = pd.concat(frames, ignore_index=True)
    df["series"] = df["series"].astype("category")
    train = TimeSeriesDataSet(
        df[df.time_idx <= 360],
        time_idx="time_idx",
        target="value",
        group_ids=["series"],
        max_encoder_length=24,
        max_prediction_length=6,
        static_categoricals=["series"],
        time_varying_known_reals=["time_idx"],
        time_varying_unknown_reals=["value"],
    )
    settings = {"num_workers": args.workers, "persistent_workers": True} if args.mode == "applied" else {}
    loader = train.to_dataloader(train=True, batch_size=32, **settings)
    model = TemporalFusionTransformer.from_dataset(
        train, hidden_size=8, attention_head_size=1, hidden_continuous_size=4
    )
    trial = args.mode == "trial"
    callback = PerfCallback(profile_budget=None, verbose=0, try_advice=trial, max_windows=1 if trial else 0)
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(
            max_epochs=args.epochs,
            gradient_clip_val=0.1,
            default_root_dir=root,
            callbacks=[callback],
            enable_progress_bar=False,
            enable_checkpointing=False,
            logger=False,
            limit_val_batches=0,
        )
        start = time.perf_counter()
        trainer.fit(model, train_dataloaders=loader)
        wall = time.perf_counter() - start
    later = [e for e in callback.epochs if e.stage == "train"][1:]
    batches = sum(e.measured_batches for e in later)
    out: dict = {
        "wall_s": wall,
        "step_ms": sum(e.step_time for e in later) / batches * 1e3,
        "wait_ms": sum(e.data_wait for e in later) / batches * 1e3,
        "epoch_s": statistics.median(e.wall_time or 0.0 for e in later),
    }
    if trial:
        out["trials"] = callback.report["run"].get("advice_trials")
        out["advice"] = [f.advice for f in callback.findings_for("train") if f.id == "dataloader_bound"][-1:]
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
