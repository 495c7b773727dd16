"""torch.compile awareness on real Trainer runs with real ``torch.compile`` (the ``aot_eager`` backend: Dynamo and
AOTAutograd as in production, without the C compiler's time): a graph break from ``.item()`` found with its
line, a Python int that changes every batch recompiling until the limit, a clean compiled model with no
finding, and a run without compile that reports nothing about it."""

import gc
import inspect
import json
import logging
import pathlib

import pytest
import torch
from torch import nn

from lightning_perf import PerfCallback
from lightning_perf.collect.compile import GRAPH_BREAK_LOGGER
from models import TinyModel, trainer

NO_WINDOWS = {"batches": [10_000]}  # no profiler window: the numbers are the always-on ones


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: Dynamo's caches and counters are per process."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Forward(TinyModel):
    """TinyModel whose steps call ``self(x)``: what ``torch.compile(model)`` and ``model.compile()`` compile."""

    def forward(self, x):
        return self.net(x)

    def _loss(self, batch, stage):
        x, y = batch
        return nn.functional.binary_cross_entropy_with_logits(self(x), y)


class ItemInForward(Forward):
    def forward(self, x):
        out = self.net(x)
        if out.mean().item() > 100.0:  # a graph break: the value leaves the graph
            out = out * 0.5
        return out


ITEM_LINE = (
    next(i for i, line in enumerate(inspect.getsourcelines(ItemInForward)[0]) if ".item()" in line)
    + inspect.getsourcelines(ItemInForward)[1]
)


class LogsInValidation(Forward):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        loss = self._loss(batch, "validate")
        self.log("val_loss", loss)  # Lightning's log is torch.compiler.disable'd: a graph break here
        return loss


LOG_LINE = (
    next(i for i, line in enumerate(inspect.getsourcelines(LogsInValidation)[0]) if "self.log(" in line)
    + inspect.getsourcelines(LogsInValidation)[1]
)


