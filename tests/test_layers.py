"""The package's layers, read from its source: imports only run downward (hooks -> collect -> summarize ->
diagnose -> report), and no module or class outgrows what a person reads in one sitting."""

from __future__ import annotations

import ast
import pathlib

import pytest

from purity import imported_modules

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "lightning_perf"
MODULES = sorted(PACKAGE.rglob("*.py"))

# The top of the layers: Lightning's hooks and the command line, which may import everything below them.
TOP = ("callback", "standalone", "cli", "hooks", "__main__")
# What each layer must not import (a module's name relative to the package; a package covers its modules).
FORBIDDEN = {
    "summarize": ("collect", "report", "diagnose", "readers", "diagnosis_context", *TOP),
    "diagnose": ("collect", "report", "readers", "diagnosis_context", *TOP),
    "collect": ("diagnose", "report", "readers", "diagnosis_context", *TOP),
    "report": ("collect", *TOP),
    "readers": ("collect", "report", *TOP),
    "diagnosis_context": ("collect", "report", "readers", *TOP),
}
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 350


def _name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def _imports(path: pathlib.Path) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (functions included), relative names."""
    found = imported_modules(path, members=True)  # members: `from package import module`
    return {name.removeprefix("lightning_perf.") for name in found if name.startswith("lightning_perf.")}


def _layer(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_imports_run_downward(path):
    forbidden = FORBIDDEN.get(_layer(_name(path)), ())
    upward = sorted(name for name in _imports(path) if _layer(name) in forbidden)
    assert not upward, f"{_name(path)} imports {upward}, above its layer"


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "rule.py"
    module.write_text("def f():\n    from lightning_perf.report.findings import headline\n")
    assert "report.findings" in _imports(module)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_or_class_outgrows_one_sitting(path):
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            assert node.end_lineno - node.lineno + 1 <= MAX_CLASS_LINES, node.name
