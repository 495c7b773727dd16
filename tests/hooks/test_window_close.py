"""A window's close on real Trainer runs: the training thread stops the profiler and has torch export the trace;
the trace file, the operator table and the record come from the window worker's thread, and are all there when
an epoch's diagnosis, a checkpoint, an interrupted run's report or the end of the run needs them."""

import json
import os
import pathlib
import pickle
import subprocess
import sys
import threading

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from torch.utils.tensorboard import SummaryWriter

from kineto import load, op_names, steps
from lightning_perf import PerfCallback
from lightning_perf.hooks.window_close import WindowWorker
from lightning_perf.layout import OPERATORS_SUFFIX
from lightning_perf.readers import load_trace
from lightning_perf.summarize.operators import operator_stats
from models import TinyModel, trainer, window_names

WINDOW_3 = {"skip_first": 1, "warmup": 1, "active": 3}  # records batches 2, 3, 4 of each epoch
LAST_3 = {"skip_first": 4, "warmup": 1, "active": 3}  # of an 8-batch epoch: batches 5, 6, 7, closed by its last batch


def _report(callback):
    with open(callback.report_path, encoding="utf-8") as f:
        return json.load(f)


class ThreadNotingWriter(SummaryWriter):
    """A SummaryWriter that notes the thread each text was added from (and adds it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.text_threads: list[tuple[str, str]] = []

    def add_text(self, tag, text_string, global_step=None, walltime=None):
        self.text_threads.append((tag, threading.current_thread().name))
        super().add_text(tag, text_string, global_step, walltime)


class ThreadNotingLogger(TensorBoardLogger):
    @property
    @rank_zero_experiment
    def experiment(self) -> ThreadNotingWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ThreadNotingWriter(log_dir=self.log_dir, **self._kwargs)
        return self._experiment


def test_windows_are_written_off_the_training_thread_in_order_and_whole_after_fit(tmp_path):
    logger = ThreadNotingLogger(tmp_path)
    callback = PerfCallback(schedule=WINDOW_3)
    trainer(tmp_path, [callback], max_epochs=2, logger=logger).fit(TinyModel(n=32))
    # In the order the windows closed: each epoch's training window, then its validation run's.
    assert window_names(callback) == [
        "train-epoch000-batches0002-0004",
        "validate-epoch000-batches0002-0004",
        "train-epoch001-batches0002-0004",
        "validate-epoch001-batches0002-0004",
    ]
    for window in callback.windows:
        with open(window.trace_path, "rb") as f:
            assert f.read(2) == b"\x1f\x8b"
        trace = load(window.trace_path)  # whole: all of its JSON parses
        assert steps(trace) == [2, 3, 4]
        marker = "aten::sin" if window.stage == "train" else "aten::cos"
        assert op_names(trace)[marker] == 3
        assert window.operators and window.summary is not None and window.summary.window == window.name
        assert window.close_seconds > 0
        assert os.path.isfile(window.trace_path.replace(".pt.trace.json.gz", OPERATORS_SUFFIX))
    threads = logger.experiment.text_threads
    tables = [name for tag, name in threads if tag.startswith("perf/operators/")]
    findings = [name for tag, name in threads if tag.startswith("perf/findings/")]
    assert len(tables) == 4 and all(name.startswith("lightning_perf-windows") for name in tables), threads
    assert findings and all(name == threading.main_thread().name for name in findings), threads
    # The worker's thread is let go at each join.
    assert not [t for t in threading.enumerate() if t.name.startswith("lightning_perf-windows")]


def test_a_window_closed_by_the_epochs_last_batch_is_in_that_epochs_diagnosis(tmp_path):
    # A data-bound run: the dataloader_bound finding names the window whose trace shows the DataLoader's
    # share; this window closes at the epoch's last batch, just before the epoch's diagnosis reads it.
    callback = PerfCallback(schedule=LAST_3, stages=["train"])
    trainer(tmp_path, [callback], limit_val_batches=0).fit(TinyModel(n=32, sleep_s=0.004))
    [finding] = [f for f in callback.findings if f.id == "dataloader_bound"]
    assert finding.window == "train-epoch000-batches0005-0007"
    [window] = callback.windows
    assert window.summary is not None and window.name == finding.window


def test_a_checkpoint_taken_right_after_a_close_holds_that_window(tmp_path):
    # ModelCheckpoint runs after PerfCallback, in the on_train_batch_end that closes the window (batch 4 is
    # global step 5): the checkpoint must list the window, written.
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"])
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1, save_last=False)
    trainer(tmp_path, [callback, checkpoint], limit_val_batches=0, enable_checkpointing=True).fit(TinyModel(n=32))
    path = next(p for p in (tmp_path / "ckpt").iterdir() if "step=5" in p.name)
    saved = torch.load(path, weights_only=False)["callbacks"][callback.state_key]
    assert [w["name"] for w in json.loads(saved["state"])["windows"]] == ["train-epoch000-batches0002-0004"]


class RaisesAtBatchEnd(Callback):
    """Raises in on_train_batch_end of ``batch``, after PerfCallback's own (which closes a window there)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == self.batch:
            raise ValueError("boom")


