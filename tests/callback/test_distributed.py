"""Real two-process runs on this machine (Lightning's DDP over gloo on the CPU), from a subprocess script
(tests/ddp_script.py): per-rank traces, the cross-rank summary, straggler and communication findings."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch_tb_profiler import io as tb_io
from torch_tb_profiler.profiler.loader import RunLoader

from lightning_perf import layout

SCRIPT = Path(__file__).resolve().parents[1] / "ddp_script.py"
ROOT = SCRIPT.parents[1]

pytestmark = pytest.mark.slow


def _start(root, strategy: str, scenario: str) -> subprocess.Popen:
    """The script's run, started in a session of its own: killed as a whole on timeout (Lightning's rank 1 is a
    child of rank 0, and a rank that hangs in a collective ignores SIGTERM)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(root), strategy, scenario],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def _finish(popen: subprocess.Popen, timeout: float):
    """The started run and its ``RESULT`` lines, by rank; a run past ``timeout`` fails the test."""
    with popen:
        try:
            stdout, stderr = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)  # every rank: the script's session is its process group
            stdout, stderr = popen.communicate()
            pytest.fail(f"{' '.join(popen.args[-2:])} still ran after {timeout:g} s (a hang?):\n{_why(stderr)}")
        finally:
            with contextlib.suppress(ProcessLookupError):  # (no process left: nothing to kill)
                os.killpg(popen.pid, signal.SIGKILL)  # a rank left behind by a rank zero that exited
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
    # Wherever a line starts: the ranks share the pipe, and one's progress bar or profiler may have left a
    # line unfinished when another prints.
    decode = json.JSONDecoder().raw_decode
    results = [decode(stdout, found.end())[0] for found in re.finditer("RESULT ", stdout)]
    return proc, sorted(results, key=lambda r: r["rank"])


def _node_ranks(stdout: str, scenario: str = "plain") -> list[int]:
    """How many of the node's other ranks each rank knew in ``scenario`` (the script's ``NODE`` lines), by rank."""
    decode = json.JSONDecoder().raw_decode
    rows = [decode(stdout, found.end())[0] for found in re.finditer("NODE ", stdout)]
    return [r["node_ranks"] for r in sorted(rows, key=lambda r: r["rank"]) if r["scenario"] == scenario]


def _run(tmp_path, strategy: str, scenario: str, timeout: float = 180):
    """The script's run to its end (:func:`_finish`)."""
    return _finish(_start(tmp_path, strategy, scenario), timeout)


_ERROR_LINE = re.compile(r"\w*(?:Error|Exception)\b:|Traceback \(most recent call last\)")


def _why(stderr: str) -> str:
    """A failed run's stderr for an assertion's message: its error lines first (the ranks share the pipe: the rank
    that failed first may have written far from its end, as a peer's "Connection reset by peer" follows it), then
    its last 3000 characters."""
    errors = [line for line in stderr.splitlines() if _ERROR_LINE.search(line)]
    return "\n".join(["error lines:", *errors[-30:], "the end:", stderr[-3000:]])


def _report(tmp_path) -> dict:
    [path] = list(tmp_path.rglob("perf_report.json"))
    return json.loads(path.read_text())


SEVERAL = ("plain", "straggler", "communication", "budget", "sync_every_step", "sync_every_epoch", "orders")


@pytest.fixture(scope="module")
def several(tmp_path_factory):
    """The scenarios that run to their end, one fit after another in one launch of two ranks (each rank's start,
    importing Lightning, takes most of a launch's 15-20 s): by scenario, its root and its ranks' results."""
    root = tmp_path_factory.mktemp("ddp_several")
    proc, results = _run(root, "ddp", ",".join(SEVERAL), timeout=400)
    assert proc.returncode == 0, _why(proc.stderr)
    runs = {name: (root / name, [r for r in results if r["scenario"] == name]) for name in SEVERAL}
    assert all([r["rank"] for r in ranks] == [0, 1] for name, (_, ranks) in runs.items() if name != "orders"), results
    return proc, runs


@pytest.fixture(scope="module")
def plain(several):
    proc, runs = several
    root, results = runs["plain"]
    return root, proc, results


def test_every_rank_writes_its_own_trace_into_each_window(plain):
    root, proc, results = plain
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["launched"] for r in results] == [1, 0]  # Lightning's launcher: rank 1 is rank zero's child
    assert _node_ranks(proc.stdout) == [1, 1]  # each knows the other, whose CPU time is the run's own
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
        # Each rank's wait for a CPU, which the rules read together: a step waits for every rank.
        assert all(0 <= r["cpu_wait_share"] < 1 for r in epoch["ranks"]), epoch["ranks"]
    assert "  rank  step p50" in proc.stderr + proc.stdout  # the console's per-rank table
    event_dirs = {p.parent for p in root.rglob("events.out.tfevents*")}
    [layout_dir] = [d for d in event_dirs if d.name == "perf"]  # the Custom Scalars layout's run, rank zero's
    assert len(list(layout_dir.glob("events.out.tfevents*"))) == 1
    [log_dir] = event_dirs - {layout_dir}
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert len(list(log_dir.glob("events.out.tfevents*"))) == 1
    assert [e.step for e in acc.Scalars("perf/train/epoch/step_time_p50_ms")] == [8, 16]
    [ranks_text, _] = acc.Tensors("perf/ranks/train/text_summary")
    assert "| rank | step p50 |" in ranks_text.tensor_proto.string_val[0].decode()


