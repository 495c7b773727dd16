"""The status the progress bar shows while an epoch runs (lightning_perf.hooks.live_status), read back from
Lightning's real TQDM and Rich bars."""

from __future__ import annotations

import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from test_phases_fit import Phased

from lightning_perf import PerfCallback
from lightning_perf.hooks.live_status import KEY
from models import TinyModel, trainer


class ReadBar(TQDMProgressBar):
    """Lightning's TQDM bar, keeping what it showed as each training batch ended."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.shown.append(self.train_progress_bar.postfix)


def test_the_tqdm_bar_shows_throughput_wait_phases_and_the_warnings_in_force(tmp_path) -> None:
    bar = ReadBar()
    callback = PerfCallback(max_windows=0, verbose=0)
    run = trainer(
        tmp_path, [callback, bar], max_epochs=2, limit_val_batches=0, log_every_n_steps=4, enable_progress_bar=True
    )
    run.fit(Phased())  # its slow optimizer is a warning from the first epoch on (optimizer_heavy)
    shown = [s for s in bar.shown if s and f"{KEY}=" in s]
    assert shown, bar.shown[-3:]
    assert "samples/s" in shown[0] and "wait " in shown[0] and " opt " in shown[0]
    # The second epoch's bar, under the first epoch's warnings (optimizer_heavy; on a busy machine cpu_contention).
    warned = [f.id for f in callback.findings_for("train", 0) if f.severity in ("warning", "critical")]
    assert warned and all(f"!{rule}" in shown[-1] for rule in warned), (warned, shown[-1])
    assert "get_metrics" not in vars(bar)  # put back at the call's end


class ReadRich(RichProgressBar):
    """Lightning's Rich bar, keeping the metrics its metrics column drew as each training batch ended."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        column = self._metric_component
        self.shown.append(dict(getattr(column, "_metrics", {}) or {}))


def test_the_rich_bar_shows_it_too(tmp_path) -> None:
    pytest.importorskip("rich")
    bar = ReadRich()
    run = trainer(
        tmp_path, [PerfCallback(max_windows=0, verbose=0), bar], log_every_n_steps=2, enable_progress_bar=True
    )
    run.fit(TinyModel(n=32))
    assert any("samples/s" in str(m.get(KEY, "")) for m in bar.shown), bar.shown[-2:]


def test_live_false_and_no_bar_leave_the_bar_alone(tmp_path) -> None:
    bar = ReadBar()
    callbacks = [PerfCallback(max_windows=0, verbose=0, live=False), bar]
    trainer(tmp_path, callbacks, log_every_n_steps=2, enable_progress_bar=True).fit(TinyModel(n=32))
    assert bar.shown and not any(s and f"{KEY}=" in s for s in bar.shown)
    # No bar at all (the tests' default Trainer): the fit runs as before.
    trainer(tmp_path, [PerfCallback(max_windows=0, verbose=0)], log_every_n_steps=2).fit(TinyModel(n=32))
