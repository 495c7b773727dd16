"""The callback never changes what it observes: a seeded fit's parameters and losses are bit-identical with and
without it, on every path a window's processing can take (the window process, a thread of the training process),
with the FLOP count and the memory measure on, whatever ``deterministic`` says, and when the fit is interrupted.

The model is the one a user reported: a 3-layer MLP with BatchNorm and Adam, on 128-sample batches whose per-sample
work makes each training window's trace larger than what is processed in the calling thread (the window process
takes it). Each step's matrix products and reductions run on torch's threads, so a step that ran on fewer threads
(the callback lowered the count while a window was processed, before) gives other last bits.
"""

from __future__ import annotations

import gzip
import pathlib

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_perf import PerfCallback
from lightning_perf.collect.run_info import cpu_count
from lightning_perf.hooks import window_process
from models import trainer

EPOCHS, BATCHES, BATCH = 2, 40, 128


class Worked(Dataset):
    """Fixed features, each item made by a few small ops (a window's trace of a batch: over 1 MB)."""

    def __init__(self, n: int = BATCHES * BATCH, dim: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        for _ in range(4):
            x = x * 0.5 + 0.25
        return x, self.y[i]


class Mlp(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, 512),
            nn.BatchNorm1d(512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.BatchNorm1d(512),
            nn.ReLU(),
            nn.Linear(512, 10),
        )
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.detach().clone())
        return loss

    def train_dataloader(self):
        return DataLoader(Worked(), batch_size=BATCH, shuffle=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Interrupt(pl.Callback):
    """Ctrl-C at a training batch's start (Lightning ends the fit gracefully, as it does for a real one)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at:
            raise KeyboardInterrupt


def fit(tmp_path, callbacks, deterministic: bool) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """A seeded fit's parameters (and buffers) and its losses, step by step."""
    pl.seed_everything(0, verbose=False)
    model = Mlp()
    run = trainer(tmp_path, callbacks, max_epochs=EPOCHS, limit_val_batches=0, deterministic=deterministic)
    try:
        run.fit(model)
    except SystemExit:  # Lightning's graceful end of an interrupted fit exits
        assert run.interrupted
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model.losses


def assert_identical(bare, observed) -> None:
    (bare_state, bare_losses), (state, losses) = bare, observed
    assert len(losses) == len(bare_losses) > 0
    differing = [i for i, (a, b) in enumerate(zip(bare_losses, losses, strict=True)) if not torch.equal(a, b)]
    assert differing == [], f"losses of steps {differing} differ"
    assert bare_state.keys() == state.keys()
    assert [k for k in state if not torch.equal(bare_state[k], state[k])] == []


@pytest.fixture
def all_threads():
    """torch on as many threads as the process has CPUs (its default), where a window process takes one of them."""
    before = torch.get_num_threads()
    torch.set_num_threads(cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    ("path", "deterministic"),
    [("process", False), ("process", True), ("thread", False)],
)
def test_a_seeded_fit_is_bit_identical_with_the_callback(tmp_path, monkeypatch, all_threads, path, deterministic):
    if path == "thread":
        monkeypatch.setenv(window_process.PROCESS_ENV, "0")
    bare = fit(tmp_path / "bare", [], deterministic)
    # No budget: every planned window opens (a window of each epoch) and the FLOP count (with the memory
    # measure of the activations saved for the backward) runs on the first batch it may.
    callback = PerfCallback(stages=["train"], profile_budget=None)
    observed = fit(tmp_path / "observed", [callback], deterministic)
    assert_identical(bare, observed)
    windows = [w for w in callback.windows if w.stage == "train"]
    assert len(windows) == EPOCHS
    if path == "process":  # each trace too large to process in the calling thread
        assert all(
            len(gzip.decompress(pathlib.Path(w.trace_path).read_bytes())) > window_process.HERE_BYTES for w in windows
        )
    assert any(e.flops_per_batch for e in callback.epochs), "no batch's FLOPs were counted"


def test_an_interrupted_fit_is_bit_identical_with_the_callback(tmp_path, all_threads):
    at = BATCHES + 5  # in the second epoch, after the first epoch's window was processed
    bare = fit(tmp_path / "bare", [Interrupt(at)], False)
    observed = fit(tmp_path / "observed", [PerfCallback(stages=["train"], profile_budget=None), Interrupt(at)], False)
    assert len(observed[1]) == at
    assert_identical(bare, observed)
