"""The window process: closed windows are written and summarized in a child process, not in the training process,
but for small traces while no child runs; a child that cannot start or dies leaves each window to the training
process's thread, with one warning."""

import copy
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from kineto import load, recorded_window, steps
from lightning_perf import PerfCallback
from lightning_perf.hooks import window_process
from lightning_perf.hooks.window_close import ClosedWindow, WindowOptions
from lightning_perf.hooks.window_process import CHILD_NICENESS, PROCESS_ENV, WindowProcess
from lightning_perf.records import WindowRecord
from models import TinyModel, trainer, window_names
from purity import heavy_modules_loaded_by, package_modules_loaded_by

WINDOW_3 = {"skip_first": 1, "warmup": 1, "active": 3}  # records batches 2, 3, 4 of each epoch
OPTIONS = WindowOptions(tensorboard_compat=True, max_bytes=2**30, record_shapes=False, sort_by=None, row_limit=10)
NOT_HERE = "processed in the training process"


def closed_window(tmp_path, name: str) -> ClosedWindow:
    """A real profiler window over two batches of a few operators, stopped and exported."""
    window = recorded_window((0, 1), lambda _: torch.ones(8, 8).matmul(torch.ones(8, 8)).sin())
    os.makedirs(tmp_path / name)
    trace_path = str(tmp_path / name / "rank0.pt.trace.json.gz")
    record = WindowRecord(
        stage="train", epoch=0, first_batch=0, last_batch=1, name=name, trace_path=trace_path, step=1, device="cpu"
    )
    return ClosedWindow(
        record=record,
        export_path=window.export(),
        written_path=trace_path,
        operators_path=str(tmp_path / name / "rank0.operators.md"),
        ran=frozenset(window.ran),
    )


def _check_written(closed, processed):
    assert not os.path.exists(closed.export_path)  # torch's export is removed once read
    assert steps(load(closed.written_path)) == [0, 1]
    assert processed.record.operators and processed.record.summary is not None
    with open(closed.operators_path, encoding="utf-8") as f:
        assert f.read() == processed.table
    assert "aten::sin" in processed.table


@pytest.fixture
def child():
    process = WindowProcess()
    yield process
    process.close()


def test_a_window_is_processed_in_a_child_process_that_imports_neither_torch_nor_lightning(tmp_path, child):
    assert heavy_modules_loaded_by("lightning_perf.hooks.window_process") == ["numpy"]
    # Nor the training side's modules: the child's start (its imports) is CPU taken from training.
    loaded = package_modules_loaded_by("lightning_perf.hooks.window_process")
    assert not {"lightning_perf.config", "lightning_perf.budget", "lightning_perf.hooks.window_control"} & set(loaded)
    first = closed_window(tmp_path, "first")
    _check_written(first, child.process(first, OPTIONS))
    pid = child.pid
    assert pid is not None and pid != os.getpid() and child.broken is None
    assert os.getsid(pid) != os.getsid(0)  # a session of its own: the terminal's Ctrl-C does not reach it
    # The lowest priority: where it and training want one CPU, training gets it.
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE and os.getpriority(os.PRIO_PROCESS, pid) == CHILD_NICENESS
    second = closed_window(tmp_path, "second")
    _check_written(second, child.process(second, OPTIONS))
    assert child.pid == pid  # one child for every window, until closed
    # A copy (a spawned rank's, a deep-copied callback's) starts with no child; the original keeps its own.
    assert pickle.loads(pickle.dumps(child)).pid is None and copy.deepcopy(child).pid is None
    assert child.pid == pid
    child.close()
    assert child.pid is None
    with pytest.raises(ProcessLookupError):  # it has exited and been reaped
        os.kill(pid, 0)


def test_the_child_starts_isolated_from_the_sites_customizations(tmp_path, monkeypatch):
    # A sitecustomize on PYTHONPATH (a site's, a test harness's) runs in every interpreter started with `site`: the
    # child starts without it, with the training process's import path.
    site = tmp_path / "site"
    site.mkdir()
    ran = tmp_path / "ran"
    (site / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'a').write('ran')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert ran.read_text() == "ran"  # it runs in a plain interpreter
    ran.unlink()
    process = WindowProcess()
    try:
        closed = closed_window(tmp_path, "w")
        _check_written(closed, process.process(closed, OPTIONS))
        assert process.pid is not None and process.broken is None
    finally:
        process.close()
    assert not ran.exists()


def test_a_small_export_is_processed_here_only_while_no_child_runs(tmp_path, child, monkeypatch):
    closed = closed_window(tmp_path, "w")  # a few operators: some kB
    assert child.small(closed.export_path)
    assert not child.small(str(tmp_path / "gone.json"))  # unreadable: the child reports why
    monkeypatch.setattr(window_process, "HERE_BYTES", 100)
    assert not child.small(closed.export_path)
    monkeypatch.setattr(window_process, "HERE_BYTES", 2**30)
    child.start()
    assert not child.small(closed.export_path)  # a child runs: every window goes to it, in order


def test_start_begins_the_child_at_once_and_never_waits_for_a_window_in_process(tmp_path, child):
    child.start()  # what the callback calls as a window's close begins: the child starts beside the export
    pid = child.pid
    assert pid is not None and child.broken is None
    child.start()
    assert child.pid == pid  # one child
    closed = closed_window(tmp_path, "w")
    _check_written(closed, child.process(closed, OPTIONS))
    assert child.pid == pid  # the window went to the child started before
    with child._lock:  # a window in the child's hands (the worker's thread holds the lock): no wait, no new child
        child.start()
    assert child.pid == pid


