"""Each bottleneck a CPU can show, provoked for real with a Trainer, and the finding that names it; and a
well-tuned run that gets no warning."""

import os
import re
import subprocess
import sys
import time

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, TensorDataset

from busy import QUIET_CPUS, others_cpus
from lightning_perf import PerfCallback
from lightning_perf.hooks.stage_measure import say
from models import Leaky, TinyModel, release_freed_memory, trainer

WINDOW = {"skip_first": 1, "warmup": 1, "active": 2}  # one 2-batch window per epoch, early


def _ids(callback, stage="train", severities=("warning", "critical")):
    return {f.id for f in callback.findings_for(stage) if f.severity in severities}


class Tuned(TinyModel):
    """Compute-bound: an in-memory TensorDataset read a whole batch per indexing op (a BatchSampler and
    ``batch_size=None``: no per-item fetch and collate), a few ms of matmuls per batch; validation a
    fraction of training."""

    def __init__(self, **kwargs):
        super().__init__(width=1024, depth=4, **kwargs)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2048, 16, generator=g)
        self.data = TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, foreach=True)

    def _batched(self, dataset, batch_size):
        sampler = BatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=False)
        return DataLoader(dataset, sampler=sampler, batch_size=None)

    def train_dataloader(self):
        return self._batched(self.data, 64)

    def val_dataloader(self):
        return self._batched(TensorDataset(*self.data[:256]), 256)


def test_a_well_tuned_run_gets_no_warning(tmp_path, one_thread):
    # One intra-op thread: two threads on this shared 2-core machine make step times jitter now and then,
    # which step_time_unstable rightly reports. (cpu_threads then says so, as `info`.)
    callback = PerfCallback(schedule=WINDOW)
    trainer(tmp_path, [callback], max_epochs=2, log_every_n_steps=50).fit(Tuned())
    for stage in ("train", "validate"):
        # On a busy machine (other processes beside the suite) the machine itself is the one warning, and it is
        # earned: the thread waited for a CPU a tenth of the time or more (over the epoch, or over its latest
        # epochs where it had too few batches of its own).
        busy = [f for f in callback.findings_for(stage) if f.id == "cpu_contention"]
        assert all(int(re.search(r"waited for a CPU (\d+)%", f.title)[1]) >= 10 for f in busy), busy
        bad = [f for f in callback.findings_for(stage) if f.severity != "info" and f.id != "cpu_contention"]
        assert not bad, bad
    diagnosed = sorted((e["stage"], e["epoch"]) for s in callback.report["stages"].values() for e in s["epochs"])
    assert diagnosed == [("train", 0), ("train", 1), ("validate", 0), ("validate", 1)]  # both stages, every epoch


# Stops the process it is given for 40 ms at each byte on its stdin, after saying so (a byte on its stdout): as a
# virtual machine's host takes the vCPU (steal time), with no wait in the run queue for the run to see.
_STOPPER = """
import os, signal, sys, time
pid = int(sys.argv[1])
while sys.stdin.buffer.read(1):
    sys.stdout.buffer.write(b"x"); sys.stdout.flush()
    os.kill(pid, signal.SIGSTOP); time.sleep(0.04); os.kill(pid, signal.SIGCONT)
"""
BURST = range(12, 17)  # the training batches of epoch 0 the host stops


class HostBurst(Callback):
    """Has the run stopped for 40 ms in each of five neighbouring training batches of epoch 0 (:data:`_STOPPER`):
    one burst, whatever the step's length."""

    def __init__(self):
        self.stopper = None

    def on_train_start(self, trainer, pl_module):
        args = [sys.executable, "-c", _STOPPER, str(os.getpid())]
        self.stopper = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == 0 and batch_idx in BURST:
            self.stopper.stdin.write(b"x")
            self.stopper.stdin.flush()
            self.stopper.stdout.read(1)  # the stop comes now, in this batch

    def close(self):
        if self.stopper is not None:
            self.stopper.kill()
            self.stopper.wait()


