"""Every training batch split into forward, backward, optimizer and other, from Lightning's hooks, on real
Trainers whose phases cost what they are built to: a sleep in ``training_step`` (forward), in a backward hook
(backward) and in the optimizer's ``step`` (optimizer)."""

from __future__ import annotations

import html
import time
from pathlib import Path

import pytest
import torch

from lightning_perf import PerfCallback
from lightning_perf.collect.phases import PhaseMarks
from lightning_perf.records import MANUAL_NOTE
from models import TinyModel, torch_threads, trainer

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

FORWARD, BACKWARD, OPTIMIZER = 0.040, 0.020, 0.030  # seconds each phase sleeps: a busy machine wakes a sleep late


class SlowSGD(torch.optim.SGD):
    def step(self, closure=None):
        loss = super().step(closure)
        time.sleep(OPTIMIZER)
        return loss


class Phased(TinyModel):
    """Known phases: forward sleeps 40 ms, backward 20 ms (a hook on the first layer), the update 30 ms."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__(n=48, batch_size=4)
        self.automatic_optimization = not manual
        self.net[0].register_full_backward_hook(lambda *_: time.sleep(BACKWARD))

    def training_step(self, batch, batch_idx):
        time.sleep(FORWARD)
        loss = super().training_step(batch, batch_idx)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def configure_optimizers(self):
        return SlowSGD(self.parameters(), lr=0.1)


def fit(tmp_path, model: Phased, **kwargs):
    callback = PerfCallback(max_windows=0, verbose=0)
    # One thread: on a busy 2-CPU machine a parallel operator waits for its second thread's CPU (10-20 ms a
    # forward here); the phases are what is measured, not the machine.
    with torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=1, limit_val_batches=0, **kwargs).fit(model)
    (epoch,) = [e for e in callback.epochs if e.stage == "train"]
    return epoch


def tolerance(epoch) -> float:
    """10% of a share, the issue's figure; 25% where other processes took a CPU or more meanwhile: there each
    sleep wakes late by a time slice, more often in the phase with more Python after its sleep (forward)."""
    busy = (epoch.other_cpu_load or 0.0) >= 1.0
    return 0.25 if busy else 0.1


def shares(epoch) -> dict[str, float]:
    """Each phase's share of the median batch's (sum of the medians: a busy machine's late wake-ups are outliers)."""
    medians = {name: getattr(epoch, f"{name}_p50") for name in ("forward", "backward", "optimizer", "other")}
    return {name: value / sum(medians.values()) for name, value in medians.items()}


def test_each_phase_is_within_a_tenth_of_its_known_share(tmp_path) -> None:
    epoch = fit(tmp_path, Phased())
    got = shares(epoch)
    total = FORWARD + BACKWARD + OPTIMIZER
    for name, known in (("forward", FORWARD), ("backward", BACKWARD), ("optimizer", OPTIMIZER)):
        assert got[name] == pytest.approx(known / total, rel=tolerance(epoch)), (name, got)
    assert sum(got.values()) == pytest.approx(1.0)
    assert epoch.forward_p50 == pytest.approx(FORWARD, rel=0.25) and epoch.forward_p90 >= epoch.forward_p50
    assert epoch.optimizer_p50 == pytest.approx(OPTIMIZER, rel=0.25)


def test_with_accumulation_only_the_stepping_batches_have_an_optimizer_step(tmp_path) -> None:
    epoch = fit(tmp_path, Phased(), accumulate_grad_batches=2)
    # Half the batches step the optimizer: those take its whole update, the others none (their zero_grad is a
    # fraction of a millisecond), so the 90th-percentile batch's is the update and the epoch's about half of all
    # batches' at that pace. Absolute times get the same 25% as the first test's (a sleep wakes late on a machine
    # whose other work is not ours to count); shares get the 10%.
    assert epoch.optimizer_p90 == pytest.approx(OPTIMIZER, rel=0.25)
    assert 0.4 <= epoch.optimizer_time / (epoch.measured_batches * epoch.optimizer_p90) <= 0.6
    assert epoch.backward_p50 == pytest.approx(BACKWARD, rel=0.25)
    assert epoch.forward_p50 == pytest.approx(FORWARD, rel=0.25)
    got = shares(epoch)
    assert got["forward"] / got["backward"] == pytest.approx(FORWARD / BACKWARD, rel=2 * tolerance(epoch))


def test_manual_optimization_is_split_by_the_hooks_lightning_still_calls(tmp_path) -> None:
    epoch = fit(tmp_path, Phased(manual=True))
    got = shares(epoch)
    total = FORWARD + BACKWARD + OPTIMIZER
    for name, known in (("forward", FORWARD), ("backward", BACKWARD), ("optimizer", OPTIMIZER)):
        assert got[name] == pytest.approx(known / total, rel=tolerance(epoch)), (name, got)


def test_other_stages_have_no_split(tmp_path) -> None:
    callback = PerfCallback(max_windows=0, verbose=0)
    trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=4).fit(TinyModel(n=64))
    validation = [e for e in callback.epochs if e.stage == "validate"]
    assert validation and all(e.forward_time is None and e.optimizer_p50 is None for e in validation)
    assert next(e for e in callback.epochs if e.stage == "train").backward_time > 0