def test_a_rank_that_sleeps_every_step_is_named_a_straggler(several):
    _, results = several[1]["straggler"]
    stragglers = [f for f in results[0]["findings"] if f[0] == "rank_straggler"]
    assert stragglers and stragglers[0][2].startswith("Rank 1 is"), results[0]["findings"]
    # Rank 0 waits in the all-reduce for rank 1: a wait, not the transfer (evidence is the finding's 4th field).
    assert "a wait, not the transfer" in stragglers[0][3] and "rank 1 the least" in stragglers[0][3]
    assert results[1]["findings"] == []  # findings are rank zero's


def test_large_parameters_with_tiny_compute_are_communication_bound(several):
    _, results = several[1]["communication"]
    assert "communication_bound" in [f[0] for f in results[0]["findings"]], results[0]["findings"]


def test_the_budgets_later_windows_open_on_every_rank_or_on_none(several):
    """Each rank measures its own profiling cost; the budget's verdicts are rank 0's on every rank, so that each
    window holds every rank's trace. Rank 1's own budget would open no later window (tests/ddp_script.py)."""
    _, results = several[1]["budget"]
    windows = [r["windows"] for r in results]
    assert windows[0] == windows[1], windows
    train = [name for name in windows[0] if name.startswith("train-")]
    assert len(train) == 3 and train[0].startswith("train-epoch000"), train  # the first, and two later ones
    for name in windows[0]:
        traces = sorted(p.name for p in (Path(results[0]["dirpath"]) / name).glob("*.pt.trace.json.gz"))
        assert traces == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"], (name, traces)


# Launches whose tests time nothing: started together, they share this machine's CPUs while each waits for its
# processes to import Lightning (62 s one after another here, about 30 s together). Never beside `several`,
# whose scenarios are timed.
TOGETHER = {"ddp_spawn": ("ddp_spawn", "plain"), "raises": ("ddp", "raises"), "raises_late": ("ddp", "raises_late")}


@pytest.fixture(scope="module")
def together(tmp_path_factory):
    """The :data:`TOGETHER` launches, started at once: by name, its root and its process."""
    started = {}
    try:
        for name, (strategy, scenario) in TOGETHER.items():
            root = tmp_path_factory.mktemp(name)
            started[name] = (root, _start(root, strategy, scenario))
        yield started
    finally:
        for _, popen in started.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)


def test_ddp_spawn_writes_every_rank_and_the_report(together):
    root, popen = together["ddp_spawn"]
    proc, _ = _finish(popen, timeout=300)
    assert proc.returncode == 0, _why(proc.stderr)
    # The ranks are siblings, neither the other's child: each still knows the other's process, whose CPU time is
    # the run's own (it read as other processes' load, 0.6-0.8 CPUs, and cpu_contention called an idle machine busy).
    assert _node_ranks(proc.stdout) == [1, 1]
    names = sorted(p.name for p in root.rglob("*.pt.trace.json.gz"))
    assert names == [
        "rank0.pt.trace.json.gz",
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
    ]
    assert [r["rank"] for r in _report(root)["stages"]["train"]["epochs"][0]["ranks"]] == [0, 1]


@pytest.mark.parametrize("scenario", ["raises", "raises_late"])
def test_a_rank_that_raises_does_not_leave_the_others_waiting(together, scenario):
    # raises_late: rank 1 stops with its gather in flight, which rank zero, waiting for rank 1 in another
    # collective, never joins; rank 1's exit must not wait for it.
    _, popen = together[scenario]
    proc, _ = _finish(popen, timeout=300)
    assert proc.returncode != 0
    assert "rank 1 failed" in proc.stderr


@pytest.fixture(scope="module")
def orders(several):
    proc, runs = several
    root, results = runs["orders"]
    return root, proc, results


