"""The offline command line on real runs and real traces: ``lightning-perf report``, ``analyze`` and
``compare``, through ``main()`` and as a console script."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.cli import main
from lightning_perf.diagnosis_context import trace_context, trace_notes, trace_stage
from lightning_perf.readers import load_trace
from lightning_perf.summarize.step_summary import summarize_trace
from models import TinyModel, torch_threads, trainer

WINDOW = {"skip_first": 1, "warmup": 1, "active": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real runs of one model (a few ms of compute per batch): data-bound (each item sleeps 20 ms), then
    the same with in-memory data."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    with torch_threads(1):  # the comparisons rest on "fast" being faster, whatever else runs on the machine
        for name, sleep_s in (("slow", 0.02), ("fast", 0.0)):
            # No trial of the advice: its few seconds buy nothing the commands here read.
            callback = PerfCallback(schedule=WINDOW, stages=["train"], verbose=0, try_advice=False)
            model = TinyModel(n=48, sleep_s=sleep_s, width=1024, depth=3)
            trainer(root / name, [callback], max_epochs=2, limit_val_batches=0).fit(model)
            out[name] = root / name
    return out


def test_report_prints_epochs_and_findings(runs, capsys):
    assert main(["report", str(runs["slow"])]) == 0
    out = capsys.readouterr().out
    assert "perf_report.json" in out and "lightning-perf | train epoch 1 |" in out
    assert "dataloader_bound" in out and "->" in out and "num_workers" in out  # the finding's advice
    assert re.search(r"\n  profiling cost \d+\.\d% of this run \(.+ of .+\), 2 windows\n", out), out
    # What the model holds (issue 24): TinyModel's 3 hidden layers of 1024 and SGD, on the CPU.
    assert re.search(r"\n  memory at training epoch 1: parameters 8\.\d MiB \(float32\), gradients 8\.\d MiB,", out), (
        out
    )
    assert "optimizer state 0 B (SGD, no state)" in out


def test_report_json_is_the_report(runs, capsys):
    assert main(["report", str(runs["slow"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["version"] == 1 and len(report["stages"]["train"]["epochs"]) == 2


def test_report_reads_a_newer_writer_s_report(runs, tmp_path, capsys):
    # load_report lets keys it does not know through (a newer writer's additions): the commands ignore them.
    [path] = runs["slow"].rglob("perf_report.json")
    report = json.loads(path.read_text())
    for stage in report["stages"].values():
        for epoch in stage["epochs"]:
            epoch["new_epoch_field"] = 1
            for finding in epoch["findings"]:
                finding["confidence"] = 0.9
    (tmp_path / "perf_report.json").write_text(json.dumps(report))
    assert main(["report", str(tmp_path)]) == 0
    assert "dataloader_bound" in capsys.readouterr().out
    assert main(["compare", str(runs["slow"]), str(tmp_path)]) == 0


def test_compare_refuses_a_directory_of_several_runs(runs, capsys):
    # Which one would it compare? (By name, version_9 sorts after version_10.)
    assert main(["compare", str(runs["slow"].parent), str(runs["fast"])]) == 2
    err = capsys.readouterr().err
    assert "holds 2 reports (fast/" in err and "pass its directory" in err


def test_analyze_runs_the_trace_rules_on_our_traces(runs, capsys):
    assert main(["analyze", str(runs["slow"])]) == 0
    out = capsys.readouterr().out
    assert out.count("rank 0: rank0.pt.trace.json.gz: 2 steps of") == 2  # one line per window


def test_analyze_diagnoses_each_trace_of_ours_as_the_stage_it_was_recorded_in(tmp_path, gpu_trace):
    callback = PerfCallback(schedule=WINDOW, stages=["train", "validate"], verbose=0)
    trainer(tmp_path, [callback], max_epochs=1).fit(TinyModel(n=32))
    stages = {w.stage for w in callback.windows}
    assert stages == {"train", "validate"}
    for window in callback.windows:
        trace = load_trace(window.trace_path)
        assert trace_stage(trace) == window.stage
        summary = summarize_trace(trace, window=window.name)
        assert trace_context(summary, {}, stage=trace_stage(trace)).epoch.stage == window.stage
    assert trace_stage(load_trace(gpu_trace("v100_single_rank.json.gz"))) == "train"  # not ours: "train"


class SlowBatches:
    """Ready batches the Trainer iterates itself, no DataLoader (as gluonts' ``IterableSlice``), each made in
    10 ms of the training process's time: no span of a trace shows it."""

    def __len__(self) -> int:
        return 8

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(8):
            time.sleep(0.01)
            x = torch.randn(4, 16, generator=g)
            yield x, (x.sum(1, keepdim=True) > 0).float()


def test_analyze_judges_a_run_without_a_dataloader_as_the_callback_does(tmp_path, capsys):
    callback = PerfCallback(schedule=WINDOW, stages=["train"], verbose=0)
    trainer(tmp_path, [callback], max_epochs=1, limit_val_batches=0).fit(TinyModel(), train_dataloaders=SlowBatches())
    [window] = callback.windows
    notes = trace_notes(load_trace(window.trace_path))
    assert notes["iterable_class"] == "SlowBatches" and notes["data_wait"] >= 0.009, notes
    assert main(["analyze", window.trace_path, "--json"]) == 0
    [analyzed] = json.loads(capsys.readouterr().out).values()
    ids = [f["id"] for f in analyzed["findings"]]
    # The iterable's 10 ms a batch was "outside torch operators" (framework_overhead, self.log and the bar).
    assert "framework_overhead" not in ids and "dataloader_bound" in ids, analyzed["findings"]


def test_analyze_a_real_gpu_trace(gpu_trace, capsys):
    assert main(["analyze", str(gpu_trace("v100_single_rank.json.gz")), "--precision", "32-true"]) == 0
    out = capsys.readouterr().out
    assert "device busy 97%" in out and "WARNING  precision  " in out


def test_analyze_groups_the_ranks_of_a_directory(gpu_trace, tmp_path, capsys):
    names = ("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz")
    for name in names:
        shutil.copy(gpu_trace(name), tmp_path / name)
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in result[str(tmp_path)]["ranks"]] == [0, 1]
    assert {result[str(tmp_path / n)]["rank"] for n in names} == {0, 1}


