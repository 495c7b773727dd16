"""The readers of untrusted traces and reports: valid files load, every broken one is an InputError naming the
file and the problem, and fuzzed input never escapes as anything else."""

import copy
import dataclasses
import gzip
import json
import pathlib
import re

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kineto import load
from lightning_perf import traces
from lightning_perf.diagnose.model import Finding
from lightning_perf.readers import InputError, load_report, load_trace
from lightning_perf.readers import files as readers_files
from lightning_perf.readers import trace as readers_trace
from lightning_perf.records import (
    CompileStats,
    EpochSummary,
    GraphBreak,
    OperatorStat,
    RankSummary,
    StepSplit,
    TraceSummary,
    WindowRecord,
)
from lightning_perf.report.json_report import (
    OPERATOR_ROWS,
    SCHEMA_VERSION,
    report_dict,
    report_epochs,
    window_dict,
    window_record,
    write_json_atomically,
)
from lightning_perf.summarize.events import KinetoTrace, as_trace
from lightning_perf.summarize.operators import operator_stats
from lightning_perf.summarize.step_summary import summarize_trace
from purity import heavy_modules_loaded_by

ROOT = pathlib.Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- Inputs ---------------------------------------------------------------------------------------------------


def _event(ph, name, ts, dur=None, cat="cpu_op", **args):
    event = {"ph": ph, "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "args": args}
    if dur is not None:
        event["dur"] = dur
    return event


def _trace():
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "Fake GPU", "computeMajor": 8}],
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "python"}},
            _event("X", "ProfilerStep#3", 0, 100, cat="user_annotation"),
            _event("X", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1, 20, cat="user_annotation"),
            _event("X", "aten::mm", 30, 10.5, **{"External id": 7, "Input Dims": [[2, 2], [2, 2]]}),
            _event("X", "cudaLaunchKernel", 32, 2, cat="cuda_runtime", correlation=9, **{"External id": 7}),
            _event("X", "sm80_gemm", 40, 5, cat="kernel", device=0, **{"External id": 7}),
            _event("i", "[memory]", 31, Bytes=512, **{"Device Type": 0}),
            {"ph": "s", "id": 9, "pid": 1, "tid": 1, "ts": 32, "cat": "ac2g", "name": "ac2g"},
        ],
    }


def _content(trace):
    """What the reader keeps of a trace (a typed one, or dictionaries converted as the analyses would), as
    plain values: the fields the analyses read, of every event (the others' phase only)."""
    return msgspec.to_builtins(trace if isinstance(trace, KinetoTrace) else as_trace(trace))


def _checked(path):
    """The trace file's JSON checked field by field (the private checks :func:`load_trace` puts a problem in
    words with, and falls back to for a file decoding refuses), as dictionaries; ``None`` if they refuse it."""
    try:
        return readers_trace._checked_trace(json.loads(pathlib.Path(path).read_text()))
    except readers_files.Invalid:
        return None


def _epoch(stage, number, **kwargs):
    fields = dict(
        stage=stage,
        epoch=number,
        batches=8,
        samples=32,
        step_time=0.8,
        data_wait=0.2,
        step_time_p50=0.1,
        step_time_p90=0.12,
        step_time_max=0.2,
        data_wait_fraction=0.25,
        throughput=40.0,
    )
    return EpochSummary(**{**fields, **kwargs})


EPOCHS = [
    _epoch("train", 0, loss=0.69, profiled_batches=2, host_rss=10**9),
    _epoch("train", 1, samples=None, throughput=None),
    _epoch("validate", 0, cuda_max_allocated=2**30, cuda_utilization=87),
]


def _report():
    summary = TraceSummary(
        window="train_e0_b2-3",
        steps=2,
        step_time=0.1,
        dataloader_time=0.02,
        optimizer_time=0.05,
        optimizer_update_time=0.01,
        optimizer_update_ops=4.0,
        optimizer_foreach=True,
        host_op_time=0.07,
        framework_time=0.01,
        ops_per_step=30.0,
        median_op_time=1e-5,
        device_name="Fake GPU",
    )
    windows = [
        WindowRecord(
            stage="train",
            epoch=0,
            first_batch=2,
            last_batch=3,
            name="train_e0_b2-3",
            trace_path="perf/train_e0_b2-3/rank0.pt.trace.json.gz",
            step=2,
            device="cpu",
            close_seconds=0.3,
            summary=summary,
            operators=(
                OperatorStat(name="aten::mm", calls=4, self_cpu_time=0.01, cpu_time=0.02, input_shapes="[[2, 2]]"),
                OperatorStat(name="aten::add", calls=2, self_cpu_time=0.002, cpu_time=0.002),
            ),
        ),
        WindowRecord(
            stage="validate",
            epoch=0,
            first_batch=0,
            last_batch=0,
            name="validate_e0_b0",
            trace_path="perf/validate_e0_b0/rank0.pt.trace.json.gz",
            step=0,
            device="cuda",
            shortened=True,
            cuda_max_allocated=2**30,
        ),
    ]
    finding = Finding(
        id="dataloader_bound",
        severity="warning",
        title="Training waits for data 25% of the time",
        evidence="data_wait_fraction 0.25 >= 0.2",
        advice="DataLoader(num_workers=4)",
        stage="train",
        epoch=0,
    )
    rank = RankSummary(
        rank=0,
        step_time_p50=0.1,
        step_time_p90=None,
        step_time_max=0.2,
        data_wait_fraction=0.25,
        throughput=40.0,
        host_rss_peak=1e9,
        cuda_max_allocated=None,
        cuda_max_reserved=None,
        communication_share=None,
    )
    return report_dict(
        generated_by="lightning-perf 0.1.0",
        run={
            "torch": "2.4.0",
            "lightning": "2.4.0",
            "device": "cpu",
            "device_name": None,
            "world_size": 1,
            "precision": "32-true",
            "strategy": "SingleDeviceStrategy",
            "cpu_count": 8,
            "torch_threads": 8,
            "dataloaders": {
                "train": {
                    "num_workers": 0,
                    "pin_memory": False,
                    "persistent_workers": False,
                    "prefetch_factor": None,
                    "batch_size": 4,
                    "drop_last": False,
                },
                "predict": None,
            },
        },
        epochs=EPOCHS,
        windows=windows,
        findings={("train", 0): [finding]},
        ranks={("train", 0): [rank]},
        compile={("train", 0): COMPILE},
        steps={("train", 0): STEPS},
    )