def test_a_burst_of_the_host_taking_the_cpu_is_no_unstable_step_warning(tmp_path, one_thread):
    # A freshly booted 2-CPU VM, nothing else running: clean runs read "p90 2.19x the median" and "p90 1.57x" as
    # warnings. The host stopping the run in one burst slows a few neighbouring steps: information, not a warning.
    callback, burst = PerfCallback(schedule=WINDOW, stages=["train"]), HostBurst()
    try:
        trainer(tmp_path, [callback, burst], max_epochs=1, limit_val_batches=0).fit(Tuned())
    finally:
        burst.close()
    unstable = [f for f in callback.findings_for("train", epoch=0) if f.id == "step_time_unstable"]
    assert all(f.severity == "info" for f in unstable), unstable
    # The burst was measured: the slow steps are in the epoch's p90 (it reads as a spread, at information).
    epoch = next(e for e in callback.epochs if e.stage == "train")
    assert epoch.step_time_max >= 0.04, epoch


def test_slow_dataset_is_dataloader_bound_and_the_advice_is_about_workers(tmp_path):
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    # Three epochs of 24 batches: enough for workers to repay their start-up, which the advice weighs.
    trainer(tmp_path, [callback], max_epochs=3, limit_val_batches=0).fit(TinyModel(n=96, sleep_s=0.005))
    [finding] = [f for f in callback.findings if f.id == "dataloader_bound"]
    # critical on an idle machine (70% wait); on a busy one, the part off the CPU may be just below it.
    assert finding.severity in ("warning", "critical") and "num_workers" in finding.advice, finding
    assert finding.window == f"train-epoch{finding.epoch:03d}-batches0002-0003"


class TinyOps(TinyModel):
    def training_step(self, batch, batch_idx):
        x = batch[0][:1, :1]
        for _ in range(1500):  # a Python loop of tiny tensor ops: thousands of dispatches per step
            x = x * 1.0001 + 0.0001
        return super().training_step(batch, batch_idx) + 0 * x.sum()


def test_a_step_full_of_tiny_ops_is_launch_bound(tmp_path, one_thread):
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    # Two epochs, two windows: about half of each step is in the loop's operators, 30% fires; a window that a
    # loaded machine slows down (a descheduled operator is no tiny one) leaves the other.
    trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=0).fit(TinyOps(n=32))
    [finding, *_] = [f for f in callback.findings_for("train") if f.id == "launch_bound"]
    assert re.fullmatch(r"Training spends \d+% of each step in [\d,]+ tiny operators", finding.title), finding.title
    assert "outside the DataLoader" in finding.evidence and "Vectorize" in finding.advice


class PerSampleTransforms(Dataset):
    """Items built by a chain of tiny tensor operations each (a per-sample transform), which run in the
    training process with ``num_workers=0``: hundreds of operators per batch inside the DataLoader."""

    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i]
        for _ in range(8):
            x = (x - 0.1) * 1.01
        return x, (x.sum(0, keepdim=True) > 0).float()


class TransformedInputsWideStep(TinyModel):
    """A step of large matrix multiplications, fed by :class:`PerSampleTransforms`."""

    def __init__(self) -> None:
        super().__init__(n=128, batch_size=32)
        self.wide = nn.Linear(512, 512)

    def training_step(self, batch, batch_idx):
        wide = torch.tanh(self.wide(torch.randn(256, 512)))
        return super().training_step(batch, batch_idx) + 0 * wide.mean()

    def train_dataloader(self):
        return DataLoader(PerSampleTransforms(self.n), batch_size=self.batch_size)


def test_tiny_operators_inside_the_dataloader_do_not_make_the_step_launch_bound(tmp_path, one_thread):
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    trainer(tmp_path, [callback], limit_val_batches=0).fit(TransformedInputsWideStep())
    [window] = callback.windows
    # Thousands of short operators per step, nearly all of them the per-sample transforms'...
    assert window.summary.ops_per_step > 1000 and window.summary.median_op_time < 20e-6
    # ...but the step's own operators are few and long.
    assert window.summary.tiny_ops_per_step < 100
    assert "launch_bound" not in _ids(callback)


class HeavyValidation(Tuned):
    def val_dataloader(self):
        return DataLoader(self.data, batch_size=16)  # the whole data set, item by item, in small batches


def test_a_heavy_validation_set_is_validation_heavy(tmp_path):
    callback = PerfCallback(schedule=WINDOW)
    trainer(tmp_path, [callback], limit_train_batches=10).fit(HeavyValidation())
    assert "validation_heavy" in _ids(callback, "train")


