"""precision's advised bf16 tried on one real step of a CUDA run (issue 48, "What is tried" 3): fp32 matmuls on a
tensor-core GPU, the trial's time and peak memory in the report, and the callback's own memory peaks and the
training left as they were. Runs wherever a CUDA device is present (``pytest tests/gpu``); skips elsewhere."""

import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_perf import PerfCallback
from models import trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present here"),
]
WINDOW = {"skip_first": 2, "warmup": 1, "active": 3}
BATCH = 8192


class Rows(Dataset):
    """Fixed features read a batch at a time (``__getitems__``): the loader costs little beside the step."""

    def __init__(self, n: int = 16 * BATCH) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1024, generator=g)
        self.y = (self.x.sum(1, keepdim=True) > 0).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, indices):
        return self.x[indices], self.y[indices]


def as_is(batch):
    return batch


class Activations(pl.LightningModule):
    """fp32 matmuls whose activations outweigh the weights (8192 rows of 1024): bf16 halves them, with dropout."""

    def __init__(self) -> None:
        super().__init__()
        layers = [m for _ in range(4) for m in (nn.Linear(1024, 1024), nn.ReLU(), nn.Dropout(0.1))]
        self.net = nn.Sequential(*layers, nn.Linear(1024, 1))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.binary_cross_entropy_with_logits(self.net(x).float(), y)
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(Rows(), batch_size=BATCH, shuffle=True, collate_fn=as_is)


def fit(tmp_path, **options):
    torch.manual_seed(0)
    model = Activations()
    callback = PerfCallback(schedule=WINDOW, stages=["train"], profile_budget=None, verbose=0, **options)
    trainer(tmp_path, [callback], accelerator="gpu", devices=1, max_epochs=2, limit_val_batches=0).fit(model)
    return callback, model


def test_bf16_is_tried_on_a_step_with_its_time_and_peak_memory_and_the_training_is_unchanged(tmp_path):
    tried, with_trial = fit(tmp_path / "on")
    untried, without = fit(tmp_path / "off", try_advice=False)
    record = tried.report["run"]["advice_trials"]["precision"]
    assert record["setting"] == 'precision="bf16-mixed"' and record["untried"] is None, record
    assert record["current_peak"] > 0 and record["advised_peak"] > 0, record
    # Activations of 8192 x 1024 per layer in bf16 instead of fp32: the step's peak falls; its time too, on tensor
    # cores (fp32 without TF32 runs on none).
    assert record["advised_peak"] < record["current_peak"] and record["ratio"] > 1.1, record
    # The epoch is diagnosed again once tried: its finding reports the measurement.
    [finding] = [f for f in tried.findings_for("train", epoch=0) if f.id == "precision"]
    assert finding.advice.startswith("Tried on one batch of your data, 9 steps each on a copy of your module:")
    assert "its peak memory" in finding.advice
    # The callback's epoch peaks leave the trial out, and the training is bit-identical.
    peaks = [(e.epoch, e.cuda_max_allocated) for e in tried.epochs if e.stage == "train"]
    assert peaks == [(e.epoch, e.cuda_max_allocated) for e in untried.epochs if e.stage == "train"]
    assert torch.equal(torch.stack(with_trial.losses), torch.stack(without.losses))
    for a, b in zip(with_trial.parameters(), without.parameters(), strict=True):
        assert torch.equal(a, b)


class FillsTheDevice(Activations):
    """Holds all but 4% of the device in a tensor of its own: memory_pressure, and no room for a copy of it."""

    def on_train_start(self):
        free, total = torch.cuda.mem_get_info()
        self.ballast = torch.empty(int(free - 0.04 * total), dtype=torch.uint8, device=self.device)

    def train_dataloader(self):
        return DataLoader(Rows(n=4 * 256), batch_size=256, collate_fn=as_is)


def test_a_module_the_free_memory_cannot_copy_is_untried_and_says_so(tmp_path):
    torch.manual_seed(0)
    callback = PerfCallback(max_windows=0, stages=["train"], profile_budget=None, verbose=0)
    trainer(tmp_path, [callback], accelerator="gpu", devices=1, max_epochs=1, limit_val_batches=0).fit(FillsTheDevice())
    record = callback.report["run"]["advice_trials"]["memory_pressure"]
    assert record["setting"] == 'precision="bf16-mixed"' and record["current"] is None, record
    assert record["untried"].startswith("the GPU has ") and "a copy of the module" in record["untried"], record
    [finding] = [f for f in callback.findings_for("train", epoch=0) if f.id == "memory_pressure"]
    assert "halves activation memory (a prediction: it was not tried on this run, the GPU has" in finding.advice
