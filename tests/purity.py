"""Which heavy frameworks a module of ours pulls in when imported on its own, and which modules a file names in its
imports (read, not run)."""

from __future__ import annotations

import ast
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


def imported_modules(path: Path, *, members: bool = False) -> set[str]:
    """The absolute module names ``path`` imports, anywhere in it (functions included): ``import a.b`` and
    ``from a.b import c`` give ``a.b``; with ``members``, ``a.b.c`` too (``from package import module``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if members:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found
