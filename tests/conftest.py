import pathlib

import pytest

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
