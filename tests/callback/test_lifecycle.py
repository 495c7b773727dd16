"""Trainer lifecycles around one PerfCallback, each on a real (tiny, CPU) Trainer run: several entry points on
one trainer, several trainers in one process, fit called twice, fast_dev_run, max_steps, gradient
accumulation, manual optimization, several validation dataloaders, short epochs, and runs that end in an
exception or a KeyboardInterrupt while a window records."""

import json
import os
import signal

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kineto import events_in_step, load, op_names, steps
from lightning_perf import PerfCallback
from models import TinyModel, trainer, window_names

WINDOW_2 = {"skip_first": 1, "warmup": 1, "active": 2}  # records batches 2, 3 of each epoch
WINDOW_3 = {"skip_first": 1, "warmup": 1, "active": 3}  # records batches 2, 3, 4 of each epoch
OPTIMIZER_STEP = "Optimizer.step#SGD.step"


def _epochs(callback):
    return [(e.stage, e.epoch) for e in callback.epochs]


def _report(callback):
    with open(callback.report_path, encoding="utf-8") as f:
        return json.load(f)


def _check_traces(callback):
    """Every window's trace exists, loads, holds exactly its recorded batches, and no two share a path."""
    paths = [w.trace_path for w in callback.windows]
    assert len(set(paths)) == len(paths), paths
    for window in callback.windows:
        assert os.path.isfile(window.trace_path), window
        assert os.path.basename(os.path.dirname(window.trace_path)) == window.name
        assert steps(load(window.trace_path)) == list(range(window.first_batch, window.last_batch + 1)), window


def _trace_files(root):
    return sorted(str(p) for p in root.rglob("*.pt.trace.json*"))


def _per_step(trace, name):
    """How many ``name`` events lie inside each ProfilerStep span, in step order."""
    return [sum(e["name"] == name for e in events_in_step(trace, step)) for step in steps(trace)]


# ------------------------------------------------------------------ several entry points, several trainers


def test_fit_then_validate_test_predict_on_one_trainer(tmp_path):
    callback = PerfCallback(schedule=WINDOW_2)  # every stage
    t = trainer(tmp_path, [callback])
    model = TinyModel(n=16, val_n=16)  # 4 batches in every stage
    t.fit(model)
    fit_windows = list(callback.windows)
    t.validate(model)
    t.test(model)
    t.predict(model)

    # The standalone validate() is validation run 1: it does not overwrite fit's validation run 0.
    assert window_names(callback) == [
        "train-epoch000-batches0002-0003",  # saved at train batch 3, before the epoch's validation run
        "validate-epoch000-batches0002-0003",
        "validate-epoch001-batches0002-0003",
        "test-epoch000-batches0002-0003",
        "predict-epoch000-batches0002-0003",
    ]
    assert callback.windows[: len(fit_windows)] == fit_windows
    assert len({os.path.dirname(w.trace_path) for w in callback.windows}) == 5
    _check_traces(callback)
    assert _epochs(callback) == [("validate", 0), ("train", 0), ("validate", 1), ("test", 0), ("predict", 0)]
    assert all(e.batches == 4 for e in callback.epochs)

    # Each trace holds only its own stage's marker op (sin/cos/tan/exp), 2 recorded batches of it.
    markers = {"train": "aten::sin", "validate": "aten::cos", "test": "aten::tan", "predict": "aten::exp"}
    for window in callback.windows:
        names = op_names(load(window.trace_path))
        assert {op: names[op] for op in markers.values()} == {
            op: (2 if stage == window.stage else 0) for stage, op in markers.items()
        }, window.name

    # All four entry points share one output directory and one report, which lists everything.
    assert callback.dirpath == str(tmp_path / "lightning_logs" / "version_0" / "perf")
    assert os.path.basename(callback.report_path) == "perf_report.json"
    assert sorted(p.name for p in tmp_path.rglob("perf_report*.json")) == ["perf_report.json"]
    report = _report(callback)
    assert [w["name"] for w in report["windows"]] == window_names(callback)
    assert set(report["stages"]) == {"train", "validate", "test", "predict"}
    assert [e["epoch"] for e in report["stages"]["validate"]["epochs"]] == [0, 1]


