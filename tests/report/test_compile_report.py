"""What ``torch.compile`` did, as the report shows it: ``perf_report.json``'s per-epoch ``compile`` (written,
read back, absent for a run that compiled nothing), the console's and TensorBoard's compile line, and the
command line's ``report`` and ``compare``. Hand-built stats, no trainer: the collector has its own tests."""

import dataclasses
import json
import re

import pytest

from lightning_perf.cli import main
from lightning_perf.readers import InputError, load_report
from lightning_perf.records import CompileStats, GraphBreak, Recompile
from lightning_perf.report.findings import compile_line, console_report, findings_markdown
from lightning_perf.report.json_report import report_dict, report_epochs, write_json_atomically
from lightning_perf.summarize.steps import summarize_epoch

# As torch 2.13's dynamo reports them (see the collector's tests for where they come from).
ITEM_BREAK = GraphBreak(
    reason="Unsupported Tensor.item() call with capture_scalar_outputs=False", location="/tmp/model.py:29", count=1
)
INT_GUARD = Recompile(function="forward (/tmp/model.py:20)", guard="0/0: n == 1", count=2)
STATS = CompileStats(
    graphs=4,
    breaks=1,
    recompiles=2,
    limit_reached=False,
    seconds=3.1,
    seconds_before=0.4,
    break_sites=(ITEM_BREAK, GraphBreak(reason="Data-dependent branching", location=None, count=3)),
    recompile_guards=(INT_GUARD, Recompile(function=None, guard=None, count=1)),
    limit_function=None,
    steps=(0, 1, 7),
)
LIMIT = dataclasses.replace(STATS, recompiles=8, limit_reached=True, limit_function="forward (/tmp/model.py:20)")
QUIET = CompileStats(graphs=0, breaks=0, recompiles=0, limit_reached=False, seconds=0.0)  # a later epoch


def _epoch(stage="train", number=0):
    return summarize_epoch(stage=stage, epoch=number, data_wait=[0.01] * 4, compute=[0.1] * 4, batch_sizes=[32] * 4)


def _write(directory, compile=None, epochs=None):
    """A perf_report.json in ``directory`` (created) of ``epochs`` (train epochs 0 and 1, validate 0)."""
    epochs = epochs or [_epoch("train", 0), _epoch("validate", 0), _epoch("train", 1)]
    report = report_dict(
        generated_by="lightning-perf test", run={"device": "cpu"}, epochs=epochs, windows=[], compile=compile
    )
    directory.mkdir()
    write_json_atomically(report, str(directory / "perf_report.json"))
    return directory


# --- perf_report.json ----------------------------------------------------------------------------------------


def test_compile_stats_go_through_the_report_file_unchanged(tmp_path):
    run = _write(tmp_path / "run", compile={("train", 0): STATS, ("train", 1): LIMIT, ("validate", 0): QUIET})
    read = {(e.summary.stage, e.summary.epoch): e.compile for e in report_epochs(load_report(run / "perf_report.json"))}
    assert read == {("train", 0): STATS, ("validate", 0): QUIET, ("train", 1): LIMIT}
    entry = json.loads((run / "perf_report.json").read_text())["stages"]["train"]["epochs"][0]["compile"]
    written = report_dict(generated_by="t", run={}, epochs=[_epoch()], windows=[], compile={("train", 0): STATS})
    assert written == json.loads(json.dumps(written))  # plain JSON values: lists, not tuples
    assert entry["break_sites"][0] == {"reason": ITEM_BREAK.reason, "location": "/tmp/model.py:29", "count": 1}
    assert entry["recompile_guards"][0] == {
        "function": "forward (/tmp/model.py:20)",
        "guard": "0/0: n == 1",
        "count": 2,
    }
    assert (entry["graphs"], entry["limit_reached"], entry["seconds"], entry["steps"]) == (4, False, 3.1, [0, 1, 7])


