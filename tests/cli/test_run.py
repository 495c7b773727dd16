"""``lightning-perf run``: real programs written to ``tmp_path``, run as subprocesses through the runner (and through
``python`` where the two are compared). Each Lightning program costs a process's imports (seconds here): the
programs are short, and one program serves the tests that read the same run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lightning_perf import PerfCallback

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
TIMEOUT = 240

# The Trainer every program builds: quiet, on the CPU, writing under its working directory.
QUIET = textwrap.dedent(
    """
    import json
    import sys

    import lightning.pytorch as pl

    from models import TinyModel


    def quiet_trainer(**kwargs):
        defaults = dict(default_root_dir="out", accelerator="cpu", max_epochs=1, logger=False, num_sanity_val_steps=0,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        return pl.Trainer(**{**defaults, **kwargs})


    def callbacks(trainer):
        return [type(c).__name__ for c in trainer.callbacks]
    """
)

# A plain script: a fit, two predicts (a Trainer each, as pytorch-forecasting's predict builds), a Trainer with a
# PerfCallback of its own, a library's subclass of Trainer and a pytorch_lightning Trainer (built, not run). RESULT is
# what the training computed; CALLBACKS what each Trainer held.
PLAIN = QUIET + textwrap.dedent(
    """
    import pytorch_lightning

    from lightning_perf import PerfCallback


    class LibraryTrainer(pl.Trainer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.built_by = "a library"


    if __name__ == "__main__":
        pl.seed_everything(int(sys.argv[1]))
        model = TinyModel(n=32)
        fit = quiet_trainer(limit_val_batches=0)
        fit.fit(model)
        predicts = [quiet_trainer() for _ in range(2)]
        outputs = [t.predict(model) for t in predicts]
        own = quiet_trainer(callbacks=[PerfCallback(dirpath="own", verbose=0)])
        own.validate(model)
        weights = [p.sum().item() for p in model.parameters()]
        predicted = [sum(o.sum().item() for o in out) for out in outputs]
        print("RESULT", json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__,
                                    "weights": weights, "predicted": predicted}))
        built = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir="out")
        subclass = LibraryTrainer(**built)  # with its ModelCheckpoint
        standalone = pytorch_lightning.Trainer(**built, enable_checkpointing=False)
        print("CALLBACKS", json.dumps({"fit": callbacks(fit), "predict": [callbacks(t) for t in predicts],
                                       "own": [getattr(c, "dirpath", None) for c in own.callbacks],
                                       "subclass": callbacks(subclass), "pytorch_lightning": callbacks(standalone)}))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(TESTS), env.get("PYTHONPATH")) if p)
    env["PYTHONWARNINGS"] = "ignore"  # Lightning's chatter on tiny CPU runs: stderr keeps what the tests read
    return env


def _runner(*args: str) -> list[str]:
    return [sys.executable, "-m", "lightning_perf", "run", *args]


def _start(command: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(command, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _finish(_start(command, cwd))


def _line(stdout: str, tag: str) -> dict:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith(f"{tag} "))[len(tag) + 1 :])


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict[str, subprocess.CompletedProcess[str]]:
    """The plain script, bare (``python train.py 7``) and through the runner, side by side, each in its own folder."""
    procs = {}
    for how in ("python", "runner"):
        folder = tmp_path_factory.mktemp(how)
        (folder / "train.py").write_text(PLAIN)
        command = [sys.executable, "train.py", "7"] if how == "python" else _runner("train.py", "7")
        procs[how] = (_start(command, folder), folder)
    results = {how: _finish(proc) for how, (proc, _) in procs.items()}
    for how, result in results.items():
        assert result.returncode == 0, result.stderr
        result.folder = procs[how][1]  # where it ran, for the tests to read its files
    return results


def test_a_script_computes_what_python_computes(plain):
    bare, run = _line(plain["python"].stdout, "RESULT"), _line(plain["runner"].stdout, "RESULT")
    assert run["argv"] == ["train.py", "7"] and run["name"] == "__main__"
    assert run["file"] == str(plain["runner"].folder / "train.py")
    assert run["path0"] == str(plain["runner"].folder.resolve())
    assert run["weights"] == bare["weights"] and run["predicted"] == bare["predicted"]


