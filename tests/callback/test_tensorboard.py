"""What TensorBoard shows: operator tables read back with TensorBoard's own reader, and the PyTorch Profiler tab
of a real TensorBoard server started before training."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from lightning.pytorch.loggers import CSVLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_perf import PerfCallback
from lightning_perf.layout import OPERATORS_SUFFIX
from models import TinyModel, trainer


def _texts(log_dir, tag):
    """{step: markdown} of a text tag, read with TensorBoard's EventAccumulator."""
    tag += "/text_summary"  # the suffix torch.utils.tensorboard.SummaryWriter.add_text appends
    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    assert tag in acc.Tags()["tensors"], acc.Tags()
    return {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)}


def test_operator_table_is_in_tensorboard_at_the_windows_step_and_beside_the_trace(tmp_path):
    callback = PerfCallback(
        schedule={"skip_first": 1, "warmup": 1, "active": 2, "repeat": 2}, stages=["train", "validate"], row_limit=5
    )
    t = trainer(tmp_path, [callback], max_epochs=2)
    t.fit(TinyModel(n=40, val_n=24))
    train = [w for w in callback.windows if w.stage == "train"]
    texts = _texts(t.logger.log_dir, "perf/operators/train")
    assert sorted(texts) == sorted(w.step for w in train) == [2, 5, 12, 15]
    table = texts[train[0].step]
    assert train[0].name in table and "| Operator | Calls | Self CPU | CPU total |" in table
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    # Sorted by self CPU time (the default without CUDA): the window's 5 largest, largest first. (Which they are
    # depends on the machine: on a slow one, record_function spans such as `Optimizer.step#SGD.step` fill them.)
    largest = sorted(train[0].operators, key=lambda op: (-op.self_cpu_time, op.name))  # ties by name
    assert [r.split("`")[1] for r in rows] == [op.name for op in largest[:5]]
    assert rows[0].startswith(f"| `{largest[0].name}` | {largest[0].calls} |")
    assert any(op.name.startswith("aten::") for op in train[0].operators)
    # The same table as a file beside the trace.
    beside = os.path.join(os.path.dirname(train[0].trace_path), "rank0" + OPERATORS_SUFFIX)
    assert pathlib.Path(beside).read_text() == table
    # Validation windows on their own step axis (the validation batches seen so far).
    assert sorted(_texts(t.logger.log_dir, "perf/operators/validate")) == [
        w.step for w in callback.windows if w.stage == "validate"
    ]


def test_shapes_and_memory_columns_appear_when_profiled(tmp_path):
    callback = PerfCallback(
        schedule={"skip_first": 0, "active": 1}, stages=["train"], record_shapes=True, profile_memory=True
    )
    trainer(tmp_path, [callback]).fit(TinyModel(n=8))
    table = pathlib.Path(callback.windows[0].trace_path.replace(".pt.trace.json.gz", OPERATORS_SUFFIX)).read_text()
    assert "| Self CPU mem |" in table and "| Input shapes |" in table
    assert any(op.input_shapes for op in callback.windows[0].operators)


@pytest.mark.parametrize("logger", [False, "csv"])
def test_without_a_tensorboard_logger_text_goes_to_our_own_event_file(tmp_path, logger):
    callback = PerfCallback(schedule={"skip_first": 0, "active": 1}, stages=["train"])
    t = trainer(tmp_path, [callback], logger=CSVLogger(tmp_path) if logger == "csv" else False)
    t.fit(TinyModel(n=8))
    expected = os.path.join(t.log_dir if logger == "csv" else str(tmp_path), "perf")
    assert callback.dirpath == expected
    assert callback.windows[0].trace_path.startswith(expected)
    assert list(_texts(expected, "perf/operators/train")) == [1]  # warm-up on batch 0, records batch 1


