"""
Offline trace analysis speed
============================

How fast lightning-perf analyses a Kineto trace offline, next to the two tools people otherwise point at the
same file, timed in one run on the same traces:

    ours         ``lightning_perf.readers.load_trace`` (read, gunzip, decode into typed events, which
                 checks them), then ``summarize_trace`` and ``operator_stats`` (the step summary and the
                 operator table; the first sorts the events out for both): what ``lightning-perf compare``
                 does with a trace (``analyze`` needs no operator table: 15% less). Load and analysis are
                 timed separately. Without the cyclic garbage collector, as the command runs (about 5%).
    tb-profiler  torch-tb-profiler's own loader, what TensorBoard's PyTorch Profiler tab runs per worker:
                 ``RunProfileData.parse(worker, span, path, cache_dir)`` then
                 ``RunGenerator(worker, span, data).generate_run_profile()``.
    HTA          Holistic Trace Analysis, where importable: ``TraceAnalysis(trace_dir=...)`` on a temporary
                 directory holding just that trace (HTA reads every trace of a directory), i.e. its parse;
                 with ``--hta-breakdown`` plus ``get_temporal_breakdown(visualize=False)``.

The three do not do the same work: tb-profiler builds every view of its tab (overview, operators, kernels,
memory, trace), HTA only parses into its dataframes, ours the two summaries the rules and reports read. Each
is what its user waits for before seeing anything; the other two run with the garbage collector on, as they
do for their users.

Run it from the repository root::

    python benchmarks/analyze_speed.py                             # fixtures + a 505k-event synthetic trace
    python benchmarks/analyze_speed.py --synthetic-events 0        # the fixtures only (about 2 minutes)
    python benchmarks/analyze_speed.py path/to/rank0.pt.trace.json.gz --repeat 5 --tools ours,hta

Inputs: the traces named on the command line, by default every ``*.json.gz`` of
``../shared/fixtures/gpu-traces`` (beside the clone; skipped with a message where absent), plus a synthetic
trace of ``--synthetic-events`` events (default 505,000, the size of the "180 MB, 505k-event trace" of the
issue; 0 for none). The synthetic trace is the largest input trace (``--synthetic-from`` to choose another)
replicated back to back: every copy's timestamps shifted past the previous copy's end, its ``External id``,
``correlation``, flow ``id`` and similar ids offset to fresh values and its ``ProfilerStep#N`` numbers
continued; metadata (``ph: M``) and global instant events kept once; the last copy cut to its earliest
events so that the total is exactly N. It is written gzipped, in Kineto's own layout, to a temporary
directory (``--keep-synthetic PATH`` keeps a copy).

Reading the output:

* Per trace: its events and size (gzipped, and the JSON once decompressed), then one line per tool:
  seconds (the run of median total of ``--repeat`` runs for ours, default 3; of ``--repeat-others`` runs for
  the other two, default 1, as they are slow), events per second, and for the other tools how many times faster ours
  is (their seconds over ours, load and analysis together). Ours' line splits its time into load and
  analysis (``summarize_trace`` + ``operator_stats``).
* A table of all traces, then one summary line per tool: total events, total seconds, events per second over
  all traces, and the range of ours' speed-up against it.
* ``targets``: whether ours is at least 10x faster than each other tool on every trace of at least 50,000
  events, with the lowest ratio on the smaller traces beside it (the issue's baseline, "about 40k events per
  second" on a 505k-event trace, is a throughput; on small traces each tool's fixed costs weigh: on a
  1,000-event trace ours takes 2 ms, tb-profiler 10 ms and HTA 20 ms); and ours' seconds per 100,000 events
  on each trace of at least 50,000 (the target: a 100k-event trace analysed in under 1 s).

Timings are wall-clock, one tool at a time, each tool on each trace in a new Python process (this script,
run again with ``--worker``) that imports the tool before timing it and runs it ``--repeat`` times, with
what the previous run built freed first. A new process is what a user's command runs in, and keeps the
heap earlier traces and tools leave behind from weighing on the next one: in one process, ours came out
about 25% slower on the small traces timed after large ones, and 5-15% faster on large ones (whose memory
an earlier trace had already mapped). ``--in-process`` times everything in this one process instead. A tool
that fails on a trace is reported as failed with its error. Peak memory is not measured. The machine should be
otherwise idle: the tools are single-threaded (HTA forks one worker process per rank, one here).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import json
import logging
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lightning_perf.readers.files import GZIP_MAGIC
from lightning_perf.traces import PROFILER_STEP_PREFIX, step_number

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures" / "gpu-traces"
TOOLS = ("ours", "tb", "hta")
LABELS = {"ours": "ours", "tb": "tb-profiler", "hta": "HTA"}
TARGET_SPEEDUP = 10.0
TARGET_SECONDS_PER_100K = 1.0
MIN_EVENTS_FOR_RATE = 50_000  # the targets (speed-up, seconds per 100k events) are judged on traces this large

# Ids that tie events together (a kernel to its launch, a flow's two ends, a Python frame to its parent):
# offset per copy in the synthetic trace so that every copy's are fresh.
ID_ARGS = ("External id", "correlation", "Record function id", "Python id", "Python parent id")
FLOW_PHASES = frozenset("stf")
WINDOW_GAP_US = 1000  # between two copies of the source trace


# --- Inputs ---------------------------------------------------------------------------------------------------


@dataclass
class Trace:
    path: pathlib.Path
    label: str
    events: int
    gz_bytes: int | None  # the file's size where it is gzipped
    json_bytes: int


def describe(path: pathlib.Path, label: str | None = None, events: int | None = None) -> Trace:
    """The trace's event count and sizes (read once here, outside any timing; it also warms the page cache)."""
    data = path.read_bytes()
    gz_bytes = None
    if data.startswith(GZIP_MAGIC):
        gz_bytes = len(data)
        data = gzip.decompress(data)
    if events is None:
        parsed = json.loads(data)
        events = len(parsed["traceEvents"] if isinstance(parsed, dict) else parsed)
        del parsed
    return Trace(path, label or path.name, events, gz_bytes, len(data))