STEPS = StepSplit(data_wait=(0.01, 0.0), compute=(0.05, 0.04), profiled=((1, 1),), compiled=(0,))


COMPILE = CompileStats(
    graphs=2,
    breaks=1,
    recompiles=0,
    limit_reached=False,
    seconds=1.5,
    break_sites=(GraphBreak(reason="Unsupported Tensor.item() call", location="/tmp/model.py:29", count=1),),
    steps=(0,),
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A directory for the fuzz tests' files (hypothesis reruns a test in one function-scoped fixture)."""
    return tmp_path_factory.mktemp("fuzz")


# --- Valid inputs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rank0.pt.trace.json.gz", "rank0.pt.trace.json"])
def test_a_trace_written_by_write_trace_loads_unchanged(tmp_path, name):
    path = tmp_path / name
    traces.write_trace(_trace(), path)
    assert _content(load_trace(path)) == _content(_trace())
    assert _content(load_trace(str(path))) == _content(_trace())


def test_a_top_level_list_of_events_is_a_trace(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps(_trace()["traceEvents"]))
    assert _content(load_trace(path)) == _content({"traceEvents": _trace()["traceEvents"]})


def test_events_of_unknown_phases_are_dropped_and_a_byte_order_mark_is_ignored(tmp_path):
    events = _trace()["traceEvents"]
    odd = [{"ph": "?", "ts": "x"}, {"name": "no phase"}, {"ph": 5}, {"ph": ["X"]}]
    path = tmp_path / "odd.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"traceEvents": odd[:2] + events + odd[2:]}).encode())
    assert _content(load_trace(path))["traceEvents"] == _content({"traceEvents": events})["traceEvents"]


def test_a_gzipped_trace_is_recognized_by_its_content_whatever_its_name(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(json.dumps(_trace()).encode()))
    assert _content(load_trace(path)) == _content(_trace())


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
def test_gunzip_gives_what_gzip_gives_or_raises_what_it_raises(monkeypatch, inflater):
    # ISA-L inflates the common case (one whole member); every other case goes through gzip itself.
    if inflater == "isal":
        assert traces.isal_zlib is not None and traces.igzip is not None  # a dependency where it has wheels
    else:
        monkeypatch.setattr(traces, "isal_zlib", None)
        monkeypatch.setattr(traces, "igzip", None)
    whole = gzip.compress(json.dumps(_trace()).encode())
    cases = {
        "whole": whole,
        "two members": whole + gzip.compress(b" "),
        "trailing bytes": whole + b"\0\0",
        "truncated": whole[:-6],
        "corrupt": whole[:20] + bytes([whole[20] ^ 0xFF]) + whole[21:],
        "empty member": gzip.compress(b""),
    }
    for case, data in cases.items():
        try:
            expected, error = gzip.decompress(data), None
        except Exception as err:  # whatever gzip raises, gunzip raises the same
            expected, error = None, err
        if error is None:
            assert traces.gunzip(data) == expected, case
            continue
        with pytest.raises(type(error)) as raised:
            traces.gunzip(data)
        assert str(raised.value) == str(error), case
    text = json.dumps(_trace()).encode()
    assert gzip.decompress(traces.gzip_bytes(text)) == text  # what write_trace writes, gzip reads


def test_real_gpu_traces_load_whole(gpu_trace):
    path = gpu_trace("a100_nccl_2rank_rank0.json.gz")
    trace = load_trace(path)
    assert len(trace.traceEvents) == len(load(path)["traceEvents"]) == 40_573
    assert summarize_trace(trace, window="w").steps == 3


def _analyses(trace):
    return summarize_trace(trace, window="w"), operator_stats(trace)


@pytest.mark.parametrize("name", ["a100_nccl_2rank_rank0.json.gz", "v100_single_rank.json.gz"])
def test_the_reader_gives_the_analyses_what_the_trace_s_json_gives(gpu_trace, name):
    path = gpu_trace(name)
    assert _analyses(load_trace(path)) == _analyses(load(path))


def test_the_reader_falls_back_to_the_field_by_field_checks_for_unusual_files(tmp_path):
    events = _trace()["traceEvents"]
    odd = [{"ph": "?", "ts": "x"}, {"name": "no phase"}, {"ph": 5}]
    path = tmp_path / "odd.json"  # events of no known phase, a byte-order mark: the fast path refuses both
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({**_trace(), "traceEvents": odd + events}).encode())
    assert _analyses(load_trace(path)) == _analyses(_trace())
    path.write_text(json.dumps(events))  # a top-level array of events
    assert _analyses(load_trace(path)) == _analyses({"traceEvents": events})


