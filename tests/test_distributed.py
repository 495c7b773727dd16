"""Real two-process runs on this machine (Lightning's DDP over gloo on the CPU), from a subprocess script
(tests/ddp_script.py): per-rank traces, the cross-rank summary, straggler and communication findings."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch_tb_profiler import io as tb_io
from torch_tb_profiler.profiler.loader import RunLoader

from lightning_perf import layout

SCRIPT = Path(__file__).resolve().parent / "ddp_script.py"
ROOT = SCRIPT.parents[1]

pytestmark = pytest.mark.slow


def _run(tmp_path, strategy: str, scenario: str, timeout: float = 180):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), strategy, scenario],
        capture_output=True,
        text=True,
        timeout=timeout,  # a hang fails the test instead of the suite
        env=env,
    )
    results = [json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return proc, sorted(results, key=lambda r: r["rank"])


def _report(tmp_path) -> dict:
    [path] = list(tmp_path.rglob("perf_report.json"))
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp_plain")
    proc, results = _run(root, "ddp", "plain")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc, results


def test_every_rank_writes_its_own_trace_into_each_window(plain):
    root, _, results = plain
    assert [r["rank"] for r in results] == [0, 1]
    windows = sorted(p.parent for p in root.rglob("*.pt.trace.json.gz"))
    by_window = {w.name: sorted(p.name for p in w.glob("*.pt.trace.json.gz")) for w in set(windows)}
    assert by_window == {
        "train-epoch000-batches0003-0004": ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"],
        "train-epoch001-batches0003-0004": ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"],
    }
    assert not list(root.rglob(f"*{layout.STAGED_MARK}*"))  # every trace published under its final name
    # Each rank's windows opened and closed on the same batches.
    assert [Path(p).parent.name for p in results[0]["windows"]] == [Path(p).parent.name for p in results[1]["windows"]]


def test_the_ranks_of_a_window_are_workers_of_one_run_in_the_profiler_tab(plain):
    root, _, _ = plain
    [window] = [p for p in root.rglob("train-epoch000-batches0003-0004") if p.is_dir()]
    with tempfile.TemporaryDirectory() as cache:
        run = RunLoader(window.name, str(window), tb_io.Cache(cache)).load()
    assert run.workers == ["All", "rank0", "rank1"]
    assert "Distributed" in [view.display_name for view in run.views]


def test_one_report_with_a_per_rank_table_and_scalars_written_once(plain):
    root, proc, _ = plain
    report = _report(root)
    assert report["run"]["world_size"] == 2 and report["run"]["strategy"] == "DDPStrategy"
    epochs = report["stages"]["train"]["epochs"]
    assert len(epochs) == 2  # rank zero's epochs, written once
    for epoch in epochs:
        assert [r["rank"] for r in epoch["ranks"]] == [0, 1]
        assert all(r["step_time_p50"] > 0 and r["communication_share"] is not None for r in epoch["ranks"])
    assert "  rank  step p50" in proc.stderr + proc.stdout  # the console's per-rank table
    [log_dir] = {p.parent for p in root.rglob("events.out.tfevents*")}
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert len(list(log_dir.glob("events.out.tfevents*"))) == 1
    assert [e.step for e in acc.Scalars("perf/train/epoch/step_time_p50_ms")] == [8, 16]
    [ranks_text, _] = acc.Tensors("perf/ranks/train/text_summary")
    assert "| rank | step p50 |" in ranks_text.tensor_proto.string_val[0].decode()


def test_a_rank_that_sleeps_every_step_is_named_a_straggler(tmp_path):
    proc, results = _run(tmp_path, "ddp", "straggler")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stragglers = [f for f in results[0]["findings"] if f[0] == "rank_straggler"]
    assert stragglers and stragglers[0][2].startswith("Rank 1 is"), results[0]["findings"]
    assert results[1]["findings"] == []  # findings are rank zero's


def test_large_parameters_with_tiny_compute_are_communication_bound(tmp_path):
    proc, results = _run(tmp_path, "ddp", "communication")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "communication_bound" in [f[0] for f in results[0]["findings"]], results[0]["findings"]


def test_ddp_spawn_writes_every_rank_and_the_report(tmp_path):
    proc, _ = _run(tmp_path, "ddp_spawn", "plain")
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(p.name for p in tmp_path.rglob("*.pt.trace.json.gz"))
    assert names == ["rank0.pt.trace.json.gz", "rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert [r["rank"] for r in _report(tmp_path)["stages"]["train"]["epochs"][0]["ranks"]] == [0, 1]


def test_a_rank_that_raises_does_not_leave_the_others_waiting(tmp_path):
    proc, _ = _run(tmp_path, "ddp", "raises", timeout=120)
    assert proc.returncode != 0
    assert "rank 1 failed" in proc.stderr