def test_every_trainer_gets_one_callback_and_one_of_its_own_keeps_it(plain):
    assert _line(plain["python"].stdout, "CALLBACKS")["fit"] == []
    held = _line(plain["runner"].stdout, "CALLBACKS")
    assert held["fit"] == ["PerfCallback"]
    assert held["predict"] == [["PerfCallback"], ["PerfCallback"]]
    assert held["own"] == [str(plain["runner"].folder / "own")]  # the program's own callback, alone
    assert held["subclass"] == ["PerfCallback", "ModelCheckpoint"]  # Lightning's order: the checkpoints last
    assert held["pytorch_lightning"] == ["StandalonePerfCallback"]  # a pytorch_lightning.Callback too


def test_the_console_says_once_and_each_call_says_where_its_report_is(plain):
    err = plain["runner"].stderr
    assert err.count("lightning-perf run: PerfCallback(the defaults) added to the Trainer") == 1, err
    assert err.count("has a PerfCallback of its own; none added") == 1, err
    assert err.count("lightning-perf: report (opens offline in a browser)") == 4, err  # fit, 2 predicts, validate
    perf = plain["runner"].folder / "out" / "perf"
    assert {p.name for p in perf.glob("perf_report*.json")} == {
        "perf_report.json",
        "perf_report-1.json",
        "perf_report-2.json",
    }


# Python's own ends, compared with the runner's: exit code, stdout and stderr (the traceback's frames the program's).
ENDS = {
    "exit_3": "import sys\nprint('before')\nsys.exit(3)\n",
    "exit_message": "import sys\nsys.exit('bye')\n",
    "raises": "def f():\n    raise ValueError('bad value')\n\nf()\n",
    "interrupted": "raise KeyboardInterrupt\n",
    "syntax_error": "x = (\n",
}


@pytest.mark.parametrize("end", ENDS)
def test_a_program_ends_as_it_ends_under_python(tmp_path, end):
    (tmp_path / "end.py").write_text(ENDS[end])
    bare = _run([sys.executable, "end.py", "a"], tmp_path)
    run = _run(_runner("end.py", "a"), tmp_path)
    assert (run.returncode, run.stdout, run.stderr) == (bare.returncode, bare.stdout, bare.stderr)
    assert bare.returncode == {"exit_3": 3, "interrupted": -signal.SIGINT}.get(end, 1)


BAD = {
    "--schedule.active 0": {"schedule": {"active": 0}},
    "--stages trian": {"stages": "trian"},
    "--profile_budget 2 --verbose 5": {"profile_budget": 2, "verbose": 5},
}


@pytest.mark.parametrize("flags", BAD)
def test_a_bad_option_stops_before_the_program_with_the_constructor_s_message(tmp_path, flags):
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    run = _run(_runner(*flags.split(), "prog.py"), tmp_path)
    with pytest.raises(ValueError, match="PerfCallback") as refused:
        PerfCallback(**BAD[flags])
    assert run.returncode == 2 and f"lightning-perf run: error: {refused.value}\n" == run.stderr
    assert not (tmp_path / "ran").exists()


def test_a_config_file_s_unknown_option_is_named(tmp_path):
    (tmp_path / "perf.yaml").write_text("max_window: 2\n")
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    run = _run(_runner("--config", "perf.yaml", "prog.py"), tmp_path)
    assert run.returncode == 2 and "PerfCallback takes no option max_window; its options are" in run.stderr
    assert not (tmp_path / "ran").exists()


# The console script pip writes for `lightning-perf` (pyproject.toml's [project.scripts]).
ENTRY_POINT = textwrap.dedent(
    """
    import sys
    from lightning_perf.cli import main
    if __name__ == "__main__":
        sys.argv[0] = sys.argv[0].removesuffix(".exe")
        sys.exit(main())
    """
)

FAILING = QUIET + textwrap.dedent(
    """
    class Failing(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 6:
                raise RuntimeError("the program's own error")
            return super().training_step(batch, batch_idx)


    if __name__ == "__main__":
        print("MAIN", json.dumps({"argv": sys.argv, "name": __name__, "spec": __spec__.name, "path0": sys.path[0]}))
        quiet_trainer().fit(Failing(n=32))
    """
)


