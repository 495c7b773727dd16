"""PerfCallback through the real LightningCLI (jsonargparse): YAML configs, command-line flags, --print_config
and the errors a bad value gives. Drives ``examples/cli.py`` in process, as its command line runs it; no mocks."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import re
import sys
from pathlib import Path

import pytest
import yaml

from cli_example import EXAMPLE, cli_example
from lightning_perf import PerfCallback, Schedule
from lightning_perf.config import STAGES

# Lightning 2.6's cli.py still calls jsonargparse APIs deprecated in jsonargparse 4.49: theirs, not ours.
pytestmark = pytest.mark.filterwarnings("ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "cli_config.yaml"

# Quiet, fast trainer flags for every in-process run; outputs go under the test's tmp_path.
QUIET = [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.num_sanity_val_steps=0",
]


example = cli_example()


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    """LightningCLI warns when given ``args`` while ``sys.argv`` has arguments (pytest's own)."""
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE)])


def _perf_callbacks(cli) -> list[PerfCallback]:
    return [cb for cb in cli.trainer.callbacks if isinstance(cb, PerfCallback)]


def _callback_entry(config: dict) -> dict:
    """The one PerfCallback entry of ``trainer.callbacks`` in a dumped config."""
    entries = [cb for cb in config["trainer"]["callbacks"] if cb["class_path"] == "lightning_perf.PerfCallback"]
    assert len(entries) == 1, config["trainer"]["callbacks"]
    return entries[0]


def test_example_config_fit_saves_scheduled_windows(tmp_path):
    configured = _callback_entry(yaml.safe_load(EXAMPLE_CONFIG.read_text()))["init_args"]
    assert {k: v for k, v in configured["schedule"].items() if k != "skip_first"} == dict(
        wait=1, warmup=1, active=2, repeat=2
    )
    # Both cycles of the schedule must fit in the limited epochs (and in the 12 validation batches of the
    # full data set, which the example config is written for).
    schedule = Schedule(**configured["schedule"])
    needed = schedule.skip_first + schedule.repeat * schedule.cycle
    assert needed <= 12

    cli = example.main(
        [
            "fit",
            "--config",
            str(EXAMPLE_CONFIG),
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.limit_train_batches={needed}",
            f"--trainer.limit_val_batches={needed}",
            *QUIET,
        ]
    )

    callbacks = _perf_callbacks(cli)
    assert len(callbacks) == 1
    cb = callbacks[0]
    assert isinstance(cb.config.schedule, Schedule)
    assert cb.config.schedule == schedule
    assert (cb.config.schedule.wait, cb.config.schedule.warmup, cb.config.schedule.active) == (1, 1, 2)
    assert cb.config.schedule.repeat == 2
    assert cb.config.stages == ("train", "validate")

    assert cb.windows, "the CLI run saved no profiler window"
    max_epochs = cli.trainer.max_epochs
    assert max_epochs == 2
    for stage in ("train", "validate"):
        for epoch in range(max_epochs):
            windows = [w for w in cb.windows if w.stage == stage and w.epoch == epoch]
            # repeat=2: two windows per epoch, each of `active` batches, none cut short.
            assert len(windows) == 2, (stage, epoch, cb.windows)
            assert all(w.last_batch - w.first_batch + 1 == 2 and not w.shortened for w in windows)
    assert {w.stage for w in cb.windows} == {"train", "validate"}
    for w in cb.windows:
        assert Path(w.trace_path).is_file()
        assert Path(w.trace_path).resolve().is_relative_to(tmp_path.resolve())


@pytest.mark.parametrize("class_path", ["lightning_perf.PerfCallback", "PerfCallback"])
def test_callbacks_append_flag_adds_perf_callback_with_defaults(tmp_path, class_path):
    cli = example.main([f"--trainer.callbacks+={class_path}", f"--trainer.default_root_dir={tmp_path}"], run=False)
    callbacks = _perf_callbacks(cli)
    assert len(callbacks) == 1
    assert callbacks[0].config == PerfCallback().config
    assert callbacks[0].config.schedule == Schedule()
    assert callbacks[0].config.stages == STAGES


