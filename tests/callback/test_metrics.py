"""Always-on step metrics on real Trainer runs: the data-wait split, loss curves, memory, every logger, and
perf_report.json, read back with TensorBoard's EventAccumulator, Lightning's CSV file and json."""

import csv
import itertools
import json
import os
import re
import time

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import CSVLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.util import tensor_util

from lightning_perf import PerfCallback
from lightning_perf.hooks.log_pace import LogPace
from lightning_perf.report.json_report import SCHEMA_VERSION
from models import Leaky, TinyModel, release_freed_memory, torch_threads, trainer

NO_WINDOWS = {"max_windows": 0}  # these tests are about the always-on metrics


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _layout_charts(log_dir) -> dict[str, list[str]]:
    """TensorBoard's Custom Scalars layout in the event files of ``log_dir``, read back as TensorBoard's own
    plugin reads it: each chart's title and its tag regexes."""
    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    [event] = acc.Tensors(custom_scalar_metadata.CONFIG_SUMMARY_TAG)[-1:]
    layout = layout_pb2.Layout.FromString(tensor_util.make_ndarray(event.tensor_proto).item())
    return {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}


def test_loss_curve_decreases_on_a_learnable_task_even_when_the_user_logs_nothing(tmp_path):
    callback = PerfCallback(**NO_WINDOWS)
    t = trainer(tmp_path, [callback], max_epochs=4, log_every_n_steps=4)
    t.fit(TinyModel(n=128, batch_size=8, val_n=32))
    scalars = _scalars(t.logger.log_dir)
    epoch_loss = [v for _, v in scalars["perf/train/epoch/loss"]]
    assert len(epoch_loss) == 4
    assert epoch_loss[-1] < epoch_loss[0] * 0.8, epoch_loss
    assert all(b <= a * 1.05 for a, b in itertools.pairwise(epoch_loss)), epoch_loss
    # Per batch at the trainer's cadence, on the training step axis.
    assert [s for s, _ in scalars["perf/train/batch/loss"]][:3] == [4, 8, 12]  # global_step after the batch
    # Validation's own series, on its own axis (validation batches so far), not on training steps.
    assert [s for s, _ in scalars["perf/validate/epoch/loss"]] == [4, 8, 12, 16]
    assert [s for s, _ in scalars["perf/validate/batch/step_time_ms"]] == [4, 8, 12, 16]


def test_at_log_every_n_steps_1_the_batch_scalars_are_thinned_to_their_share_of_the_run(tmp_path):
    # 512 batches of about 1.5 ms, a logging point after each: written at every one, the scalars took 0.4-0.6 ms a
    # batch and the run 1.5x as long (docs/cost.md). The first points are all written (the pace's burst), later
    # ones at logging points of the Trainer's, and the epoch's own summary still counts every batch.
    callback = PerfCallback(**NO_WINDOWS)
    # A share small enough to thin on any machine: at the default 1%, a busy machine's slower steps (beside two CPU
    # burners) left every write within it, as they should, and nothing to thin. A burst of 10 ms holds a slow first
    # write (a new event file) and the first points; the writes must cost well beyond it: 512 of them cost under
    # 30 ms on a fast VM (0.06 ms each, against 0.4-0.6 ms on the one docs/cost.md measured), so 2,048.
    callback._epochs.stages["train"].pace = LogPace(share=1e-4, burst=0.01)
    t = trainer(tmp_path, [callback], max_epochs=1, limit_val_batches=0, log_every_n_steps=1)
    t.fit(TinyModel(n=4 * 4096, batch_size=8))
    steps = [s for s, _ in _scalars(t.logger.log_dir)["perf/train/batch/step_time_ms"]]
    pace = callback._epochs.stages["train"].pace
    assert len(steps) == 2048 - pace.skipped and pace.skipped > 0, (len(steps), pace.skipped)
    assert steps[:5] == [1, 2, 3, 4, 5] and steps == sorted(set(steps))
    assert callback.epochs[0].batches == 2048


class DictLoss(TinyModel):
    def training_step(self, batch, batch_idx):
        return {"loss": super().training_step(batch, batch_idx), "extra": 1}