def default_inputs() -> list[pathlib.Path]:
    if not FIXTURES.is_dir():
        print(f"note: no fixtures at {FIXTURES} (they live in ../shared beside the clone): skipped")
        return []
    paths = sorted(FIXTURES.glob("*.json.gz"))
    if not paths:
        print(f"note: no *.json.gz traces in {FIXTURES}: skipped")
    return paths


# --- Synthetic trace ------------------------------------------------------------------------------------------


def _max_id(events: list[dict[str, Any]]) -> int:
    top = 0
    for e in events:
        if e.get("ph") in FLOW_PHASES and type(e.get("id")) is int:
            top = max(top, e["id"])
        args = e.get("args")
        if args:
            for key in ID_ARGS:
                if type(args.get(key)) is int:
                    top = max(top, args[key])
    return top


def _step_range(events: list[dict[str, Any]]) -> tuple[int, int]:
    numbers = [n for e in events if (n := step_number(e.get("name"))) is not None]
    return (min(numbers), max(numbers)) if numbers else (0, 0)


def _shifted(event: dict[str, Any], shift: float, id_offset: int, step_offset: int) -> dict[str, Any]:
    e = dict(event)
    if "ts" in e and isinstance(e["ts"], (int, float)):
        e["ts"] = e["ts"] + shift
    if id_offset:
        if e.get("ph") in FLOW_PHASES and type(e.get("id")) is int:
            e["id"] += id_offset
        args = e.get("args")
        if args and any(type(args.get(key)) is int for key in ID_ARGS):
            args = e["args"] = dict(args)
            for key in ID_ARGS:
                if type(args.get(key)) is int:
                    args[key] += id_offset
    step = step_number(e.get("name"))
    if step_offset and step is not None:
        e["name"] = f"{PROFILER_STEP_PREFIX}{step + step_offset}"
    return e


def _kineto_text(event: dict[str, Any]) -> str:
    """One event laid out as Kineto writes it: top-level fields on one line, ``args`` in a block."""
    if "args" not in event:
        return "  {\n    " + json.dumps(event)[1:-1] + "\n  }"
    top = {k: v for k, v in event.items() if k != "args"}
    return (
        "  {\n    "
        + json.dumps(top)[1:-1]
        + ',\n    "args": {\n      '
        + json.dumps(event["args"])[1:-1]
        + "\n    }\n  }"
    )


