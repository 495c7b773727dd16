"""Every code block of the README and the site is run here, or marked as not run with a reason.

Python blocks run page by page, in order, in one namespace per page (a later block may use what an earlier one
made), in a temporary directory. The namespace starts with what the pages take as given: ``model`` (a tiny
LightningModule from tests/models.py), and ``Trainer`` and ``PerfCallback``, which Getting started imports once.
YAML blocks are LightningCLI configs: each configures ``examples/cli.py`` for a short fit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch import Trainer
from markdown_blocks import PAGES, ROOT, SHOWN, Block, all_blocks, blocks

from lightning_perf import PerfCallback
from models import TinyModel

#: The languages the suite runs; a block of any other language (bash, json) says why it is not run.
RUN = frozenset({"python", "yaml"})


def test_every_block_names_its_language() -> None:
    unnamed = [block.where for block in all_blocks() if not block.language]
    assert not unnamed, f"code blocks without a language (```text for output): {unnamed}"


def test_every_block_is_run_or_says_why_not() -> None:
    silent = [
        f"{block.where} ({block.language})"
        for block in all_blocks()
        if block.language not in SHOWN | RUN and not (block.not_run or "").strip()
    ]
    assert not silent, f"blocks neither run nor marked <!-- not run: REASON -->: {silent}"


def _pages_with(language: str) -> list[Path]:
    return [page for page in PAGES if any(b.language == language and b.not_run is None for b in blocks(page))]


@pytest.mark.parametrize("page", _pages_with("python"), ids=lambda page: page.name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__", "model": TinyModel(), "Trainer": Trainer, "PerfCallback": PerfCallback}
    for block in blocks(page):
        if block.language == "python" and block.not_run is None:
            exec(compile(block.code, block.where, "exec"), namespace)


def _yaml_blocks() -> list[Block]:
    unique: dict[str, Block] = {}
    for block in all_blocks():
        if block.language == "yaml" and block.not_run is None:
            unique.setdefault(block.code, block)
    return list(unique.values())


@pytest.mark.slow
@pytest.mark.parametrize("block", _yaml_blocks(), ids=lambda block: block.where)
def test_yaml_blocks_configure_lightning_cli(block: Block, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(block.code)
    fit = [
        *("fit", "--config", str(config), "--trainer.max_epochs=1", "--trainer.limit_train_batches=8"),
        *("--trainer.limit_val_batches=4", f"--trainer.default_root_dir={tmp_path}"),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cli.py"), *fit],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, f"{block.where}: {result.stderr[-3000:]}"
    assert list(tmp_path.rglob("perf_report.json")), f"{block.where}: the fit wrote no perf_report.json"