def test_callback_options_from_command_line(tmp_path):
    cli = example.main(
        [
            "--trainer.callbacks+=lightning_perf.PerfCallback",
            "--trainer.callbacks.schedule.active=2",
            "--trainer.callbacks.stages=[train]",
            "--trainer.callbacks.max_windows=1",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    (cb,) = _perf_callbacks(cli)
    assert cb.config.schedule == Schedule(active=2)
    assert cb.config.stages == ("train",)
    assert cb.config.max_windows == 1


def _expected_dump(value):
    """A Python default as --print_config writes it to YAML."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def test_print_config_shows_every_option_with_its_default(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        example.main(
            [
                "fit",
                "--trainer.callbacks+=lightning_perf.PerfCallback",
                f"--trainer.default_root_dir={tmp_path}",
                "--print_config",
            ]
        )
    assert exc.value.code in (0, None)
    init_args = _callback_entry(yaml.safe_load(capsys.readouterr().out))["init_args"]

    params = inspect.signature(PerfCallback.__init__).parameters
    names = [name for name in params if name != "self"]
    assert set(init_args) == set(names)
    assert init_args["schedule"] == dict(skip_first=5, wait=0, warmup=1, active=1, repeat=1)
    for name in names:
        assert init_args[name] == _expected_dump(params[name].default), name


def test_print_config_of_example_config(tmp_path, capsys):
    with pytest.raises(SystemExit):
        example.main(
            ["fit", "--config", str(EXAMPLE_CONFIG), f"--trainer.default_root_dir={tmp_path}", "--print_config"]
        )
    init_args = _callback_entry(yaml.safe_load(capsys.readouterr().out))["init_args"]
    configured = _callback_entry(yaml.safe_load(EXAMPLE_CONFIG.read_text()))["init_args"]
    assert init_args["schedule"] == dataclasses.asdict(Schedule(**configured["schedule"]))
    assert init_args["stages"] == ["train", "validate"]
    assert init_args["max_windows"] == 5  # an option the file leaves out: its default


BAD_VALUES = {
    # Rejected by Schedule.__post_init__ when jsonargparse instantiates the callback (after parsing).
    "active": "schedule: {active: 0}",
    "wait": "schedule: {wait: -1}",
    # Rejected by jsonargparse while parsing: not one of the Literal values of `Stage`.
    "stages": "stages: [training]",
}


def _bad_run(tmp_path: Path, field: str) -> tuple[int, str, Path]:
    """``examples/cli.py fit --config <bad yaml>`` with ``BAD_VALUES[field]``, in process as the command line runs
    it: (its exit status, what it wrote and the error it ended with, its ``default_root_dir``)."""
    config = tmp_path / "bad.yaml"
    config.write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - class_path: lightning_perf.PerfCallback\n"
        "      init_args:\n"
        f"        {BAD_VALUES[field]}\n"
    )
    out, run_dir = io.StringIO(), tmp_path / "run"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            example.main(["fit", "--config", str(config), f"--trainer.default_root_dir={run_dir}"])
            code = 0
        except SystemExit as exc:  # argparse's usage error
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # what `python examples/cli.py` prints in its traceback, exiting with 1
            print(f"{type(exc).__name__}: {exc}", file=out)
            code = 1
    return code, out.getvalue(), run_dir


@pytest.mark.parametrize(
    ("field", "pattern"),
    [
        ("active", r"schedule\.active must be an integer >= 1, got 0 \(integer\)"),
        ("wait", r"schedule\.wait must be an integer >= 0, got -1 \(integer\)"),
    ],
)
def test_invalid_schedule_exits_naming_the_field(tmp_path, field, pattern):
    returncode, out, run_dir = _bad_run(tmp_path, field)
    assert returncode != 0, out
    assert re.search(pattern, out), out
    assert not run_dir.exists(), "the run started despite the bad value"


def test_invalid_stage_is_rejected_at_parse_time(tmp_path):
    returncode, out, run_dir = _bad_run(tmp_path, "stages")
    assert returncode == 2, out  # argparse's usage error, before anything is built
    assert 'Parser key "stages"' in out, out
    # The message lists the allowed values next to the one given.
    assert any("training" in line and all(f"'{stage}'" in line for stage in STAGES) for line in out.splitlines()), out
    assert not run_dir.exists()
