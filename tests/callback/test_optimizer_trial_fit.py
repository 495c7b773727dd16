"""optimizer_heavy's advised implementation tried on copies of the run's own optimizer (issue 48, "What is tried"
2): a real Trainer, an Adam over many small parameters on CPU, validated every epoch; the trial's record in the
report, its measurement in the advice, and a training unchanged by it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback
from lightning_perf.cli import main
from models import trainer


class ManySmall(pl.LightningModule):
    """400 parameters of 16 floats and a tiny forward: the update (a loop over 400 tensors) is most of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(16) * 0.1) for _ in range(400))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        return sum((x * w).sum() for w in self.weights[:8]) ** 2 + sum(w.square().sum() for w in self.weights) * 1e-4

    def validation_step(self, batch, batch_idx):
        return self.training_step(batch, batch_idx)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, foreach=False)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(24 * 4, 16, generator=g)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(2 * 4, 16)), batch_size=4)


def fit(tmp_path, **options):
    torch.manual_seed(0)
    model = ManySmall()
    callback = PerfCallback(profile_budget=None, verbose=0, **options)
    # With a validation run each epoch, as real programs have: Lightning sets the gradients to None before it, so
    # the epoch ends with none (the trial steps zeros of their shapes: collect/optimizer_trial.py, Notes 2).
    trainer(tmp_path, [callback], max_epochs=2).fit(model)
    return callback, model


def trial_or_skip(callback: PerfCallback) -> dict:
    """The run's optimizer trial; on a busy machine, where ``cpu_contention`` makes ``optimizer_heavy`` information
    (so its advice is not tried), the test skips, saying so."""
    record = (callback.report["run"].get("advice_trials") or {}).get("optimizer_heavy")
    if record is None:
        busy = [f.title for e in (0, 1) for f in callback.findings_for("train", epoch=e) if f.id == "cpu_contention"]
        if busy:
            pytest.skip(f"busy machine, so optimizer_heavy is information and its advice untried: {busy[0]}")
    return record


def test_fused_adam_is_tried_on_the_runs_own_optimizer_and_leads_the_advice(tmp_path):
    callback, _ = fit(tmp_path)
    record = trial_or_skip(callback)
    assert record is not None and record["untried"] is None and record["setting"] == "fused=True", record
    # 400 tensors stepped one by one against one fused pass: several times faster on any CPU, however loaded.
    assert record["ratio"] >= 2.0, record
    [finding] = [f for f in callback.findings_for("train", epoch=1) if f.id == "optimizer_heavy"]
    assert finding.advice.startswith("Tried on a copy of your optimizer, 30 steps each: with `fused=True`")
    # The page shows the trial's record beside its finding.
    page = Path(callback.page_path).read_text()
    [block] = [b for b in page.split('<div class="finding ') if "</strong> · <code>optimizer_heavy</code>" in b]
    assert "<b>Tried on this run:</b>" in block and "<code>fused=True</code>" in block and "30 x 3" in block


def test_the_trial_leaves_the_training_bit_identical_and_try_advice_false_tries_nothing(tmp_path):
    tried, with_trial = fit(tmp_path / "on")
    untried, without = fit(tmp_path / "off", try_advice=False)
    assert trial_or_skip(tried) is not None
    assert "optimizer_heavy" not in (untried.report["run"].get("advice_trials") or {})
    for a, b in zip(with_trial.parameters(), without.parameters(), strict=True):
        assert torch.equal(a, b)


def test_compare_tells_a_tried_advice_from_an_untried_one(tmp_path, capsys):
    untried, _ = fit(tmp_path / "untried", try_advice=False)
    tried, _ = fit(tmp_path / "tried")
    trial_or_skip(tried)
    shown = [f for f in tried.findings_for("train", epoch=1) if f.id == "optimizer_heavy" and f.severity != "info"]
    busy = [f.title for f in tried.findings_for("train", epoch=1) if f.id == "cpu_contention"]
    if not shown and busy:  # compare lists warnings: a busy machine's last epoch made optimizer_heavy information
        pytest.skip(f"busy machine, so optimizer_heavy is information at the end and compare lists it not: {busy[0]}")
    before, after = os.path.dirname(untried.report_path), os.path.dirname(tried.report_path)
    assert main(["compare", before, after]) == 0
    out = capsys.readouterr().out
    assert re.search(r"findings (?:kept|new): .*optimizer_heavy \[advice tried: \d+\.\d\dx\]", out), out
    assert main(["compare", before, after, "--json"]) == 0
    trials = json.loads(capsys.readouterr().out)["advice_trials"]
    assert trials["before"] == {} and trials["after"]["optimizer_heavy"].startswith("tried: ")
    # A kept or new finding is labelled from the side it is shown from (after), and so is the page's table (new: the
    # busy machine may have made the untried run's finding information, which compare leaves out).
    assert "optimizer_heavy" in json.dumps(trials["after"]) and "optimizer_heavy" not in json.dumps(trials["before"])
    page = tmp_path / "compare.html"
    assert main(["compare", before, after, "--html", str(page)]) == 0
    assert "advice tried (on its side)" in page.read_text() and "tried: " in page.read_text()


def test_a_later_trainer_call_keeps_the_fits_trials(tmp_path):
    # A program that tests or predicts with the fit's Trainer (Lightning's examples do) lost the fit's trial records
    # from the report at that call's setup: the page's "Tried on this run" and compare's labels with them.
    torch.manual_seed(0)
    model, callback = ManySmall(), PerfCallback(profile_budget=None, verbose=0)
    fitted = trainer(tmp_path, [callback], max_epochs=2)
    fitted.fit(model)
    record = trial_or_skip(callback)
    assert record is not None and record["untried"] is None, record
    fitted.validate(model)
    assert callback.report["run"]["advice_trials"]["optimizer_heavy"] == record
    assert json.loads(Path(callback.report_path).read_text())["run"]["advice_trials"]["optimizer_heavy"] == record