def test_two_trainers_in_one_process_each_with_its_own_callback(tmp_path):
    results = []
    for name in ("first", "second"):
        root = tmp_path / name
        callback = PerfCallback(schedule=WINDOW_2, stages=["train", "validate"])
        trainer(root, [callback]).fit(TinyModel(n=16, val_n=16))
        results.append((root, callback))

    for root, callback in results:
        assert window_names(callback) == ["train-epoch000-batches0002-0003", "validate-epoch000-batches0002-0003"]
        assert _epochs(callback) == [("validate", 0), ("train", 0)]
        _check_traces(callback)
        assert callback.dirpath == str(root / "lightning_logs" / "version_0" / "perf")
        assert all(w.trace_path.startswith(str(root) + os.sep) for w in callback.windows)
        assert _trace_files(root) == sorted(w.trace_path for w in callback.windows)
        assert [w["name"] for w in _report(callback)["windows"]] == window_names(callback)


def test_fit_twice_on_one_trainer_keeps_the_first_fits_windows(tmp_path):
    callback = PerfCallback(schedule=WINDOW_2, stages=["train", "validate"])
    t = trainer(tmp_path, [callback])
    model = TinyModel(n=16, val_n=16)
    t.fit(model)
    first = list(callback.windows)
    t.fit_loop.max_epochs = 2
    t.fit(model)  # Lightning resumes its fit loop: epoch 1 only
    assert t.current_epoch == 2 and t.global_step == 8

    assert callback.windows[: len(first)] == first
    assert window_names(callback) == [
        "train-epoch000-batches0002-0003",
        "validate-epoch000-batches0002-0003",
        "train-epoch001-batches0002-0003",
        "validate-epoch001-batches0002-0003",
    ]
    _check_traces(callback)  # no two windows share a trace path, every trace is there
    assert _trace_files(tmp_path) == sorted(w.trace_path for w in callback.windows)
    assert _epochs(callback) == [("validate", 0), ("train", 0), ("validate", 1), ("train", 1)]
    assert [w["name"] for w in _report(callback)["windows"]] == window_names(callback)


@pytest.mark.parametrize(
    "schedule",
    [None, {"skip_first": 0, "warmup": 0, "active": 1}],
    ids=["default-schedule", "one-batch-schedule"],
)
@pytest.mark.filterwarnings("ignore:PerfCallback. schedule.warmup=0")
def test_fast_dev_run(tmp_path, monkeypatch, recwarn, schedule):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # anything written relative to the working directory would land here
    root = tmp_path / "root"
    callback = PerfCallback(schedule=schedule, stages=["train", "validate", "test"])
    t = trainer(root, [callback], fast_dev_run=True)
    model = TinyModel(n=16, val_n=16)
    t.fit(model)
    t.test(model)

    # Lightning writes nothing in this mode, nor do we: no window, no event file, no report; every batch is
    # still measured, and the console shows the summaries.
    assert window_names(callback) == []
    assert _epochs(callback) == [("validate", 0), ("train", 0), ("test", 0)]
    assert all(e.batches == 1 for e in callback.epochs)
    assert callback.dirpath is None and callback.report_path is None
    assert list(cwd.iterdir()) == []
    assert not root.exists() or list(root.rglob("*")) == []
    assert not [w for w in recwarn if "too few for the schedule" in str(w.message)]


# ------------------------------------------------------------------ how a training epoch is cut and counted