def test_loss_from_a_dict_output_and_log_loss_off(tmp_path):
    on = PerfCallback(**NO_WINDOWS)
    trainer(tmp_path / "on", [on]).fit(DictLoss(n=32))
    assert on.epochs[0].loss is not None and on.epochs[0].loss > 0
    off = PerfCallback(log_loss=False, **NO_WINDOWS)
    t = trainer(tmp_path / "off", [off])
    t.fit(DictLoss(n=32))
    assert off.epochs[0].loss is None
    assert not [tag for tag in _scalars(t.logger.log_dir) if tag.endswith("/loss")]
    assert "perf/train/epoch/step_time_p50_ms" in _scalars(t.logger.log_dir)  # the other scalars are there


# The in-memory bound leaves room for a loaded process (it read over 0.2 once in a full suite's run, 1 GB of heap
# and threads from earlier tests), and stays apart from the slow dataset's 0.5.
@pytest.mark.parametrize(("sleep_s", "low", "high"), [(0.006, 0.5, 1.0), (0.0, 0.0, 0.35)])
def test_data_wait_fraction_tells_a_slow_dataset_from_an_in_memory_one(tmp_path, sleep_s, low, high):
    callback = PerfCallback(**NO_WINDOWS)
    # A few ms of compute per batch of 32 (4 layers of 512); loading 32 items sleeps 192 ms, or nothing: on a
    # machine busy enough to stretch that compute to 100 ms (seen on 2 shared cores), still over half waiting.
    model = TinyModel(n=384, batch_size=32, sleep_s=sleep_s, width=512, depth=4)
    trainer(tmp_path, [callback], limit_val_batches=0).fit(model)
    [train] = [e for e in callback.epochs if e.stage == "train"]
    assert low < train.data_wait_fraction < high, train
    # One batch (the second) was counted for its FLOPs: like a profiled batch, left out of times and samples.
    assert (train.batches, train.profiled_batches, train.samples) == (12, 1, 384 - 32)
    assert train.throughput == pytest.approx((384 - 32) / train.step_time)


def test_host_memory_peak_grows_for_a_module_that_keeps_its_outputs(tmp_path):
    release_freed_memory()  # (a full suite's process saw 10 MiB and 4 MiB of growth, at 1 GB RSS)
    callback = PerfCallback(**NO_WINDOWS)
    trainer(tmp_path, [callback], max_epochs=3, limit_val_batches=0).fit(Leaky())
    peaks = [e.host_rss_peak for e in callback.epochs if e.stage == "train"]
    assert None not in peaks
    # 16 batches x 4 MiB = 64 MiB more every epoch (the bound leaves room for memory that earlier tests in
    # this process freed and the allocator reuses).
    assert peaks[1] - peaks[0] > 48 * 2**20 and peaks[2] - peaks[1] > 48 * 2**20, peaks


