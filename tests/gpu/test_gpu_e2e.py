"""GPU end-to-end checks: real CUDA runs that provoke the GPU-only findings. They run wherever a CUDA
device is present (``pytest tests/gpu``) and skip with a reason elsewhere; the same rules are tested on the
CPU machine against the real GPU traces in ../shared/fixtures/gpu-traces."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_perf import PerfCallback
from models import TinyModel, trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present here"),
]
WINDOW = {"skip_first": 2, "warmup": 1, "active": 3}


def _ids(callback, stage="train"):
    return {f.id for f in callback.findings_for(stage) if f.severity != "info"}


def _gpu_trainer(tmp_path, callbacks, **kwargs):
    return trainer(tmp_path, callbacks, accelerator="gpu", devices=1, limit_val_batches=0, **kwargs)


class SyncEveryStep(TinyModel):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        print(loss.item(), end="\r")  # a host sync every step, as a debugging print would do
        torch.cuda.synchronize()
        return loss


def test_item_every_step_is_host_sync(tmp_path):
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    _gpu_trainer(tmp_path, [callback]).fit(SyncEveryStep(n=256, batch_size=8, width=1024, depth=4))
    assert "host_sync" in _ids(callback)
    assert all(w.summary and w.summary.syncs_per_step >= 1 for w in callback.windows)


def test_a_slow_dataset_leaves_the_device_idle(tmp_path):
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    _gpu_trainer(tmp_path, [callback]).fit(TinyModel(n=128, batch_size=8, sleep_s=0.002))
    assert {"device_idle", "dataloader_bound"} <= _ids(callback)


class FillsTheDevice(TinyModel):
    def on_train_start(self):
        free, total = torch.cuda.mem_get_info()
        # Hold all but 4% of the device: reserved/capacity above the 90% warning.
        self.ballast = torch.empty(int(free - 0.04 * total), dtype=torch.uint8, device=self.device)


def test_a_nearly_full_device_is_memory_pressure(tmp_path):
    callback = PerfCallback(max_windows=0, stages=["train"])
    _gpu_trainer(tmp_path, [callback]).fit(FillsTheDevice(n=64))
    assert "memory_pressure" in _ids(callback)
    epoch = callback.epochs[-1]
    assert epoch.cuda_max_reserved / epoch.cuda_capacity >= 0.9


def test_trace_of_a_cuda_run_shows_runtime_in_the_profiler_tab(tmp_path):
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    _gpu_trainer(tmp_path, [callback]).fit(TinyModel(n=128, batch_size=8, width=1024, depth=4))
    path = callback.windows[0].trace_path
    data = RunProfileData.parse("rank0", None, path, str(tmp_path))
    profile = RunGenerator("rank0", None, data).generate_run_profile()
    shares = {c["name"]: c["extra"] for c in profile.overview["performance"][0]["children"]}
    assert shares["Runtime"] > 0 and shares["Kernel"] > 0
    assert sum(r["device_self_duration"] for r in profile.operation_table_by_name["data"]) > 0


class RunsOutOfMemory(TinyModel):
    """Asks the device for far more than it has at epoch 1, batch 2: a real CUDA out-of-memory error."""

    def training_step(self, batch, batch_idx):
        if (self.current_epoch, batch_idx) == (1, 2):
            total = torch.cuda.get_device_properties(batch[0].device).total_memory
            torch.empty(total, dtype=torch.uint8, device=batch[0].device)  # the allocation that fails
        return super().training_step(batch, batch_idx)


def test_a_cuda_out_of_memory_error_leaves_the_breakdown_the_snapshot_and_the_call_sites(tmp_path):
    callback = PerfCallback(max_windows=0, memory_history=True)
    with pytest.raises(torch.OutOfMemoryError):
        _gpu_trainer(tmp_path, [callback], max_epochs=3).fit(RunsOutOfMemory(n=64, width=1024))
    oom = callback.report["run"]["out_of_memory"]
    assert oom["requested"] is not None and oom["free"] is not None and oom["finding"]["severity"] == "critical"
    assert Path(oom["snapshot"]).is_file() and oom["largest_allocations"]
    memory = callback.report["run"]["memory"]
    assert memory["device"] == "cuda" and memory["device_total"] and memory["outside_allocator"] is not None