def test_a_run_without_compile_stats_has_no_compile_key(tmp_path):
    for name, compile in (("none", None), ("empty", {}), ("other_epoch", {("train", 1): QUIET})):
        run = _write(tmp_path / name, compile=compile)
        report = json.loads((run / "perf_report.json").read_text())
        keyed = [(s, e["epoch"]) for s, stage in report["stages"].items() for e in stage["epochs"] if "compile" in e]
        assert keyed == ([("train", 1)] if compile else []), name
        read = {
            (e.summary.stage, e.summary.epoch): e.compile for e in report_epochs(load_report(run / "perf_report.json"))
        }
        assert read == {("train", 0): None, ("train", 1): QUIET if compile else None, ("validate", 0): None}


def test_a_report_written_before_compile_stats_loads(tmp_path):
    # No compile key (an older writer), and a compile object of the fields that have no default only.
    run = _write(tmp_path / "old", compile={("train", 0): STATS})
    path = run / "perf_report.json"
    report = json.loads(path.read_text())
    entry = report["stages"]["train"]["epochs"][0]["compile"]
    for name in ("seconds_before", "break_sites", "recompile_guards", "limit_function", "steps"):
        del entry[name]
    entry["future_field"] = [1]  # a newer writer's addition
    path.write_text(json.dumps(report))
    [first, *others] = report_epochs(load_report(path))
    assert first.compile == CompileStats(graphs=4, breaks=1, recompiles=2, limit_reached=False, seconds=3.1)
    assert all(e.compile is None for e in others)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ((), None, r"compile must be an object, got None \(null\)"),
        (("graphs",), "4", r"compile\.graphs must be an integer, got '4' \(string\)"),
        (("limit_reached",), 1, r"compile\.limit_reached must be a boolean, got 1 \(integer\)"),
        (("seconds",), "DEL", r"compile\.seconds is missing"),
        (("break_sites",), {}, r"compile\.break_sites must be an array, got \{\} \(object\)"),
        (("break_sites", 0, "location"), 29, r"compile\.break_sites\[0\]\.location must be a string or null, got 29"),
        (("recompile_guards", 1, "count"), "DEL", r"compile\.recompile_guards\[1\]\.count is missing"),
        (("steps", 1), 2.5, r"compile\.steps\[1\] must be an integer, got 2\.5 \(number\)"),
    ],
)
def test_a_malformed_compile_entry_is_an_input_error_naming_the_field(tmp_path, where, value, message):
    run = _write(tmp_path / "run", compile={("train", 0): STATS})
    path = run / "perf_report.json"
    report = json.loads(path.read_text())
    *parents, last = ("stages", "train", "epochs", 0, "compile", *where)
    container = report
    for key in parents:
        container = container[key]
    if value == "DEL":
        del container[last]
    else:
        container[last] = value
    path.write_text(json.dumps(report))
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}: field stages\.train\.epochs\[0\]\.{message}"):
        load_report(path)


# --- The console and TensorBoard -----------------------------------------------------------------------------


def test_the_compile_line_says_what_compiled():
    assert compile_line(STATS) == "compile: 4 graphs, 1 graph break, 2 recompiles, 3.10 s compiling"
    one = CompileStats(graphs=1, breaks=0, recompiles=1, limit_reached=False, seconds=0.0423)
    assert compile_line(one) == "compile: 1 graph, 0 graph breaks, 1 recompile, 42.3 ms compiling"
    assert compile_line(LIMIT).endswith("8 recompiles, 3.10 s compiling, recompile limit reached")
    assert compile_line(None) is None and compile_line(QUIET) is None  # nothing compiled: nothing to say


def test_the_console_shows_the_compile_line_under_the_headline():
    epoch = _epoch()
    plain = console_report(epoch, [], verbose=1)
    assert console_report(epoch, [], verbose=1, compile=None) == plain and "\n" not in plain
    assert console_report(epoch, [], verbose=1, compile=QUIET) == plain
    assert console_report(epoch, [], verbose=1, compile=STATS) == f"{plain}\n  {compile_line(STATS)}"
    assert console_report(epoch, [], verbose=0, compile=STATS) is None


def test_tensorboard_s_findings_text_has_the_compile_line():
    epoch = _epoch()
    plain = findings_markdown(epoch, [])
    assert findings_markdown(epoch, [], compile=None) == plain == findings_markdown(epoch, [], compile=QUIET)
    head, *rest = plain.split("\n\n")
    assert findings_markdown(epoch, [], compile=STATS) == "\n\n".join([head, compile_line(STATS), *rest])


