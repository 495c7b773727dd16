"""``lightning-perf run``'s options and command line, in process: the flags are the constructor's arguments, their
values YAML, and the program's arguments stay the program's."""

from __future__ import annotations

import inspect
import os
import os.path
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_perf import PerfCallback
from lightning_perf.cli import build_parser, split_program
from lightning_perf.cli.run_options import OptionsError, callback_arguments, callback_options, check, options_from

ROOT = Path(__file__).resolve().parents[2]


def _options(*argv: str) -> dict:
    ours, _ = split_program(["run", *argv], build_parser())
    return options_from(build_parser().parse_args(ours))


def test_the_options_are_the_constructor_s_arguments_with_its_defaults():
    signature = inspect.signature(PerfCallback.__init__).parameters
    expected = {name: p.default for name, p in signature.items() if name != "self"}
    assert {option.name: option.default for option in callback_options()} == expected
    assert all(option.help for option in callback_options())


def test_flag_values_are_yaml_and_override_the_file_s(tmp_path):
    config = tmp_path / "perf.yaml"
    config.write_text("schedule: {wait: 1, active: 4}\nstages: [train, validate]\nmax_windows: 3\n")
    options = _options(
        "--config", str(config), "--schedule.active", "2", "--stages", "train", "--dirpath", "2024", "x.py"
    )
    assert options == {"schedule": {"wait": 1, "active": 2}, "stages": "train", "max_windows": 3, "dirpath": "2024"}
    assert _options("--thresholds.dataloader_warning", "0.2", "--record_shapes", "true", "x.py") == {
        "thresholds": {"dataloader_warning": 0.2},
        "record_shapes": True,
    }


@pytest.mark.parametrize(
    "options",
    [{"schedule": {"active": 0}}, {"stages": ["train", "fit"]}, {"thresholds": {"no_such": 1}}, {"row_limit": "x"}],
)
def test_a_refused_option_gets_the_constructor_s_message(options):
    with pytest.raises(ValueError, match="PerfCallback") as refused:
        PerfCallback(**options)
    with pytest.raises(OptionsError) as checked:
        check(options)
    assert str(checked.value) == str(refused.value)


def test_batch_size_fn_is_an_import_path_imported_when_the_callback_is_built():
    check({"batch_size_fn": "os.path:join"})
    assert callback_arguments({"batch_size_fn": "os.path:join"}) == {"batch_size_fn": os.path.join}
    with pytest.raises(OptionsError, match=r"batch_size_fn"):
        check({"batch_size_fn": "len"})


def test_the_program_s_arguments_are_the_program_s():
    parser = build_parser()
    argv = ["run", "--stages", "train", "--verbose=2", "train.py", "--", "--help", "-m", "x", "--stages", "all"]
    assert split_program(argv, parser) == (argv[:5], argv[5:])
    assert split_program(["run", "-m", "pkg.mod", "--config", "c.yaml"], parser) == (
        ["run", "-m", "pkg.mod"],
        ["--config", "c.yaml"],
    )
    assert split_program(["run", "-mpkg.mod", "a"], parser) == (["run", "-mpkg.mod"], ["a"])


def test_the_runner_imports_neither_torch_nor_lightning_before_the_program(tmp_path):
    # A program may set OMP_NUM_THREADS or CUDA_VISIBLE_DEVICES before its own `import torch`.
    (tmp_path / "prog.py").write_text(
        "import sys\n"
        "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', 'numpy') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "lightning_perf", "run", "--stages", "train", "prog.py"]
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert out.stdout == "[]\n"


def test_a_missing_module_or_script_is_python_s_message(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runner = [sys.executable, "-m", "lightning_perf", "run"]
    module = subprocess.run([*runner, "-m", "no_such_module"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (module.returncode, module.stderr) == (1, f"{sys.executable}: No module named no_such_module\n")
    script = subprocess.run([*runner, "nothing.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert script.returncode == 2 and "can't open file" in script.stderr