def synthetic_events(source: dict[str, Any], n: int) -> Iterator[dict[str, Any]]:
    """Exactly ``n`` events: ``source``'s, replicated back to back with fresh ids (see the module's notes)."""
    events = source["traceEvents"]
    once = [e for e in events if e.get("ph") == "M" or (e.get("ph") in ("i", "I") and e.get("s") == "g")]
    ids_once = {id(e) for e in once}
    repeated = [e for e in events if id(e) not in ids_once]
    if not repeated:
        raise ValueError("the source trace has no events to replicate")
    starts = [e["ts"] for e in repeated if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in repeated if isinstance(e.get("ts"), (int, float))]
    period = math.ceil(max(ends) - min(starts)) + WINDOW_GAP_US
    id_stride = _max_id(events) + 1
    first_step, last_step = _step_range(events)
    step_stride = last_step - first_step + 1

    budget = n - len(once)
    if budget < 0:
        raise ValueError(f"--synthetic-events {n} is fewer than the source's {len(once)} metadata events")
    copies, rest = divmod(budget, len(repeated))
    last_shift = (copies if rest else copies - 1) * period
    for e in once:
        yield _shifted(e, last_shift, 0, 0) if e.get("name") == "Record Window End" else e
    for c in range(copies):
        for e in repeated:
            yield _shifted(e, c * period, c * id_stride, c * step_stride)
    if rest:  # the last copy's earliest ``rest`` events, in file order
        by_time = sorted(range(len(repeated)), key=lambda i: repeated[i].get("ts", 0))
        keep = set(by_time[:rest])
        for i, e in enumerate(repeated):
            if i in keep:
                yield _shifted(e, copies * period, copies * id_stride, copies * step_stride)


def write_synthetic(source_path: pathlib.Path, n: int, out: pathlib.Path) -> None:
    with gzip.open(source_path, "rb") if source_path.name.endswith(".gz") else open(source_path, "rb") as f:
        source = json.load(f)
    if isinstance(source, list):
        source = {"traceEvents": source}
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=6) as f:
        f.write("{")
        for key, value in source.items():
            if key != "traceEvents":
                f.write(f"\n  {json.dumps(key)}: {json.dumps(value)},")
        f.write('\n  "traceEvents": [\n')
        for i, event in enumerate(synthetic_events(source, n)):
            if i:
                f.write(",\n")
            f.write(_kineto_text(event))
        f.write("\n  ]\n}\n")


# --- The tools ------------------------------------------------------------------------------------------------


@dataclass
class Timing:
    seconds: float | None = None  # median total
    parts: dict[str, float] = field(default_factory=dict)  # medians of the parts (ours)
    error: str | None = None