def _scalar_events(log_dir) -> list[dict[str, float]]:
    """Each event of the event files under ``log_dir`` that holds scalars: {tag: value}."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    events = []
    for path in sorted(pathlib.Path(log_dir).glob("events.out.tfevents.*")):
        for event in LegacyEventFileLoader(str(path)).Load():  # as written (no conversion)
            scalars = {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")}
            if scalars:
                events.append(scalars)
    return events


@pytest.mark.parametrize("logger", [True, False], ids=["tensorboard", "none"])
def test_an_epochs_scalars_are_one_event_that_tensorboard_reads_each_of(tmp_path, logger):
    # Issue 46: an event per scalar woke the writer's thread for each (1.0 ms for 8; one event of 8, 0.12 ms).
    callback = PerfCallback(stages=["predict"])
    trainer(tmp_path, [callback], logger=logger).predict(TinyModel(n=8), return_predictions=False)
    log_dir = tmp_path / "lightning_logs" / "version_0" if logger else pathlib.Path(callback.dirpath)
    (event,) = [e for e in _scalar_events(log_dir) if "perf/predict/epoch/batches" in e]
    assert event["perf/predict/epoch/batches"] == 2 and "perf/predict/epoch/step_time_p50_ms" in event
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    assert {tag for tag in acc.Tags()["scalars"] if tag.startswith("perf/predict/epoch/")} == set(event)
    assert [s.value for s in acc.Scalars("perf/predict/epoch/batches")] == [2.0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _ProfilerPlugin:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/data/plugin/pytorch_profiler"

    def get(self, route: str, **query):
        url = self.base + route + ("?" + urllib.parse.urlencode(query) if query else "")
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.load(response)

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                assert self.get("/runs")["runs"] == []
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError("TensorBoard did not start")

    def wait_for_runs(self, expected: set, timeout: float = 90.0) -> list:
        deadline = time.monotonic() + timeout
        runs: list = []
        while time.monotonic() < deadline:
            try:
                answer = self.get("/runs")
                runs = answer["runs"]
                if expected <= {r.rsplit("/", 1)[-1] for r in runs} and not answer["loading"]:
                    return runs
            except OSError:
                pass  # not listening yet
            time.sleep(1)
        raise AssertionError(f"TensorBoard listed {runs}, expected windows {sorted(expected)}")


@pytest.fixture
def tensorboard(tmp_path):
    """A real TensorBoard with the profiler plugin on 127.0.0.1, started on an empty logdir."""
    port = _free_port()
    (tmp_path / "logs").mkdir()
    with open(tmp_path / "tensorboard.log", "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(tmp_path / "logs"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield _ProfilerPlugin(port)
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.slow
def test_profiler_tab_shows_windows_written_after_it_started_with_the_real_dataloader_share(tmp_path, tensorboard):
    tensorboard.wait_until_serving()  # it has scanned the (empty) logdir once before any window exists
    callback = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 3}, stages=["train", "validate"])
    # Every item sleeps 10 ms: a batch of 4 waits 40 ms for data against about 1 ms of compute.
    trainer(tmp_path / "logs", [callback]).fit(TinyModel(n=40, val_n=24, sleep_s=0.01))
    assert [w.name for w in callback.windows] == [
        "train-epoch000-batches0002-0004",
        "validate-epoch000-batches0002-0004",
    ]

    runs = tensorboard.wait_for_runs({w.name for w in callback.windows})
    for window in callback.windows:
        [run] = [r for r in runs if r.endswith("/" + window.name)]
        # The tab's run list reads like a table of contents.
        assert run == f"lightning_logs/version_0/perf/{window.name}"
        assert tensorboard.get("/workers", run=run, view="Overview") == ["rank0"]
        spans = tensorboard.get("/spans", run=run, worker="rank0")
        query = dict(run=run, worker="rank0", span=spans[0] if spans else "")
        overview = tensorboard.get("/overview", **query)
        assert [row[0] for row in overview["steps"]["rows"]] == ["2", "3", "4"]
        shares = {c["name"]: c["extra"] for c in overview["performance"][0]["children"]}
        assert shares["DataLoader"] > 50, (window.name, overview["steps"]["rows"])
        operators = tensorboard.get("/operation", **query, group_by="Operation")
        names = [row[0] for row in operators["host_self_time"]["rows"]]
        assert any(name.startswith("aten::") for name in names), names
