"""Window semantics, each on a real Trainer run: which batches a trace holds and when windows open and close."""

import gc
import json
import pathlib
import time

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from kineto import events_in_step, load, op_names, steps
from lightning_perf import PerfCallback
from models import TinyModel, trainer, window_names

SCHEDULE_3 = {"skip_first": 1, "warmup": 1, "active": 3}  # records batches 2, 3, 4 of each epoch


def test_train_step_span_holds_exactly_one_batch(tmp_path):
    callback = PerfCallback(schedule=SCHEDULE_3, stages=["train"])
    trainer(tmp_path, [callback]).fit(TinyModel(n=32))
    [window] = callback.windows
    trace = load(window.trace_path)
    assert steps(trace) == [2, 3, 4]
    for step in steps(trace):
        inside = events_in_step(trace, step)
        counts = op_names({"traceEvents": inside})
        fetches = [e for e in inside if e["name"].startswith("enumerate(DataLoader)#")]
        optimizer = [e for e in inside if e["name"] == "Optimizer.step#SGD.step"]
        forward = [e for e in inside if e["name"] == "aten::sin"]  # TinyModel's train-stage marker
        backward = [e for e in inside if e["name"].startswith("autograd::engine::evaluate_function")]
        assert (len(fetches), len(forward), len(optimizer)) == (1, 1, 1), counts
        assert backward, counts
        # One batch: its forward, then its backward, both inside its optimizer step (Lightning runs them in
        # the optimizer's closure), and the step's own update after them.
        opt_start, opt_end = optimizer[0]["ts"], optimizer[0]["ts"] + optimizer[0]["dur"]
        assert opt_start < forward[0]["ts"] < min(e["ts"] for e in backward)
        assert max(e["ts"] + e["dur"] for e in backward) < opt_end


def test_the_callbacks_own_per_batch_work_is_no_part_of_a_recorded_step(tmp_path):
    # log_every_n_steps=1: the callback logs its scalars after every batch, reading the loss with `.item()` (the
    # one operator of its own). Inside the step span, on a tiny model it was 0.6 ms of a 2-ms step outside any
    # torch operator, and framework_overhead blamed the program for it.
    callback = PerfCallback(schedule=SCHEDULE_3, stages=["train"])
    trainer(tmp_path, [callback], log_every_n_steps=1).fit(TinyModel(n=32))
    trace = load(callback.windows[0].trace_path)
    assert steps(trace) == [2, 3, 4]
    for step in steps(trace):
        counts = op_names({"traceEvents": events_in_step(trace, step)})
        assert "aten::item" not in counts, counts


class SanityMarked(TinyModel):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        if self.trainer.sanity_checking:
            torch.atan(batch[0])
        return super().validation_step(batch, batch_idx, dataloader_idx)


def test_sanity_check_is_never_counted_or_recorded(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 0, "warmup": 0, "active": 1}, stages=["validate"], max_windows=1)
    trainer(tmp_path, [callback], num_sanity_val_steps=2).fit(SanityMarked(n=16))
    assert window_names(callback) == ["validate-epoch000-batches0000-0000"]
    names = op_names(load(callback.windows[0].trace_path))
    assert names["aten::cos"] == 1 and names["aten::atan"] == 0


class SlowValidation(TinyModel):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        time.sleep(0.05)
        return super().validation_step(batch, batch_idx, dataloader_idx)


def test_validation_inside_a_training_window_stays_out_of_its_trace(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 5}, stages=["train", "validate"])
    # 12 train batches; validation after every 3rd, i.e. in the middle of the train window (batches 2..6).
    trainer(tmp_path, [callback], val_check_interval=3).fit(SlowValidation(n=48, val_n=24))
    train = [w for w in callback.windows if w.stage == "train"]
    validate = [w for w in callback.windows if w.stage == "validate"]
    assert [w.name for w in train] == ["train-epoch000-batches0002-0006"]
    assert validate and all(w.name.startswith("validate-") for w in validate)

    trace = load(train[0].trace_path)
    assert steps(trace) == [2, 3, 4, 5, 6]
    names = op_names(trace)
    assert names["aten::sin"] == 5 and names["aten::cos"] == 0
    # The validation run's sleeps (6 batches of 50 ms: 300 ms) are in no training step: each step is one fast
    # batch, well under half a validation run even on a loaded machine (73 ms seen at load 8 on 2 CPUs).
    spans = [e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert max(e["dur"] for e in spans) < 150_000
    for window in validate:
        names = op_names(load(window.trace_path))
        assert names["aten::cos"] > 0 and names["aten::sin"] == 0


def test_window_open_at_epoch_end_is_closed_and_saved_there(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 2, "warmup": 1, "active": 10}, stages=["train"])
    with pytest.warns(UserWarning, match="train window was cut short by the end of its epoch"):
        trainer(tmp_path, [callback], max_epochs=2).fit(TinyModel(n=32))  # 8 batches per epoch
    assert window_names(callback) == ["train-epoch000-batches0003-0007", "train-epoch001-batches0003-0007"]
    assert all(w.shortened for w in callback.windows)
    assert steps(load(callback.windows[1].trace_path)) == [3, 4, 5, 6, 7]


