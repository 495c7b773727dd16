"""A busy machine, for real: two CPU-burning processes beside a Trainer run (tests/busy.py). The callback must
say the machine is busy, first, and not blame the program for it; a real bottleneck is still found."""

from __future__ import annotations

import pytest

from busy import cpu_burners
from lightning_perf import PerfCallback
from models import TinyModel, torch_threads, trainer

pytestmark = pytest.mark.slow


def fit_busy(tmp_path, model: TinyModel, epochs: int = 2) -> PerfCallback:
    perf = PerfCallback(verbose=0)
    with torch_threads(1), cpu_burners():
        trainer(tmp_path, [perf], max_epochs=epochs, limit_val_batches=0).fit(model)
    return perf


def test_a_busy_machine_is_named_first_and_the_program_is_not_blamed(tmp_path):
    # An in-memory dataset and a tiny MLP: nothing in the program to fix.
    perf = fit_busy(tmp_path, TinyModel(n=256, batch_size=8))
    last = perf.findings_for("train", epoch=perf.epochs[-1].epoch)
    assert last and last[0].id == "cpu_contention", last
    assert "The load comes from outside this run" in last[0].advice
    loud = [f.id for f in last[1:] if f.severity != "info"]
    assert loud == [], [(f.id, f.severity, f.title, f.evidence) for f in last]


def test_a_real_data_bottleneck_is_still_found_on_a_busy_machine(tmp_path):
    # 2 ms of sleeping (a disk, the network) per item, 8 items a batch: the wait is not the busy CPUs'. Two
    # epochs of 32 batches: long enough for the workers the advice names to repay their start-up.
    perf = fit_busy(tmp_path / "slow", TinyModel(n=256, batch_size=8, sleep_s=0.002))
    last = {f.id: f for f in perf.findings_for("train", epoch=perf.epochs[-1].epoch)}
    assert last["dataloader_bound"].severity == "critical", last
