"""``examples/cli.py``, the LightningCLI example, imported once for the tests that drive it in process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cli.py"
_NAME = "lightning_perf_cli_example"


def cli_example() -> ModuleType:
    """The example as a module (registered in ``sys.modules``: jsonargparse resolves its annotations there)."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module