def test_stage_too_short_gets_no_window_and_one_warning(tmp_path, recwarn):
    callback = PerfCallback(schedule={"skip_first": 20}, stages=["train"])
    trainer(tmp_path, [callback], max_epochs=3).fit(TinyModel(n=32))
    assert callback.windows == []
    short = [w for w in recwarn if "too few for the schedule" in str(w.message)]
    assert len(short) == 1
    assert "train epoch had 8 batches" in str(short[0].message)
    assert not list(tmp_path.rglob("*.pt.trace.json*"))  # never a recording of the whole run


def test_the_default_window_records_batch_six_alone_in_each_stage(tmp_path):
    callback = PerfCallback()  # skip 5 batches, warm up on the 6th (index 5), record the next one
    trainer(tmp_path, [callback], max_epochs=1).fit(TinyModel(n=48, val_n=40))  # 12 training, 10 validation batches
    assert window_names(callback) == ["train-epoch000-batches0006-0006", "validate-epoch000-batches0006-0006"]
    assert [steps(load(w.trace_path)) for w in callback.windows] == [[6], [6]]


def test_a_small_validation_set_under_the_default_schedule_is_a_note_not_a_warning(tmp_path, recwarn, caplog):
    callback = PerfCallback()  # the default plan: the user asked for no window in particular
    with caplog.at_level("INFO"):
        trainer(tmp_path, [callback], max_epochs=1).fit(TinyModel(n=48, val_n=8))  # 12 training, 2 validation batches
    assert not [w for w in recwarn if "PerfCallback" in str(w.message)]
    assert "the validate epoch had 2 batches, too few for the schedule" in caplog.text


def test_a_run_of_short_epochs_gets_the_default_window_in_its_second_epoch_and_counts_flops_in_its_first(tmp_path):
    callback = PerfCallback()  # the default plan records batch 6: no epoch here has one
    trainer(tmp_path, [callback], max_epochs=3).fit(TinyModel(n=16, val_n=8))  # 4 training, 2 validation batches
    assert window_names(callback) == ["train-epoch001-batches0001-0001", "validate-epoch001-batches0001-0001"]
    assert [steps(load(w.trace_path)) for w in callback.windows] == [[1], [1]]
    train = [e for e in callback.epochs if e.stage == "train"]
    assert train[0].flops_per_second is not None  # counted before the window: its epoch could open none


def test_repeat_two_gives_two_windows_every_epoch(tmp_path):
    callback = PerfCallback(
        schedule={"skip_first": 0, "wait": 1, "warmup": 1, "active": 2, "repeat": 2}, stages=["train"]
    )
    trainer(tmp_path, [callback], max_epochs=2).fit(TinyModel(n=48))  # 12 batches per epoch
    assert window_names(callback) == [
        "train-epoch000-batches0002-0003",
        "train-epoch000-batches0006-0007",
        "train-epoch001-batches0002-0003",
        "train-epoch001-batches0006-0007",
    ]


def test_repeat_zero_records_every_full_cycle_of_the_epoch(tmp_path):
    callback = PerfCallback(
        schedule={"skip_first": 0, "wait": 1, "warmup": 1, "active": 2, "repeat": 0}, stages=["train"], max_windows=10
    )
    trainer(tmp_path, [callback]).fit(TinyModel(n=40))  # 10 batches: cycles at 0 and 4; one at 8 would not fit
    assert window_names(callback) == ["train-epoch000-batches0002-0003", "train-epoch000-batches0006-0007"]
    assert not any(w.shortened for w in callback.windows)


def test_explicit_batches_replace_the_schedule(tmp_path):
    callback = PerfCallback(batches=[2, 3, 6], stages=["train"])
    trainer(tmp_path, [callback]).fit(TinyModel(n=40))
    assert window_names(callback) == ["train-epoch000-batches0002-0003", "train-epoch000-batches0006-0006"]