def test_compare_shows_the_gain_and_the_fixed_finding(runs, capsys):
    assert main(["compare", str(runs["slow"]), str(runs["fast"]), "--fail-if-slower", "5"]) == 0
    out = capsys.readouterr().out
    assert "findings fixed:" in out and "operators whose self time changed most" in out
    assert "dataloader_bound" in out
    assert main(["compare", str(runs["slow"]), str(runs["fast"]), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for metric in ("step time p50", "throughput", "data wait"):
        assert result["metrics"][metric]["change"].endswith("(better)"), result["metrics"][metric]
    # The slow run waited for data most of the time (critical); the fast one waits little, if at all.
    assert any(f.startswith("dataloader_bound") for f in result["findings"]["fixed"] + result["findings"]["kept"])
    findings = result["findings"]
    assert "dataloader_bound" in findings["fixed"] or "dataloader_bound (critical -> warning)" in findings["kept"]
    slowest = result["operators"][0]
    assert slowest["name"].startswith("enumerate(DataLoader)#") and slowest["after_us"] < slowest["before_us"]


def test_compare_fails_in_ci_when_slower(runs, capsys):
    assert main(["compare", str(runs["fast"]), str(runs["slow"]), "--fail-if-slower", "10"]) == 1
    captured = capsys.readouterr()
    assert "step time p50" in captured.out and "(worse)" in captured.out
    assert "slower (limit --fail-if-slower 10%)" in captured.err


def test_compare_two_traces(runs, capsys):
    before = sorted(runs["slow"].rglob("*.pt.trace.json.gz"))[0]
    after = sorted(runs["fast"].rglob("*.pt.trace.json.gz"))[0]
    assert main(["compare", str(before), str(after), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["metrics"]["step time p50"]["change"].endswith("(better)")


def _export_as_torch_writes_it(path):
    """A real torch.profiler trace of two steps, exported by torch itself, a ``record_function`` label with a
    double quote in each: torch 2.13 writes it unescaped, so the file is invalid JSON."""
    import torch

    steps = torch.profiler.schedule(wait=0, warmup=0, active=2, repeat=1)
    with torch.profiler.profile(schedule=steps, on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(2):
            with torch.profiler.record_function('load "shard-3"'):
                torch.randn(64, 64) @ torch.randn(64, 64)
            prof.step()
    with pytest.raises(json.JSONDecodeError), open(path, encoding="utf-8") as f:
        json.load(f)


def test_analyze_and_compare_read_a_trace_torch_wrote_as_invalid_json_and_say_they_repaired_it(tmp_path, capsys):
    path = tmp_path / "broken.pt.trace.json"
    _export_as_torch_writes_it(path)
    assert main(["analyze", str(path), "--json", "--html", str(tmp_path / "traces.html")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[str(path.resolve())]["summary"]["steps"] == 2
    [said] = [line for line in captured.err.splitlines() if "repaired" in line]
    assert said.startswith(f"lightning-perf: warning: {path}: invalid JSON, repaired: 2 string values held an")
    assert "unescaped double quote ('load \"shard-3\"'), first on line " in said
    assert "<td>load &#34;shard-3&#34;</td>" in (tmp_path / "traces.html").read_text()
    assert main(["compare", str(path), str(path)]) == 0
    captured = capsys.readouterr()
    assert 'load "shard-3"' in captured.out  # among the operators
    assert captured.err.count(f"lightning-perf: warning: {path}: invalid JSON, repaired") == 2  # once a side


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "/nonexistent"], "/nonexistent: no such file or directory"),
        (["analyze", "{empty}"], "holds no Kineto trace"),
        (["report", "{empty}"], "holds no perf_report.json"),
        (["analyze", "{bad}"], "not a valid gzip file"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, message, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08 truncated")
    args = [a.format(empty=tmp_path / "empty", bad=tmp_path / "bad.pt.trace.json.gz") for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("lightning-perf: error: ") and message in err and "Traceback" not in err


def test_console_script_and_module_entry_point(runs):
    for command in (["lightning-perf"], [sys.executable, "-m", "lightning_perf"]):
        if command[0] == "lightning-perf":
            command = [str(__import__("pathlib").Path(sys.executable).with_name("lightning-perf"))]
        proc = subprocess.run([*command, "report", str(runs["fast"])], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "lightning-perf | train epoch 0 |" in proc.stdout
    usage = subprocess.run([sys.executable, "-m", "lightning_perf", "nonsense"], capture_output=True, text=True)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(runs):
    # `lightning-perf report RUN | head -1`, at its most abrupt: the pipe's reader is gone before the first
    # write. The command stops without a traceback, with the status a shell shows for SIGPIPE.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "lightning_perf", "report", str(runs["slow"])],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr.decode() == "", proc.stderr.decode()


def _modules_loaded_by(args: list[str]) -> tuple[set[str], str]:
    """The modules a fresh interpreter has loaded after ``main(args)`` (which must succeed), and what it printed."""
    code = (
        "import json, sys\nfrom lightning_perf.cli import main\n"
        f"assert main({args!r}) == 0\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1])), out.stdout


def test_analyzing_a_run_s_traces_loads_neither_torch_nor_lightning(runs):
    # What keeps the command quick to start: torch and Lightning take seconds to import. (numpy, 45 ms, holds
    # the trace analyses' columns.)
    loaded, _ = _modules_loaded_by(["analyze", str(runs["slow"]), "--json"])
    assert sorted({m.split(".")[0] for m in loaded} & {"torch", "lightning", "pytorch_lightning"}) == []


# What `analyze` leaves unimported without --html and --jobs: the other commands, the HTML pages and the
# operator table (--html), the worker processes (--jobs), and numpy's masked arrays (which np.unique loads).
NOT_FOR_ANALYZE = (
    "lightning_perf.cli.compare",
    "lightning_perf.cli.report",
    "lightning_perf.report.html",
    "lightning_perf.report.json_report",
    "lightning_perf.summarize.operators",
    "concurrent.futures.process",
    "multiprocessing",
    "numpy.ma",
)


def test_analyze_imports_only_what_the_command_runs(gpu_trace):
    # Each costs start-up time on every `analyze` (and compiling, where bytecode is not cached).
    loaded, printed = _modules_loaded_by(["analyze", str(gpu_trace("a100_8rank_rank3.json.gz"))])
    assert "communication_bound" in printed  # the trace's own finding: the command ran
    assert sorted(loaded & set(NOT_FOR_ANALYZE)) == []


def test_compare_rounds_shares_down_as_everywhere_else(tmp_path, capsys):
    # A data wait of 99.6% is shown as 99%, not as all of the step (as the findings and the console show it).
    from lightning_perf.report.json_report import report_dict, write_json_atomically
    from lightning_perf.summarize.steps import summarize_epoch

    for name, wait in (("before", 0.996), ("after", 0.5)):
        epoch = summarize_epoch(stage="train", epoch=0, data_wait=[wait], compute=[1 - wait], batch_sizes=[4])
        report = report_dict(generated_by="lightning-perf test", run={"device": "cpu"}, epochs=[epoch], windows=[])
        (tmp_path / name).mkdir()
        write_json_atomically(report, str(tmp_path / name / "perf_report.json"))
    assert main(["compare", str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    [row] = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("data wait")]
    assert row[2:4] == ["99%", "50%"], row
    assert main(["compare", str(tmp_path / "before"), str(tmp_path / "after"), "--json"]) == 0
    data_wait = json.loads(capsys.readouterr().out)["metrics"]["data wait"]
    assert (data_wait["before"], data_wait["after"]) == ("99%", "50%")


def test_analyze_prints_findings_as_the_console_does(gpu_trace, capsys):
    # One way to print findings: the lines under a trace are the console's lines for the same findings.
    from lightning_perf.diagnose.model import Finding
    from lightning_perf.report.findings import console_report, finding_lines
    from lightning_perf.summarize.steps import summarize_epoch

    path = str(gpu_trace("v100_single_rank.json.gz"))
    assert main(["analyze", path, "--precision", "32-true", "-v", "2", "--json"]) == 0
    findings = [Finding(**f) for f in json.loads(capsys.readouterr().out)[path]["findings"]]
    lines = finding_lines(findings, verbose=2)
    assert findings and any(line.startswith("WARNING  precision  ") for line in lines)
    assert main(["analyze", path, "--precision", "32-true", "-v", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[2:] == ["    " + line for line in lines]
    epoch = summarize_epoch(stage="train", epoch=0, data_wait=[0.0], compute=[0.1], batch_sizes=[None])
    assert console_report(epoch, findings, verbose=2).splitlines()[1:] == ["  " + line for line in lines]


def _write_report(directory, *, flops_per_second=None, mfu=None, counted=True):
    """A hand-built perf_report.json of one training epoch, with the FLOPs figures the callback fills in."""
    import dataclasses

    from lightning_perf.report.json_report import report_dict, write_json_atomically
    from lightning_perf.summarize.steps import summarize_epoch

    epoch = summarize_epoch(stage="train", epoch=0, data_wait=[0.01] * 4, compute=[0.1] * 4, batch_sizes=[32] * 4)
    run = {"device": "cuda", "device_name": "NVIDIA H200", "world_size": 1, "precision": "bf16-mixed"}
    if counted:
        epoch = dataclasses.replace(epoch, flops_per_batch=4.12e12, flops_per_second=flops_per_second, mfu=mfu)
        run["peak_flops"] = 989e12 if mfu is not None else None
        run["flops"] = {
            "by_module": [["encoder.layer1", 2.06e12], ["decoder", 1.03e12], ["head", 0.2e12]],
            "forward": 1.03e12 * 4,  # the modules' shares are of the forward pass
            "counted": [{"flops": 3 * 4.12e12, "samples": 32, "shape": "32x128"}],
            "uncounted": [["aten.mkldnn_rnn_layer", 4]],
        }
    report = report_dict(generated_by="lightning-perf test", run=run, epochs=[epoch], windows=[])
    directory.mkdir()
    write_json_atomically(report, str(directory / "perf_report.json"))
    return directory


def test_report_shows_flops_per_batch_mfu_and_the_top_modules(tmp_path, capsys):
    run = _write_report(tmp_path / "run", flops_per_second=3.1e14, mfu=0.3134)
    assert main(["report", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  peak 989 TFLOP/s per device (what MFU divides by)" in lines
    assert "  top modules by forward FLOPs: encoder.layer1 50%, decoder 25%, head 4%" in lines
    assert (
        "  not counted (no FLOP formula in torch; the figures are lower bounds): aten.mkldnn_rnn_layer (4 calls)"
        in lines
    )
    [i] = [i for i, line in enumerate(lines) if line.startswith("lightning-perf | train epoch 0 |")]
    assert lines[i].split(" | ")[2].endswith("samples/s, 310 TFLOP/s, MFU 31%")
    assert lines[i + 1] == "  FLOPs per batch: 4.12 TFLOP (forward and backward)"


def test_a_report_without_flops_shows_no_flops_line(tmp_path, capsys):
    run = _write_report(tmp_path / "run", counted=False)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "lightning-perf | train epoch 0 |" in out
    assert not [word for word in ("FLOP", "MFU", "peak", "top modules") if word in out]
    # Counted on a device whose peak is unknown: FLOP/s and modules, no MFU and no peak.
    run = _write_report(tmp_path / "cpu", flops_per_second=3.1e10)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "31.0 GFLOP/s" in out and "top modules by forward FLOPs:" in out and "MFU" not in out and "peak" not in out


def test_compare_shows_flops_and_mfu_before_and_after(tmp_path, capsys):
    before = _write_report(tmp_path / "before", flops_per_second=1.5e14, mfu=0.1516)
    after = _write_report(tmp_path / "after", flops_per_second=3.1e14, mfu=0.3134)
    assert main(["compare", str(before), str(after)]) == 0
    rows = {line.split("  ")[1]: line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    assert rows["FLOP/s"][1:] == ["150", "TFLOP/s", "310", "TFLOP/s", "+106.7%", "(better)"]
    assert rows["MFU"][1:] == ["15%", "31%", "+16.2", "pp", "(better)"]  # rounded down; a share's change in points
    assert main(["compare", str(before), str(after), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["MFU"] == {"before": "15%", "after": "31%", "change": "+16.2 pp (better)"}
    assert metrics["FLOP/s"] == {"before": "150 TFLOP/s", "after": "310 TFLOP/s", "change": "+106.7% (better)"}


def test_compare_shows_unknown_flops_as_a_dash_and_as_null_in_json(tmp_path, capsys):
    before = _write_report(tmp_path / "before", counted=False)
    after = _write_report(tmp_path / "after", flops_per_second=3.1e10)  # counted on a device of unknown peak
    assert main(["compare", str(before), str(after)]) == 0
    rows = {line.split("  ")[1]: line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    assert rows["FLOP/s"][1:] == ["-", "31.0", "GFLOP/s"] and rows["MFU"][1:] == ["-", "-"]
    assert main(["compare", str(before), str(after), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["FLOP/s"] == {"before": None, "after": "31.0 GFLOP/s", "change": None}
    assert metrics["MFU"] == {"before": None, "after": None, "change": None}


def _write_trace(path, *names_ts_dur):
    """A hand-built CPU Kineto trace of one 1 ms ``ProfilerStep#0`` on the main thread and ``cpu_op`` spans."""
    events = [("ProfilerStep#0", 0, 1000, "user_annotation")] + [(*span, "cpu_op") for span in names_ts_dur]
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}
            for name, ts, dur, cat in events
        ]
    }
    path.write_text(json.dumps(trace))
    return str(path)


def test_analyze_shows_the_share_of_compiled_regions_and_guard_checks(tmp_path, capsys):
    path = _write_trace(
        tmp_path / "compiled.json",
        ("TorchDynamo Cache Lookup", 100, 12),
        ("Torch-Compiled Region: 0/0", 120, 629),
        ("CompiledFunction", 150, 500),
    )
    assert main(["analyze", path]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith(", compiled regions 62% of the step, guard checks 1.2%")  # rounded down, as everywhere
    assert main(["analyze", path, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)[path]["summary"]
    assert summary["compiled_time"] == pytest.approx(629e-6) and summary["guard_time"] == pytest.approx(12e-6)


def test_analyze_of_a_trace_without_compiled_code_says_nothing_of_it(tmp_path, capsys):
    path = _write_trace(tmp_path / "eager.json", ("aten::addmm", 100, 500))
    assert main(["analyze", path]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith("1 operators per step") and "compiled" not in line and "guard" not in line
    assert main(["analyze", path, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)[path]["summary"]
    assert (summary["compiled_time"], summary["guard_time"]) == (None, None)


def test_compare_calls_noise_the_same_and_a_share_s_change_points(tmp_path, capsys):
    # The trial's text: an operator of 11 us -> 11 us called slower, data wait 12% -> 13% called +6.4% (worse).
    from lightning_perf.report.json_report import report_dict, write_json_atomically
    from lightning_perf.summarize.steps import summarize_epoch

    for name, step, wait in (("before", 0.1, 0.012), ("after", 0.102, 0.0133)):
        epoch = summarize_epoch(stage="train", epoch=0, data_wait=[wait], compute=[step - wait], batch_sizes=[4])
        report = report_dict(generated_by="lightning-perf test", run={"device": "cpu"}, epochs=[epoch], windows=[])
        (tmp_path / name).mkdir()
        write_json_atomically(report, str(tmp_path / name / "perf_report.json"))
    assert main(["compare", str(tmp_path / "before"), str(tmp_path / "after")]) == 0
    rows = {line[2:].split("  ")[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["step time p50"][-2:] == ["+2.0%", "(same)"]  # within run-to-run noise
    assert rows["data wait"][-5:] == ["12%", "13%", "+1.0", "pp", "(worse)"]  # points, not +8.7%
    # Operators, from two traces: 11 us -> 11.4 us is the same, 500 us -> 300 us faster, 3 us new is the same.
    before = _write_trace(tmp_path / "a.json", ("aten::add", 100, 11), ("aten::mm", 200, 500))
    after = _write_trace(tmp_path / "b.json", ("aten::add", 100, 11.4), ("aten::mm", 200, 300), ("aten::t", 600, 3))
    assert main(["compare", before, after]) == 0
    out = capsys.readouterr().out
    assert "(per window, CPU time; same: under 5% or 5 us):" in out
    words = {line.split()[0]: line.split()[-1] for line in out.split("changed most", 1)[1].splitlines()[1:]}
    assert words == {"aten::mm": "faster", "aten::add": "same", "aten::t": "new"}
    assert main(["compare", before, after, "--json"]) == 0
    operators = json.loads(capsys.readouterr().out)["operators"]
    assert [(o["name"], o["change"]) for o in operators] == [
        ("aten::mm", "faster"),
        ("aten::t", "new"),
        ("aten::add", "same"),
    ]


def test_analyze_of_a_relative_path_names_absolute_paths(gpu_trace, tmp_path, monkeypatch, capsys):
    # `analyze c2/perf --html`: the page's trace path and commands must work wherever the page is opened.
    window = tmp_path / "c2" / "perf" / "train-epoch0"
    window.mkdir(parents=True)
    shutil.copy(gpu_trace("v100_single_rank.json.gz"), window / "rank0.pt.trace.json.gz")
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "c2/perf", "--json", "--html", "traces.html"]) == 0
    trace = str(window / "rank0.pt.trace.json.gz")
    assert trace in json.loads(capsys.readouterr().out)  # as the directories always were
    text, _ = _page(tmp_path / "traces.html")
    assert f"Trace: <code>{trace}</code>" in text and f"tensorboard --logdir {tmp_path / 'c2' / 'perf'}</code>" in text
    assert "<code>c2/perf" not in text and "--logdir c2/" not in text


# --- --html OUT ----------------------------------------------------------------------------------------------


def _page(path):
    """A page a command wrote, checked to be one self-contained document, and the figures it draws, each
    validated by Plotly's own schema."""
    import plotly.graph_objects as go

    from html_pages import assert_self_contained, figures_in

    text = path.read_text(encoding="utf-8")
    assert_self_contained(text)
    figures = figures_in(text)
    for figure in figures.values():
        go.Figure(figure)  # raises on a property Plotly does not know
    return text, figures


def test_report_html_writes_the_run_page_and_still_prints_the_report(runs, tmp_path, capsys):
    out = tmp_path / "slow.html"
    assert main(["report", str(runs["slow"]), "--html", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("lightning-perf | train epoch 1 |") for line in lines)  # the usual text
    assert lines[-1].startswith(f"HTML page: {out} (") and "MiB" in lines[-1]  # then where the page went
    text, _ = _page(out)
    assert "dataloader_bound" in text
    # OUT a directory: the page is OUT/report.html; with --json, stdout stays JSON and the line goes to stderr.
    assert main(["report", str(runs["slow"]), "--json", "--html", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["version"] == 1
    assert captured.err.startswith(f"HTML page: {tmp_path / 'report.html'} (")
    _page(tmp_path / "report.html")


def test_report_html_needs_one_run(runs, tmp_path, capsys):
    assert main(["report", str(runs["slow"].parent), "--html", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "holds 2 reports (fast/" in err and "--html writes one run's page: pass its directory" in err
    assert not (tmp_path / "x.html").exists()


def test_analyze_html_writes_the_traces_page(runs, tmp_path, capsys):
    out = tmp_path / "traces.html"
    assert main(["analyze", str(runs["slow"]), "--html", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("rank 0: rank0.pt.trace.json.gz: 2 steps of" in line for line in lines) == 2  # a window an epoch
    assert lines[-1].startswith(f"HTML page: {out} (")
    text, _ = _page(out)
    for trace in runs["slow"].rglob("*.pt.trace.json.gz"):
        assert trace.parent.name in text  # every trace's window is on the page


def test_compare_html_of_two_runs(runs, tmp_path, capsys):
    out = tmp_path / "compare.html"
    assert main(["compare", str(runs["slow"]), str(runs["fast"]), "--html", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"HTML page: {out} (")
    text, figures = _page(out)
    assert set(figures) == {"operators-chart", "epochs-chart-0", "epochs-chart-1"}
    assert [t["name"] for t in figures["epochs-chart-0"]["data"]] == ["before", "after"]
    assert [len(t["x"]) for t in figures["epochs-chart-0"]["data"]] == [2, 2]  # both runs' two epochs
    # The headline's changes coloured the right way: a lower step time and a higher throughput are better.
    for metric in ("step time p50", "throughput", "data wait"):
        row = text.split(f"<td>{metric}</td>", 1)[1].split("</tr>", 1)[0]
        assert '<span class="good">' in row and "(better)" in row, row
    # The slow run waited for data most of the time (critical); the fast one waits little, if at all.
    fixed = "<td>fixed</td><td>dataloader_bound</td><td>critical</td><td>-</td>"
    kept = "<td>kept</td><td>dataloader_bound</td><td>critical</td><td>warning</td>"
    assert 'id="findings-table"' in text and (fixed in text or kept in text)
    assert 'id="operators-table"' in text and "enumerate(DataLoader)#" in text


def test_compare_html_is_written_when_slower_too(runs, tmp_path, capsys):
    # In CI the page is what shows why the job failed.
    out = tmp_path / "slower.html"
    assert main(["compare", str(runs["fast"]), str(runs["slow"]), "--fail-if-slower", "10", "--html", str(out)]) == 1
    assert "slower (limit --fail-if-slower 10%)" in capsys.readouterr().err
    text, _ = _page(out)
    assert '<span class="bad">' in text


def test_compare_html_escapes_an_operator_named_like_a_script(runs, tmp_path, capsys):
    # A record_function can be named anything: on the page its name is text, in the tables and in the charts.
    import gzip

    name = "<script>document.title='pwned'</script>"
    before = sorted(runs["fast"].rglob("*.pt.trace.json.gz"))[-1]
    with gzip.open(before, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    renamed = 0
    for event in trace["traceEvents"]:
        if event.get("name") == "aten::mm":
            event["name"], renamed = name, renamed + 1
    assert renamed
    after = tmp_path / "after.pt.trace.json"
    after.write_text(json.dumps(trace))
    out = tmp_path / "compare.html"
    assert main(["compare", str(before), str(after), "--html", str(out)]) == 0
    text, figures = _page(out)
    assert "<script>document.title" not in text and "pwned'</script>" not in text
    assert ">&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;</td>" in text  # the table's cell
    bars = figures["operators-chart"]["data"][0]
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in bars["y"]  # Plotly shows it as text
    assert capsys.readouterr().out.count("<script>document.title='pwned'</script>") == 1  # the text lists it as is


@pytest.mark.parametrize("command", ["report", "analyze", "compare"])
def test_html_into_a_directory_that_does_not_exist_is_one_line_and_exit_code_2(command, runs, tmp_path, capsys):
    inputs = {"report": [str(runs["slow"])], "analyze": [str(runs["slow"])]}
    inputs["compare"] = [str(runs["slow"]), str(runs["fast"])]
    out = tmp_path / "missing" / "page.html"
    assert main([command, *inputs[command], "--html", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"lightning-perf: error: --html {out}: no such directory: {out.parent}\n"
    assert captured.out == ""  # checked before any work


def test_compare_reads_the_trace_beside_the_report_before_the_path_the_run_wrote(runs, tmp_path, capsys):
    # A renamed run directory whose version_N a later run reused: the report's recorded trace paths name that run's
    # traces (Lightning's transformer example read 84.60 ms of all-reduce for 153.15 ms, its own).
    [report] = runs["slow"].rglob("perf_report.json")
    [other] = [t for t in runs["fast"].rglob("*.pt.trace.json.gz") if t.parent.name.startswith("train")][-1:]
    renamed = tmp_path / "renamed"
    shutil.copytree(report.parent, renamed)
    data = json.loads((renamed / "perf_report.json").read_text())
    for window in data["windows"]:
        window["trace_path"] = str(other)  # exists: another run's
    (renamed / "perf_report.json").write_text(json.dumps(data))
    assert main(["compare", str(renamed), str(report.parent), "--json"]) == 0
    operators = json.loads(capsys.readouterr().out)["operators"]
    assert all(o["before_us"] == o["after_us"] for o in operators), operators  # its own trace on both sides


def test_compare_finds_a_moved_run_s_traces_or_uses_the_operators_its_report_kept(runs, tmp_path, capsys):
    # A run directory copied off a cluster: its report names traces where the run wrote them, gone here.
    [report] = runs["slow"].rglob("perf_report.json")
    moved = tmp_path / "moved"
    shutil.copytree(report.parent, moved)
    data = json.loads((moved / "perf_report.json").read_text())
    for window in data["windows"]:
        window["trace_path"] = f"/cluster/scratch/{window['name']}/rank0.pt.trace.json.gz"
    (moved / "perf_report.json").write_text(json.dumps(data))
    last = data["windows"][-1]
    assert main(["compare", str(moved), str(runs["fast"]), "--json", "--html", str(tmp_path)]) == 0
    operators = json.loads(capsys.readouterr().out)["operators"]
    assert len(operators) == 20 and operators[0]["name"].startswith("enumerate(DataLoader)#")
    assert f"(before: {last['name']}; after: " in (tmp_path / "compare.html").read_text()  # its whole trace
    # Without its window directories: the top operators the report kept, and the page says so.
    for window in data["windows"]:
        shutil.rmtree(moved / window["name"])
    assert main(["compare", str(moved), str(runs["fast"]), "--html", str(tmp_path)]) == 0
    assert "enumerate(DataLoader)#" in capsys.readouterr().out
    # The report keeps the operators in seconds; compared in µs, as read off the trace itself.
    assert main(["compare", str(moved), str(runs["fast"]), "--json"]) == 0
    from_report = {o["name"]: o["before_us"] for o in json.loads(capsys.readouterr().out)["operators"]}
    from_trace = {o["name"]: o["before_us"] for o in operators}
    assert set(from_report) & set(from_trace) and from_report[operators[0]["name"]] > 1_000  # a sleeping loader
    # (An operator among the other run's top but not among the ones this report kept reads 0 from the report.)
    kept_names = {o["name"] for o in last["operators"]}
    assert kept_names & set(from_trace)
    for name in set(from_report) & set(from_trace) & kept_names:
        assert from_report[name] == pytest.approx(from_trace[name], rel=1e-6), name
    kept = f"(before: {last['name']} (its top {len(last['operators'])} operators, as the report keeps them); after: "
    assert kept in (tmp_path / "compare.html").read_text()


def test_analyze_shows_each_traces_collectives_and_puts_them_in_its_json(gpu_trace, capsys):
    path = str(gpu_trace("a100_nccl_2rank_rank0.json.gz"))
    assert main(["analyze", path]) == 0
    out = capsys.readouterr().out
    assert "collective  group       ranks  calls/step  bytes/call" in out
    # 5 all-reduces a step of 19.5 MiB on average (the hand count of tests/summarize/test_collectives.py).
    assert re.search(r"allreduce\s+default_pg\s+2\s+5\s+19\.5 MiB\s+15\.59 ms\s+84%\s+6\.56 GB/s\s+6\.56 GB/s", out)
    assert main(["analyze", path, "--json"]) == 0
    (entry,) = [v for k, v in json.loads(capsys.readouterr().out).items() if k.endswith(".json.gz")]
    assert [(c["kind"], c["calls"], c["bytes"]) for c in entry["collectives"]] == [
        ("allreduce", 15, 306_684_384),
        ("broadcast", 6, 638_712),
    ]


def test_analyze_jobs_reads_the_traces_in_processes_and_prints_what_a_serial_run_prints(gpu_trace, tmp_path, capsys):
    for name in ("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz", "a100_nccl_2rank_rank0.json.gz"):
        (tmp_path / ("other" if name.startswith("a100") else "ranks")).mkdir(exist_ok=True)
        shutil.copy(gpu_trace(name), tmp_path / ("other" if name.startswith("a100") else "ranks") / name)
    outputs = {}
    for jobs in ("1", "2"):
        for form in ([], ["--json"]):
            assert main(["analyze", str(tmp_path), "--jobs", jobs, *form]) == 0
            outputs[(jobs, bool(form))] = capsys.readouterr().out
    assert outputs[("1", False)] == outputs[("2", False)] and outputs[("1", True)] == outputs[("2", True)]
    assert "across ranks:" in outputs[("2", False)] and "sendrecv" in outputs[("2", False)]
    with pytest.raises(SystemExit):
        main(["analyze", str(tmp_path), "--jobs", "0"])
    assert "--jobs must be a whole number of processes, at least 1; got '0'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", "x", "--precision", "fp32"], "--precision must be one of Lightning's precisions (bf16-mixed,"),
        (["compare", "a", "b", "--precision", "foo"], "--precision must be one of Lightning's precisions"),
        (["compare", "a", "b", "--operators", "-1"], "--operators must be a whole number of operators, at least 1"),
        (["compare", "a", "b", "--operators", "0"], "--operators must be a whole number of operators, at least 1"),
    ],
)
def test_options_out_of_range_fail_naming_the_option_the_value_and_what_is_allowed(argv, message, capsys):
    # `--precision fp32` ran with the precision rule silently off; `--operators -1` listed all but the last.
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_analyze_skips_what_a_directory_holds_besides_traces_and_refuses_an_empty_trace(runs, tmp_path, capsys):
    # A run directory with a config.json beside its trace failed whole: "config.json: field traceEvents is missing".
    [trace] = [t for t in runs["fast"].rglob("*.pt.trace.json.gz") if t.parent.name.startswith("train")][:1]
    shutil.copy(trace, tmp_path / trace.name)
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert list(json.loads(captured.out)) == [str(tmp_path / trace.name)]
    assert f"lightning-perf: warning: skipped {tmp_path / 'config.json'}: field traceEvents is missing" in captured.err
    # Named on the command line, it is an error, as is a directory that holds nothing readable.
    assert main(["analyze", str(tmp_path / "config.json")]) == 2
    (tmp_path / trace.name).unlink()
    assert main(["analyze", str(tmp_path)]) == 2
    assert "holds no Kineto trace that could be read" in capsys.readouterr().err
    # A trace of no events read "1 steps of 0 us ... no bottleneck found", exit 0.
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    assert main(["analyze", str(tmp_path / "empty.json")]) == 2
    assert "the trace holds no operator, kernel or step (no complete event)" in capsys.readouterr().err