def test_csv_logger_gets_the_scalars_and_tensorboard_files_still_get_written(tmp_path):
    callback = PerfCallback(**NO_WINDOWS)
    t = trainer(tmp_path, [callback], logger=CSVLogger(tmp_path), max_epochs=2)
    t.fit(TinyModel(n=32))
    with open(os.path.join(t.logger.log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    column = "perf/train/epoch/step_time_p50_ms"
    values = [float(r[column]) for r in rows if r.get(column)]
    assert len(values) == 2 and all(v > 0 for v in values)
    # No TensorBoardLogger: our own event file in the output directory has everything too.
    assert "perf/train/epoch/data_wait_fraction" in _scalars(callback.dirpath)
    assert _layout_charts(callback.dirpath)


def test_without_any_logger_everything_still_goes_to_files(tmp_path):
    callback = PerfCallback(**NO_WINDOWS)
    trainer(tmp_path, [callback], logger=False).fit(TinyModel(n=32))
    assert callback.dirpath == os.path.join(str(tmp_path), "perf")
    assert "perf/train/epoch/step_time_p90_ms" in _scalars(callback.dirpath)
    assert os.path.exists(os.path.join(callback.dirpath, "perf_report.json"))


def test_tensorboards_custom_scalars_charts_draw_the_step_split_from_our_scalars(tmp_path):
    callback = PerfCallback(**NO_WINDOWS)
    t = trainer(tmp_path, [callback], max_epochs=2, log_every_n_steps=1)
    t.fit(TinyModel(n=32))
    charts = _layout_charts(callback.dirpath)  # a run of its own beside the logger's: the user's layout stays
    tags = set(_scalars(t.logger.log_dir))
    split = charts["train: step time per batch, data wait and compute (ms)"]
    drawn = {tag for regex in split for tag in tags if re.search(regex, tag)}
    assert drawn == {f"perf/train/batch/{part}_ms" for part in ("step_time", "data_wait", "compute")}
    for title, regexes in charts.items():  # every chart draws at least two of the run's series
        assert len({tag for regex in regexes for tag in tags if re.search(regex, tag)}) >= 2, title
    assert {title.split(":")[0] for title in charts} == {"train", "validate"}
    logger_run = EventAccumulator(t.logger.log_dir).Reload().Tags()["tensors"]
    assert custom_scalar_metadata.CONFIG_SUMMARY_TAG not in logger_run  # the user's own layout is left alone


class ReportReader(Callback):
    """Reads perf_report.json after every epoch, as a user's tool would while training runs."""

    def __init__(self, perf: PerfCallback):
        self.perf = perf
        self.seen: list[dict] = []

    def on_train_epoch_end(self, trainer, pl_module):
        with open(self.perf.report_path) as f:
            self.seen.append(json.load(f))


def test_perf_report_json_parses_after_every_epoch_and_has_its_schema(tmp_path):
    perf = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 1}, stages=["train", "validate"])
    reader = ReportReader(perf)
    trainer(tmp_path, [perf, reader], max_epochs=3).fit(TinyModel(n=32, val_n=16))
    # PerfCallback comes first in the list: it has written each stage's first epoch when the reader looks, and
    # later epochs as its time budget allows (docs/schema.md); every read parses.
    for stage in ("train", "validate"):
        counts = [len(r["stages"][stage]["epochs"]) for r in reader.seen]
        assert counts[0] == 1 and counts == sorted(counts) and counts[-1] <= 3, (stage, counts)
    assert [len(s["epochs"]) for s in perf.report["stages"].values()] == [3, 3]

    report = perf.report
    with open(perf.report_path) as f:
        assert json.load(f) == json.loads(json.dumps(report))
    assert report["version"] == SCHEMA_VERSION
    run = report["run"]
    assert run["torch"] == torch.__version__ and run["device"] == "cpu" and run["world_size"] == 1
    assert run["precision"] == "32-true" and run["strategy"] == "SingleDeviceStrategy"
    assert run["dataloaders"]["train"] == {
        "num_workers": 0,
        "pin_memory": False,
        "persistent_workers": False,
        "prefetch_factor": None,
        "batch_size": 4,
        "drop_last": False,
        "dataset": "map",
        "shared_state": None,
        "dataset_class": "SleepyDataset",
        "dataset_library": None,  # the test's own class
        "dataset_length": 32,  # its 32 items, whatever an epoch loads of them
        "built_by": None,  # the test's own module built it
        "builder": None,
    }
    assert run["max_epochs"] == 3
    epoch = report["stages"]["train"]["epochs"][0]
    assert {
        "epoch",
        "batches",
        "samples",
        "step_time_p50",
        "step_time_p90",
        "step_time_max",
        "data_wait_fraction",
        "throughput",
        "loss",
        "host_rss",
        "host_rss_peak",
        "cuda_max_allocated",
        "first_data_wait",
        "loading_cpu_share",
        "worker_cpu",
        "wall_time",
        "cpu_wait_share",
    } <= set(epoch)
    # Batches 1 and 2 ran in the profiler window (warm-up, record), batch 3 was counted for its FLOPs: left out
    # of times and samples, and so are those while the window was still processed (its process starting: all the
    # epoch's last batches of a few ms here).
    assert epoch["batches"] == 8 and epoch["profiled_batches"] >= 3
    assert epoch["samples"] == 4 * (8 - epoch["profiled_batches"])
    assert epoch["cuda_max_allocated"] is None
    windows = report["windows"]
    assert [w["name"] for w in windows][:2] == ["train-epoch000-batches0002-0002", "validate-epoch000-batches0002-0002"]
    assert all(os.path.exists(w["trace_path"]) for w in windows)