def test_max_windows_caps_each_stage_over_the_run(tmp_path, caplog):
    callback = PerfCallback(
        schedule={"skip_first": 0, "warmup": 1, "active": 1, "repeat": 0}, stages=["train", "validate"], max_windows=3
    )
    with caplog.at_level("INFO"):
        trainer(tmp_path, [callback], max_epochs=2).fit(TinyModel(n=32, val_n=16))
    assert len(window_names(callback, "train")) == 3
    assert len(window_names(callback, "validate")) == 3
    last = [r.getMessage() for r in caplog.records if "the last of max_windows=3" in r.getMessage()]
    assert sorted(m.split()[2] for m in last) == ["train", "validate"]  # once per stage, when it opens


def test_test_and_predict_stages_get_their_own_windows(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 0, "warmup": 1, "active": 2}, stages=["test", "predict"])
    t = trainer(tmp_path, [callback])
    model = TinyModel(n=16, val_n=16)
    t.test(model)
    t.predict(model)
    assert window_names(callback) == ["test-epoch000-batches0001-0002", "predict-epoch000-batches0001-0002"]
    test_names = op_names(load(callback.windows[0].trace_path))
    predict_names = op_names(load(callback.windows[1].trace_path))
    assert test_names["aten::tan"] == 2 and test_names["aten::exp"] == 0
    assert predict_names["aten::exp"] == 2 and predict_names["aten::tan"] == 0


# Lightning's PyTorchProfiler raises in its own __del__ when it was set up but never started; not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_lightning_pytorch_profiler_is_refused_at_setup(tmp_path):
    t = trainer(tmp_path, [PerfCallback()], profiler="pytorch")
    with pytest.raises(MisconfigurationException, match="cannot run together with Lightning's PyTorchProfiler"):
        t.fit(TinyModel(n=8))
    del t
    gc.collect()


def test_an_active_torch_profiler_is_refused_at_setup(tmp_path):
    t = trainer(tmp_path, [PerfCallback()])
    with (
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]),
        pytest.raises(MisconfigurationException, match="found a torch profiler already running"),
    ):
        t.fit(TinyModel(n=8))


def test_a_failure_in_our_own_output_warns_once_and_training_goes_on(tmp_path):
    dirpath = tmp_path / "perf"
    dirpath.mkdir()
    # A file where the first two windows' directories should go: writing their traces fails for real.
    for name in ("train-epoch000-batches0001-0001", "train-epoch001-batches0001-0001"):
        (dirpath / name).write_text("in the way")
    callback = PerfCallback(
        schedule={"skip_first": 0, "active": 1, "repeat": 2}, stages=["train"], dirpath=str(dirpath), strict=False
    )
    t = trainer(tmp_path, [callback], max_epochs=2)
    with pytest.warns(UserWarning, match=r"measuring the train stage failed \(FileExistsError") as caught:
        t.fit(TinyModel(n=16))
    assert t.current_epoch == 2 and t.global_step == 8  # training finished
    # The windows after the failing ones are still recorded, and the failure is reported once.
    assert [w.name for w in callback.windows] == ["train-epoch000-batches0003-0003", "train-epoch001-batches0003-0003"]
    assert len([w for w in caught if "measuring the train stage failed" in str(w.message)]) == 1


def test_a_page_that_cannot_be_written_warns_once_and_leaves_training_and_the_report_as_they_are(tmp_path):
    dirpath = tmp_path / "perf"
    (dirpath / "report.html").mkdir(parents=True)  # a directory where the page should go: its write fails
    callback = PerfCallback(max_windows=0, stages=["train"], dirpath=str(dirpath), strict=False)
    t = trainer(tmp_path, [callback], max_epochs=2)
    with pytest.warns(UserWarning, match=r"failed \(IsADirectoryError") as caught:
        t.fit(TinyModel(n=16))
    assert t.current_epoch == 2
    assert len([w for w in caught if "IsADirectoryError" in str(w.message)]) == 1
    report = json.loads((dirpath / "perf_report.json").read_text())  # written before the page, every time
    assert [e["epoch"] for e in report["stages"]["train"]["epochs"]] == [0, 1]
    assert not [p for p in dirpath.iterdir() if p.name.endswith(".tmp")]  # no half-written page left


