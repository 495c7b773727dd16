"""A window's torch session: it skips the post-processing nothing here reads (``trace_only``) and exports the
same operators as a session that does not, and keeps the post-processing where stacks need it."""

import json
import os
from collections import Counter

import torch

from kineto import recorded_window
from lightning_perf.collect.profiler import ProfilerWindow, _trace_only


def _operators(window) -> Counter:
    path = window.export()
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    return Counter(e["name"] for e in events if e.get("cat") == "cpu_op")


def test_the_session_skips_post_processing_and_exports_the_same_operators(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def step(batch: int) -> None:
        model(torch.ones(4, 8)).sum().backward()

    step(0)  # first calls out of the way
    window = recorded_window([1, 2], step)
    assert window._profiler.experimental_config.trace_only
    ours = _operators(window)
    plain = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with plain:
        for batch in (1, 2):
            with torch.profiler.record_function(f"ProfilerStep#{batch}"):
                step(batch)
    plain.export_chrome_trace(str(tmp_path / "plain.json"))
    with open(tmp_path / "plain.json") as f:
        expected = Counter(e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op")
    assert ours == expected and ours["aten::addmm"] == 4


def test_stacks_keep_torchs_post_processing():
    assert _trace_only(with_stack=True) is None
    window = ProfilerWindow(
        use_cuda=False, record_shapes=False, profile_memory=False, with_stack=True, with_flops=False, metadata={}
    )
    assert window._profiler.experimental_config is None
