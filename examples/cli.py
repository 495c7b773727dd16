"""
LightningCLI example
====================

A small MLP on scikit-learn's 8x8 digits (1797 images, 10 classes, shipped inside the scikit-learn wheel:
no download), trained through :class:`~lightning.pytorch.cli.LightningCLI`, with
:class:`~lightning_perf.PerfCallback` configured from YAML.

Run it (from the repository root)::

    python examples/cli.py fit --config examples/cli_config.yaml

Useful variations::

    # every option of the CLI, PerfCallback's included, with its default
    python examples/cli.py fit --config examples/cli_config.yaml --print_config

    # add a PerfCallback with its defaults, without a config file, and change one option
    python examples/cli.py fit --trainer.callbacks+=PerfCallback --trainer.callbacks.schedule.active=2 \
        --trainer.max_epochs=1

    # see the traces and operator tables
    tensorboard --logdir lightning_logs

Needs ``jsonargparse[signatures]`` (``pip install lightning-perf[cli]``) and ``scikit-learn``.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Imported so that the CLI also accepts the short name: `--trainer.callbacks+=PerfCallback`.
import lightning_perf  # noqa: F401


class DigitsDataModule(pl.LightningDataModule):
    """scikit-learn's ``load_digits`` as in-memory tensors, split into train and validation sets.

    Args:
        batch_size: Samples per batch (32 gives 45 training and 12 validation batches).
        val_fraction: Share of the 1797 images held out for validation.
        seed: Seed of the train/validation split.
    """

    def __init__(self, batch_size: int = 32, val_fraction: float = 0.2, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel values are 0..16
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.seed))
        n_val = int(len(x) * self.val_fraction)
        val, train = order[:n_val], order[n_val:]
        self.train_set = TensorDataset(x[train], y[train])
        self.val_set = TensorDataset(x[val], y[val])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=0)


class DigitsClassifier(pl.LightningModule):
    """A two-layer MLP on the 64 pixels of a digit.

    Args:
        hidden: Width of the hidden layer.
        lr: Adam learning rate.
    """

    def __init__(self, hidden: int = 128, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(args: list[str] | dict | None = None, run: bool = True) -> LightningCLI:
    """Builds the CLI (and, with ``run=True``, runs its subcommand); ``args=None`` reads ``sys.argv``."""
    return LightningCLI(DigitsClassifier, DigitsDataModule, args=args, run=run)


if __name__ == "__main__":
    main()
