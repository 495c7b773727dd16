"""
A PerfCallback in every Trainer
===============================

What ``lightning-perf run`` changes in the program it runs, and nothing else:

1. ``Trainer.__init__``, of ``lightning.pytorch`` and of ``pytorch_lightning`` alike, adds one ``PerfCallback`` to
   the Trainer it has built, unless the Trainer has one already. Subclasses of ``Trainer`` (a library's) run it
   through ``super().__init__``. The callback goes where Lightning's callback connector puts a callback of the
   user's: before the checkpoints, which run last.
2. Lightning's subprocess launcher (``strategy="ddp"``) starts each other rank as ``python -m lightning_perf run
   --options-json ... SCRIPT ARGS`` instead of ``python SCRIPT ARGS``: every rank builds its Trainers here too.

Both take effect when the program imports those modules, not before: nothing here imports torch or Lightning
until the program has. The console says once that the callback was added; each Trainer call's end says where
its report is (the callback's own lines).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from lightning_perf.cli.run_options import callback_arguments, yaml_text

#: How a runner starts the runner of another rank: ``python`` followed by these, its options and the program.
RUNNER = ("-m", "lightning_perf", "run")

# The modules that define a Trainer, by package; and those that build the command of a rank's process.
_TRAINERS = {"lightning.pytorch.trainer.trainer": "lightning", "pytorch_lightning.trainer.trainer": "pytorch_lightning"}
_LAUNCHERS = (
    "lightning.fabric.strategies.launchers.subprocess_script",
    "lightning_fabric.strategies.launchers.subprocess_script",
)
_COMMANDS = ("_basic_subprocess_cmd", "_hydra_subprocess_cmd")


def install(options: Mapping[str, Any]) -> None:
    """Patches the Trainers and the launchers with ``options`` (checked ones) as each module is imported."""
    patches: dict[str, Callable[[ModuleType], None]] = {}
    said: set[str] = set()
    for name, package in _TRAINERS.items():
        patches[name] = functools.partial(_patch_trainer, package=package, options=dict(options), said=said)
    for name in _LAUNCHERS:
        patches[name] = functools.partial(_patch_launcher, options=dict(options))
    finder = AfterImport(patches)
    for name in list(patches):
        if name in sys.modules:  # already imported (a runner called from a program that imported Lightning)
            patches.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, finder)


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``patches[name](module)`` right after module ``name`` is first executed, before any other module
    takes a name from it (``from ... import Trainer``)."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self._patches = patches
        self._finding: set[str] = set()  # another finder that asks the others (ours among them) asks us once

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._patches or fullname in self._finding:
            return None
        spec = None
        self._finding.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        patch, loader = self._patches.pop(fullname), spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this module's own loader instance
        return spec


def _patch_trainer(module: ModuleType, *, package: str, options: dict[str, Any], said: set[str]) -> None:
    """Wraps ``module.Trainer.__init__``: the Trainer it has built gets a callback (:func:`add_callback`)."""
    trainer_class = module.Trainer
    original = trainer_class.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        add_callback(self, package, options, said)

    trainer_class.__init__ = __init__


def add_callback(trainer: Any, package: str, options: Mapping[str, Any], said: set[str]) -> None:
    """One ``PerfCallback(**options)`` in ``trainer.callbacks``, unless it holds one; the console told once.

    ``package``: the Trainer's, ``"lightning"`` or ``"pytorch_lightning"`` (whose LightningCLI and checks want its
    own ``Callback``: :class:`~lightning_perf.standalone.StandalonePerfCallback`)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from lightning_perf.callback import PerfCallback

    if any(isinstance(callback, PerfCallback) for callback in trainer.callbacks):
        if "kept" not in said:
            said.add("kept")
            rank_zero_info("lightning-perf run: the Trainer has a PerfCallback of its own; none added")
        return
    if package == "pytorch_lightning":
        from lightning_perf.standalone import StandalonePerfCallback as PerfCallback

    callback = PerfCallback(**callback_arguments(options))
    callbacks = [*trainer.callbacks, callback]
    connector = getattr(trainer, "_callback_connector", None)  # Lightning's order: tuners first, checkpoints last
    reorder = getattr(connector, "_reorder_callbacks", None)
    trainer.callbacks = reorder(callbacks) if reorder is not None else callbacks
    if "added" not in said:
        said.add("added")
        given = ", ".join(f"{name}={yaml_text(value)}" for name, value in options.items()) or "the defaults"
        rank_zero_info(
            f"lightning-perf run: PerfCallback({given}) added to the Trainer; every Trainer the program builds gets"
            " its own"
        )


def _patch_launcher(module: ModuleType, *, options: dict[str, Any]) -> None:
    """Wraps the launcher's command builders: each rank's process runs the program through the runner."""
    for name in _COMMANDS:
        if hasattr(module, name):
            setattr(module, name, through_runner(getattr(module, name), options))


def through_runner(build: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    """A command builder whose command, ``[python, SCRIPT | -m MODULE, ARGS...]`` (and its working directory, where
    it gives one), runs the program through the runner, with ``options``."""

    @functools.wraps(build)
    def command(*args: Any, **kwargs: Any) -> Any:
        built = build(*args, **kwargs)
        with_cwd = isinstance(built, tuple)  # hydra's: (command, cwd)
        python, *program = built[0] if with_cwd else built
        through = [python, *RUNNER, "--options-json", json.dumps(options), *program]
        return (through, built[1]) if with_cwd else through

    return command