def test_a_subclassed_optimizer_is_timed_to_its_own_steps_end_after_its_base_class_was_used(tmp_path) -> None:
    # torch wraps a class's `step` for its hooks at its first instance: once plain SGD was used, SlowSGD's
    # `super().step()` runs the post-hooks too, before SlowSGD's own sleep.
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    epoch = fit(tmp_path, Phased())
    assert epoch.optimizer_p50 == pytest.approx(OPTIMIZER, rel=0.25) and epoch.other_p50 < 0.005


def test_a_slow_optimizer_is_found_on_every_batch_without_any_profiler_window(tmp_path) -> None:
    callback = PerfCallback(max_windows=0, verbose=0)
    with torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0).fit(Phased())
    found = [f for f in callback.findings_for("train") if f.id == "optimizer_heavy"]
    assert found and found[-1].window is None and not callback.windows
    assert "of each training step over" in found[-1].evidence


def test_every_mark_reaches_the_clock(tmp_path, monkeypatch) -> None:
    # Each of the hooks of a batch's phases is called on the callback (none overridden away by another of its
    # hooks, each bound to the marks it was made with): the marks of the last batch, in Lightning's order, then
    # the optimizer's post-hook.
    seen = []
    mark = PhaseMarks.mark
    monkeypatch.setattr(PhaseMarks, "mark", lambda self, name, *_: (seen.append(name), mark(self, name)))
    callback = PerfCallback(max_windows=0, verbose=0)
    with torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=2, limit_val_batches=0).fit(Phased())
    # (no "optimizer" mark: the torch optimizer's post-hook marks the step's end, phases Notes 3)
    assert seen[:4] == ["zero_grad", "backward", "after_backward", "step_end"]


class Watched(TinyModel):
    """Records, at each training batch's start (after the callbacks'), whether Lightning will dispatch the
    callback's ``on_before_optimizer_step``, and whether a FLOP count is under way."""

    def __init__(self, callback: PerfCallback) -> None:
        super().__init__(n=64, batch_size=4)
        self.callback = callback
        self.seen: list[tuple[bool, bool]] = []

    def on_train_batch_start(self, batch, batch_idx):
        self.seen.append((callable(self.callback.on_before_optimizer_step), self.callback._flops.active))


def test_the_optimizer_step_hook_is_dispatched_only_where_it_has_work(tmp_path) -> None:
    # The optimizer's post-hook marks every step's end, so Lightning dispatches on_before_optimizer_step to the
    # callback only on the batches whose FLOP count it ends (stage_hooks, Notes 1): and that count still ends at the
    # step (its FLOPs are the batch's forward and backward, not the update's).
    callback = PerfCallback(max_windows=0, verbose=0, peak_flops=1e12)  # asked for MFU: a count is made
    model = Watched(callback)
    with torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0).fit(model)
    assert [dispatched for dispatched, _ in model.seen] == [counting for _, counting in model.seen]
    assert 1 <= sum(counting for _, counting in model.seen) < len(model.seen) / 4
    assert callback._flops.counts and callable(callback.on_before_optimizer_step)  # the fit's end put it back


def test_a_fit_that_measures_no_training_dispatches_no_mark_hook(tmp_path) -> None:
    callback = PerfCallback(stages=["validate"], max_windows=0, verbose=0)
    assert callback.on_before_backward is None and callback.on_after_backward is None
    with torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=4, limit_val_batches=2).fit(TinyModel())
    assert [e.stage for e in callback.epochs] == ["validate"]


def test_a_subclass_keeps_its_own_mark_and_step_hooks(tmp_path) -> None:
    # Hooks a subclass overrides are not replaced on the instance; their super() still marks.
    called = []

    class Own(PerfCallback):
        def on_before_backward(self, trainer, pl_module, loss):
            called.append("backward")
            super().on_before_backward(trainer, pl_module, loss)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            called.append("step")
            super().on_before_optimizer_step(trainer, pl_module, optimizer)

    callback = Own(max_windows=0, verbose=0)
    with torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=6, limit_val_batches=0).fit(Phased())
    assert called.count("backward") == called.count("step") == 6
    (epoch,) = [e for e in callback.epochs if e.stage == "train"]
    assert epoch.backward_p50 is not None and epoch.backward_p50 > BACKWARD / 2


@pytest.mark.parametrize("manual", [True, False])
def test_manual_optimization_says_what_its_phases_cannot_split(tmp_path, caplog, manual) -> None:
    # Issue 49: "manual optimization reports what its hooks allow and says what it cannot split": beside the
    # phases, on the epoch line and the page; perf_report.json's run says which.
    callback = PerfCallback(max_windows=0)
    with caplog.at_level("INFO"), torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=4, limit_val_batches=0).fit(Phased(manual))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("lightning-perf | train epoch 0"))
    assert (MANUAL_NOTE in line) is manual and "p50 forward" in line, line
    assert callback.report["run"]["manual_optimization"] is manual
    page = Path(callback.page_path).read_text()
    assert (html.escape(MANUAL_NOTE) in page) is manual