def test_a_failing_module_run_with_m(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "failing.py").write_text(FAILING)
    # Through a `lightning-perf` script as pip installs it, in a folder of its own: its folder is sys.path[0].
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "lightning-perf").write_text(ENTRY_POINT)
    command = [sys.executable, str(tmp_path / "bin" / "lightning-perf"), "run", "--schedule.skip_first", "1"]
    run = _run([*command, "-m", "pkg.failing", "--flag", "x"], tmp_path)
    assert run.returncode == 1
    main = _line(run.stdout, "MAIN")
    assert main == {
        "argv": [str(tmp_path / "pkg" / "failing.py"), "--flag", "x"],
        "name": "__main__",
        "spec": "pkg.failing",
        "path0": str(tmp_path),
    }
    traceback = run.stderr[run.stderr.index("Traceback (most recent call last):") :]
    first = traceback.splitlines()[1]
    assert first.startswith(f'  File "{tmp_path / "pkg" / "failing.py"}"'), traceback
    assert traceback.rstrip().endswith("RuntimeError: the program's own error")
    assert "runpy" not in traceback and "lightning_perf/cli" not in traceback
    report = json.loads((tmp_path / "out" / "perf" / "perf_report.json").read_text())
    assert [(e["stage"], e["interrupted"]) for e in report["stages"]["train"]["epochs"]] == [("train", True)]


# A LightningCLI script, its YAML config asking for 2 ranks on the CPU: Lightning's launcher starts rank 1 by running
# the command line again, the CLI's arguments included.
CLI_DDP = QUIET + textwrap.dedent(
    """
    from lightning.pytorch.cli import LightningCLI

    if __name__ == "__main__":
        cli = LightningCLI(TinyModel, save_config_callback=None)
        print("RANK", json.dumps({"rank": cli.trainer.global_rank, "callbacks": callbacks(cli.trainer)}), flush=True)
    """
)


def test_a_lightning_cli_script_on_two_ranks_with_its_yaml_and_ours(tmp_path):
    (tmp_path / "cli.py").write_text(CLI_DDP)
    (tmp_path / "config.yaml").write_text(
        "seed_everything: 0\n"
        "trainer: {accelerator: cpu, strategy: ddp, devices: 2, max_epochs: 1, logger: false,"
        " enable_progress_bar: false, enable_model_summary: false, enable_checkpointing: false,"
        " default_root_dir: out, limit_val_batches: 0}\n"
        "model: {n: 64}\n"
    )
    (tmp_path / "perf.yaml").write_text("schedule: {skip_first: 2, active: 2}\nstages: [train]\n")
    command = _runner("--config", "perf.yaml", "--schedule.active", "3", "cli.py", "fit", "--config", "config.yaml")
    run = _run(command, tmp_path)
    assert run.returncode == 0, run.stderr
    ranks = [json.loads(line[5:]) for line in run.stdout.splitlines() if line.startswith("RANK ")]
    assert sorted((r["rank"], r["callbacks"]) for r in ranks) == [(0, ["PerfCallback"]), (1, ["PerfCallback"])]
    report = json.loads((tmp_path / "out" / "perf" / "perf_report.json").read_text())
    assert report["run"]["world_size"] == 2
    assert [rank["rank"] for rank in report["stages"]["train"]["epochs"][0]["ranks"]] == [0, 1]  # each measured
    # skip 2, warm up 1, record 3 (the flag over the file): batches 3 to 5 of each rank's 8
    assert [(w["stage"], w["first_batch"], w["last_batch"]) for w in report["windows"]] == [("train", 3, 5)]


SLOW = QUIET + textwrap.dedent(
    """
    from pathlib import Path


    class Slow(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                Path("started").touch()
            return super().training_step(batch, batch_idx)


    if __name__ == "__main__":
        quiet_trainer(max_epochs=1000).fit(Slow(n=32, sleep_s=0.005))
    """
)


def test_ctrl_c_ends_the_run_and_keeps_its_report(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    proc = _start(_runner("--schedule.skip_first", "1", "slow.py"), tmp_path)
    deadline = time.monotonic() + TIMEOUT
    while not (tmp_path / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    run = _finish(proc)
    assert run.returncode == 1, run.stderr  # Lightning's end for Ctrl-C in fit, as under python
    assert "Detected KeyboardInterrupt, attempting graceful shutdown" in run.stderr
    report = json.loads((tmp_path / "out" / "perf" / "perf_report.json").read_text())
    epochs = report["stages"]["train"]["epochs"]
    assert epochs and epochs[-1]["interrupted"]