class ManySmallParameters(TinyModel):
    def __init__(self):
        super().__init__(n=64)
        self.many = nn.ParameterList(nn.Parameter(torch.zeros(4)) for _ in range(400))

    def training_step(self, batch, batch_idx):
        extra = torch.stack(list(self.many)).sum() * 0
        return super().training_step(batch, batch_idx) + extra

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3, foreach=False)  # one kernel per parameter and op


def test_a_single_tensor_optimizer_over_many_parameters_is_optimizer_heavy(tmp_path):
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    trainer(tmp_path, [callback], limit_val_batches=0).fit(ManySmallParameters())
    [finding] = [f for f in callback.findings if f.id == "optimizer_heavy"]
    assert "foreach" in finding.advice or "fused" in finding.advice


class SleepyCallback(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(0.01)


def test_a_callback_that_sleeps_is_framework_overhead(tmp_path, one_thread):
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    # Before PerfCallback in the list: its sleep is inside the batch's hooks, as a slow logger would be.
    trainer(tmp_path, [SleepyCallback(), callback], limit_val_batches=0).fit(Tuned())
    if "cpu_contention" in _ids(callback):
        # The rule counts only what is beyond the thread's wait for a CPU, and a busy machine's wait can be as long
        # as the sleep: a documented limit (docs/findings.md#framework_overhead).
        pytest.skip("the machine was busy: its wait for a CPU may hold the sleep's time")
    assert "framework_overhead" in _ids(callback)


def test_a_leaking_module_shows_memory_growth(tmp_path):
    callback = PerfCallback(max_windows=0, stages=["train"])
    release_freed_memory()  # memory earlier tests freed would absorb the module's growth
    trainer(tmp_path, [callback], max_epochs=4, limit_val_batches=0).fit(Leaky())
    assert "memory_growth" in _ids(callback)


class PeriodicStall(TinyModel):
    def training_step(self, batch, batch_idx):
        if batch_idx % 8 == 7:
            time.sleep(0.1)  # a stall every 8 batches: a checkpoint, a sync, a GC pause
        return super().training_step(batch, batch_idx)


def test_periodic_stalls_make_step_time_unstable(tmp_path, one_thread):
    callback = PerfCallback(max_windows=0, stages=["train"])
    # 80 batches, 10 stalls of 0.1 s on steps of several ms: a busy machine's stray delays (a scheduler slice or a
    # few, 4-12 ms) are no spike (>= 3x the median) of such steps; on a 1 ms step they were, as many as the stalls.
    trainer(tmp_path, [callback], limit_val_batches=0).fit(PeriodicStall(n=320, width=512, depth=4))
    [finding] = [f for f in callback.findings if f.id == "step_time_unstable"]
    assert "8" in finding.evidence  # the period of the stalls
    assert finding.title == "Training stalls every 8 batches"


class TenthStall(TinyModel):
    def training_step(self, batch, batch_idx):
        # Steps of 125 ms, off the CPU (a busy machine delays a sleeping step little), 60 ms more every 10th batch:
        # under 1.5x the step, no spike (3x) and no spread (p90 1.48x the median).
        time.sleep(0.125 + (0.06 if batch_idx % 10 == 9 else 0.0))
        return super().training_step(batch, batch_idx)


def test_a_stall_every_10th_batch_under_the_spread_is_found_by_its_position(tmp_path):
    callback = PerfCallback(max_windows=0, stages=["train"])
    # 80 batches: 8 cycles, over which the 10th position stands out of a busy machine's delays at other positions.
    others = others_cpus(lambda: trainer(tmp_path, [callback], limit_val_batches=0).fit(TenthStall(n=320)))
    found = [f for f in callback.findings if f.id == "step_time_unstable"]
    if not found and others > QUIET_CPUS:
        # Other programs' preemptions at other positions (tens of ms each) can outweigh the 10th position's 60 ms.
        pytest.skip(f"no cadence found while other programs used {others:.1f} CPUs: a busy machine")
    [finding] = found
    assert finding.title == "Training stalls every 10 batches" and finding.severity == "warning", finding
    assert "every 10 batches (at batches 9, 19, 29, 39, 49, 59, 69, 79) a step" in finding.evidence, finding


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs at least 2 CPUs")
def test_one_intra_op_thread_on_a_compute_bound_cpu_run_is_cpu_threads(tmp_path, one_thread):
    callback = PerfCallback(max_windows=0, stages=["train"])
    trainer(tmp_path, [callback], limit_val_batches=0).fit(Tuned())
    assert "cpu_threads" in _ids(callback, severities=("info", "warning", "critical"))


def test_findings_reach_tensorboard_the_console_and_the_report(tmp_path, caplog):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    with caplog.at_level("INFO"):
        t = trainer(tmp_path, [callback], max_epochs=3, limit_val_batches=0)
        # Long enough for the workers the advice names to pay, and for epoch 0 to keep 8 measured batches beside
        # its window, its FLOP count and the batches while the window is processed (14-20 of 24 left out).
        t.fit(TinyModel(n=192, sleep_s=0.005))
    console = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lightning-perf | train epoch 0")]
    assert len(console) == 1 and "dataloader_bound" in console[0] and "->" in console[0]
    acc = EventAccumulator(t.logger.log_dir, size_guidance={"tensors": 0})
    acc.Reload()
    event, *_ = acc.Tensors("perf/findings/train/text_summary")  # one per epoch
    assert "`dataloader_bound`" in event.tensor_proto.string_val[0].decode()
    epoch = callback.report["stages"]["train"]["epochs"][0]
    assert "dataloader_bound" in [f["id"] for f in epoch["findings"]]


def test_a_smoke_run_gets_no_warning_or_critical_finding(tmp_path):
    # Trainer(fast_dev_run=True) on Lightning's BoringModel: one batch per stage, its wait the DataLoader's
    # start-up ("CRITICAL dataloader_bound ... waits for data 36%" from one batch, before).
    from lightning.pytorch.demos.boring_classes import BoringModel

    perf = PerfCallback(verbose=0)
    trainer(tmp_path, [perf], fast_dev_run=True, default_root_dir=tmp_path).fit(BoringModel())
    loud = [(f.id, f.severity) for f in perf.findings_for("train") if f.severity != "info"]
    assert loud == []


def test_a_smoke_runs_epoch_lines_say_too_little_to_judge(tmp_path, caplog):
    # One batch per stage: no line may read as a clean result ("no bottleneck found", "nothing to change found").
    from lightning.pytorch.demos.boring_classes import BoringModel

    with caplog.at_level("INFO"):
        run = trainer(tmp_path, [PerfCallback()], fast_dev_run=True, default_root_dir=tmp_path)
        run.fit(BoringModel())
        run.validate(BoringModel())
    lines = [r.getMessage().splitlines()[0] for r in caplog.records if r.getMessage().startswith("lightning-perf |")]
    assert {line.split(" | ")[1].split(" epoch")[0] for line in lines} == {"train", "validate"}, lines
    judged = r"\| \d measured batch(es of the last \d epochs)?: too little to judge"
    assert all(re.search(judged, line) for line in lines), lines
    assert "| 1 measured batch: too little to judge" in lines[0], lines


def test_one_batch_epochs_are_judged_over_the_stages_recent_batches(tmp_path):
    perf = PerfCallback(verbose=0, max_windows=0)
    # A dataset waiting 3 ms per item (a disk): every batch waits, so the finding is there to judge at every epoch.
    trainer(tmp_path, [perf], max_epochs=12, limit_train_batches=1, limit_val_batches=0).fit(
        TinyModel(n=4, batch_size=4, sleep_s=0.003)
    )
    early = [f for f in perf.findings_for("train") if f.epoch < 7 and f.id == "dataloader_bound"]
    assert all(f.severity == "info" for f in early), early  # from fewer than 8 batches: never louder
    late = [f for f in perf.findings_for("train", epoch=11) if f.id == "dataloader_bound"]
    assert late, perf.findings_for("train", epoch=11)  # found, from enough batches
    assert all("over the last 8 epochs, 8 batches" in f.evidence for f in late), late  # pooled, and said so


def test_with_a_progress_bar_the_epoch_line_starts_a_line_of_its_own(tmp_path, capfd):
    # A log line written while TQDM's bar stands was glued to it: "Epoch 0: 100%|...| 32/32 [...]lightning-perf |
    # train epoch 0 | ...". Through the bar's own print, TQDM writes it on a line of its own.
    callback = PerfCallback(max_windows=0, stages=["train"])
    bar = TQDMProgressBar()  # (the default is Rich where it is installed)
    trainer(tmp_path, [callback, bar], enable_progress_bar=True, limit_val_batches=0).fit(TinyModel(n=32))
    out, err = capfd.readouterr()
    lines = (out + err).splitlines()
    assert any(line.startswith("lightning-perf | train epoch 0 |") for line in lines), out + err
    assert not any("it/s" in line and "lightning-perf |" in line for line in lines), out + err


class SaysAtTeardown(Callback):
    """Says a line at its Trainer call's teardown, where PerfCallback's call-end lines are said."""

    def teardown(self, trainer, pl_module, stage):
        say(trainer, f"lightning-perf | said at the end of {trainer.state.fn.value}")


@pytest.mark.parametrize("bar", ["tqdm", "rich"])
def test_with_a_progress_bar_a_line_said_at_a_calls_end_is_printed(tmp_path, capfd, caplog, bar):
    # TQDM's print drops a message where no bar of its is open, as at a Trainer call's end (teardown comes after
    # the loops closed their bars): the lines made there (epochs grouped or left pending by the paces, measured and
    # reported at the end) were lost in a run with the default progress bar.
    bars = [RichProgressBar() if bar == "rich" else TQDMProgressBar()]  # (the default is Rich where it is installed)
    with caplog.at_level("INFO"):
        fit = trainer(tmp_path, [SaysAtTeardown(), *bars], enable_progress_bar=True, limit_val_batches=0)
        fit.fit(TinyModel(n=16))
        fit.validate(TinyModel(n=16))
    out, err = capfd.readouterr()
    lines = [*(out + err).splitlines(), *(r.getMessage() for r in caplog.records)]
    said = [line for line in lines if line.startswith("lightning-perf | said at the end")]
    assert said == ["lightning-perf | said at the end of fit", "lightning-perf | said at the end of validate"], lines


def test_with_tqdms_bar_every_epochs_line_of_a_fit_is_printed(tmp_path, capfd, caplog):
    # The real path of the test above: the lines of a fit's last epochs, held back (nothing new in them) and said at
    # its end, after the loops closed TQDM's bars, were lost ("validate epoch 1" and "train epoch 1" here).
    bar = TQDMProgressBar()  # (the default is Rich where it is installed)
    with caplog.at_level("INFO"):
        trainer(tmp_path, [PerfCallback(max_windows=0), bar], enable_progress_bar=True, max_epochs=2).fit(
            TinyModel(n=32)
        )
    out, err = capfd.readouterr()
    # (TQDM moves the cursor over its validation bar before a line: an escape sequence, no text)
    lines = [*re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out + err).splitlines(), *(r.getMessage() for r in caplog.records)]
    heads = {line.split(" | ")[1] for line in lines if line.startswith("lightning-perf | ")}
    assert {"train epoch 0", "train epoch 1", "validate epoch 0", "validate epoch 1"} <= heads, heads


