"""Holistic Trace Analysis reads our traces: a real window of ours, and the rewritten real GPU traces, which
give HTA the same answers as the traces as torch wrote them."""

import shutil

import pytest
from hta.trace_analysis import TraceAnalysis

from kineto import load
from lightning_perf import PerfCallback, traces
from models import TinyModel, trainer


def _analysis(trace_dir) -> TraceAnalysis:
    return TraceAnalysis(trace_dir=str(trace_dir))


def test_hta_loads_a_window_of_ours(tmp_path):
    callback = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 3}, stages=["train"])
    trainer(tmp_path, [callback]).fit(TinyModel(n=24))
    [window] = callback.windows
    window_dir = tmp_path / "hta"
    window_dir.mkdir()
    shutil.copy(window.trace_path, window_dir)  # the trace alone: HTA reads every JSON file of a directory
    analysis = _analysis(window_dir)
    df = analysis.t.get_trace(0)
    analysis.t.symbol_table.add_symbols_to_trace_df(df, "name")
    names = set(df["name"])
    # HTA leaves out a trace's last ProfilerStep by design (its include_last_profiler_step=False).
    assert {"ProfilerStep#2", "ProfilerStep#3", "aten::sin"} <= names
    assert any(n.startswith("enumerate(DataLoader)#") for n in names)


def _gpu_answers(path, tmp_path, rewrite: bool):
    trace = load(path)
    if rewrite:
        traces.tensorboard_compatible(trace)
    trace_dir = tmp_path / ("rewritten" if rewrite else "as_recorded")
    trace_dir.mkdir()
    traces.write_trace(trace, trace_dir / "rank0.pt.trace.json.gz")
    analysis = _analysis(trace_dir)
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    launches = analysis.get_cuda_kernel_launch_stats(visualize=False)[0]
    return breakdown.to_dict(), len(launches), launches["launch_delay"].sum()


@pytest.mark.slow
def test_hta_gives_the_same_answers_on_rewritten_gpu_traces(gpu_trace, tmp_path):
    path = gpu_trace("v100_single_rank.json.gz")
    as_recorded = _gpu_answers(path, tmp_path, rewrite=False)
    rewritten = _gpu_answers(path, tmp_path, rewrite=True)
    assert as_recorded[1] > 0
    assert rewritten == as_recorded