def test_max_steps_stopping_inside_a_window_saves_it_shortened(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 5}, stages=["train"])
    t = trainer(tmp_path, [callback], max_steps=4, limit_val_batches=0)
    with pytest.warns(UserWarning, match="train window was cut short"):
        t.fit(TinyModel(n=64))  # 16 batches per epoch; the run stops after batch 3
    assert t.global_step == 4
    [window] = callback.windows
    assert window.name == "train-epoch000-batches0002-0003" and window.shortened
    trace = load(window.trace_path)
    assert steps(trace) == [2, 3]
    assert op_names(trace)["aten::sin"] == 2
    [epoch] = callback.epochs
    assert (epoch.stage, epoch.batches, epoch.profiled_batches) == ("train", 4, 3)  # warm-up 1 + recorded 2
    assert [w["shortened"] for w in _report(callback)["windows"]] == [True]


def test_gradient_accumulation_windows_count_micro_batches(tmp_path):
    # A window counts batches (micro-batches), not optimizer steps: active=3 with accumulate_grad_batches=2
    # records 3 batches = 1.5 optimizer steps, and each ProfilerStep span is one batch.
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"])
    t = trainer(tmp_path, [callback], accumulate_grad_batches=2, limit_val_batches=0)
    t.fit(TinyModel(n=32))  # 8 batches, 4 optimizer steps (after batches 1, 3, 5, 7)
    assert t.global_step == 4
    [window] = callback.windows
    assert window.name == "train-epoch000-batches0002-0004" and not window.shortened
    trace = load(window.trace_path)
    assert steps(trace) == [2, 3, 4]
    assert _per_step(trace, "aten::sin") == [1, 1, 1]  # one forward per span
    assert _per_step(trace, OPTIMIZER_STEP) == [0, 1, 0]  # the optimizer steps after odd batches only
    for step in steps(trace):
        inside = events_in_step(trace, step)
        assert sum(e["name"].startswith("enumerate(DataLoader)#") for e in inside) == 1
        assert any(e["name"].startswith("autograd::engine::evaluate_function") for e in inside)  # a backward
    [epoch] = callback.epochs
    assert epoch.batches == 8 and epoch.loss is not None


class ManualOptimization(TinyModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self._loss(batch, "train")
        self.manual_backward(loss)
        opt.step()
        return loss


def test_manual_optimization(tmp_path):
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"])
    t = trainer(tmp_path, [callback], limit_val_batches=0)
    t.fit(ManualOptimization(n=32))
    assert t.global_step == 8
    [window] = callback.windows
    assert window.name == "train-epoch000-batches0002-0004"
    trace = load(window.trace_path)
    assert steps(trace) == [2, 3, 4]
    assert _per_step(trace, "aten::sin") == [1, 1, 1]
    assert _per_step(trace, OPTIMIZER_STEP) == [1, 1, 1]
    [epoch] = callback.epochs
    assert epoch.batches == 8 and epoch.loss is not None and epoch.loss > 0
    assert _report(callback)["stages"]["train"]["epochs"][0]["loss"] == pytest.approx(epoch.loss)


class TwoValidationLoaders(TinyModel):
    def val_dataloader(self):
        return [self._loader(12), self._loader(20)]  # 3 + 5 batches


def test_several_validation_dataloaders_are_one_sequence_of_batches(tmp_path):
    callback = PerfCallback(schedule=WINDOW_3, stages=["validate"])
    trainer(tmp_path, [callback]).fit(TwoValidationLoaders(n=16))
    # Batches 0-2 come from the first dataloader, 3-7 from the second: the window spans both.
    assert window_names(callback) == ["validate-epoch000-batches0002-0004"]
    trace = load(callback.windows[0].trace_path)
    assert steps(trace) == [2, 3, 4]
    assert _per_step(trace, "aten::cos") == [1, 1, 1]
    assert op_names(trace)["aten::sin"] == 0
    [epoch] = callback.epochs
    assert (epoch.stage, epoch.epoch, epoch.batches) == ("validate", 0, 8)
    assert _report(callback)["stages"]["validate"]["epochs"][0]["batches"] == 8


def test_limit_train_batches_below_the_schedule_gives_no_window_and_one_warning(tmp_path, recwarn):
    callback = PerfCallback(schedule={"skip_first": 5}, stages=["train"])
    t = trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=3, limit_val_batches=0)
    t.fit(TinyModel(n=32))
    assert t.global_step == 6
    assert callback.windows == []
    short = [w for w in recwarn if "too few for the schedule" in str(w.message)]
    assert len(short) == 1
    assert "train epoch had 3 batches" in str(short[0].message)
    assert _trace_files(tmp_path) == []
    assert _epochs(callback) == [("train", 0), ("train", 1)]
    assert all(e.batches == 3 for e in callback.epochs)
    assert _report(callback)["windows"] == []