def _median_runs(runs: int, once: Callable[[], dict[str, float]]) -> Timing:
    samples: list[dict[str, float]] = []
    for _ in range(runs):
        gc.collect()
        try:
            samples.append(once())
        except Exception as err:  # a tool failing on a trace is a result, not the end of the benchmark
            last = traceback.extract_tb(err.__traceback__)[-1]
            where = f"{os.path.basename(last.filename)}:{last.lineno}"
            return Timing(error=f"{type(err).__name__}: {str(err)[:120]} (at {where})")
        finally:
            gc.collect()
    middle = sorted(samples, key=lambda s: sum(s.values()))[(len(samples) - 1) // 2]  # (so its parts add up)
    return Timing(sum(middle.values()), middle)


def time_ours(path: pathlib.Path, runs: int) -> Timing:
    from lightning_perf.readers import load_trace
    from lightning_perf.summarize.operators import operator_stats
    from lightning_perf.summarize.step_summary import summarize_trace

    def once() -> dict[str, float]:
        # As `lightning-perf` runs it: without the cyclic garbage collector (see lightning_perf/cli.py).
        gc.disable()
        try:
            t0 = time.perf_counter()
            trace = load_trace(path)
            t1 = time.perf_counter()
            summarize_trace(trace, window=path.name)
            t2 = time.perf_counter()
            operator_stats(trace)
            t3 = time.perf_counter()
        finally:
            gc.enable()
        return {"load": t1 - t0, "summarize": t2 - t1, "operators": t3 - t2}

    return _median_runs(runs, once)


def time_tb(path: pathlib.Path, runs: int, workdir: pathlib.Path) -> Timing:
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    cache_dir = workdir / "tb-cache"
    cache_dir.mkdir(exist_ok=True)

    def once() -> dict[str, float]:
        t0 = time.perf_counter()
        data = RunProfileData.parse("worker0", None, str(path), str(cache_dir))
        RunGenerator("worker0", None, data).generate_run_profile()
        return {"total": time.perf_counter() - t0}

    return _median_runs(runs, once)


def time_hta(path: pathlib.Path, runs: int, workdir: pathlib.Path, breakdown: bool) -> Timing:
    from hta.trace_analysis import TraceAnalysis

    trace_dir = workdir / "hta"
    shutil.rmtree(trace_dir, ignore_errors=True)
    trace_dir.mkdir()
    name = path.name if path.name.endswith((".json", ".gz")) else path.name + ".json"
    shutil.copy(path, trace_dir / name)

    def once() -> dict[str, float]:
        t0 = time.perf_counter()
        analysis = TraceAnalysis(trace_dir=str(trace_dir))
        if breakdown:
            analysis.get_temporal_breakdown(visualize=False)
        return {"total": time.perf_counter() - t0}

    try:
        return _median_runs(runs, once)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def time_tool(tool: str, path: pathlib.Path, runs: int, workdir: pathlib.Path, breakdown: bool) -> Timing:
    if tool == "ours":
        return time_ours(path, runs)
    if tool == "tb":
        return time_tb(path, runs, workdir)
    return time_hta(path, runs, workdir, breakdown)


def time_isolated(tool: str, path: pathlib.Path, runs: int, workdir: pathlib.Path, breakdown: bool) -> Timing:
    """:func:`time_tool` in a new Python process (this script with ``--worker``), which imports the tool before
    timing it: no trace timed before, nor another tool's leftovers, weighs on this one."""
    command = [sys.executable, __file__, "--worker", tool, str(path), "--workdir", str(workdir)]
    command += ["--repeat", str(runs)] + (["--hta-breakdown"] if breakdown else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return Timing(error=f"worker exited {done.returncode}: {done.stderr.strip()[-200:]}")
    return Timing(**json.loads(lines[-1]))


def worker(tool: str, path: pathlib.Path, runs: int, workdir: pathlib.Path, breakdown: bool) -> None:
    logging.disable(logging.ERROR)
    warnings.simplefilter("ignore")
    tools, notes = available_tools([tool])
    timing = time_tool(tool, path, runs, workdir, breakdown) if tools else Timing(error=notes[tool])
    print(json.dumps(dataclasses.asdict(timing)))


def available_tools(wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    """The tools of ``wanted`` that import here, and a note for each that does not; imports them now, so that
    no import is timed."""
    notes: dict[str, str] = {}
    modules = {
        "ours": (
            "lightning_perf.readers",
            "lightning_perf.summarize.operators",
            "lightning_perf.summarize.step_summary",
        ),
        "tb": ("torch_tb_profiler.profiler.data", "torch_tb_profiler.profiler.run_generator"),
        "hta": ("hta.trace_analysis",),
    }
    for tool in wanted:
        try:
            for module in modules[tool]:
                __import__(module)
        except ImportError as err:
            notes[tool] = f"{LABELS[tool]} skipped: not importable here ({err})"
    return [tool for tool in wanted if tool not in notes], notes


# --- Output ---------------------------------------------------------------------------------------------------


def _mb(n: int | None) -> str:
    return f"{n / 1e6:.1f} MB" if n is not None else "-"


def _secs(t: Timing | None) -> str:
    if t is None:
        return "-"
    return f"{t.seconds:.2f}" if t.seconds is not None else "failed"


def _rate(events: int, t: Timing | None) -> str:
    return f"{events / t.seconds:,.0f}" if t and t.seconds else "-"


def _speedup(ours: Timing | None, other: Timing | None) -> float | None:
    if ours and other and ours.seconds and other.seconds:
        return other.seconds / ours.seconds
    return None


def print_trace(trace: Trace, results: dict[str, Timing], runs: dict[str, int], hta_breakdown: bool) -> None:
    size = f"{_mb(trace.gz_bytes)} gzipped, {_mb(trace.json_bytes)} JSON" if trace.gz_bytes else _mb(trace.json_bytes)
    print(f"\n{trace.label}: {trace.events:,} events, {size}")
    ours = results.get("ours")
    for tool, t in results.items():
        label = LABELS[tool] + (" (parse + breakdown)" if tool == "hta" and hta_breakdown else "")
        runs_note = f"median of {runs[tool]}" if runs[tool] > 1 else "1 run"
        if t.seconds is None:
            print(f"  {label:<12} failed: {t.error}")
            continue
        line = f"  {label:<12} {t.seconds:8.2f} s  {_rate(trace.events, t):>10} events/s  ({runs_note})"
        if tool == "ours":
            p = t.parts
            analysis = p["summarize"] + p["operators"]
            line += (
                f"\n  {'':<12} load {p['load']:.2f} s + analysis {analysis:.2f} s"
                f" (summarize_trace {p['summarize']:.2f}, operator_stats {p['operators']:.2f})"
            )
        else:
            ratio = _speedup(ours, t)
            line += f"   ours is {ratio:.1f}x faster" if ratio else ""
        print(line)
    sys.stdout.flush()


def print_summary(
    traces: list[Trace], results: dict[str, dict[str, Timing]], tools: list[str], notes: dict[str, str]
) -> None:
    print("\n" + "=" * 100)
    header = f"{'trace':<34} {'events':>9} {'gz':>8} {'JSON':>9}"
    for tool in tools:
        header += f" {LABELS[tool] + ' s':>14}"
        if tool == "ours":
            header += f" {'load':>6} {'analysis':>8}"
    header += "".join(f" {'x ' + LABELS[t]:>14}" for t in tools if t != "ours" and "ours" in tools)
    print(header)
    for trace in traces:
        r = results[trace.label]
        row = f"{trace.label[:34]:<34} {trace.events:>9,} {_mb(trace.gz_bytes):>8} {_mb(trace.json_bytes):>9}"
        for tool in tools:
            row += f" {_secs(r.get(tool)):>14}"
            if tool == "ours":
                t = r.get("ours")
                ok = t is not None and t.seconds is not None
                row += f" {t.parts['load'] if ok else float('nan'):>6.2f}"
                row += f" {t.parts['summarize'] + t.parts['operators'] if ok else float('nan'):>8.2f}"
        for tool in tools:
            if tool != "ours" and "ours" in tools:
                ratio = _speedup(r.get("ours"), r.get(tool))
                row += f" {f'{ratio:.1f}x' if ratio else '-':>14}"
        print(row)

    print()
    for tool in tools:
        done = [(tr, results[tr.label][tool]) for tr in traces if results[tr.label][tool].seconds is not None]
        failed = sum(1 for tr in traces if results[tr.label][tool].seconds is None)
        events = sum(tr.events for tr, _ in done)
        seconds = sum(t.seconds for _, t in done)
        line = f"{LABELS[tool] + ':':<13} {len(done)} trace(s), {events:,} events in {seconds:.2f} s"
        line += f", {events / seconds:,.0f} events/s" if seconds else ""
        if failed:
            line += f", {failed} failed"
        if tool != "ours" and "ours" in tools:
            ratios = [_speedup(results[tr.label]["ours"], t) for tr, t in done]
            ratios = [x for x in ratios if x]
            if ratios:
                line += f"; ours faster by {min(ratios):.1f}x to {max(ratios):.1f}x"
                line += f" (geometric mean {statistics.geometric_mean(ratios):.1f}x)"
        print(line)
    for note in notes.values():
        print(note)

    if "ours" not in tools:
        return
    print("\ntargets (ours: load_trace + summarize_trace + operator_stats):")
    for tool in tools:
        if tool == "ours":
            continue
        pairs = [(tr.label, tr.events, _speedup(results[tr.label]["ours"], results[tr.label][tool])) for tr in traces]
        large = [(label, x) for label, events, x in pairs if x and events >= MIN_EVENTS_FOR_RATE]
        small = [(label, x) for label, events, x in pairs if x and events < MIN_EVENTS_FOR_RATE]
        if not large:
            line = f"  >= {TARGET_SPEEDUP:.0f}x faster than {LABELS[tool]}: no trace of {MIN_EVENTS_FOR_RATE:,}+ events"
        else:
            label, worst = min(large, key=lambda p: p[1])
            met = "MET" if worst >= TARGET_SPEEDUP else "NOT MET"
            line = (
                f"  >= {TARGET_SPEEDUP:.0f}x faster than {LABELS[tool]} on every trace of {MIN_EVENTS_FOR_RATE:,}+"
                f" events: {met} (lowest {worst:.1f}x, {label})"
            )
        if small:
            label, worst = min(small, key=lambda p: p[1])
            line += f"; on smaller traces lowest {worst:.1f}x ({label})"
        print(line)
    rates = [
        (tr.label, tr.events, results[tr.label]["ours"].seconds)
        for tr in traces
        if tr.events >= MIN_EVENTS_FOR_RATE and results[tr.label]["ours"].seconds is not None
    ]
    if not rates:
        print(f"  100k events in < {TARGET_SECONDS_PER_100K:.0f} s: no trace of {MIN_EVENTS_FOR_RATE:,}+ events")
        return
    for label, events, seconds in rates:
        per_100k = seconds * 100_000 / events
        print(f"  {label[:34]:<34} {per_100k:6.2f} s per 100k events ({seconds:.2f} s for {events:,})")
    label, events, seconds = max(rates, key=lambda r: r[2] / r[1])
    worst = seconds * 100_000 / events
    met = "MET" if worst < TARGET_SECONDS_PER_100K else "NOT MET"
    print(f"  a 100k-event trace in < {TARGET_SECONDS_PER_100K:.0f} s: {met} (slowest {worst:.2f} s per 100k, {label})")


# --- Main -----------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=pathlib.Path, help=f"Kineto traces (default: {FIXTURES}/*.json.gz)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of ours per trace, median shown (default 3)")
    parser.add_argument("--repeat-others", type=int, default=1, help="runs of tb-profiler and HTA (default 1)")
    parser.add_argument("--synthetic-events", type=int, default=505_000, help="synthetic trace's events; 0: none")
    parser.add_argument("--synthetic-from", type=pathlib.Path, help="its source trace (default: the largest input)")
    parser.add_argument("--keep-synthetic", type=pathlib.Path, help="also copy the synthetic trace to this path")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated, of ours,tb,hta (default: all)")
    parser.add_argument("--hta-breakdown", action="store_true", help="time HTA's parse plus get_temporal_breakdown")
    parser.add_argument("--in-process", action="store_true", help="time every tool on every trace in this one process")
    parser.add_argument("--worker", choices=TOOLS, help=argparse.SUPPRESS)  # time_isolated's child
    parser.add_argument("--workdir", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.traces[0], args.repeat, args.workdir, args.hta_breakdown)  # --repeat: its runs
        return
    wanted = [tool.strip() for tool in args.tools.split(",") if tool.strip()]
    if unknown := [tool for tool in wanted if tool not in TOOLS]:
        parser.error(f"unknown tool(s) {', '.join(unknown)}; choose from {', '.join(TOOLS)}")
    if args.repeat < 1 or args.repeat_others < 1:
        parser.error("--repeat and --repeat-others must be >= 1")

    # The tools log progress (HTA a warning per parse; tb-profiler an error per pair of overlapping operator
    # ranges, which the ns-resolution V100 trace has) and pandas warns about deprecations: keep the table clean.
    logging.disable(logging.ERROR)
    warnings.simplefilter("ignore")
    tools, notes = available_tools(wanted)
    for note in notes.values():
        print(f"note: {note}")
    runs = {"ours": args.repeat, "tb": args.repeat_others, "hta": args.repeat_others}

    paths = args.traces or default_inputs()
    missing = [p for p in paths if not p.is_file()]
    for p in missing:
        print(f"note: {p}: no such file, skipped")
    paths = [p for p in paths if p.is_file()]

    with tempfile.TemporaryDirectory(prefix="analyze_speed_") as tmp:
        workdir = pathlib.Path(tmp)
        traces = [describe(p) for p in paths]
        if args.synthetic_events > 0:
            source = args.synthetic_from or (max(paths, key=lambda p: p.stat().st_size) if paths else None)
            if source is None:
                print("note: no input trace to build the synthetic trace from: skipped")
            else:
                out = workdir / f"synthetic_{args.synthetic_events}.pt.trace.json.gz"
                t0 = time.perf_counter()
                write_synthetic(source, args.synthetic_events, out)
                label = f"synthetic {args.synthetic_events // 1000}k (from {source.name.split('.')[0]})"
                traces.append(describe(out, label, events=args.synthetic_events))
                print(
                    f"synthetic trace: {args.synthetic_events:,} events from {source}, written in"
                    f" {time.perf_counter() - t0:.1f} s ({_mb(traces[-1].gz_bytes)} gzipped,"
                    f" {_mb(traces[-1].json_bytes)} JSON)"
                )
                if args.keep_synthetic:
                    shutil.copy(out, args.keep_synthetic)
        if not traces:
            print("nothing to time")
            return

        names = ", ".join(LABELS[t] for t in tools)
        where = "all in this process" if args.in_process else "each tool on each trace in a new process"
        print(f"tools: {names}; python {sys.version.split()[0]}, {os.cpu_count()} CPU(s); {where}")
        results: dict[str, dict[str, Timing]] = {}
        for trace in traces:
            timed = time_tool if args.in_process else time_isolated
            r = {tool: timed(tool, trace.path, runs[tool], workdir, args.hta_breakdown) for tool in tools}
            results[trace.label] = r
            print_trace(trace, r, runs, args.hta_breakdown)
        print_summary(traces, results, tools, notes)


if __name__ == "__main__":
    main()