def test_the_reader_reads_shapes_only_when_asked(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace()))
    by_shape = {
        op.name: op.input_shapes for op in operator_stats(load_trace(path, shapes=True), group_by_input_shape=True)
    }
    assert by_shape["aten::mm"] == "[[2, 2], [2, 2]]"
    assert {op.input_shapes for op in operator_stats(load_trace(path), group_by_input_shape=True)} == {None}


def test_a_memory_event_whose_bytes_are_no_number_counts_none(tmp_path):
    trace = _trace()
    memory = next(e for e in trace["traceEvents"] if e["name"] == "[memory]")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    assert {op.name: op.self_cpu_memory for op in operator_stats(load_trace(path))}["aten::mm"] == 512
    memory["args"]["Bytes"] = "512"  # the field-by-field checks refuse it; decoding reads past it
    path.write_text(json.dumps(trace))
    assert {op.name: op.self_cpu_memory for op in operator_stats(load_trace(path))}["aten::mm"] == 0


def test_a_report_written_by_the_writer_loads_unchanged(tmp_path):
    path = str(tmp_path / "perf_report.json")
    write_json_atomically(_report(), path)
    report = load_report(path)
    assert report == json.loads(json.dumps(_report()))
    epochs = [epoch for stage in report["stages"].values() for epoch in stage["epochs"]]
    assert [EpochSummary(**{f.name: e[f.name] for f in dataclasses.fields(EpochSummary)}) for e in epochs] == EPOCHS
    assert Finding(**epochs[0]["findings"][0]).id == "dataloader_bound"


def test_a_report_gives_back_its_step_splits_and_window_operators_as_records(tmp_path):
    path = str(tmp_path / "perf_report.json")
    write_json_atomically(_report(), path)
    report = load_report(path)
    assert report_epochs(report)[0].steps == STEPS
    window = window_record(report["windows"][0])
    assert [op.name for op in window.operators] == ["aten::mm", "aten::add"]  # largest self CPU time first
    assert window.summary is not None and window.summary.steps == 2
    assert window_record(report["windows"][1]).operators == ()


def test_a_report_written_before_step_splits_and_operators_were_kept_loads_without_them(tmp_path):
    report = _report()
    del report["stages"]["train"]["epochs"][0]["steps"], report["windows"][0]["operators"]
    path = tmp_path / "perf_report.json"
    path.write_text(json.dumps(report))
    loaded = load_report(path)
    assert [e.steps for e in report_epochs(loaded)] == [None] * len(EPOCHS)
    assert window_record(loaded["windows"][0]).operators == ()


def test_a_window_keeps_its_top_operators_by_self_device_time_on_a_gpu(tmp_path):
    ops = tuple(
        OperatorStat(name=f"op{i}", calls=1, self_cpu_time=1.0, cpu_time=1.0, self_device_time=float(i), device_time=i)
        for i in range(OPERATOR_ROWS + 5)
    )
    window = WindowRecord(
        stage="train",
        epoch=0,
        first_batch=0,
        last_batch=0,
        name="w",
        trace_path="t",
        step=0,
        device="cuda",
        operators=ops,
    )
    kept = window_dict(window)["operators"]
    assert len(kept) == OPERATOR_ROWS and kept[0]["name"] == f"op{OPERATOR_ROWS + 4}"
    assert "operators" not in window_dict(window, with_analysis=False)


def test_a_report_may_lack_fields_with_defaults_and_carry_unknown_keys(tmp_path):
    report = _report()
    epoch = report["stages"]["train"]["epochs"][0]
    for name in ("profiled_batches", "cuda_utilization", "findings", "ranks"):
        del epoch[name]
    del report["windows"][0]["summary"], report["windows"][1]["shortened"]
    report["future_section"] = {"anything": [1, 2]}
    epoch["future_metric"] = "x"
    path = tmp_path / "perf_report.json"
    path.write_text(json.dumps(report))
    loaded = load_report(path)
    epoch = loaded["stages"]["train"]["epochs"][0]
    assert (epoch["profiled_batches"], epoch["cuda_utilization"], epoch["findings"], epoch["ranks"]) == (
        0,
        None,
        [],
        [],
    )
    assert (loaded["windows"][0]["summary"], loaded["windows"][1]["shortened"]) == (None, False)
    assert loaded["future_section"] == {"anything": [1, 2]} and epoch["future_metric"] == "x"


def test_a_window_summary_written_before_tiny_operators_were_measured_loads_without_them(tmp_path):
    report = _report()
    summary = report["windows"][0]["summary"]
    del summary["tiny_op_time"], summary["tiny_ops_per_step"]
    path = tmp_path / "perf_report.json"
    path.write_text(json.dumps(report))
    loaded = TraceSummary(**load_report(path)["windows"][0]["summary"])
    assert (loaded.tiny_op_time, loaded.tiny_ops_per_step) == (None, None)


