"""What fills memory (issue 24), on real Trainer runs: the bytes of parameters, gradients and optimizer state equal
a hand count, each storage once; the report, the console and ``lightning-perf report`` carry them."""

from __future__ import annotations

import json
import logging

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from models import trainer


class Tied(pl.LightningModule):
    """Tokens in, tokens out: an embedding whose weight the output layer shares, a frozen layer, a bf16 layer."""

    def __init__(self, optimizer: str = "adam") -> None:
        super().__init__()
        self.optimizer = optimizer
        self.embed = nn.Embedding(10, 8)  # 80 floats: 320 B
        self.body = nn.Linear(8, 8)  # 72 floats: 288 B
        self.frozen = nn.Linear(8, 8).requires_grad_(False)  # 288 B, no gradient, no state
        self.low = nn.Linear(8, 8).to(torch.bfloat16)  # 72 bf16: 144 B
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: counted once

    def training_step(self, batch, batch_idx):
        (tokens,) = batch
        h = torch.relu(self.body(self.embed(tokens)))
        h = self.low(self.frozen(h).bfloat16()).float()
        return nn.functional.cross_entropy(self.head(h), tokens)

    def validation_step(self, batch, batch_idx):
        # Lightning sets the gradients to None before every validation run: they are counted before it.
        return self.training_step(batch, batch_idx)

    def val_dataloader(self):
        return self.train_dataloader()

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.arange(40) % 10), batch_size=8)


def fit(tmp_path, optimizer: str) -> dict:
    callback = PerfCallback(max_windows=0)
    trainer(tmp_path, [callback], max_epochs=2).fit(Tied(optimizer))
    with open(callback.report_path) as f:
        assert json.load(f)["run"]["memory"] == callback.report["run"]["memory"]
    with open(callback.page_path) as f:
        page = f.read()
    assert "What fills memory" in page and "exp_avg" in page if optimizer == "adam" else "SGD" in page
    return callback.report["run"]["memory"]


def test_parameters_gradients_and_adam_state_equal_the_hand_count(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        memory = fit(tmp_path, "adam")
    trainable = 320 + 288 + 144  # embed (and head, tied), body, low
    assert memory["parameters"] == {
        "total": trainable + 288,
        "trainable": trainable,
        "frozen": 288,
        "by_dtype": {"float32": 320 + 288 + 288, "bfloat16": 144},
    }
    assert memory["gradients"] == trainable
    # Adam: two moments of each trainable parameter, in its dtype, and a 4-byte step per parameter tensor (5).
    assert memory["optimizer_state"] == {
        "total": 2 * trainable + 5 * 4,
        "by_entry": {"step": 20, "exp_avg": trainable, "exp_avg_sq": trainable},
    }
    assert memory["master_copies"] == 0 and memory["optimizers"] == ["Adam"] and memory["epoch"] == 1
    assert memory["device"] == "cpu" and memory["activations"] is None  # measured on CUDA only
    said = [r.getMessage() for r in caplog.records if "lightning-perf: memory" in r.getMessage()]
    assert len(said) == 1, said  # the first count; the second epoch's is the same
    assert said[0].startswith("lightning-perf: memory at training epoch 0: parameters 1.0 KiB (float32 896 B,")
    assert "optimizer state 1.5 KiB (Adam: step 20 B, exp_avg 752 B, exp_avg_sq 752 B)" in said[0]


def test_sgd_without_momentum_has_no_state(tmp_path):
    memory = fit(tmp_path, "sgd")
    assert memory["optimizer_state"] == {"total": 0, "by_entry": {}} and memory["optimizers"] == ["SGD"]
    assert memory["gradients"] == 320 + 288 + 144
