"""Which heavy frameworks a module of ours pulls in when imported on its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("lightning", "numpy", "pytorch_lightning", "torch")


def heavy_modules_loaded_by(module: str) -> list[str]:
    """Imports ``module`` in a fresh interpreter (``lightning_perf``'s own ``__init__`` imports the callback
    only on first use) and lists the heavy top-level modules that got loaded."""
    code = (
        f"import {module}\n"
        "import json, sys\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def package_modules_loaded_by(module: str) -> list[str]:
    """Imports ``module`` in a fresh interpreter and lists the modules of ``lightning_perf`` that got loaded."""
    code = (
        f"import {module}\n"
        "import json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('lightning_perf.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])