def test_a_window_summary_with_compiled_code_loads_and_one_written_before_it_was_measured_loads_without_it(tmp_path):
    report = _report()
    summary = report["windows"][0]["summary"]
    summary.update(compiled_time=0.062, guard_time=0.0012)
    path = tmp_path / "perf_report.json"
    path.write_text(json.dumps(report))
    loaded = TraceSummary(**load_report(path)["windows"][0]["summary"])
    assert (loaded.compiled_time, loaded.guard_time) == (0.062, 0.0012)
    summary["guard_time"] = "1.2%"
    path.write_text(json.dumps(report))
    with pytest.raises(InputError, match="guard_time"):
        load_report(path)
    del summary["compiled_time"], summary["guard_time"]
    path.write_text(json.dumps(report))
    loaded = TraceSummary(**load_report(path)["windows"][0]["summary"])
    assert (loaded.compiled_time, loaded.guard_time) == (None, None)


def test_a_real_run_s_report_and_traces_load(tmp_path):
    from lightning_perf import PerfCallback
    from models import TinyModel, trainer

    callback = PerfCallback(schedule={"skip_first": 0, "warmup": 1, "active": 2}, verbose=0)
    trainer(tmp_path, [callback], limit_train_batches=4, limit_val_batches=3).fit(TinyModel(n=16))
    report = load_report(callback.report_path)
    assert set(report["stages"]) == {"train", "validate"}
    assert report["windows"] and all(load_trace(w["trace_path"]).traceEvents for w in report["windows"])


# --- Broken inputs --------------------------------------------------------------------------------------------

_VALID_GZ = gzip.compress(json.dumps(_trace()).encode())


def _bad_crc(data: bytes) -> bytes:
    return data[:-8] + bytes([data[-8] ^ 0xFF]) + data[-7:]