def test_batch_size_fn_overrides_inference(tmp_path):
    callback = PerfCallback(batch_size_fn=lambda batch: 2 * len(batch[0]), **NO_WINDOWS)
    trainer(tmp_path, [callback]).fit(TinyModel(n=32))
    assert callback.epochs[-1].samples == 64 - 8  # 8 batches of 8, one counted for its FLOPs (left out)


def test_flops_per_batch_do_not_change_with_what_batch_size_fn_counts(tmp_path):
    # A batch_size_fn that counts tokens (here: twice the samples) must not inflate FLOPs per batch or FLOP/s:
    # the count's FLOPs are per sample as the same function counts them.
    plain = PerfCallback(**NO_WINDOWS)
    trainer(tmp_path / "plain", [plain]).fit(TinyModel(n=32))
    doubled = PerfCallback(batch_size_fn=lambda batch: 2 * len(batch[0]), **NO_WINDOWS)
    trainer(tmp_path / "doubled", [doubled]).fit(TinyModel(n=32))
    assert doubled.epochs[-1].flops_per_batch == pytest.approx(plain.epochs[-1].flops_per_batch)


def test_a_failing_batch_size_fn_is_reported_once_and_training_goes_on(tmp_path):
    callback = PerfCallback(batch_size_fn=lambda batch: batch["missing"], **NO_WINDOWS)
    with pytest.warns(UserWarning, match="batch_size_fn .* raised"):
        trainer(tmp_path, [callback]).fit(TinyModel(n=32))
    assert callback.epochs[-1].samples is None and callback.epochs[-1].throughput is None


class SlowAfterWindow(Callback):
    """Makes the batches after the windows of :data:`WINDOWS` (batches 10 and 15) 50 ms slower, as a window's
    close can leave them."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx in (10, 15):
            time.sleep(0.05)


# Windows at batches 8-9 and 13-14: the default skip_first=5, then wait 2, warm-up 1, record 2, twice.
WINDOWS = dict(wait=2, warmup=1, active=2, repeat=2)


def test_the_batch_after_a_window_is_left_out_of_the_epochs_times(tmp_path):
    perf = PerfCallback(schedule=WINDOWS, verbose=0)
    trainer(tmp_path, [perf], limit_train_batches=16, limit_val_batches=0).fit(TinyModel(n=64, batch_size=4))
    clock = perf._stages["train"].clock
    # Batches 10 and 15 come after the windows' closes; and those while a window is still processed follow them.
    assert [w.name for w in perf.windows] == ["train-epoch000-batches0008-0009", "train-epoch000-batches0013-0014"]
    assert clock.after_close[0] == 10 and 15 in clock.after_close, clock.after_close
    epoch = perf.epochs[0]
    left_out = {i for i in clock.after_close if i < 16} | {i for i, p in enumerate(clock.profiled) if p}
    assert epoch.profiled_batches == len(left_out)
    assert epoch.measured_batches == 16 - epoch.profiled_batches


def test_a_slow_batch_after_a_window_is_no_step_time_spike(tmp_path):
    perf = PerfCallback(schedule=WINDOWS, verbose=0)
    # torch on one thread: the window process, starting at the first close, has a CPU of its own on 2 cores.
    with torch_threads(1):
        # Steps of several ms (a wider MLP), so that a few ms of noise is no spread.
        trainer(tmp_path, [perf, SlowAfterWindow()], limit_train_batches=32, limit_val_batches=0).fit(
            TinyModel(n=128, batch_size=4, width=512, depth=4)
        )
    epoch = perf.epochs[0]
    assert epoch.step_time_max < 0.04, epoch
    # A loaded machine may make other steps spiky; the slowed batches are never among the spikes.
    unstable = [f for f in perf.findings_for("train") if f.id == "step_time_unstable"]
    named = {int(i) for f in unstable for m in re.findall(r"at batches ([\d, ]+)", f.evidence) for i in m.split(",")}
    assert not named & {10, 15}, unstable
