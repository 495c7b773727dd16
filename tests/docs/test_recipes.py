"""Each recipe of docs/libraries.md runs as a user would run it: the library's own model and data, the callback
wired in as the page says, one short fit (and pytorch-forecasting's forecasts). The page includes these files
(examples/recipes/), so what it shows is what runs here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_blocks import ROOT

RECIPES = ROOT / "examples" / "recipes"
LIBRARIES = ROOT / "docs" / "libraries.md"


def run_recipe(name: str, root: Path) -> tuple[str, dict]:
    """Runs ``examples/recipes/<name>.py --root root``; its output and the report its ``report:`` line names."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run(
        [sys.executable, str(RECIPES / f"{name}.py"), "--root", str(root)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    match = re.search(r"^report: (.+)$", result.stdout, re.MULTILINE)
    assert match, output[-3000:]
    return output, json.loads(Path(match.group(1)).read_text())


def per_batch(report: dict) -> list[float]:
    """Each training epoch's samples per batch (``samples`` counts the batches outside profiler windows)."""
    epochs = report["stages"]["train"]["epochs"]
    assert len(epochs) == 2
    return [e["samples"] / (e["batches"] - e["profiled_batches"]) for e in epochs]


def test_the_page_shows_every_recipe_file_and_each_file_has_its_test() -> None:
    page = LIBRARIES.read_text()
    included = set(re.findall(r'--8<-- "examples/recipes/(\w+)\.py', page))
    files = {p.stem for p in RECIPES.glob("*.py")}
    assert included == files
    tested = set(re.findall(r'run_recipe\("(\w+)"', Path(__file__).read_text()))
    assert tested == files


@pytest.mark.slow
def test_pytorch_forecasting_fit_and_forecasts(tmp_path: Path) -> None:
    output, report = run_recipe("forecasting", tmp_path)
    for samples in per_batch(report):
        # A TimeSeriesDataSet batch is (x: dict, (target, weight)): 32 samples, the last batch fewer.
        assert 16 < samples <= 32
    # Each tft.predict() builds a Trainer; configure_callbacks gave it a callback, which wrote its report.
    predicted = json.loads((tmp_path / "predict_perf" / "perf_report.json").read_text())
    assert predicted["stages"]["predict"]["epochs"][0]["batches"] > 0
    assert "forecast: (" in output  # the library's own prediction callback still ran
    # The user made the loaders (`to_dataloader`) and passed them in; the library's model built the optimizer.
    loader = report["run"]["dataloaders"]["train"]
    assert (loader["dataset_library"], loader["built_by"], loader["builder"]) == ("pytorch_forecasting", None, None)
    built = report["run"]["optimizer_info"]
    assert (built["built_by"], built["builder"]) == ("pytorch_forecasting", "BaseModel.configure_optimizers")


@pytest.mark.slow
def test_darts_gets_its_callback_through_pl_trainer_kwargs(tmp_path: Path) -> None:
    output, report = run_recipe("darts_rnn", tmp_path)
    for samples in per_batch(report):
        assert 16 < samples <= 32  # batches of 32 windows of the series, the last one fewer
    # darts builds its Trainer without a logger: the output goes beside its checkpoints, and the console says so.
    assert (tmp_path / "sine" / "checkpoints").is_dir() and (tmp_path / "sine" / "perf" / "report.html").is_file()
    assert "lightning-perf: output in " in output
    # darts builds the loaders inside `fit` (passed to the Trainer) and the optimizer in its module's hook.
    assert report["run"]["dataloaders"]["train"]["dataset_library"] == "darts"
    built = report["run"]["optimizer_info"]
    assert (built["built_by"], built["builder"]) == ("darts", "PLForecastingModule.configure_optimizers")


@pytest.mark.slow
def test_transformers_counts_tokens_with_batch_size_fn(tmp_path: Path) -> None:
    _, report = run_recipe("transformers_bert", tmp_path)
    for samples in per_batch(report):
        # 16 sequences of 8-32 tokens a batch: the tokens are counted, not the sequences.
        assert 8 * 16 <= samples <= 32 * 16


@pytest.mark.slow
def test_pyg_counts_graphs(tmp_path: Path) -> None:
    _, report = run_recipe("pyg_gcn", tmp_path)
    assert per_batch(report) == [16, 16]  # 160 graphs in batches of 16: graphs are counted, not nodes