def _with_event(**fields):
    event = {"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2, **fields}
    return json.dumps({"traceEvents": [_trace()["traceEvents"][1], {k: v for k, v in event.items() if v != "DEL"}]})


TRACE_FAILURES = [
    ("no_file", "t.json", None, r"no such file"),
    ("directory", "t.json", "DIR", r"is a directory"),
    ("empty", "t.json", b"", r"is empty$"),
    ("truncated_gzip", "t.json.gz", _VALID_GZ[: len(_VALID_GZ) // 2], r"not a valid gzip file \(truncated\?\)"),
    ("gzip_cut_in_header", "t.json.gz", _VALID_GZ[:5], r"not a valid gzip file"),
    ("gzip_bad_crc", "t.json.gz", _bad_crc(_VALID_GZ), r"not a valid gzip file \(CRC check failed"),
    ("gzip_corrupt_stream", "t.json.gz", _VALID_GZ[:12] + b"\xff" * 20 + _VALID_GZ[32:], r"not a valid gzip file \("),
    ("plain_json_named_gz", "t.json.gz", b'{"traceEvents": []}', r"not a valid gzip file"),
    ("gzip_of_nothing", "t.json.gz", gzip.compress(b""), r"is empty once decompressed"),
    ("not_utf8", "t.json", b'{"a": "\xff"}', r"not UTF-8 text \(byte 0xff at offset 7; a binary file\?\)"),
    ("not_utf8_in_gzip", "t.json.gz", gzip.compress(b"\xc3"), r"not UTF-8 text once decompressed"),
    ("whitespace", "t.json", b" \n\t", r"holds only whitespace, no JSON"),
    (
        "truncated_json",
        "t.json",
        b'{"traceEvents": [\n  {"ph": "X"',
        r"invalid JSON at line 2, column 13: .*truncated\?",
    ),
    ("bad_json", "t.json", b'{"traceEvents": [}]}', r"invalid JSON at line 1, column 18: Expecting value$"),
    ("bad_json_in_gzip", "t.json.gz", gzip.compress(b"{x}"), r"invalid JSON once decompressed at line 1, column 2"),
    ("deep_json", "t.json", b"[" * 100_000, r"invalid JSON: nested too deeply"),
    ("huge_integer", "t.json", b"9" * 5000, r"invalid JSON: Exceeds the limit"),
    ("top_level_number", "t.json", b"42", r"the top level must be an object or an array, got 42 \(integer\)"),
    (
        "no_trace_events",
        "t.json",
        b'{"events": []}',
        r"field traceEvents is missing \(not a Kineto or Chrome trace\?\)",
    ),
    (
        "trace_events_object",
        "t.json",
        b'{"traceEvents": {}}',
        r"field traceEvents must be an array, got \{\} \(object\)",
    ),
    ("event_not_object", "t.json", b"[[1]]", r"field traceEvents\[0\] must be an object, got \[1\] \(array\)"),
    ("ts_string", "t.json", _with_event(ts="12"), r"field traceEvents\[1\]\.ts must be a number, got '12' \(string\)"),
    (
        "dur_bool",
        "t.json",
        _with_event(dur=True),
        r"field traceEvents\[1\]\.dur must be a number, got True \(boolean\)",
    ),
    ("dur_negative", "t.json", _with_event(dur=-1), r"field traceEvents\[1\]\.dur must be a number >= 0, got -1"),
    ("dur_missing", "t.json", _with_event(dur="DEL"), r"field traceEvents\[1\]\.dur is missing \(a complete event"),
    ("ts_nan", "t.json", _with_event(ts=float("nan")), r"field traceEvents\[1\]\.ts must be a finite number, got nan"),
    ("dur_overflow", "t.json", _with_event(dur=10**400), r"traceEvents\[1\]\.dur must be a number between -2\*\*63"),
    ("name_number", "t.json", _with_event(name=3), r"field traceEvents\[1\]\.name must be a string, got 3"),
    ("args_list", "t.json", _with_event(args=[1]), r"field traceEvents\[1\]\.args must be an object, got \[1\]"),
    ("args_null", "t.json", _with_event(args=None), r"field traceEvents\[1\]\.args must be an object, got None"),
    ("cat_list", "t.json", _with_event(cat=["cpu_op"]), r"field traceEvents\[1\]\.cat must be a string"),
    ("tid_object", "t.json", _with_event(tid={}), r"field traceEvents\[1\]\.tid must be a number or a string"),
    ("external_id_list", "t.json", _with_event(args={"External id": [1]}), r"traceEvents\[1\]\.args\['External id'\]"),
    ("correlation_list", "t.json", _with_event(args={"correlation": [1]}), r"traceEvents\[1\]\.args\['correlation'\]"),
    ("flops_string", "t.json", _with_event(args={"flops": "1e9"}), r"\[1\]\.args\.flops must be a number or null"),
    ("instant_ts_missing", "t.json", b'[{"ph": "i", "name": "x"}]', r"field traceEvents\[0\]\.ts is missing"),
    ("memory_bytes", "t.json", b'[{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Bytes": "8"}}]', r"args\.Bytes"),
    ("device_properties", "t.json", b'{"traceEvents": [], "deviceProperties": 5}', r"field deviceProperties must be"),
    ("own_notes", "t.json", b'{"traceEvents": [], "lightning_perf": []}', r"field lightning_perf must be an object"),
]


def _cases(table):
    return [pytest.param(*case[1:], id=case[0]) for case in table]


@pytest.mark.parametrize(("filename", "content", "message"), _cases(TRACE_FAILURES))
def test_a_broken_trace_is_an_input_error_naming_the_file_and_the_problem(tmp_path, filename, content, message):
    path = tmp_path / filename
    if content == "DIR":
        path.mkdir()
    elif isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError) as info:
        load_trace(path)
    first_line = str(info.value).splitlines()[0]
    assert first_line.startswith(f"{path}: ")
    assert _search(message, first_line[len(f"{path}: ") :])


def _search(pattern, text):
    assert re.search(pattern, text), f"{pattern!r} not in {text!r}"
    return True


def test_parse_errors_chain_the_original_exception(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(_VALID_GZ[:-20])
    with pytest.raises(InputError) as info:
        load_trace(path)
    assert isinstance(info.value.__cause__, EOFError)
    path.write_bytes(gzip.compress(b"{"))
    with pytest.raises(InputError) as info:
        load_trace(path)
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def _set(path, value):
    def mutate(report):
        *parents, last = path
        for key in parents:
            report = report[key]
        if value == "DEL":
            del report[last]
        else:
            report[last] = value

    return mutate


EPOCH = ("stages", "train", "epochs", 0)
REPORT_FAILURES = [
    ("top_level_list", lambda r: [r], r"not a perf_report\.json: the top level must be an object, got \[\{"),
    ("no_version", _set(("version",), "DEL"), r"field version is missing \(not a perf_report\.json\?\)"),
    ("version_string", _set(("version",), "1"), r"field version must be an integer, got '1' \(string\)"),
    ("version_bool", _set(("version",), True), r"field version must be an integer, got True"),
    ("version_zero", _set(("version",), 0), r"unknown report schema version 0 \(this lightning-perf reads version 1\)"),
    ("generated_by", _set(("generated_by",), 1), r"field generated_by must be a string"),
    ("no_run", _set(("run",), "DEL"), r"field run is missing"),
    ("run_list", _set(("run",), []), r"field run must be an object, got \[\]"),
    ("run_world_size", _set(("run", "world_size"), "2"), r"field run\.world_size must be an integer, got '2'"),
    ("run_dataloaders", _set(("run", "dataloaders"), [1]), r"field run\.dataloaders must be an object"),
    (
        "loader_workers",
        _set(("run", "dataloaders", "train", "num_workers"), "x"),
        r"field run\.dataloaders\.train\.num_workers must be an integer or null, got 'x'",
    ),
    (
        "loader_pin",
        _set(("run", "dataloaders", "train", "pin_memory"), 1),
        r"field run\.dataloaders\.train\.pin_memory must be a boolean or null, got 1",
    ),
    ("no_stages", _set(("stages",), "DEL"), r"field stages is missing"),
    ("stages_list", _set(("stages",), []), r"field stages must be an object"),
    ("stage_not_object", _set(("stages", "train"), 3), r"field stages\.train must be an object, got 3"),
    ("no_epochs", _set(("stages", "train", "epochs"), "DEL"), r"field stages\.train\.epochs is missing"),
    ("epochs_object", _set(("stages", "train", "epochs"), {}), r"field stages\.train\.epochs must be an array"),
    ("epoch_not_object", _set(EPOCH, "e"), r"field stages\.train\.epochs\[0\] must be an object, got 'e'"),
    (
        "epoch_field_missing",
        _set((*EPOCH, "step_time_p50"), "DEL"),
        r"field stages\.train\.epochs\[0\]\.step_time_p50 is missing",
    ),
    (
        "epoch_field_type",
        _set((*EPOCH, "step_time_p50"), "abc"),
        r"field stages\.train\.epochs\[0\]\.step_time_p50 must be a number, got 'abc' \(string\)",
    ),
    (
        "epoch_field_null",
        _set((*EPOCH, "step_time"), None),
        r"epochs\[0\]\.step_time must be a number, got None \(null\)",
    ),
    ("epoch_count_float", _set((*EPOCH, "batches"), 8.0), r"epochs\[0\]\.batches must be an integer, got 8\.0"),
    ("epoch_optional_type", _set((*EPOCH, "loss"), "0.7"), r"epochs\[0\]\.loss must be a number or null, got '0\.7'"),
    (
        "epoch_infinite",
        _set((*EPOCH, "throughput"), float("inf")),
        r"epochs\[0\]\.throughput must be a finite number, got inf",
    ),
    ("epoch_huge", _set((*EPOCH, "host_rss"), 10**30), r"epochs\[0\]\.host_rss must be a number between"),
    (
        "epoch_stage_mismatch",
        _set((*EPOCH, "stage"), "test"),
        r"field stages\.train\.epochs\[0\]\.stage is 'test' \(string\), but the epoch is listed under 'train'",
    ),
    ("findings_object", _set((*EPOCH, "findings"), {}), r"epochs\[0\]\.findings must be an array"),
    ("finding_without_id", _set((*EPOCH, "findings", 0, "id"), "DEL"), r"epochs\[0\]\.findings\[0\]\.id is missing"),
    ("finding_id_type", _set((*EPOCH, "findings", 0, "advice"), ["x"]), r"findings\[0\]\.advice must be a string"),
    (
        "finding_severity",
        _set((*EPOCH, "findings", 0, "severity"), "fatal"),
        r"findings\[0\]\.severity must be one of 'info', 'warning', 'critical', got 'fatal'",
    ),
    ("rank_type", _set((*EPOCH, "ranks", 0, "rank"), "0"), r"epochs\[0\]\.ranks\[0\]\.rank must be an integer"),
    ("compile_list", _set((*EPOCH, "compile"), []), r"epochs\[0\]\.compile must be an object, got \[\] \(array\)"),
    (
        "compile_break_count",
        _set((*EPOCH, "compile", "break_sites", 0, "count"), None),
        r"epochs\[0\]\.compile\.break_sites\[0\]\.count must be an integer, got None \(null\)",
    ),
    ("steps_list", _set((*EPOCH, "steps"), []), r"epochs\[0\]\.steps must be an object, got \[\]"),
    ("steps_value", _set((*EPOCH, "steps", "compute", 1), "4"), r"epochs\[0\]\.steps\.compute\[1\] must be a number"),
    (
        "steps_lengths",
        _set((*EPOCH, "steps", "compute"), [0.1]),
        r"steps\.data_wait and .*steps\.compute differ in length",
    ),
    ("steps_per_bar", _set((*EPOCH, "steps", "per_bar"), 0), r"epochs\[0\]\.steps\.per_bar must be at least 1, got 0"),
    (
        "steps_profiled",
        _set((*EPOCH, "steps", "profiled", 0), [1]),
        r"steps\.profiled\[0\] must be a \[first, last\] pair of batch indices, got \[1\]",
    ),
    ("steps_compiled", _set((*EPOCH, "steps", "compiled", 0), 0.5), r"steps\.compiled\[0\] must be an integer"),
    (
        "window_operator",
        _set(("windows", 0, "operators", 1, "calls"), "2"),
        r"field windows\[0\]\.operators\[1\]\.calls must be an integer, got '2'",
    ),
    ("no_windows", _set(("windows",), "DEL"), r"field windows is missing"),
    ("windows_object", _set(("windows",), {}), r"field windows must be an array"),
    ("window_name", _set(("windows", 0, "name"), 5), r"field windows\[0\]\.name must be a string, got 5"),
    ("window_trace_path", _set(("windows", 1, "trace_path"), None), r"field windows\[1\]\.trace_path must be a string"),
    ("window_stage_missing", _set(("windows", 0, "stage"), "DEL"), r"field windows\[0\]\.stage is missing"),
    ("window_summary", _set(("windows", 0, "summary"), []), r"field windows\[0\]\.summary must be an object"),
    (
        "window_summary_field",
        _set(("windows", 0, "summary", "optimizer_foreach"), "yes"),
        r"windows\[0\]\.summary\.optimizer_foreach must be a boolean or null",
    ),
    (
        "odd_stage_name",
        lambda r: r["stages"].update({"my stage": {"epochs": [1]}}),
        r"field stages\['my stage'\]\.epochs\[0\]",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), _cases(REPORT_FAILURES))
def test_a_broken_report_is_an_input_error_naming_the_file_and_the_field(tmp_path, mutate, message):
    report = _report()
    report = mutate(report) or report
    path = tmp_path / "perf_report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(InputError) as info:
        load_report(path)
    first_line = str(info.value).splitlines()[0]
    assert first_line.startswith(f"{path}: ")
    assert _search(message, first_line[len(f"{path}: ") :])
    assert info.value.__cause__ is None  # a structural problem: no parser exception behind it


def test_a_newer_report_says_which_release_wrote_it(tmp_path):
    report = {**_report(), "version": SCHEMA_VERSION + 1, "generated_by": "lightning-perf 9.9.9", "stages": "new"}
    path = tmp_path / "perf_report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(InputError) as info:
        load_report(path)
    first, second = str(info.value).splitlines()
    assert first == f"{path}: report schema version 2 is newer than this lightning-perf reads (version 1)"
    assert "written by lightning-perf 9.9.9" in second


def test_a_report_file_that_is_not_json_is_an_input_error(tmp_path):
    path = tmp_path / "perf_report.json"
    path.write_text('{"version": 1,')
    with pytest.raises(InputError, match=r"perf_report\.json: invalid JSON at line 1, column 15: .*truncated\?"):
        load_report(path)


def test_long_values_are_cut_in_messages(tmp_path):
    path = tmp_path / "perf_report.json"
    path.write_text(json.dumps({**_report(), "run": "x" * 1000}))
    with pytest.raises(InputError) as info:
        load_report(path)
    assert str(info.value) == f"{path}: field run must be an object, got '{'x' * 56}... (string)"


def _as_torch_writes_it(name):
    """:func:`_trace` laid out one field a line, as torch's exporter writes it, its ``aten::mm`` renamed to
    ``name`` as written (torch escapes nothing)."""
    text = json.dumps(_trace(), indent=2).replace('"name": "aten::mm"', f'"name": "{name}"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    return text.encode()


@pytest.mark.parametrize("filename", ["t.json", "t.json.gz"])
def test_a_trace_torch_wrote_as_invalid_json_is_read_repaired_and_says_so_once(tmp_path, filename):
    path = tmp_path / filename
    data = _as_torch_writes_it('load "shard-3"')
    path.write_bytes(gzip.compress(data) if filename.endswith(".gz") else data)
    said = []
    trace = load_trace(path, on_repair=said.append)
    assert [op.name for op in operator_stats(trace) if op.name.startswith("load")] == ['load "shard-3"']
    assert summarize_trace(trace, window="t").steps == 1
    line = next(i for i, text in enumerate(data.split(b"\n"), start=1) if b"shard-3" in text)
    decompressed = " once decompressed" if filename.endswith(".gz") else ""
    assert said == [
        f"{path}: invalid JSON, repaired: 1 string value held an unescaped double quote ('load \"shard-3\"'),"
        f" first on line {line}{decompressed} (torch's trace exporter does not escape them); read as if escaped"
    ]
    with pytest.warns(UserWarning, match=r"invalid JSON, repaired: 1 string value held an unescaped double") as info:
        assert _content(load_trace(path)) == _content(trace)
    assert len(info) == 1


def test_a_trace_the_repair_does_not_make_valid_is_the_file_s_own_error(tmp_path):
    path = tmp_path / "t.json"
    data = _as_torch_writes_it('load "shard-3"')
    path.write_bytes(data[: data.index(b"shard-3") + 40])  # repairable, but cut short
    said = []
    with pytest.raises(InputError, match=r"invalid JSON at line \d+, column \d+: Expecting ',' delimiter$"):
        load_trace(path, on_repair=said.append)
    assert said == []


def test_the_readers_import_neither_torch_nor_lightning():
    assert heavy_modules_loaded_by("lightning_perf.readers") == []


# --- Fuzzing --------------------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)


def _loads_or_input_error(load, path):
    try:
        return load(path)
    except InputError:
        return None


@FUZZ
@given(data=st.binary(max_size=500), suffix=st.sampled_from([".json", ".json.gz"]))
def test_random_bytes_load_or_are_input_errors(scratch, data, suffix):
    path = scratch / f"bytes{suffix}"
    path.write_bytes(data)
    _loads_or_input_error(load_trace, path)
    _loads_or_input_error(load_report, path)


@FUZZ
@given(
    cut=st.integers(0, len(_VALID_GZ)),
    flips=st.lists(st.tuples(st.integers(0, len(_VALID_GZ) - 1), st.integers(1, 255)), max_size=3),
)
def test_damaged_gzip_loads_or_is_an_input_error(scratch, cut, flips):
    data = bytearray(_VALID_GZ[:cut] if cut < len(_VALID_GZ) else _VALID_GZ)
    for at, mask in flips:
        if at < len(data):
            data[at] ^= mask
    path = scratch / "damaged.json.gz"
    path.write_bytes(bytes(data))
    _loads_or_input_error(load_trace, path)


@FUZZ
@given(value=JSON)
def test_random_json_loads_or_is_an_input_error(scratch, value):
    path = scratch / "value.json"
    path.write_text(json.dumps(value))
    _loads_or_input_error(load_trace, path)
    _loads_or_input_error(load_report, path)
    path.write_text(json.dumps({"traceEvents": value}))
    _loads_or_input_error(load_trace, path)


def _leaves(value, path=()):
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    else:
        yield path


_REPORT = json.loads(json.dumps(_report()))
_REPORT_LEAVES = list(_leaves(_REPORT))


@FUZZ
@given(where=st.sampled_from(_REPORT_LEAVES), value=JSON | st.just("DEL"), depth=st.integers(0, 4))
def test_a_mutated_report_loads_into_records_or_is_an_input_error(scratch, where, value, depth):
    report = copy.deepcopy(_REPORT)
    where = where[: max(len(where) - depth, 1)]  # a leaf, or one of the containers above it
    _set(where, value)(report)
    path = scratch / "perf_report.json"
    path.write_text(json.dumps(report))
    loaded = _loads_or_input_error(load_report, path)
    if loaded is None:
        return
    # What loads builds the records the CLI needs.
    for entry in loaded["stages"].values():
        for epoch in entry["epochs"]:
            EpochSummary(**{f.name: epoch[f.name] for f in dataclasses.fields(EpochSummary)})
            for finding in epoch["findings"]:
                Finding(**{f.name: finding[f.name] for f in dataclasses.fields(Finding)})
            for rank in epoch["ranks"]:
                RankSummary(**{f.name: rank[f.name] for f in dataclasses.fields(RankSummary)})
    for window in loaded["windows"]:
        if window["summary"] is not None:
            TraceSummary(**{f.name: window["summary"][f.name] for f in dataclasses.fields(TraceSummary)})
    report_epochs(loaded)  # the epochs' records, their compile stats included


_ABSENT = object()


def _mostly(good, odds=400, absent=True):
    """``good`` values, with one in ``odds`` any JSON value (or, where ``absent``, an absent key) instead."""
    bad = JSON | st.just(_ABSENT) if absent else JSON
    # Not k == 0: hypothesis draws the ends of a range far more often than the rest.
    return st.integers(0, odds - 1).flatmap(lambda k: bad if k == odds // 2 else good)


def _object(**fields):
    """Objects of ``fields``, keys whose value came out ``_ABSENT`` left out."""
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not _ABSENT})


_NUMBERS = _mostly(st.integers(0, 200) | st.floats(0, 200), odds=200).flatmap(
    lambda n: st.sampled_from([float("nan"), float("inf"), 10**30, -1]) if n is _ABSENT else st.just(n)
)
_EVENTS = _object(
    ph=_mostly(st.sampled_from(["X", "X", "X", "X", "X", "i", "M", "s", "f", "B", "q"])),
    cat=_mostly(
        st.sampled_from(
            ["cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset", "python_function"]
        )
    ),
    name=_mostly(
        st.sampled_from(
            [
                "ProfilerStep#1",
                "ProfilerStep#2",
                "ProfilerStep#x",
                "Optimizer.step#SGD.step",
                "aten::mm",
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                "[memory]",
                "cudaStreamSynchronize",
                "Memcpy HtoD (Pageable -> Device)",
                "autograd::engine::evaluate_function: MmBackward0",
                "nccl:all_reduce",
                "sm80_xmma_gemm_f32f32_tn",
                "aten::_local_scalar_dense",
                "gloo:all_reduce",
            ]
        )
    ),
    ts=_NUMBERS,
    dur=_NUMBERS,
    pid=_mostly(st.integers(0, 1) | st.just("Traces")),
    tid=_mostly(st.integers(0, 1)),
    args=_mostly(
        _object(
            **{
                "External id": _mostly(st.integers(0, 3), odds=60),
                "Bytes": _mostly(st.integers(-100, 100), odds=60),
                "Device Type": _mostly(st.integers(0, 1), odds=60),
                "flops": _mostly(st.integers(0, 100), odds=60),
                "device": _mostly(st.integers(0, 1), odds=60),
                "Input Dims": JSON,
            }
        )
    ),
)
_DEVICE = _object(
    id=_mostly(st.integers(0, 1), 5), name=_mostly(st.text(max_size=5), 5), computeMajor=_mostly(st.integers(5, 9), 5)
)
_TRACES = _object(
    traceEvents=st.lists(_EVENTS, min_size=2, max_size=40),
    deviceProperties=_mostly(st.lists(_mostly(_DEVICE, 5, absent=False), max_size=2), 5),
    lightning_perf=_mostly(st.just({}), 5),
)


@FUZZ
@given(trace=_TRACES)
# An instant event whose name is null, which the field-by-field checks allow (found by hypothesis in CI).
@example(
    trace={
        "traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 0, "dur": 0}, {"ph": "i", "name": None, "ts": 0}]
    }
)
def test_a_trace_that_loads_is_one_the_analyses_can_read(scratch, trace):
    path = scratch / "fuzzed.json"
    path.write_text(json.dumps(trace))
    checked = _checked(path)  # what load_trace falls back to where decoding refuses a file
    if checked is None:
        return
    summary = summarize_trace(copy.deepcopy(checked), window="w")
    operators = operator_stats(copy.deepcopy(checked), group_by_input_shape=True)
    # Decoding reads every trace the field-by-field checks accept, into the same summaries.
    typed = load_trace(path, shapes=True)
    assert summarize_trace(typed, window="w") == summary
    assert operator_stats(typed, group_by_input_shape=True) == operators
    list(traces.profiler_steps(checked))
    traces.keep_steps(traces.standard_categories(traces.tensorboard_compatible(checked)), {1, 2})
    list(traces.profiler_steps(_content(typed)))  # the typed trace's content, as dictionaries