def test_a_child_that_dies_leaves_the_next_windows_to_this_process(tmp_path, child):
    first = closed_window(tmp_path, "first")
    child.process(first, OPTIONS)
    os.kill(child.pid, signal.SIGKILL)
    second = closed_window(tmp_path, "second")
    _check_written(second, child.process(second, OPTIONS))
    assert re.fullmatch(r"the window process \(pid \d+\) ended \(exit code -9\)", child.broken)
    assert child.pid is None  # and no new one is started
    third = closed_window(tmp_path, "third")
    _check_written(third, child.process(third, OPTIONS))


def test_a_child_that_cannot_start_leaves_windows_to_this_process(tmp_path, child, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    closed = closed_window(tmp_path, "w")
    _check_written(closed, child.process(closed, OPTIONS))
    assert child.broken is not None and child.broken.startswith("the window process could not start (")


def test_an_error_in_the_childs_processing_is_raised_here_and_the_child_goes_on(tmp_path, child):
    closed = closed_window(tmp_path, "w")
    os.makedirs(closed.operators_path)  # the table cannot be written
    with pytest.raises(IsADirectoryError, match=r"rank0\.operators\.md"):
        child.process(closed, OPTIONS)
    assert child.broken is None and child.pid is not None
    other = closed_window(tmp_path, "other")
    _check_written(other, child.process(other, OPTIONS))


def _not_here(*args, **kwargs):
    raise AssertionError(NOT_HERE)


def test_a_runs_large_windows_are_written_by_the_window_process(tmp_path, monkeypatch):
    # Writing a trace in this (the training) process fails, and strict re-raises it: every window of the run
    # comes whole from the child, where each trace is larger than what is processed here.
    monkeypatch.setattr("lightning_perf.hooks.window_process.HERE_BYTES", 0)
    monkeypatch.setattr("lightning_perf.hooks.window_close.finish_trace", _not_here)
    callback = PerfCallback(schedule=WINDOW_3, strict=True)
    trainer(tmp_path, [callback], max_epochs=2).fit(TinyModel(n=32))
    assert len(callback.windows) == 4
    for window in callback.windows:
        assert steps(load(window.trace_path)) == [2, 3, 4] and window.operators and window.summary is not None
    assert callback._profiler_windows._window_process.pid is None  # let go at the end of fit


def _no_child(*args, **kwargs):
    raise AssertionError("a window process started")


def test_a_runs_small_windows_are_processed_here_and_start_no_child(tmp_path, monkeypatch):
    # A child's start (an interpreter and its imports: about 0.3 s) would take longer than a tiny model's trace
    # takes here, and a short run's epoch end waited for it. Starting one fails here, and strict re-raises it.
    monkeypatch.setattr(window_process.subprocess, "Popen", _no_child)
    callback = PerfCallback(schedule=WINDOW_3, strict=True)
    trainer(tmp_path, [callback], max_epochs=2).fit(TinyModel(n=32))
    assert len(callback.windows) == 4
    for window in callback.windows:
        assert steps(load(window.trace_path)) == [2, 3, 4] and window.operators and window.summary is not None
        assert os.path.getsize(window.trace_path) < window_process.HERE_BYTES


def test_a_child_that_exits_at_once_warns_once_and_every_window_is_still_saved(tmp_path, monkeypatch):
    monkeypatch.setattr("lightning_perf.hooks.window_process.HERE_BYTES", 0)
    monkeypatch.setattr(window_process, "_CHILD_CODE", "import sys; sys.exit(3)")
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"])
    with pytest.warns(UserWarning, match=r"window process \(pid \d+\) ended \(exit code 3\)") as record:
        trainer(tmp_path, [callback], max_epochs=3, limit_val_batches=0).fit(TinyModel(n=32))
    assert len([w for w in record if "window process" in str(w.message)]) == 1
    assert window_names(callback) == [f"train-epoch00{e}-batches0002-0004" for e in range(3)]
    for window in callback.windows:
        assert steps(load(window.trace_path)) == [2, 3, 4] and window.operators


def test_the_environment_variable_keeps_windows_in_the_training_process(tmp_path, monkeypatch):
    monkeypatch.setattr("lightning_perf.hooks.window_process.HERE_BYTES", 0)
    monkeypatch.setenv(PROCESS_ENV, "0")
    started = []
    monkeypatch.setattr(WindowProcess, "_start", lambda self: started.append(self))
    callback = PerfCallback(schedule=WINDOW_3, stages=["train"], strict=True)
    trainer(tmp_path, [callback], limit_val_batches=0).fit(TinyModel(n=32))
    assert window_names(callback) == ["train-epoch000-batches0002-0004"] and not started


def test_a_window_still_queued_at_interpreter_exit_is_written_by_the_child(tmp_path):
    # The script queues a window behind a slow job and exits without joining: the executor's exit handler runs
    # both, and the child, still there, writes the window.
    script = textwrap.dedent(
        """
        import pathlib, sys, time
        sys.path[:0] = [sys.argv[2]]
        from test_window_process import OPTIONS, closed_window
        from lightning_perf.hooks.window_close import WindowWorker
        from lightning_perf.hooks.window_process import WindowProcess

        closed = closed_window(pathlib.Path(sys.argv[1]), "w")
        worker, child = WindowWorker(), WindowProcess()
        worker.submit(time.sleep, 0.5)
        worker.submit(child.process, closed, OPTIONS)
        print(closed.written_path)
        """
    )
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, tests, os.getcwd()])}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), here], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert steps(load(out.stdout.strip())) == [0, 1]
