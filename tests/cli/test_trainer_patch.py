"""The runner's two patches, in process: a module patched right after its first import, and a rank's command
(Lightning's basic form and Hydra's, with its working directory) run through the runner."""

from __future__ import annotations

import importlib
import json
import sys

from lightning_perf.cli.trainer_patch import RUNNER, AfterImport, through_runner


def test_a_module_is_patched_once_right_after_its_first_import(tmp_path, monkeypatch):
    (tmp_path / "patched_here.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = AfterImport({"patched_here": lambda module: seen.append(module.VALUE)})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    module = importlib.import_module("patched_here")
    importlib.reload(module)  # a later execution: not patched again
    assert seen == [1]
    monkeypatch.delitem(sys.modules, "patched_here")


class AskingFinder:
    """A finder that asks the other finders for the spec (as import-hook libraries do)."""

    def find_spec(self, name, path, target=None):
        if name != "asked_around":
            return None
        others = [finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")]
        return next((s for f in others if (s := f.find_spec(name, path, target)) is not None), None)


def test_a_finder_that_asks_the_others_does_not_loop_through_ours(tmp_path, monkeypatch):
    (tmp_path / "asked_around.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = AfterImport({"asked_around": lambda module: seen.append(module.VALUE)})
    monkeypatch.setattr(sys, "meta_path", [AskingFinder(), finder, *sys.meta_path])
    importlib.import_module("asked_around")
    assert seen == [2]
    monkeypatch.delitem(sys.modules, "asked_around")


def test_each_rank_s_command_runs_the_program_through_the_runner():
    options = {"schedule": {"active": 2}}
    basic = through_runner(lambda: ["/bin/python", "/abs/train.py", "--lr", "1"], options)
    assert basic() == ["/bin/python", *RUNNER, "--options-json", json.dumps(options), "/abs/train.py", "--lr", "1"]
    module = through_runner(lambda: ["/bin/python", "-m", "pkg.train", "fit"], options)
    assert module()[-3:] == ["-m", "pkg.train", "fit"]
    hydra = through_runner(
        lambda local_rank: (["/bin/python", "/abs/train.py", f"hydra.job.name=r{local_rank}"], "/o"), {}
    )
    assert hydra(1) == (["/bin/python", *RUNNER, "--options-json", "{}", "/abs/train.py", "hydra.job.name=r1"], "/o")