def test_log_every_n_steps_zero_logs_no_batch_scalars_and_trains_on(tmp_path):
    # Lightning accepts 0 (Trainer(barebones=True) sets it): no per-batch scalars, everything else as usual.
    callback = PerfCallback(schedule=WINDOW_2, stages=["train"])
    t = trainer(tmp_path, [callback], log_every_n_steps=0, limit_val_batches=0)
    t.fit(TinyModel(n=32))
    assert window_names(callback) == ["train-epoch000-batches0002-0003"]
    assert _epochs(callback) == [("train", 0)] and callback.epochs[0].batches == 8
    t.logger.finalize("success")
    acc = EventAccumulator(t.logger.log_dir)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "perf/train/epoch/step_time_p50_ms" in tags
    assert not [tag for tag in tags if tag.startswith("perf/train/batch/")]


# ------------------------------------------------------------------ runs that end while a window records


class RaisesInEpoch1(TinyModel):
    """Raises ``error`` in training_step at batch 3 of epoch 1, inside the window recording batches 2-4."""

    def __init__(self, error: BaseException, **kwargs):
        super().__init__(**kwargs)
        self.error = error

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)  # its aten::sin marker first
        if self.current_epoch == 1 and batch_idx == 3:
            raise self.error
        return loss


def _check_interrupted(callback, tmp_path):
    assert window_names(callback) == ["train-epoch000-batches0002-0004", "train-epoch001-batches0002-0003"]
    interrupted = callback.windows[-1]
    assert interrupted.shortened
    _check_traces(callback)
    with open(interrupted.trace_path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"  # gzipped, whole (read_trace above parsed all of its JSON)
    trace = load(interrupted.trace_path)
    assert steps(trace) == [2, 3]  # the batch that raised is recorded, up to where it raised
    assert op_names(trace)["aten::sin"] == 2
    assert _trace_files(tmp_path) == sorted(w.trace_path for w in callback.windows)
    assert not torch.autograd._profiler_enabled()  # no profiler left running in the process
    # perf_report.json was first written at epoch 0's end; it still parses, and lists the window saved at
    # the interruption too (on_exception rewrites it). The interrupted epoch is summarized, marked so: batches
    # 0-2 ran (1 warming the window up, 2 recorded in it), 3 raised.
    assert os.path.basename(callback.report_path) == "perf_report.json"
    report = _report(callback)
    assert [w["name"] for w in report["windows"]] == window_names(callback)
    epochs = report["stages"]["train"]["epochs"]
    assert [(e["stage"], e["epoch"], e["interrupted"]) for e in epochs] == [("train", 0, False), ("train", 1, True)]
    assert epochs[1]["batches"] == 3 and epochs[1]["profiled_batches"] == 2
    assert _epochs(callback) == [("train", 0), ("train", 1)]


def test_an_exception_in_training_step_inside_a_window(tmp_path):
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"])
    t = trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    with pytest.raises(ValueError, match="boom"), pytest.warns(UserWarning, match="train window was cut short"):
        t.fit(RaisesInEpoch1(ValueError("boom"), n=32))
    assert t.state.status == TrainerStatus.INTERRUPTED
    _check_interrupted(callback, tmp_path)


def test_a_keyboard_interrupt_in_training_step_inside_a_window(tmp_path):
    # What Lightning 2.6 does on a KeyboardInterrupt (lightning/pytorch/trainer/call.py,
    # _call_and_handle_interrupt): it logs "Detected KeyboardInterrupt, attempting graceful shutdown ...",
    # sets SIGINT to SIG_IGN for the rest of the process, calls every callback's on_exception (status
    # INTERRUPTED), tears the trainer down (not the callbacks' teardown), and then calls sys.exit(1): fit
    # raises SystemExit(1), not KeyboardInterrupt, and does not return.
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"])
    t = trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exit_info, pytest.warns(UserWarning, match="train window was cut short"):
            t.fit(RaisesInEpoch1(KeyboardInterrupt(), n=32))
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning left Ctrl+C ignored
    assert exit_info.value.code == 1
    assert t.state.status == TrainerStatus.INTERRUPTED
    _check_interrupted(callback, tmp_path)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SIGTERMException()], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_says_where_its_windows_and_report_are(tmp_path, caplog, error):
    # Ctrl-C: Lightning exits (SystemExit(1)); SIGTERM: its handler raises SIGTERMException. Either way it calls
    # on_exception and no callback's teardown.
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"], verbose=0)
    t = trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with caplog.at_level("INFO"), pytest.raises(SystemExit), pytest.warns(UserWarning, match="cut short"):
            t.fit(RaisesInEpoch1(error, n=32))
    finally:
        signal.signal(signal.SIGINT, handler)
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert f"lightning-perf: 2 profiler window(s) saved under {callback.dirpath}" in said
    assert f"lightning-perf: report (opens offline in a browser): {callback.page_path}" in said
    assert os.path.isfile(callback.page_path)


