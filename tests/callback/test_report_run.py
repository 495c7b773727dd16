"""The report's ``run`` facts over several Trainer calls on one callback, on a real (tiny, CPU) Trainer: a later
``test`` keeps what the fit planned, an epoch's ``profiled_batches`` without any window is its FLOP-counted
batch, and the progress bar is named with its refresh rate."""

import json

import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

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
    callback = PerfCallback(max_windows=0)
    t = trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    t.fit(TinyModel(n=16))

    report = _report(callback)
    assert report["windows"] == []
    epochs = report["stages"]["train"]["epochs"]
    # No profiler ran, yet epoch 0 leaves one batch out of its times: the one whose FLOPs were counted (slowed by
    # the counter), as the field's description says; the first after the epoch's first, and one only.
    assert [e["profiled_batches"] for e in epochs] == [1, 0]
    assert len(report["run"]["flops"]["counted"]) == 1
    assert epochs[0]["steps"]["profiled"] == [[1, 1]]


@pytest.mark.parametrize(
    ("bars", "enabled", "expected"),
    [
        ([], True, ("RichProgressBar", 100) if _RICH_AVAILABLE else ("TQDMProgressBar", 1)),  # Lightning's default
        ([TQDMProgressBar(refresh_rate=20)], True, ("TQDMProgressBar", 20)),
        ([RichProgressBar(refresh_rate=5)], True, ("RichProgressBar", 5)),
        ([], False, (None, None)),
    ],
)
def test_the_progress_bar_and_how_often_it_redraws_are_in_the_report(tmp_path, bars, enabled, expected):
    # dataloader_bound's advice names a bar that redraws after almost every batch (diagnose/loader_advice.py).
    callback = PerfCallback(max_windows=0)
    trainer(tmp_path, [callback, *bars], enable_progress_bar=enabled).fit(TinyModel(n=16))
    run = _report(callback)["run"]
    assert (run["progress_bar"], run["progress_bar_refresh"]) == expected


def test_a_predict_call_with_nothing_to_change_writes_its_report_and_no_page(tmp_path, caplog):
    # Issue 46: a loop of short predict calls, one Trainer each, paid 0.7 ms a call for a page that repeats the
    # report's numbers. A window, or a finding, makes the page worth drawing.
    quiet = PerfCallback()
    with caplog.at_level("INFO"):
        trainer(tmp_path / "quiet", [quiet]).predict(TinyModel(n=8), return_predictions=False)
    assert _report(quiet)["stages"]["predict"]["epochs"][0]["batches"] == 2
    assert not (tmp_path / "quiet" / "lightning_logs" / "version_0" / "perf" / "report.html").exists()
    assert "report (opens offline in a browser)" not in caplog.text
    windowed = PerfCallback(batches=[1])
    trainer(tmp_path / "windowed", [windowed]).predict(TinyModel(n=16), return_predictions=False)
    assert (
        _report(windowed)["windows"]
        and (tmp_path / "windowed" / "lightning_logs" / "version_0" / "perf" / "report.html").exists()
    )
    fitted = PerfCallback()
    t = trainer(tmp_path / "fitted", [fitted])
    t.fit(TinyModel(n=8))
    t.predict(TinyModel(n=8), return_predictions=False)
    assert set(_report(fitted)["stages"]) == {"train", "validate", "predict"}
    assert (tmp_path / "fitted" / "lightning_logs" / "version_0" / "perf" / "report.html").exists()
