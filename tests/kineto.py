"""Reading our traces back in tests: plain JSON, as Perfetto or HTA would see it; and recording a real window to
read (:func:`recorded_window`)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from lightning_perf import traces


def load(path) -> dict:
    """A trace file's JSON as dictionaries, gunzipped where its name ends in ``.gz``: every field, as written
    (the package reads traces into typed events, :func:`lightning_perf.readers.load_trace`)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def op_names(trace: dict) -> Counter:
    """How often each complete (``ph == "X"``) event name occurs."""
    return Counter(e["name"] for e in trace["traceEvents"] if e.get("ph") == "X")


def steps(trace: dict) -> list[int]:
    return [n for n, _, _ in traces.profiler_steps(trace)]


def events_in_step(trace: dict, step: int) -> list[dict]:
    """The complete events on the step span's thread that lie inside ``ProfilerStep#step``."""
    span = next(e for e in trace["traceEvents"] if e.get("name") == f"ProfilerStep#{step}" and e.get("ph") == "X")
    start, end = span["ts"], span["ts"] + span["dur"]
    return [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
        and e is not span
        and (e.get("pid"), e.get("tid")) == (span.get("pid"), span.get("tid"))
        and start <= e["ts"] <= end
    ]


def recorded_window(batches: Iterable[int], step: Callable[[int], Any], metadata: dict | None = None) -> Any:
    """A real CPU profiler window (:class:`~lightning_perf.collect.profiler.ProfilerWindow`) that recorded
    ``step(batch)`` in each of ``batches``' spans, stopped: ready for ``export()``."""
    from lightning_perf.collect.profiler import ProfilerWindow  # torch: only for the tests that record

    window = ProfilerWindow(
        use_cuda=False,
        record_shapes=False,
        profile_memory=False,
        with_stack=False,
        with_flops=False,
        metadata=metadata or {},
    )
    window.start()
    for batch in batches:
        window.begin_step(batch)
        window.mark_ran(batch)
        step(batch)
        window.end_step()
    window.stop()
    return window