class DepthPerBatch(Forward):
    """Applies its hidden layer ``1 + batch_idx`` times: a Python int that changes every batch, which Dynamo
    specialises (``range`` of it is unrolled), so every batch recompiles."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hidden = nn.Linear(32, 32)

    def forward(self, x, depth: int = 1):
        h = self.net[1](self.net[0](x))
        for _ in range(depth):
            h = torch.relu(self.hidden(h))
        return self.net[2](h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.binary_cross_entropy_with_logits(self(x, 1 + batch_idx), y)


FORWARD_LINE = inspect.getsourcelines(DepthPerBatch.forward)[1]


def _ids(perf, stage="train"):
    return {f.id: f for f in perf.findings_for(stage)}


def test_a_graph_break_from_item_is_found_with_the_line_that_calls_it(tmp_path):
    perf = PerfCallback(**NO_WINDOWS, stages=["train"])
    trainer(tmp_path, [perf], limit_val_batches=0).fit(torch.compile(ItemInForward(n=16), backend="aot_eager"))
    stats = perf._epochs.compile_stats[("train", 0)]
    assert stats.breaks == 1 and stats.graphs >= 1
    site = stats.break_sites[0]
    assert "item()" in site.reason
    assert site.location is not None and site.location.endswith(f"test_compile.py:{ITEM_LINE}")
    finding = _ids(perf)["compile_graph_breaks"]
    assert finding.severity == "warning"
    assert f"test_compile.py:{ITEM_LINE}" in finding.evidence
    assert "capture_scalar_outputs" in finding.advice
    report = json.loads(pathlib.Path(perf.report_path).read_text())
    entry = report["stages"]["train"]["epochs"][0]["compile"]
    assert entry["breaks"] == stats.breaks and entry["break_sites"][0]["location"] == site.location


def test_a_python_int_that_changes_every_batch_recompiles_to_the_limit_and_is_critical(tmp_path):
    perf = PerfCallback(**NO_WINDOWS, stages=["train"])
    model = DepthPerBatch(n=32)
    model.compile(backend="aot_eager")  # nn.Module.compile: the module's __call__ is compiled
    with torch._dynamo.config.patch(recompile_limit=4):
        trainer(tmp_path, [perf], limit_val_batches=0).fit(model)
    stats = perf._epochs.compile_stats[("train", 0)]
    assert stats.recompiles >= 3 and stats.limit_reached
    assert stats.limit_function == f"forward (tests/callback/test_compile.py:{FORWARD_LINE})"
    assert any("depth" in (r.guard or "") for r in stats.recompile_guards)
    assert {0, 2, 3} <= set(stats.steps)  # the batches that compiled (batch 1: its FLOPs counted, eager)
    finding = _ids(perf)["compile_recompiles"]
    assert finding.severity == "critical"
    assert "depth" in finding.evidence


class Static(TinyModel):
    """A compiled submodule on batches of one shape (2,048 samples, 64 a batch): nothing to recompile for. Wide
    enough for steps of several ms, and enough of them, that a busy machine's jitter does not make them
    unstable."""

    def __init__(self) -> None:
        # 32 batches an epoch: with 16, two slow ones (the suite's earlier tests still settling) made a p90 of 1.64x
        # the median in 1 run of 3 of the suite's first five files, at 5437b28 as after it.
        super().__init__(n=2048, batch_size=64, val_n=128, width=512, depth=3)
        self.net = torch.compile(self.net, backend="aot_eager")


def test_a_clean_compiled_model_gets_no_compile_warning_and_no_unstable_steps(tmp_path):
    perf = PerfCallback(**NO_WINDOWS, stages=["train", "validate"])
    # The suite's own heap (every earlier test's objects) out of the garbage collector's passes: a collection
    # inside one of this run's steps costs in proportion to the test process's heap, nothing of the model's.
    gc.collect()
    gc.freeze()
    try:
        trainer(tmp_path, [perf], max_epochs=2).fit(Static())
    finally:
        gc.unfreeze()
    first, second = (perf._epochs.compile_stats[("train", e)] for e in (0, 1))
    assert first.graphs >= 1 and 0 in first.steps and first.seconds > 0
    assert (second.graphs, second.breaks, second.recompiles, second.steps) == (0, 0, 0, ())
    # The batches that compiled are left out of the epoch's times, as the FLOP-counted batch 1 is.
    train0 = next(e for e in perf.epochs if e.stage == "train" and e.epoch == 0)
    assert train0.profiled_batches == len({*first.steps, 1})
    for stage in ("train", "validate"):
        found = _ids(perf, stage)
        assert not {"compile_graph_breaks", "compile_recompiles"} & set(found), found
        # Steady, but on a busy machine: there the epoch's findings open with cpu_contention (point 1's logic),
        # whose wait may explain a spread (torch's second thread, descheduled, holds up the step unseen).
        for epoch in perf.epochs:
            listed = perf.findings_for(stage, epoch=epoch.epoch) if epoch.stage == stage else []
            busy = bool(listed) and listed[0].id == "cpu_contention"
            loud = listed[0].severity != "info" if busy else False
            unstable = [f for f in listed if f.id == "step_time_unstable"]
            # Named first and loud, it explains a spread; otherwise a spread is at most information: a few steps late
            # in one stretch of the epoch are a scheduler's or a virtual machine host's (a freshly booted 2-CPU VM,
            # nothing else running, read "p90 2.19x the median" here as a warning).
            assert not unstable or unstable[0].severity == "info" or (busy and loud), listed
    report = json.loads(pathlib.Path(perf.report_path).read_text())
    assert [e["compile"]["graphs"] for e in report["stages"]["train"]["epochs"]] == [first.graphs, 0]
    resumed = PerfCallback(**NO_WINDOWS, stages=["train", "validate"])  # from a checkpoint: the report's numbers
    resumed.load_state_dict(json.loads(json.dumps(perf.state_dict())))
    assert resumed._epochs.compile_stats == perf._epochs.compile_stats


def test_a_run_without_compile_reports_nothing_about_it_and_leaves_torch_as_it_was(tmp_path):
    breaks = logging.getLogger(GRAPH_BREAK_LOGGER)
    level, propagate = breaks.level, breaks.propagate
    from torch._dynamo.callback import callback_handler

    callbacks = (list(callback_handler.start_callbacks), list(callback_handler.end_callbacks))
    perf = PerfCallback(**NO_WINDOWS)
    trainer(tmp_path, [perf], max_epochs=2).fit(TinyModel(n=16))
    assert perf._epochs.compile_stats == {}
    report = json.loads(pathlib.Path(perf.report_path).read_text())
    assert not any("compile" in e for stage in report["stages"].values() for e in stage["epochs"])
    assert (breaks.level, breaks.propagate) == (level, propagate)
    assert (list(callback_handler.start_callbacks), list(callback_handler.end_callbacks)) == callbacks


def test_a_break_inside_lightnings_log_is_placed_at_the_users_call_and_advised_as_logging(tmp_path):
    perf = PerfCallback(**NO_WINDOWS, stages=["validate"])
    model = torch.compile(LogsInValidation(n=16, val_n=16), backend="aot_eager")
    trainer(tmp_path, [perf], limit_train_batches=2).fit(model)  # with fit(compiled), Lightning compiles the steps
    stats = perf._epochs.compile_stats[("validate", 0)]
    (site,) = [s for s in stats.break_sites if "lightning `log`" in s.reason]
    assert site.location == f"tests/callback/test_compile.py:{LOG_LINE}"
    finding = _ids(perf, "validate")["compile_graph_breaks"]
    assert f"test_compile.py:{LOG_LINE}" in finding.advice and "on_validation_batch_end" in finding.advice


def test_model_compile_on_a_module_lightning_never_calls_is_found_to_compile_nothing(tmp_path):
    # TinyModel's training_step calls self.net, never self(...): nn.Module.compile() on it compiles nothing.
    model = TinyModel(n=16)
    model.compile(backend="aot_eager")
    perf = PerfCallback(**NO_WINDOWS, stages=["train"])
    trainer(tmp_path, [perf], limit_val_batches=0).fit(model)
    assert perf._epochs.compile_stats == {}
    assert perf.report["run"]["compiled_modules"] == "`LightningModule`"
    finding = _ids(perf)["compile_unused"]
    assert finding.severity == "warning" and "torch.compile(self.net)" in finding.advice
