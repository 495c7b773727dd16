"""Every code block of the README and the site is run here, or marked as not run with a reason.

Python blocks run page by page, in order, in one namespace per page (a later block may use what an earlier one
made), in a temporary directory. The namespace starts with what the pages take as given: ``model`` (a tiny
LightningModule from tests/models.py), and ``Trainer`` and ``PerfCallback``, which Getting started imports once.
YAML blocks are LightningCLI configs: each configures ``examples/cli.py`` for a short fit, in process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lightning.pytorch import Trainer
from markdown_blocks import PAGES, ROOT, SHOWN, Block, all_blocks, blocks

from cli_example import cli_example
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
# Lightning 2.6's cli.py still calls jsonargparse APIs deprecated in jsonargparse 4.49: theirs, not ours.
@pytest.mark.filterwarnings("ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning")
@pytest.mark.parametrize("block", _yaml_blocks(), ids=lambda block: block.where)
def test_yaml_blocks_configure_lightning_cli(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(block.code)
    fit = [
        *("fit", "--config", str(config), "--trainer.max_epochs=1", "--trainer.limit_train_batches=8"),
        *("--trainer.limit_val_batches=4", f"--trainer.default_root_dir={tmp_path}"),
    ]
    # In process, as `python examples/cli.py fit ...` runs it (a process of its own spent 7-11 s importing Lightning).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "examples" / "cli.py")])  # LightningCLI warns of pytest's own
    cli_example().main(fit)
    assert list(tmp_path.rglob("perf_report.json")), f"{block.where}: the fit wrote no perf_report.json"
