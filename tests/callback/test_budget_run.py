"""The profiling budget in a real Trainer run (issue 26): a stage's first window opens as planned, a later one
only while the measured cost leaves room, said once; a plan of the user's keeps its meaning; the report and the
console's last line carry the run's profiling share. The budget's own logic: tests/test_budget.py."""

from __future__ import annotations

import json
import logging
import re

import lightning.pytorch as pl
import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.cli import main
from lightning_perf.collect.threads import usable_cpus
from models import TinyModel, trainer


def fit(tmp_path, callback: PerfCallback, epochs: int = 4) -> dict:
    # Epochs of 16 batches of a millisecond or two: a window (its close, its profiled batches, its processing: 10-20
    # ms) costs far more than 0.2% of such a run (under a second), on an idle machine or a busy one.
    trainer(tmp_path, [callback], max_epochs=epochs, limit_val_batches=0).fit(TinyModel(n=64, batch_size=4))
    with open(callback.report_path) as f:
        return json.load(f)


def test_later_windows_wait_for_the_budget_and_the_skip_is_said_once(tmp_path, caplog, capsys):
    # 0.2%, not the default's 2%: a tiny model's windows cost less than 2% of such a run where it is slowed by a
    # busy machine (its trace processed on a thread in a few ms), and the budget then had room for a second one.
    callback = PerfCallback(stages=["train"], profile_budget=0.002)
    with caplog.at_level(logging.INFO):
        report = fit(tmp_path, callback)
    assert [w["epoch"] for w in report["windows"]] == [0]  # the first opens as planned; no room after it
    profiling = report["run"]["profiling"]
    assert profiling["budget"] == 0.002 and profiling["windows"] == 1 and profiling["skipped"] == 3
    assert profiling["seconds"] > 0 and profiling["share"] == pytest.approx(
        profiling["seconds"] / profiling["run_seconds"]
    )
    cost = report["windows"][0]["cost_seconds"]
    assert cost >= report["windows"][0]["close_seconds"] > 0 and cost <= profiling["seconds"]
    messages = [r.getMessage() for r in caplog.records]
    skipped = [m for m in messages if "window was skipped to keep profiling within profile_budget=0.2%" in m]
    assert len(skipped) == 1, skipped
    ends = [m for m in messages if "lightning-perf: report" in m]
    assert ends and ends[-1].splitlines()[-1].startswith("lightning-perf: profiling cost ")
    # The FLOP count waited for the first window, then for room that never came: none, said on the last line.
    assert "1 window; 3 skipped and the FLOP count held back for the budget (0.2%)" in ends[-1].splitlines()[-1]
    assert profiling["flops_held"] is True and "flops" not in report["run"]
    assert [e["profiled_batches"] for e in report["stages"]["train"]["epochs"]][1:] == [0, 0, 0]  # none counted
    with open(callback.page_path, encoding="utf-8") as f:
        page = f.read()
    assert re.search(r"its cost to the run \(close, slowed batches, processing\)</td><td>[\d.]+ m?s</td>", page)
    assert "held the FLOP count back" in page
    assert main(["report", str(tmp_path)]) == 0  # read back from perf_report.json
    assert "3 skipped and the FLOP count held back for the budget (0.2%)\n" in capsys.readouterr().out


def test_a_longer_run_counts_its_flops_once_the_budget_has_room(tmp_path):
    """The same run, with a budget that leaves room after the first window: its FLOPs are counted, once."""
    report = fit(tmp_path, PerfCallback(stages=["train"], profile_budget=0.9))
    profiling = report["run"]["profiling"]
    assert profiling["flops_held"] is False and len(report["run"]["flops"]["counted"]) == 1
    epochs = report["stages"]["train"]["epochs"]
    assert all(e["flops_per_batch"] for e in epochs)  # counted in epoch 0 ...
    assert epochs[0]["steps"]["profiled"][0][0] == 5  # ... after its window (warm-up 5, batch 6), not at batch 1


def test_a_schedule_of_the_users_opens_every_planned_window(tmp_path):
    report = fit(tmp_path, PerfCallback(stages=["train"], schedule={"skip_first": 2, "active": 2}))
    assert [w["epoch"] for w in report["windows"]] == [0, 1, 2, 3]
    assert report["run"]["profiling"]["budget"] is None and report["run"]["profiling"]["skipped"] == 0


def test_a_schedule_of_the_users_with_a_budget_keeps_to_it(tmp_path):
    report = fit(tmp_path, PerfCallback(stages=["train"], batches=[3, 4], profile_budget=0.01))
    assert [w["epoch"] for w in report["windows"]] == [0] and report["run"]["profiling"]["skipped"] == 3


def test_a_generous_budget_opens_every_planned_window(tmp_path):
    report = fit(tmp_path, PerfCallback(stages=["train"], profile_budget=1.0))
    assert [w["epoch"] for w in report["windows"]] == [0, 1, 2, 3]
    assert all(w["cost_seconds"] >= w["close_seconds"] for w in report["windows"])


class ThreadsSeen(pl.Callback):
    """torch's thread count at each training batch's start, by epoch and batch."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], int] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen[trainer.current_epoch, batch_idx] = torch.get_num_threads()


@pytest.mark.parametrize("deterministic", [False, True])
def test_training_leaves_a_cpu_to_the_window_process_while_it_works(tmp_path, deterministic, monkeypatch):
    # On a machine whose CPUs torch's threads all take, a parallel operator waits for the thread the window process
    # displaces (collect/threads.py): training runs one thread fewer from a window's close until its processing is
    # done, but records each window, and ends, with its own count. Not where algorithms are deterministic.
    cpus = usable_cpus()
    if cpus < 2:
        pytest.skip("one usable CPU: there is no thread to give up")
    monkeypatch.setattr("lightning_perf.hooks.window_process.HERE_BYTES", 0)  # every trace goes to the process
    before = torch.get_num_threads()
    torch.set_num_threads(cpus)
    seen = ThreadsSeen()
    # Windows of batch 1 and batch 3, warmed up in batches 0 and 2: batch 2 starts while the first is processed.
    schedule = {"skip_first": 0, "wait": 0, "warmup": 1, "active": 1, "repeat": 2}
    try:
        trainer(
            tmp_path,
            [PerfCallback(schedule=schedule, stages=["train"]), seen],
            limit_val_batches=0,
            deterministic=deterministic,
        ).fit(TinyModel(n=64, batch_size=4))
        after = torch.get_num_threads()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)
    lowered = cpus if deterministic else cpus - 1
    assert [seen.seen[0, b] for b in range(5)] == [cpus, cpus, cpus, cpus, lowered]
    assert after == cpus
