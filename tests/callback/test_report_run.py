"""The report's ``run`` facts over several Trainer calls on one callback, on a real (tiny, CPU) Trainer: a later
``test`` keeps what the fit planned, and an epoch's ``profiled_batches`` without any window is its FLOP-counted
batch."""

import json

from lightning_perf import PerfCallback
from models import TinyModel, trainer


def _report(callback):
    with open(callback.report_path, encoding="utf-8") as f:
        return json.load(f)


def test_a_test_call_after_fit_keeps_the_fits_plan_in_the_report(tmp_path):
    callback = PerfCallback()  # 4 batches an epoch: too few for the default schedule, no window
    t = trainer(tmp_path, [callback], max_epochs=3)
    model = TinyModel(n=16, val_n=8)
    t.fit(model)
    fitted = _report(callback)["run"]
    t.test(model)

    run = _report(callback)["run"]
    assert fitted["max_epochs"] == 3
    # What the fit planned and used describes the training the report holds: the test call (1 epoch, no optimizer)
    # leaves it; what the test call adds (its DataLoader's settings) joins it.
    assert run["max_epochs"] == 3
    assert run["optimizer_info"] == fitted["optimizer_info"]
    assert run["optimizer_info"]["class"] == "SGD"
    assert run["flops"] == fitted["flops"]
    assert set(run["dataloaders"]) == {"train", "validate", "test"}


def test_profiled_batches_without_a_window_are_the_flop_counted_batch(tmp_path):
    callback = PerfCallback()
    t = trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    t.fit(TinyModel(n=16))

    report = _report(callback)
    assert report["windows"] == []
    epochs = report["stages"]["train"]["epochs"]
    # No profiler ran, yet epoch 1 leaves one batch out of its times: the one whose FLOPs were counted (slowed by
    # the counter), as the field's description says. Epoch 0 counted none: the count waits for the run's first
    # window, which epochs this short never open, so it waited no longer after that epoch.
    assert [e["profiled_batches"] for e in epochs] == [0, 1]
    assert len(report["run"]["flops"]["counted"]) == 1
    assert epochs[1]["steps"]["profiled"] == [[1, 1]]