def test_an_output_directory_that_cannot_be_written_fails_at_setup(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the output directory should be")
    t = trainer(tmp_path, [PerfCallback(dirpath=str(blocker))])
    with pytest.raises(MisconfigurationException, match="cannot write its output directory dirpath="):
        t.fit(TinyModel(n=8))
    assert t.global_step == 0


class FailsAtBatch3(TinyModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            raise RuntimeError("boom in training_step")
        return super().training_step(batch, batch_idx)


def test_an_exception_inside_a_window_still_leaves_a_valid_trace(tmp_path):
    callback = PerfCallback(schedule=SCHEDULE_3, stages=["train"])
    with pytest.raises(RuntimeError, match="boom in training_step"):
        trainer(tmp_path, [callback]).fit(FailsAtBatch3(n=32))
    [window] = callback.windows
    assert window.shortened and (window.first_batch, window.last_batch) == (2, 3)
    assert steps(load(window.trace_path)) == [2, 3]  # valid JSON, with the batch that raised


def test_strict_re_raises_our_own_failure(tmp_path):
    dirpath = tmp_path / "perf"
    dirpath.mkdir()
    (dirpath / "train-epoch000-batches0001-0001").write_text("in the way")
    callback = PerfCallback(
        schedule={"skip_first": 0, "active": 1}, stages=["train"], dirpath=str(dirpath), strict=True
    )
    with pytest.raises(FileExistsError):
        trainer(tmp_path, [callback]).fit(TinyModel(n=16))


def test_a_trace_over_max_trace_mb_keeps_its_first_steps_with_a_warning(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 6}, stages=["train"], max_trace_mb=0.05)
    with pytest.warns(UserWarning, match=r"larger than max_trace_mb=0.05; it keeps its first \d step"):
        trainer(tmp_path, [callback]).fit(TinyModel(n=48))
    [window] = callback.windows
    trace = load(window.trace_path)
    kept = steps(trace)
    assert 1 <= len(kept) < 6 and kept == list(range(2, 2 + len(kept)))
    assert trace["lightning_perf"]["cut_to_steps"] == len(kept)


def test_a_second_run_in_the_same_dirpath_overwrites_nothing(tmp_path):
    dirpath = str(tmp_path / "shared")
    first = PerfCallback(schedule={"skip_first": 1, "active": 1}, stages=["train"], dirpath=dirpath)
    trainer(tmp_path / "a", [first]).fit(TinyModel(n=16))
    first_files = {path: pathlib.Path(path).read_bytes() for path in (first.windows[0].trace_path, first.report_path)}
    second = PerfCallback(schedule={"skip_first": 1, "active": 1}, stages=["train"], dirpath=dirpath)
    trainer(tmp_path / "b", [second]).fit(TinyModel(n=16))
    assert {
        path: pathlib.Path(path).read_bytes() for path in first_files
    } == first_files  # the first run's files as they were
    assert first.windows[0].name == "train-epoch000-batches0002-0002"
    assert second.windows[0].name == "train-epoch000-batches0002-0002-1"
    assert first.report_path.endswith("perf_report.json") and second.report_path.endswith("perf_report-1.json")
    assert load(first.windows[0].trace_path) != load(second.windows[0].trace_path)


def test_a_rank_left_out_of_ranks_records_no_window_but_measures_every_batch(tmp_path):
    # A single process is global rank 0: ranks=[1] leaves it out.
    callback = PerfCallback(schedule=SCHEDULE_3, ranks=[1])
    trainer(tmp_path, [callback], max_epochs=2).fit(TinyModel(n=16))
    assert callback.windows == [] and not list(tmp_path.rglob("*.pt.trace.json*"))
    train = [e for e in callback.epochs if e.stage == "train"]
    assert len(train) == 2 and all(e.batches == 16 // 4 for e in train)


def test_a_stage_too_short_to_record_after_its_warm_up_opens_no_window(tmp_path, capfd):
    # 6 validation batches: the default schedule (skip_first 5, warm-up 1) would warm up on the last batch and
    # record none; torch then printed "disableProfiler called but no active profiling session" (C++, stderr),
    # twice per fit in pytorch-forecasting, and the batch was lost to the epoch's times.
    perf = PerfCallback(verbose=0, stages=["validate"])  # no training window still processed when it starts
    model = TinyModel(n=64, batch_size=4, val_n=24)  # 16 training batches, 6 validation batches
    trainer(tmp_path, [perf], limit_train_batches=16, num_sanity_val_steps=0).fit(model)
    assert "disableProfiler called but no active profiling session" not in capfd.readouterr().err
    validation = [e for e in perf.epochs if e.stage == "validate"]
    assert validation and validation[0].profiled_batches == 0 and validation[0].batches == 6
    assert window_names(perf, "validate") == []