# --- The command line ----------------------------------------------------------------------------------------


def test_report_prints_each_epoch_s_compile_line(tmp_path, capsys):
    run = _write(tmp_path / "run", compile={("train", 0): STATS, ("train", 1): QUIET})
    assert main(["report", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [i] = [i for i, line in enumerate(lines) if line.startswith("lightning-perf | train epoch 0 |")]
    assert lines[i + 1] == "  compile: 4 graphs, 1 graph break, 2 recompiles, 3.10 s compiling"
    assert sum("compile:" in line for line in lines) == 1  # the quiet epoch and the validation epoch: none
    assert main(["report", str(_write(tmp_path / "eager"))]) == 0
    assert "compile" not in capsys.readouterr().out


def _rows(out):
    return {line.split("  ")[1]: line.split() for line in out.splitlines() if line.startswith("  ")}


def test_compare_shows_compile_totals_when_either_run_compiled(tmp_path, capsys):
    before = _write(tmp_path / "before")
    # Over the training epochs only: the validation epoch's compile is not counted.
    after_stats = {("train", 0): STATS, ("train", 1): dataclasses.replace(QUIET, seconds=0.4), ("validate", 0): LIMIT}
    after = _write(tmp_path / "after", compile=after_stats)
    assert main(["compare", str(before), str(after)]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["compile time"][2:] == ["-", "3.50", "s"]
    assert rows["graph breaks"][2:] == ["-", "1"] and rows["recompiles"][1:] == ["-", "2"]
    assert main(["compare", str(after), str(after), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["compile time"] == {"before": "3.50 s", "after": "3.50 s", "change": "+0.0% (same)"}
    assert main(["compare", str(after), str(before), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["graph breaks"] == {"before": "1", "after": None, "change": None}
    assert metrics["recompiles"] == {"before": "2", "after": None, "change": None}


def test_compare_of_runs_that_compiled_nothing_in_training_has_no_compile_rows(tmp_path, capsys):
    before, after = _write(tmp_path / "before"), _write(tmp_path / "after", compile={("validate", 0): STATS})
    assert main(["compare", str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "step time p50" in out and not [w for w in ("compile time", "graph breaks", "recompiles") if w in out]
    assert main(["compare", str(before), str(after), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert "step time p50" in metrics and not {"compile time", "graph breaks", "recompiles"} & set(metrics)


def _trace(path, *spans):
    """A CPU Kineto trace of one 1 ms ``ProfilerStep#0`` holding ``(name, ts, dur)`` operator spans (us)."""
    events = [("ProfilerStep#0", 0, 1000, "user_annotation"), *((*span, "cpu_op") for span in spans)]
    path.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}
                    for name, ts, dur, cat in events
                ]
            }
        )
    )
    return str(path)


def test_compare_of_traces_shows_the_compiled_share_of_the_step(tmp_path, capsys):
    eager = _trace(tmp_path / "eager.json", ("aten::addmm", 100, 500))
    compiled = _trace(
        tmp_path / "compiled.json",
        ("TorchDynamo Cache Lookup", 100, 12),
        ("Torch-Compiled Region: 0/0", 120, 629),
        ("CompiledFunction", 150, 500),
    )
    assert main(["compare", eager, compiled]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["compiled regions"][2:] == ["-", "62%"] and rows["guard checks"][2:] == ["-", "1.2%"]
    assert "compile time" not in rows  # a trace holds no compile totals
    half = _trace(tmp_path / "half.json", ("Torch-Compiled Region: 0/0", 120, 314))
    assert main(["compare", compiled, half, "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["compiled regions"] == {
        "before": "62%",
        "after": "31%",
        "change": "-31.5 pp",
    }  # a share: in points; no "better"
    assert metrics["guard checks"] == {"before": "1.2%", "after": None, "change": None}
    assert main(["compare", eager, eager, "--json"]) == 0
    assert not {"compiled regions", "guard checks"} & set(json.loads(capsys.readouterr().out)["metrics"])
