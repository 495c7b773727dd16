"""The trace rewrite for torch-tb-profiler, on synthetic events and on real GPU traces read by the plugin's own
loader; the steps' spans kept, found and numbered; atomic gzipped writes."""

import copy
import gzip
import json
import os
import shutil

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch_tb_profiler.consts import WORKER_PATTERN
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator

from kineto import load, recorded_window, steps
from lightning_perf import layout, readers, traces
from lightning_perf.cli import UsageError, find_traces


def _event(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _trace(*events):
    return {"schemaVersion": 1, "traceEvents": list(events)}


def test_dataloader_spans_become_cpu_ops_and_other_annotations_stay():
    trace = _trace(
        _event("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 10),
        _event("user_annotation", "ProfilerStep#3", 0, 20),
        _event("user_annotation", "my_block", 12, 2),
        _event("cpu_op", "aten::mm", 12, 1),
    )
    traces.tensorboard_compatible(trace)
    assert [e["cat"] for e in trace["traceEvents"]] == ["cpu_op", "user_annotation", "user_annotation", "cpu_op"]
    assert trace["lightning_perf"]["renamed_categories"] == {"user_annotation:enumerate(DataLoader)#*": "cpu_op"}


def test_runtime_and_driver_calls_get_the_category_the_plugin_knows():
    trace = _trace(_event("cuda_runtime", "cudaLaunchKernel", 0, 5), _event("cuda_driver", "cuLaunchKernel", 6, 5))
    traces.tensorboard_compatible(trace)
    assert [e["cat"] for e in trace["traceEvents"]] == ["Runtime", "Runtime"]


def test_standard_categories_undoes_the_rewrite_exactly():
    original = _trace(
        _event("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 10),
        _event("cuda_runtime", "cudaLaunchKernel", 0, 5, correlation=7),
        _event("kernel", "gemm", 8, 5, correlation=7),
    )
    rewritten = traces.tensorboard_compatible(copy.deepcopy(original))
    assert rewritten != original
    assert traces.standard_categories(rewritten)["traceEvents"] == original["traceEvents"]


def test_keep_steps_keeps_the_last_span_of_each_recorded_batch():
    trace = _trace(
        _event("user_annotation", "ProfilerStep#5", 0, 10),
        _event("user_annotation", "ProfilerStep#6", 10, 1),  # opened, then paused for validation
        _event("cpu_op", "aten::mm", 3, 1),
        _event("user_annotation", "ProfilerStep#6", 50, 10),  # the same batch after validation
        _event("user_annotation", "ProfilerStep#7", 60, 1),  # opened for a batch that never came
    )
    traces.keep_steps(trace, {5, 6})
    assert list(traces.profiler_steps(trace)) == [(5, 0.0, 10.0), (6, 50.0, 60.0)]
    assert any(e["name"] == "aten::mm" for e in trace["traceEvents"])


@pytest.mark.parametrize(
    ("name", "number"),
    [
        ("ProfilerStep#0", 0),
        ("ProfilerStep#12", 12),
        ("ProfilerStep#x", None),  # a ProfilerStep# name whose rest is no integer: no step
        ("ProfilerStep#", None),
        ("ProfilerStep", None),
        ("aten::mm", None),
        (None, None),  # a name of another type (a fuzzed trace's)
        (3, None),
    ],
)
def test_step_number_reads_n_of_a_profiler_step_span_s_name(name, number):
    assert traces.step_number(name) == number


def test_profiler_steps_are_the_complete_events_named_profilerstep_n():
    trace = _trace(
        _event("user_annotation", "ProfilerStep#2", 0, 10),
        {"ph": "i", "name": "ProfilerStep#3", "ts": 5},  # not a span
        _event("user_annotation", "ProfilerStep#x", 10, 5),  # not a step's name
        _event("user_annotation", "ProfilerStep#4", 20, 10),
    )
    assert list(traces.profiler_steps(trace)) == [(2, 0.0, 10.0), (4, 20.0, 30.0)]


def test_write_trace_is_gzip_json_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "rank0.pt.trace.json.gz"
    traces.write_trace(_trace(_event("cpu_op", "aten::mm", 0, 1)), path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    with gzip.open(path, "rt") as f:
        assert json.load(f)["traceEvents"][0]["name"] == "aten::mm"
    assert load(path) == _trace(_event("cpu_op", "aten::mm", 0, 1))


def _plugin_profile(path, tmp_path):
    data = RunProfileData.parse("rank0", None, str(path), str(tmp_path))
    return RunGenerator("rank0", None, data).generate_run_profile()


def _overview_shares(profile):
    return {c["name"]: c["extra"] for c in profile.overview["performance"][0]["children"]}


@pytest.mark.parametrize("name", ["v100_single_rank.json.gz", "a100_nccl_2rank_rank0.json.gz"])
def test_real_gpu_trace_shows_runtime_and_operator_device_time_only_after_rewrite(name, gpu_trace, tmp_path):
    trace = load(gpu_trace(name))
    as_recorded = tmp_path / "as_recorded.pt.trace.json.gz"
    rewritten = tmp_path / "rewritten.pt.trace.json.gz"
    traces.write_trace(trace, as_recorded)
    traces.write_trace(traces.tensorboard_compatible(trace), rewritten)

    before, after = _plugin_profile(as_recorded, tmp_path), _plugin_profile(rewritten, tmp_path)
    # The plugin's misreading, as recorded: no runtime, no device time for any operator.
    assert _overview_shares(before)["Runtime"] == 0
    assert sum(r["device_self_duration"] for r in before.operation_table_by_name["data"]) == 0
    # Rewritten: runtime calls are counted and kernels are tied to the operators that launched them.
    assert _overview_shares(after)["Runtime"] > 0
    assert _overview_shares(after)["Kernel"] > 0
    assert sum(r["device_self_duration"] for r in after.operation_table_by_name["data"]) > 0


def test_a_staged_trace_is_gzipped_under_a_name_no_trace_reader_picks_up(tmp_path):
    final = str(tmp_path / layout.trace_filename(0))
    staged = layout.staged_path(final)
    traces.write_trace({"traceEvents": []}, staged)
    with open(staged, "rb") as f:
        assert gzip.decompress(f.read()) == b'{"traceEvents":[]}'  # gzipped, as the final one
    assert WORKER_PATTERN.match(os.path.basename(final)) and not WORKER_PATTERN.match(os.path.basename(staged))
    with pytest.raises(UsageError, match="holds no Kineto trace"):  # nor the offline CLI
        find_traces([str(tmp_path)])


def _export(window_metadata: dict) -> str:
    """torch's own export of a real window over three DataLoader batches, steps 0, 1 and 2."""
    loader = iter(DataLoader(TensorDataset(torch.ones(8, 4)), batch_size=2))
    return recorded_window(
        (0, 1, 2), lambda _: next(loader)[0].matmul(torch.ones(4, 4)).sin(), window_metadata
    ).export()


@pytest.mark.parametrize("tensorboard_compat", [True, False])
def test_finish_trace_changes_a_window_in_place_as_the_dictionary_path_does(tmp_path, monkeypatch, tensorboard_compat):
    # The common case changes torch's export event by event (traces._changed_in_place); a cut or a repair goes
    # through dictionaries. Both must write the same trace and return the same typed one.
    export = _export({"lightning_perf": {"stage": "train"}})
    copy_ = str(tmp_path / "copy.json")
    shutil.copy(export, copy_)
    in_place = traces.finish_trace(
        export, str(tmp_path / "a.json.gz"), steps={0, 2}, tensorboard_compat=tensorboard_compat
    )
    monkeypatch.setattr(traces, "_changed_in_place", lambda *args: None)
    as_dicts = traces.finish_trace(
        copy_, str(tmp_path / "b.json.gz"), steps={0, 2}, tensorboard_compat=tensorboard_compat
    )
    written = load(tmp_path / "a.json.gz")
    assert written == load(tmp_path / "b.json.gz")
    assert in_place.trace == as_dicts.trace == readers.load_trace(tmp_path / "a.json.gz")
    assert not os.path.exists(export) and not os.path.exists(copy_)
    assert steps(written) == [0, 2]  # the span of step 1, not recorded, is dropped
    loading = [e for e in written["traceEvents"] if traces.is_dataloader_next(e.get("name"))]
    assert len(loading) == 3
    assert written["lightning_perf"]["stage"] == "train"  # the window's own notes stay beside the rename's
    if tensorboard_compat:
        assert {e["cat"] for e in loading} == {"cpu_op"}
        assert written["lightning_perf"]["renamed_categories"] == {"user_annotation:enumerate(DataLoader)#*": "cpu_op"}
    else:
        assert {e["cat"] for e in loading} == {"user_annotation"} and "renamed_categories" not in written[
            "lightning_perf"
        ]