def test_no_callback_order_deadlocks_a_metric_synced_for_the_progress_bar(orders):
    # A progress bar before PerfCallback reduced the synced metric on rank zero alone while rank 1 waited in
    # our gather: the run hung at the end of the first epoch (now _run fails it after its timeout).
    root, _, results = orders
    names = ["tqdm_first", "tqdm_last", "rich_first", "rich_last", "refit"]
    assert sorted((r["order"], r["rank"]) for r in results) == sorted((n, rank) for n in names for rank in (0, 1))
    for name in names:  # the refit's report holds its callback's first fit too: 4 epochs
        report = json.loads(next((root / name).rglob("perf_report.json")).read_text())
        for stage in ("train", "validate"):
            epochs = report["stages"][stage]["epochs"]
            assert [[r["rank"] for r in e["ranks"]] for e in epochs] == [[0, 1]] * (4 if name == "refit" else 2)
    assert not list(root.rglob(f"*{layout.STAGED_MARK}*"))  # every rank's traces published, in every fit
    by_window = {}
    for trace in root.rglob("*.pt.trace.json.gz"):
        by_window.setdefault(trace.parent, []).append(trace.name)
    assert len(by_window) == 5 * 4  # train and validate windows, 2 epochs, 5 fits
    assert all(sorted(traces) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"] for traces in by_window.values())


def test_the_cross_rank_summary_uses_no_deprecated_collective(plain):
    # The strategy's all_gather went through torch.distributed.nn.functional.all_gather, which torch deprecates.
    _, proc, _ = plain
    lines = (proc.stdout + proc.stderr).splitlines()
    assert [line for line in lines if "all_gather" in line and "deprecated" in line] == []


def test_the_rank_exchange_holds_no_rank_but_rank_zero_and_sees_late_gathers_end(tmp_path):
    proc, results = _run(tmp_path, "none", "exchange", timeout=120)
    assert proc.returncode == 0, _why(proc.stderr)
    zero, one = results
    assert zero["rows"] == [[0, 0.5], [1, 1.5]]  # every rank's values, by rank
    assert one["issued_without_waiting"]  # else rank zero, alone in its first collective, would wait for ever
    assert zero["late"] is None  # rank 1 not there within the wait: no rows, and rank zero goes on
    assert zero["polled"] == one["polled"] == ["epoch0", "epoch1"]
    assert zero["drained"] == one["drained"] == [[], 0]
    assert zero["again"] == [0, 1]  # a second exchange in the same processes
    assert zero["last_drain"] == [["again"], 0]
    assert one["last_drain"] == [["again", "never"], 1]  # handed back all the same; one still in flight
    assert one["held"] == []  # and held only until rank zero's close ended it: the process exits cleanly


def test_a_ddp_windows_collectives_are_gloos_all_reduces_in_the_report(plain):
    root, _, _ = plain
    train = [w for w in _report(root)["windows"] if w["stage"] == "train"]
    assert train
    for window in train:
        # DDP's gradient buckets: gloo all-reduces among the 2 ranks, every recorded step; gloo records no sizes.
        reduces = [c for c in window["collectives"] if c["kind"] == "all_reduce"]
        assert len(reduces) == 1 and reduces[0]["ranks"] == 2 and reduces[0]["per_step"] >= 1
        assert reduces[0]["seconds"] > 0 and reduces[0]["bytes"] is None and not reduces[0]["on_device"]


def test_small_collectives_advice_applied_makes_the_step_faster(several):
    # 12 values logged with sync_dist=True every step: 12 all-reduces and, on gloo, 12 barriers a step. The advice
    # (log them with on_step=False, on_epoch=True) applied: reduced once per epoch, the finding gone, the step
    # faster (min epoch step p50, idle machine: 0.5-0.7x; beside two CPU burners, which slow every step, 0.7-0.85x).
    runs = {}
    for scenario in ("sync_every_step", "sync_every_epoch"):
        root, results = several[1][scenario]
        steps = [e["step_time_p50"] for e in _report(root)["stages"]["train"]["epochs"]]
        runs[scenario] = ({f[0] for f in results[0]["findings"]}, min(steps))
    (every_ids, every_step), (once_ids, once_step) = runs["sync_every_step"], runs["sync_every_epoch"]
    assert "small_collectives" in every_ids and "small_collectives" not in once_ids
    assert once_step < 0.85 * every_step, runs


def test_a_multi_node_launch_of_two_nodes_of_two_processes_each(tmp_path):
    # Lightning's multi-node path on one machine: every process started as a cluster's launcher would (gloo,
    # num_nodes=2, MASTER_ADDR, NODE_RANK, LOCAL_RANK), forked by the script.
    proc, results = _run(tmp_path, "ddp", "multinode", timeout=240)
    assert proc.returncode == 0, _why(proc.stderr)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    # Each window holds one trace per global rank, named by it; one report, rank zero's, with every rank.
    windows = {Path(p).parent for r in results for p in r["windows"]}
    assert windows and all(
        sorted(p.name for p in w.glob("*.pt.trace.json.gz")) == [f"rank{i}.pt.trace.json.gz" for i in range(4)]
        for w in windows
    )
    report = _report(tmp_path)
    assert (report["run"]["world_size"], report["run"]["num_nodes"]) == (4, 2)
    assert all([x["rank"] for x in e["ranks"]] == [0, 1, 2, 3] for e in report["stages"]["train"]["epochs"])
