"""Tiny real models and data sets for end-to-end tests (no mocks: real Trainer runs on the CPU)."""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SleepyDataset(Dataset):
    """Random features whose every item takes ``sleep_s`` to load: a data-bound input pipeline."""

    def __init__(self, n: int = 64, dim: int = 16, sleep_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = (self.x.sum(dim=1, keepdim=True) > 0).float()
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


class TinyModel(pl.LightningModule):
    """An MLP on :class:`SleepyDataset`, with every stage's step and dataloader."""

    def __init__(
        self,
        n: int = 64,
        batch_size: int = 4,
        sleep_s: float = 0.0,
        val_n: int | None = None,
        width: int = 32,
        depth: int = 1,
    ) -> None:
        super().__init__()
        self.n, self.batch_size, self.sleep_s = n, batch_size, sleep_s
        self.val_n = n if val_n is None else val_n
        hidden = [layer for _ in range(depth - 1) for layer in (nn.Linear(width, width), nn.ReLU())]
        self.net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), *hidden, nn.Linear(width, 1))
        # Marker ops that name the stage in a trace: a test can tell which stage's batches a trace holds.
        self.stage_marker = {"train": torch.sin, "validate": torch.cos, "test": torch.tan, "predict": torch.exp}

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        x, y = batch
        self.stage_marker[stage](x)
        return nn.functional.binary_cross_entropy_with_logits(self.net(x), y)

    def training_step(self, batch, batch_idx):
        return self._loss(batch, "train")

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return self._loss(batch, "validate")

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        return self._loss(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self.stage_marker["predict"](batch[0])
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def _loader(self, n: int) -> DataLoader:
        return DataLoader(SleepyDataset(n, sleep_s=self.sleep_s), batch_size=self.batch_size)

    def train_dataloader(self):
        return self._loader(self.n)

    def val_dataloader(self):
        return self._loader(self.val_n)

    def test_dataloader(self):
        return self._loader(self.val_n)

    def predict_dataloader(self):
        return self._loader(self.val_n)


def window_names(callback, stage=None) -> list[str]:
    """The names of the windows a PerfCallback saved, of one stage or all."""
    return [w.name for w in callback.windows if stage is None or w.stage == stage]


def trainer(tmp_path, callbacks, *, trainer_class: type = pl.Trainer, **kwargs) -> pl.Trainer:
    """A quiet CPU Trainer writing under ``tmp_path`` (``trainer_class``: e.g. ``pytorch_lightning.Trainer``)."""
    defaults = dict(
        default_root_dir=tmp_path,
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    defaults.update(kwargs)
    return trainer_class(callbacks=callbacks, **defaults)


class Leaky(TinyModel):
    """Keeps every step's output with its autograd graph: 4 MiB more host memory every batch, 64 MiB an epoch."""

    def __init__(self) -> None:
        super().__init__(n=256, batch_size=16)
        self.wide = nn.Linear(16, 65536)
        self.kept: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.kept.append(self.wide(batch[0]).relu())  # 16 x 65536 floats = 4 MiB, kept with its graph
        return super().training_step(batch, batch_idx)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for a while: the timing-based end-to-end tests then measure the
    same on a 2-core runner whatever else runs beside them (two runs of 2 threads each on 2 cores slowed a
    few-ms step 20-fold)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_FROM = 4 * 2**20  # the Leaky module's tensors and larger


def release_freed_memory() -> None:
    """Gives the memory earlier tests in this process freed back to the system (glibc's ``malloc_trim``), so that
    a test of RSS growth sees a module's new memory as new: reused, it grows no RSS (a full suite's process, at
    1 GB RSS, absorbed a module's 64 MiB per epoch). And fixes glibc's mmap threshold at :data:`MMAP_FROM` for
    the rest of the process: left dynamic, it rises as large blocks are freed, and whether a 4-MiB tensor then
    comes from memory the heap kept depends on what ran before (in one process, after other allocations: the
    Leaky module's epochs grew RSS by 60.1 then 64.0 MiB, then 128 and 128 in the next fits; fixed, 64.1 each;
    a full suite once saw 47.4)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_FROM)
