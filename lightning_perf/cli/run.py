"""
``lightning-perf run``
======================

``lightning-perf run [OPTIONS] script.py [ARGS...]`` and ``lightning-perf run [OPTIONS] -m module [ARGS...]`` run
the program as ``python script.py ARGS`` and ``python -m module ARGS`` would, with one ``PerfCallback(OPTIONS)`` in
every Trainer it builds (:mod:`lightning_perf.cli.trainer_patch`).

Notes:
    1. The options are checked first (:mod:`lightning_perf.cli.run_options`); a bad one is one line on stderr and
       exit code 2, and the program does not start.
    2. The program gets what Python gives it: ``sys.argv`` (``[script, *ARGS]``; ``-m``: the module's file first),
       ``sys.path[0]`` (the script's directory, symbolic links resolved; ``-m``: the working directory), a fresh
       ``__main__`` module (``__file__`` absolute, ``__spec__`` ``None``; ``-m``: the module's spec).
    3. Its end is Python's: its exit code (``sys.exit(3)``: 3), an uncaught exception's traceback (the program's
       frames, not ours) and exit code 1, a ``KeyboardInterrupt``'s traceback and then death by ``SIGINT`` (130 in
       a shell). Lightning turns Ctrl-C during ``fit`` into exit code 1 itself, after the callback has written its
       report (``on_exception``).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import types
from types import TracebackType
from typing import Any

from lightning_perf.cli import trainer_patch
from lightning_perf.cli.inputs import EXIT_BAD_INPUT
from lightning_perf.cli.run_options import OptionsError, options_from

# The files whose frames a traceback of the program leaves out: this one's, and runpy's.
_OURS = (os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>")


def command_run(args: argparse.Namespace) -> int:
    try:
        options = options_from(args)
    except OptionsError as err:
        print(f"lightning-perf run: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if (args.module is None) == (args.script is None):
        print("lightning-perf run: error: give the program: a script, or -m MODULE", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.script is not None and not os.path.exists(args.script):
        print(f"{sys.executable}: can't open file {os.path.abspath(args.script)!r}: no such file", file=sys.stderr)
        return EXIT_BAD_INPUT
    trainer_patch.install(options)
    if args.module is not None:
        sys.path[0] = os.getcwd()  # not the folder of the `lightning-perf` script: where `python -m` looks first
        if not _module_exists(args.module):  # what `python -m` says, and its exit code
            print(f"{sys.executable}: No module named {args.module}", file=sys.stderr)
            return 1
    try:
        if args.module is not None:
            sys.argv = [args.module, *args.args]  # run_module puts the module's file first, as `python -m` does
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [args.script, *args.args]
            run_script(args.script)
    except SystemExit:
        raise
    except KeyboardInterrupt as err:
        _interrupted(err)
        raise
    except BaseException as err:
        frames = program_frames(err.__traceback__)  # Python's hook prints the exception's own traceback
        sys.excepthook(type(err), err.with_traceback(frames), frames)
        return 1
    return 0


def _module_exists(name: str) -> bool:
    """Whether module ``name`` can be found (its parent packages are imported, as ``python -m`` imports them)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def run_script(path: str) -> None:
    """Runs the file at ``path`` as Python runs a script: in a new ``__main__`` module, which stays ``__main__``
    after it (for what runs at exit). A directory or zip file with a ``__main__.py`` runs through ``runpy``."""
    if not os.path.isfile(path) or path.endswith(".zip"):
        del sys.path[0]  # run_path puts the directory or archive there
        runpy.run_path(path, run_name="__main__")
        return
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    file = os.path.abspath(path)
    with io.open_code(file) as source:
        code = compile(source.read(), file, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=file,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", file),
        __spec__=None,
        __package__=None,
        __builtins__=sys.modules["builtins"],
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def program_frames(traceback: TracebackType | None) -> TracebackType | None:
    """The traceback from the program's first frame: the runner's frames and runpy's left out."""
    while traceback is not None and traceback.tb_frame.f_code.co_filename in _OURS:
        traceback = traceback.tb_next
    return traceback


def _interrupted(err: KeyboardInterrupt) -> None:
    """Python's end for a ``KeyboardInterrupt`` the program did not catch: its traceback (the program's frames),
    then, once the interpreter has finished, death by ``SIGINT``; ``err`` goes on up to the interpreter for it."""
    frames, hook = program_frames(err.__traceback__), sys.excepthook

    def print_program_frames(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        if value is err:
            value, traceback = value.with_traceback(frames), frames
        hook(kind, value, traceback)

    sys.excepthook = print_program_frames
