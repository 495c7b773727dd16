"""
lightning-perf under DDP
========================

The digits MLP of ``examples/demo.py`` trained with Lightning's DDP: one process per device, every rank
measured, each window traced on every rank, and rank zero reporting a per-rank table and the distributed
findings (``rank_straggler``, ``communication_bound``).

Run it on the CPU (two processes, gloo)::

    python examples/ddp.py

or on GPUs (NCCL), and across nodes with Lightning's usual launch (``num_nodes``, ``torchrun``, SLURM)::

    python examples/ddp.py --accelerator gpu --devices 4

``--slow-rank 1`` makes rank 1 sleep 20 ms every step, to see a straggler found.
"""

from __future__ import annotations

import argparse
import time

import lightning.pytorch as pl

from lightning_perf import PerfCallback

try:  # run as a script from the repository root, or as a module
    from demo import DigitsClassifier, DigitsData
except ImportError:  # pragma: no cover
    from examples.demo import DigitsClassifier, DigitsData


class MaybeSlowRank(DigitsClassifier):
    def __init__(self, slow_rank: int | None) -> None:
        super().__init__()
        self.slow_rank = slow_rank

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.slow_rank:
            time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--root", default="ddp_logs")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--slow-rank", type=int, default=None)
    args = parser.parse_args(argv)

    pl.seed_everything(0, verbose=False)
    perf = PerfCallback(stages=["train", "validate"])
    trainer = pl.Trainer(
        default_root_dir=args.root,
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp",
        max_epochs=args.epochs,
        callbacks=[perf],
        enable_progress_bar=False,
        log_every_n_steps=10,
    )
    trainer.fit(MaybeSlowRank(args.slow_rank), datamodule=DigitsData())
    if trainer.is_global_zero:
        print(f"Per-rank traces, one directory per window: {perf.dirpath}")
        print(
            f"Open them (each window is a run, its ranks are workers): tensorboard --logdir {perf.tensorboard_logdir}"
        )


if __name__ == "__main__":
    main()