def test_an_exception_right_after_a_close_still_writes_the_window_and_lists_it_in_the_report(tmp_path):
    # A large trace (100 layers, stacks and shapes): its job is still running when the run fails.
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"], with_stack=True, record_shapes=True)
    with pytest.raises(ValueError, match="boom"):
        trainer(tmp_path, [callback, RaisesAtBatchEnd(4)], limit_val_batches=0).fit(TinyModel(n=32, depth=100))
    [window] = callback.windows
    assert steps(load(window.trace_path)) == [2, 3, 4]
    assert [w["name"] for w in _report(callback)["windows"]] == ["train-epoch000-batches0002-0004"]


def _block_operator_tables(dirpath, epochs):
    """Puts a directory where each epoch's training window will write its operator table: the window worker's
    job fails there (IsADirectoryError), after the trace is written."""
    for epoch in range(epochs):
        os.makedirs(dirpath / f"train-epoch{epoch:03d}-batches0002-0004" / f"rank0{OPERATORS_SUFFIX}")


def test_a_failing_window_job_warns_once_and_training_goes_on(tmp_path):
    dirpath = tmp_path / "perf"
    _block_operator_tables(dirpath, epochs=2)
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"], dirpath=str(dirpath), strict=False)
    t = trainer(tmp_path, [callback], max_epochs=3, limit_val_batches=0)
    with pytest.warns(UserWarning, match="IsADirectoryError") as record:
        t.fit(TinyModel(n=32))
    assert len([w for w in record if "IsADirectoryError" in str(w.message)]) == 1
    assert t.state.finished
    assert [(e.stage, e.epoch) for e in callback.epochs] == [("train", 0), ("train", 1), ("train", 2)]
    assert window_names(callback) == ["train-epoch002-batches0002-0004"]  # the one whose job could finish


def test_a_failing_window_job_is_raised_on_the_training_thread_when_strict(tmp_path):
    dirpath = tmp_path / "perf"
    _block_operator_tables(dirpath, epochs=1)
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"], dirpath=str(dirpath), strict=True)
    t = trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0)
    with pytest.raises(IsADirectoryError, match=OPERATORS_SUFFIX):
        t.fit(TinyModel(n=32))
    assert t.current_epoch == 0  # raised at epoch 0's end, on the training thread
    assert callback.windows == []


def test_a_job_still_queued_at_interpreter_exit_is_finished(tmp_path):
    done = tmp_path / "done"
    script = (
        "import sys, time\n"
        "from lightning_perf.hooks.window_close import WindowWorker\n"
        "worker = WindowWorker()\n"
        "worker.submit(time.sleep, 0.5)\n"
        "worker.submit(open(sys.argv[1], 'w').write, 'written')\n"
        # no join: the interpreter exits with both jobs still queued
    )
    subprocess.run([sys.executable, "-c", script, str(done)], check=True, timeout=60)
    assert done.read_text() == "written"


