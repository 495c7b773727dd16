"""Our scalars beside the user's, with every kind of logger and run: a single-axis logger (CSV) keeps one
monotonic step axis and whole rows, TensorBoard keeps a step axis per stage, the standalone
``pytorch_lightning`` package's trainer and loggers are recognized, and ``fast_dev_run`` writes no file."""

import csv
import gc
import os
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar.metadata import CONFIG_SUMMARY_TAG as LAYOUT_TAG
from torch import nn

from lightning_perf import PerfCallback
from lightning_perf.layout import default_dirpath
from models import SleepyDataset, TinyModel, trainer
from purity import heavy_modules_loaded_by

NO_WINDOWS = {"max_windows": 0}
ONE_WINDOW = {"schedule": {"skip_first": 0, "active": 1}, "stages": ["train"], "max_windows": 1}
BATCHES = 12  # TinyModel(n=48): 12 training and 12 validation batches of 4


class Logging(TinyModel):
    """Logs its own metrics, as a user's module does: the rows our rows sit among."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        loss = super().validation_step(batch, batch_idx)
        self.log("val_loss", loss)
        return loss


def _csv_rows(log_dir) -> list[dict[str, str]]:
    with open(os.path.join(log_dir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def _ours(row: dict[str, str]) -> bool:
    return any(value != "" for key, value in row.items() if key.startswith("perf/"))


def _steps(rows, column) -> list[int]:
    return [int(r["step"]) for r in rows if r.get(column, "") != ""]


def _event_scalars(root) -> dict[str, dict[str, list[int]]]:
    """Every event file under ``root``: its scalars' steps by tag, by the file's directory; but the run that holds
    only our Custom Scalars layout (tests/callback/test_metrics.py reads it)."""
    found: dict[str, dict[str, list[int]]] = {}
    for directory, _, files in os.walk(root):
        if any(f.startswith("events.out.tfevents") for f in files):
            acc = EventAccumulator(directory, size_guidance={"scalars": 0, "tensors": 0})
            acc.Reload()
            tags = acc.Tags()
            if tags["tensors"] == [LAYOUT_TAG] and not tags["scalars"]:
                continue
            found[directory] = {tag: [e.step for e in acc.Scalars(tag)] for tag in tags["scalars"]}
            found[directory].update({tag: [e.step for e in acc.Tensors(tag)] for tag in tags["tensors"]})
    return found


# ---------------------------------------------------------------------------------- a single step axis (CSV)


def test_csv_rows_keep_one_monotonic_step_axis_an_integer_epoch_and_few_extra_rows(tmp_path, every_write):
    callback = PerfCallback(**NO_WINDOWS)
    t = trainer(tmp_path, [callback], logger=CSVLogger(tmp_path), max_epochs=2, log_every_n_steps=2)
    t.fit(Logging(n=48))
    rows = _csv_rows(t.logger.log_dir)
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps), steps
    # Every row carries its epoch as an integer, ours as Lightning's own: no blanks, no float column.
    assert all(r["epoch"].isdigit() for r in rows), [r["epoch"] for r in rows]
    theirs = [r for r in rows if not _ours(r)]
    epoch_at = {int(r["step"]): r["epoch"] for r in theirs}
    assert all(epoch_at.get(int(r["step"]), r["epoch"]) == r["epoch"] for r in rows if _ours(r))
    # One row of ours per logging cadence and one per stage epoch end: as many as Lightning's own here.
    ours = [r for r in rows if _ours(r)]
    assert len(ours) == 2 * (BATCHES // 2 + 2) == len(theirs)
    # At the very steps Lightning logs the same moments at.
    assert _steps(rows, "perf/train/batch/step_time_ms") == _steps(rows, "train_loss_step")
    assert _steps(rows, "perf/validate/epoch/step_time_p50_ms") == _steps(rows, "val_loss") == [11, 23]
    assert _steps(rows, "perf/train/epoch/step_time_p50_ms") == _steps(rows, "train_loss_epoch") == [11, 23]
    # A stage's per-batch series would pile onto one training step: it stays on TensorBoard's own axes.
    assert not [key for key in rows[0] if key.startswith("perf/validate/batch/")]


def test_tensorboard_keeps_a_step_axis_per_stage_beside_a_csv_logger_with_one(tmp_path):
    callback = PerfCallback(**NO_WINDOWS)
    loggers = [TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")]
    t = trainer(tmp_path, [callback], logger=loggers, max_epochs=2, log_every_n_steps=4)
    t.fit(Logging(n=48))
    [tensorboard] = _event_scalars(tmp_path / "tb").values()
    assert tensorboard["perf/validate/batch/step_time_ms"] == [4, 8, 12, 16, 20, 24]  # validation batches so far
    assert tensorboard["perf/validate/epoch/loss"] == [12, 24]
    assert tensorboard["perf/train/batch/loss"] == [4, 8, 12, 16, 20, 24]  # global_step after the batch
    rows = _csv_rows(loggers[1].log_dir)
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps), steps
    assert _steps(rows, "perf/validate/epoch/loss") == [11, 23]
    assert _steps(rows, "perf/train/batch/loss") == [3, 7, 11, 15, 19, 23]


# ------------------------------------------------------------------------------- standalone pytorch_lightning


def _standalone():
    """A tiny module and data of the standalone ``pytorch_lightning`` package (imported here only)."""
    import pytorch_lightning as ptl

    class Standalone(ptl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def _loss(self, batch):
            x, y = batch
            return nn.functional.binary_cross_entropy_with_logits(self.net(x), y)

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(SleepyDataset(32), batch_size=4)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(SleepyDataset(16), batch_size=4)

    return ptl, Standalone


def _standalone_trainer(ptl, tmp_path, callbacks, **kwargs):
    return trainer(tmp_path, callbacks, trainer_class=ptl.Trainer, **{"max_epochs": 2, **kwargs})


def test_a_pytorch_lightning_trainer_and_its_tensorboard_logger_get_our_scalars_once(tmp_path, caplog):
    ptl, Standalone = _standalone()
    callback = PerfCallback(**ONE_WINDOW)
    logger = ptl.loggers.TensorBoardLogger(tmp_path)
    with caplog.at_level("INFO"):
        _standalone_trainer(ptl, tmp_path, [callback], logger=logger).fit(Standalone())
    assert len(callback.windows) == 1 and [e.stage for e in callback.epochs] == ["train", "train"]
    # Written once: into the user's event file (scalars and the operator table), no event file of our own.
    files = _event_scalars(tmp_path)
    assert list(files) == [logger.log_dir]
    assert files[logger.log_dir]["perf/train/epoch/loss"] == [8, 16]
    assert files[logger.log_dir]["perf/operators/train/text_summary"] == [1]
    assert callback.tensorboard_logdir == logger.root_dir
    lines = [r.getMessage() for r in caplog.records if "tensorboard --logdir" in r.getMessage()]
    assert len(lines) == 1 and f"tensorboard --logdir {logger.root_dir}\n" in lines[0], lines
    assert f"browser): {callback.page_path}\n" in lines[0]
    assert lines[0].splitlines()[-1].startswith("lightning-perf: profiling cost ")  # the run's share, last


def test_a_pytorch_lightning_csv_logger_is_recognized(tmp_path):
    ptl, Standalone = _standalone()
    callback = PerfCallback(**NO_WINDOWS)
    logger = ptl.loggers.CSVLogger(tmp_path)
    _standalone_trainer(ptl, tmp_path, [callback], logger=logger).fit(Standalone())
    assert callback.tensorboard_logdir == logger.root_dir  # our own event file is under its log_dir/perf
    rows = _csv_rows(logger.log_dir)
    assert [int(r["step"]) for r in rows] == sorted(int(r["step"]) for r in rows)
    assert all(r["epoch"].isdigit() for r in rows)


# Lightning's PyTorchProfiler raises in its own __del__ when it was set up but never started; not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_pytorch_lightning_pytorch_profiler_is_refused(tmp_path):
    ptl, Standalone = _standalone()
    t = _standalone_trainer(ptl, tmp_path, [PerfCallback(**NO_WINDOWS)], profiler="pytorch")
    with pytest.raises(MisconfigurationException, match="cannot run together with Lightning's PyTorchProfiler"):
        t.fit(Standalone())
    del t
    gc.collect()


def test_the_callback_does_not_import_pytorch_lightning():
    # Recognizing the standalone package's classes must not load it into a run that does not use it (the
    # callback imports the modules that look them up).
    assert "pytorch_lightning" not in heavy_modules_loaded_by("lightning_perf.callback")


# ------------------------------------------------------------------------------- no logger: beside the checkpoints


def _checkpointed_fit(tmp_path, package: str):
    """A Trainer shaped as darts builds it: no logger, no ``default_root_dir``, checkpoints in the library's own
    run directory (``<work_dir>/<model_name>/checkpoints``); run from an empty working directory."""
    if package == "pytorch_lightning":
        ptl, Standalone = _standalone()
        trainer_class, checkpoint, model = ptl.Trainer, ptl.callbacks.ModelCheckpoint, Standalone()
    else:
        trainer_class, checkpoint, model = pl.Trainer, ModelCheckpoint, Logging(n=32)
    run_dir = tmp_path / "work" / "model"
    perf = PerfCallback(**ONE_WINDOW)
    callbacks = [perf, checkpoint(dirpath=run_dir / "checkpoints", filename="last-{epoch}")]
    t = trainer(
        tmp_path, callbacks, trainer_class=trainer_class, logger=False, default_root_dir=None, enable_checkpointing=True
    )
    t.fit(model)
    t.validate(model)
    return perf, run_dir


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_without_a_logger_the_output_goes_beside_the_checkpoints_and_the_console_says_so(
    tmp_path, monkeypatch, caplog, package
):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with caplog.at_level("INFO"):
        perf, run_dir = _checkpointed_fit(tmp_path, package)
    assert os.listdir(cwd) == []
    assert perf.dirpath == str(run_dir / "perf") and perf.report_path == str(run_dir / "perf" / "perf_report.json")
    assert os.path.exists(perf.report_path) and len(perf.windows) == 1
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "perf"]
    assert all(f.endswith(".ckpt") for f in os.listdir(run_dir / "checkpoints"))  # nothing of ours in there
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lightning-perf: output in")]
    assert said == [f"lightning-perf: output in {run_dir / 'perf'} (beside the checkpoints: the Trainer has no logger)"]


@pytest.mark.parametrize(
    ("log_dir", "root_dir", "checkpoints", "expected", "place"),
    [
        ("/logs/version_0", "/cwd", ["/run/checkpoints"], "/logs/version_0/perf", None),
        (None, "/root", ["/run/checkpoints"], "/root/perf", "in default_root_dir"),
        (None, "/cwd", [None, "/run/checkpoints/", "/other"], "/run/perf", "beside the checkpoints"),
        (None, "/cwd", ["s3://bucket/checkpoints", "/run/checkpoints"], "/run/perf", "beside the checkpoints"),
        (None, "/cwd", [None], "/cwd/perf", "beside the checkpoints"),  # a default ModelCheckpoint: ./checkpoints
        (None, "/cwd", [], "/cwd/perf", "in the working directory"),
    ],
)
def test_the_default_output_directory_follows_the_logger_the_root_then_the_checkpoints(
    log_dir, root_dir, checkpoints, expected, place
):
    dirpath, said = default_dirpath(log_dir, root_dir, checkpoints, cwd="/cwd")
    assert dirpath == expected
    assert said is None if place is None else said.startswith(place)


# ----------------------------------------------------------------------------------------------- fast_dev_run


@pytest.mark.parametrize("fast_dev_run", [True, 3])
def test_fast_dev_run_writes_no_file_and_prints_the_summary(tmp_path, monkeypatch, caplog, fast_dev_run):
    monkeypatch.chdir(tmp_path)  # Lightning's default_root_dir is the working directory
    callback = PerfCallback(schedule={"skip_first": 0, "active": 1})
    t = trainer(tmp_path, [callback], fast_dev_run=fast_dev_run, default_root_dir=None)
    with caplog.at_level("INFO"), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        t.fit(Logging(n=48))
        t.test(Logging(n=48))
    assert not [w for w in warned if "PerfCallback" in str(w.message)]  # no "epoch too short for a window"
    assert [(d, files) for d, _, files in os.walk(tmp_path)] == [(str(tmp_path), [])]
    assert callback.windows == [] and callback.report_path is None
    assert [e.stage for e in callback.epochs] == ["validate", "train", "test"]
    console = [r.getMessage() for r in caplog.records]
    assert [m for m in console if m.startswith("lightning-perf | train epoch 0")]
    assert not [m for m in console if "tensorboard --logdir" in m]


def test_a_pytorch_lightning_cli_takes_the_standalone_perf_callback(tmp_path):
    # pytorch_lightning's LightningCLI only takes its own Callback's subclasses in trainer.callbacks.
    from pytorch_lightning.cli import LightningCLI

    from lightning_perf.standalone import StandalonePerfCallback

    ptl, Standalone = _standalone()
    args = [
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=lightning_perf.standalone.StandalonePerfCallback",
        "--trainer.callbacks.max_windows=1",
    ]
    cli = LightningCLI(Standalone, args=args, run=False, save_config_callback=None)
    [perf] = [c for c in cli.trainer.callbacks if isinstance(c, StandalonePerfCallback)]
    assert isinstance(perf, ptl.Callback) and perf.config.max_windows == 1
    cli.trainer.fit(cli.model)
    assert [e.stage for e in perf.epochs] == ["validate", "train"] and perf.report_path is not None
    # The version of the package the trainer comes from, not lightning's (both are installed).
    run = perf.report["run"]
    assert (run["lightning_package"], run["lightning"]) == ("pytorch_lightning", ptl.__version__)
