"""Each training batch's phases as the CUDA device ran them (lightning_perf.collect.device_phases): events read
once the device has passed them. Runs wherever a CUDA device is present (``pytest tests/gpu``); skips elsewhere."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_perf import PerfCallback
from models import TinyModel, trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present here"),
]


class DeviceHeavy(TinyModel):
    """A forward of 8 large matmuls, so the device's forward dwarfs the host's queueing of it."""

    def __init__(self) -> None:
        super().__init__(n=512, batch_size=64)
        self.wide = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(8)])

    def training_step(self, batch, batch_idx):
        x = batch[0].repeat(1, 256)  # 64 x 4096
        return self.wide(x).pow(2).mean() + super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def test_a_cuda_fit_reports_the_devices_phases(tmp_path) -> None:
    callback = PerfCallback(max_windows=0, verbose=0)
    trainer(tmp_path, [callback], accelerator="cuda", max_epochs=2, limit_val_batches=0).fit(DeviceHeavy())
    timeline = callback._stages["train"].clock.phase_marks.device
    assert timeline is not None and timeline.broken is None
    epoch = [e for e in callback.epochs if e.stage == "train"][-1]
    # 8 matmuls forward, twice as many backward: the device's backward takes longer than its forward, whatever the
    # host's clock said when it queued them.
    assert epoch.forward_time > 0 and epoch.backward_time > epoch.forward_time and epoch.optimizer_time > 0