def test_the_worker_runs_jobs_in_order_and_hands_errors_to_the_joining_thread():
    worker = WindowWorker()
    ran, errors = [], []

    def job(i):
        ran.append((i, threading.current_thread().name))

    for i in range(5):
        worker.submit(job, i)
    worker.submit(int, "not a number")
    worker.submit(job, 5)
    assert worker.pending == 7
    assert pickle.loads(pickle.dumps(worker)).pending == 0  # a copy (a spawned rank's) has no thread, no jobs
    worker.join(on_error=lambda err: errors.append((err, threading.current_thread().name)))
    assert [i for i, _ in ran] == [0, 1, 2, 3, 4, 5] and worker.pending == 0
    assert {name for _, name in ran} == {"lightning_perf-windows_0"}
    [(err, thread)] = errors
    assert isinstance(err, ValueError) and thread == threading.main_thread().name
    assert not [t for t in threading.enumerate() if t.name.startswith("lightning_perf-windows")]  # let go
    worker.join(on_error=errors.append)  # nothing left: a no-op
    worker.submit(job, 6)  # a new thread for the next jobs
    worker.join(on_error=errors.append)
    assert ran[-1][0] == 6 and len(errors) == 1


class NamedBlocks(TinyModel):
    """Runs each training step under ``record_function`` labels holding a double quote, a backslash and a tab."""

    LABELS = ('load "shard-3"', "C:\\data\\x", "tab\there")

    def training_step(self, batch, batch_idx):
        with torch.profiler.record_function(self.LABELS[0]):
            with torch.profiler.record_function(self.LABELS[1]):
                torch.relu(batch[0])
            with torch.profiler.record_function(self.LABELS[2]):
                torch.tanh(batch[0])
            return super().training_step(batch, batch_idx)


def test_a_trace_torch_exports_as_invalid_json_is_repaired_and_the_window_kept(tmp_path):
    # torch 2.13's export_chrome_trace writes `"name": "load "shard-3"",`: the whole export is invalid JSON.
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"], max_windows=2)
    with pytest.warns(UserWarning, match="not valid JSON") as record:
        trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0).fit(NamedBlocks(n=32))
    said = [str(w.message) for w in record if "not valid JSON" in str(w.message)]
    assert said == [
        "PerfCallback: a train window's trace, as torch exported it, was not valid JSON: 3 string values held an"
        " unescaped double quote ('load \"shard-3\"') (torch's `export_chrome_trace` does not escape them). It was"
        " repaired and saved as valid JSON."
    ]  # once per run, for two windows, each with one such name per step
    assert not [w for w in record if "failed" in str(w.message)]
    assert window_names(callback) == ["train-epoch000-batches0002-0004", "train-epoch001-batches0002-0004"]
    for window in callback.windows:
        assert steps(load(window.trace_path)) == [2, 3, 4]  # valid JSON, as Perfetto and HTA read it
        assert window.summary is not None and window.summary.steps == 3
        operators = {op.name: op for op in window.operators}
        assert operators['load "shard-3"'].calls == 3
        # torch 2.13 writes backslashes as slashes and a name holding a tab as "unknown" (valid JSON both):
        # the repair of those, as other exporters write them, is tests/test_trace_repair.py's.
        assert {"C:\\data\\x", "C:/data/x"} & operators.keys() and {"tab\there", "unknown"} & operators.keys()
        assert tuple(operator_stats(load_trace(window.trace_path))) == tuple(window.operators)
        table = (pathlib.Path(window.trace_path).parent / f"rank0{OPERATORS_SUFFIX}").read_text()
        assert 'load "shard-3"' in table
    assert "<td>load &#34;shard-3&#34;</td>" in pathlib.Path(callback.page_path).read_text()  # the page's tables
