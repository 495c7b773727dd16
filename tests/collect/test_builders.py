"""Who built the run's DataLoader and optimizer (lightning_perf.collect.builders), read from real Trainers: an
installed library's hook, or the user's own code."""

from __future__ import annotations

import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.collect.builders import hook_builder, installed_package
from models import TinyModel, trainer


def test_the_users_own_classes_and_lightnings_defaults_are_no_librarys() -> None:
    assert installed_package(TinyModel) is None  # a test's (a project's) class
    assert installed_package(torch.optim.Adam) == "torch"
    assert hook_builder(TinyModel(), "configure_optimizers") is None  # the user's own hook
    assert hook_builder(TinyModel(), "train_dataloader") is None  # theirs too (TinyModel defines it)


def test_the_users_fit_records_no_builder(tmp_path) -> None:
    callback = PerfCallback(max_windows=0, verbose=0)
    trainer(tmp_path, [callback], max_epochs=1, limit_val_batches=0).fit(TinyModel(n=32))
    run = callback.report["run"]
    assert (run["dataloaders"]["train"]["built_by"], run["optimizer_info"]["built_by"]) == (None, None)


def test_lightnings_demo_datamodule_is_named_as_the_dataloaders_builder() -> None:
    """Lightning's examples build their loaders with its demo ``MNISTDataModule(num_workers=16)``: the advice's
    ``DataLoader(num_workers=...)`` is reached through it, as through a library's data module."""
    from lightning.pytorch import LightningDataModule
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.demos.mnist_datamodule import MNISTDataModule

    assert hook_builder(MNISTDataModule(), "train_dataloader") == {
        "built_by": "lightning",
        "builder": "MNISTDataModule.train_dataloader",
    }
    assert hook_builder(BoringModel(), "configure_optimizers")["builder"] == "BoringModel.configure_optimizers"
    assert hook_builder(LightningDataModule(), "train_dataloader") is None  # Lightning's default hook


@pytest.mark.slow
def test_a_pyg_datamodule_is_named_as_the_dataloaders_builder(tmp_path) -> None:
    datamodule = pytest.importorskip("torch_geometric.data.lightning.datamodule")
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    graphs = [
        Data(
            x=torch.randn(4, 16, generator=g),
            y=torch.randn(1, 1, generator=g),
            edge_index=torch.tensor([[0, 1], [1, 2]]),
        )
        for _ in range(32)
    ]

    class GraphModel(TinyModel):
        def training_step(self, batch, batch_idx):
            out = self.net(batch.x).view(-1, 4).mean(1, keepdim=True)
            return torch.nn.functional.mse_loss(out, batch.y)

    data = datamodule.LightningDataset(graphs, batch_size=8, num_workers=0)
    callback = PerfCallback(max_windows=0, verbose=0)
    trainer(tmp_path, [callback], max_epochs=1).fit(GraphModel(), datamodule=data)
    loader = callback.report["run"]["dataloaders"]["train"]
    assert (loader["built_by"], loader["builder"]) == ("torch_geometric", "LightningDataset.train_dataloader")
