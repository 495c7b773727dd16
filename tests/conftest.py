import os
import pathlib
import signal

import pytest

from models import torch_threads

# A background job of a non-interactive shell (`make test &` in a script) starts with SIGINT ignored, and so does
# every process it starts: a Ctrl-C test's run would never see its Ctrl-C. The tests take SIGINT as a terminal
# gives it (their processes inherit a handled SIGINT as the default one).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared"
GPU_TRACES = SHARED / "fixtures" / "gpu-traces"


@pytest.fixture
def gpu_trace():
    """Path of a real GPU Kineto trace from ../shared/fixtures/gpu-traces; skips where it is absent."""

    def get(name: str) -> pathlib.Path:
        path = GPU_TRACES / name
        if not path.exists():
            pytest.skip(f"real GPU traces not found at {GPU_TRACES} (they live in ../shared beside the clone)")
        return path

    return get


# Our own failures re-raise in the test suite instead of being warned about and skipped (PerfCallback's
# `strict`), so that a bug of ours cannot hide behind the fail-safe. Tests of the fail-safe pass strict=False.
os.environ.setdefault("LIGHTNING_PERF_STRICT", "1")


@pytest.fixture
def one_thread():
    """One intra-op torch thread for the test (:func:`models.torch_threads`)."""
    with torch_threads(1):
        yield


@pytest.fixture
def every_epoch_alone(monkeypatch):
    """Every epoch measured on its own, however slow the machine: no epoch is carried into the next (the
    measurement pace has no end), for tests that count epochs over a run longer than its burst."""
    from lightning_perf.hooks import stage_measure

    monkeypatch.setattr(stage_measure, "MEASURE_BURST", float("inf"))


@pytest.fixture
def every_write(monkeypatch):
    """Every per-batch logging point written, however slow the machine: the scalars' pace has no end, for tests
    that count the points of a run (hooks/log_pace.py)."""
    from lightning_perf.hooks import stage_measure

    monkeypatch.setattr(stage_measure, "LOG_BURST", float("inf"))


@pytest.fixture
def every_console_line(monkeypatch):
    """Every reported epoch's console line printed, however short the epochs: no status line is held back
    (hooks/console_lines.py, STATUS_SECONDS), for tests that count the lines of a run."""
    from lightning_perf.hooks import console_lines

    monkeypatch.setattr(console_lines, "STATUS_SECONDS", 0.0)