def _window_dirs(perf: PerfCallback) -> set[str]:
    return {d for d in os.listdir(perf.dirpath) if os.path.isdir(os.path.join(perf.dirpath, d))}


def _reported_windows(perf: PerfCallback) -> set[str]:
    with open(perf.report_path) as f:
        return {w["name"] for w in json.load(f)["windows"]}


@pytest.mark.slow
def test_evaluating_a_checkpoint_after_fit_keeps_every_window_and_epoch(tmp_path, caplog):
    # Lightning's examples: fit with a checkpoint per epoch, then test the first (or the best) checkpoint.
    # Lightning restores every callback's state from it; only a resumed fit may take ours back.
    from lightning.pytorch.callbacks import ModelCheckpoint

    perf = PerfCallback(batches=[2], stages=["train", "test", "predict"], max_windows=10, verbose=0)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    t = trainer(tmp_path, [perf, checkpoints], max_epochs=3, limit_val_batches=0, enable_checkpointing=True)
    model = TinyModel(n=16, batch_size=4)
    t.fit(model)
    first = sorted(os.listdir(tmp_path / "ckpt"))[0]
    with caplog.at_level("INFO"):
        t.test(model, ckpt_path=str(tmp_path / "ckpt" / first))
    trained = [e.epoch for e in perf.epochs if e.stage == "train"]
    assert trained == [0, 1, 2]  # the later epochs did not vanish
    assert _reported_windows(perf) == _window_dirs(perf) == set(window_names(perf))
    assert len(window_names(perf, "train")) == 3 and len(window_names(perf, "test")) == 1
    assert not [r for r in caplog.records if "-1 profiler window" in r.getMessage()]
    assert [r for r in caplog.records if "1 profiler window(s) saved" in r.getMessage()]
    t.predict(model, ckpt_path="best")
    assert _reported_windows(perf) == _window_dirs(perf) == set(window_names(perf))
    assert len(window_names(perf, "predict")) == 1 and [e.epoch for e in perf.epochs if e.stage == "train"] == [0, 1, 2]