class SlowStart(torch.utils.data.IterableDataset):
    """An iterable dataset that takes 0.2 s to start each epoch (opening files, building an index), then yields its
    items at once."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x.sum(1, keepdim=True) > 0).float()

    def __iter__(self):
        time.sleep(0.2)
        yield from zip(self.x, self.y, strict=True)


class SlowStartModel(TinyModel):
    def train_dataloader(self):
        return DataLoader(SlowStart(self.n), batch_size=self.batch_size)


def test_an_iterable_datasets_slow_start_is_named_not_what_runs_between_batches(tmp_path):
    # Every window sees the DataLoader small (it cannot see an epoch's first batch); every batch measured the first
    # one's wait. The title said "between batches, outside the DataLoader" and the advice the progress bar.
    callback = PerfCallback(schedule=WINDOW, stages=["train"])
    trainer(tmp_path, [callback], max_epochs=3, limit_val_batches=0).fit(SlowStartModel(n=64))
    found = [f for f in callback.findings if f.id == "dataloader_bound"]
    assert found, callback.findings
    for f in found:  # whatever its severity (a busy machine makes it information)
        assert "outside the DataLoader" not in f.title and "progress bar" not in f.advice, f
        assert "each epoch's first batch" in f.advice and "once in `setup`" in f.advice, f
