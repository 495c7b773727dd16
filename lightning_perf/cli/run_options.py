"""
``lightning-perf run``'s options
================================

:class:`~lightning_perf.PerfCallback`'s options as ``lightning-perf run`` flags and as a YAML file, checked before the
program starts, with the constructor's own messages.

The flags come from the constructor's signature, read from the callback's source (not imported): one flag per
argument (``--max_windows 2``), one per field of the schedule (``--schedule.active 2``) and of the thresholds
(``--thresholds.dataloader_warning 0.2``). Each flag's help is the first sentence of the argument's ``Args:`` entry.
A value is YAML (``--stages train``, ``--stages '[train, validate]'``, ``--record_shapes true``, ``--peak_flops
null``); ``dirpath`` is taken as written. ``batch_size_fn`` is an import path, ``module:function``, imported when the
first Trainer is built (``__main__:batch_size`` names a function of the script).

Nothing here imports torch or Lightning: the program imports them itself, after what it sets first
(``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_perf import config
from lightning_perf.config import PerfConfig, Schedule
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.docstrings import doc_entries, plain_roles

#: The file whose ``PerfCallback.__init__`` gives the options.
CALLBACK_SOURCE = Path(__file__).resolve().parents[1] / "callback.py"
#: The options that take a mapping, whose fields are also flags of their own (``--schedule.active``).
NESTED: dict[str, type] = {"schedule": Schedule, "thresholds": Thresholds}
#: The options taken as written, not as YAML (a directory named ``null`` or ``2024`` is a directory).
AS_WRITTEN = ("dirpath",)
#: The import path ``batch_size_fn`` takes: ``module:function`` (``package.module:Class.method``).
IMPORT_PATH = re.compile(r"^[\w.]+:[\w.]+$")

# The namespace of the parsed flags that are options (``perf:schedule.active``), apart from the command's own.
_PREFIX = "perf:"


class OptionsError(ValueError):
    """An option that ``PerfCallback`` would refuse, or a flag or file that gives none; its message says why."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One keyword argument of ``PerfCallback.__init__``.

    Attributes:
        name: The argument's name, the flag's (``--max_windows``) and the YAML key's.
        annotation: Its type, as the source writes it.
        default: Its default value.
        help: The first sentence of its ``Args:`` entry.
    """

    name: str
    annotation: str
    default: Any
    help: str


@functools.cache
def callback_options() -> tuple[Option, ...]:
    """``PerfCallback.__init__``'s keyword arguments, in order, read from :data:`CALLBACK_SOURCE`."""
    tree = ast.parse(CALLBACK_SOURCE.read_text(encoding="utf-8"))
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "PerfCallback")
    init = next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    helps = doc_entries(ast.get_docstring(cls), "Args")
    return tuple(
        Option(
            name=arg.arg,
            annotation=ast.unparse(arg.annotation) if arg.annotation is not None else "Any",
            default=_value(default),
            help=first_sentence(helps.get(arg.arg, "")),
        )
        for arg, default in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True)
    )


def _value(node: ast.expr | None) -> Any:
    """A default as the source writes it: a literal, or a constant of :mod:`lightning_perf.config` by name."""
    if node is None:
        raise ValueError("PerfCallback's options all have defaults")
    if isinstance(node, ast.Name):
        return getattr(config, node.id)
    return ast.literal_eval(node)


def first_sentence(text: str) -> str:
    """A docstring entry's first sentence, its roles as code spans."""
    return plain_roles(re.split(r"(?<=\.)\s+(?=[A-Z(])", text.strip(), maxsplit=1)[0])


def yaml_text(value: Any) -> str:
    """A value as YAML's flow style writes it (what a flag or the config file takes)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {yaml_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_text(item) for item in value) + "]"
    return str(value)


def _metavar(annotation: str) -> str:
    """The placeholder a flag's usage shows for a value of this type."""
    for word, metavar in (("Schedule", "MAPPING"), ("dict", "MAPPING"), ("Sequence", "LIST"), ("Callable", "IMPORT")):
        if word in annotation:
            return metavar
    for start, metavar in (("bool", "BOOL"), ("int", "INT"), ("float", "NUMBER"), ("str", "PATH")):
        if annotation.startswith(start):
            return metavar
    return "VALUE"


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of PerfCallback's options, and ``--config``, on ``run``'s parser."""
    group = parser.add_argument_group(
        "PerfCallback's options",
        "Each value is YAML: --stages train, --stages '[train, validate]', --record_shapes true. They go before the"
        " program; a flag overrides the same option in --config.",
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="a YAML file of PerfCallback's options, a mapping of their names to values (`schedule: {active: 2}`)",
    )
    for option in callback_options():
        extra = "; or one of them: `--thresholds.NAME VALUE`" if option.name == "thresholds" else ""
        group.add_argument(
            f"--{option.name}",
            dest=f"{_PREFIX}{option.name}",
            metavar=_metavar(option.annotation),
            default=None,
            help=f"{option.help} Default: `{yaml_text(option.default)}`{extra}",
        )
        if option.name in NESTED:
            cls = NESTED[option.name]
            helps = doc_entries(cls.__doc__, "Args")
            shown = option.name == "schedule"  # the thresholds are many: docs/findings.md lists them
            for field in dataclasses.fields(cls):
                group.add_argument(
                    f"--{option.name}.{field.name}",
                    dest=f"{_PREFIX}{option.name}.{field.name}",
                    metavar="INT" if shown else "NUMBER",
                    default=None,
                    help=f"the {option.name}'s `{field.name}`: {first_sentence(helps.get(field.name, ''))} Default:"
                    f" `{yaml_text(getattr(cls(), field.name))}`"
                    if shown
                    else argparse.SUPPRESS,
                )
    # What a runner gives the runners it starts for the other ranks (trainer_patch.py): its options, as JSON.
    parser.add_argument("--options-json", default=None, help=argparse.SUPPRESS)


def options_from(args: argparse.Namespace) -> dict[str, Any]:
    """The options the command line gives, checked: ``--options-json``'s, ``--config``'s over them, and each
    flag's over both (a whole ``--schedule`` before its fields).

    Raises:
        OptionsError: A file that cannot be read, a value that is not YAML, an unknown option, or a value that
            ``PerfCallback`` refuses (its own message).
    """
    options: dict[str, Any] = {}
    if args.options_json is not None:
        options.update(json.loads(args.options_json))
    if args.config is not None:
        options.update(_read_config(args.config))
    given = [(dest.removeprefix(_PREFIX), text) for dest, text in vars(args).items() if dest.startswith(_PREFIX)]
    for name, text in sorted(((n, t) for n, t in given if t is not None), key=lambda item: "." in item[0]):
        head, _, key = name.partition(".")
        value = text if head in AS_WRITTEN else _yaml(f"--{name}", text)
        if not key:
            options[head] = value
            continue
        base = options.get(head) or {}
        if not isinstance(base, Mapping):
            raise OptionsError(f"--{name}: {head} is {base!r}, not a mapping of its fields")
        options[head] = {**base, key: value}
    check(options)
    return options


def _yaml(where: str, text: str) -> Any:
    import msgspec.yaml  # PyYAML's parser (Lightning's dependency), typed; for the run command only

    try:
        return msgspec.yaml.decode(text.encode())
    except msgspec.DecodeError as err:
        raise OptionsError(f"{where}: {text!r} is not a YAML value: {err}") from None


def _read_config(path: str) -> dict[str, Any]:
    """A ``--config`` file's options."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise OptionsError(f"--config {path}: {err.strerror or err}") from None
    options = _yaml(f"--config {path}", text)
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options):
        raise OptionsError(f"--config {path}: a mapping of PerfCallback's options to their values, not {options!r}")
    return dict(options)


def check(options: Mapping[str, Any]) -> None:
    """Raises :class:`OptionsError` where ``PerfCallback(**options)`` would refuse them, with its message."""
    names = [option.name for option in callback_options()]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise OptionsError(f"PerfCallback takes no option {', '.join(unknown)}; its options are {', '.join(names)}")
    try:
        json.dumps(dict(options))
    except (TypeError, ValueError) as err:
        raise OptionsError(f"options must be plain YAML values (numbers, text, lists, mappings): {err}") from None
    values = {option.name: option.default for option in callback_options()} | dict(options)
    function = values["batch_size_fn"]
    if isinstance(function, str) and IMPORT_PATH.match(function):
        values["batch_size_fn"] = len  # a stand-in callable: the function is imported when a Trainer is built
    try:
        PerfConfig.build(**values)
    except ValueError as err:
        raise OptionsError(str(err)) from None


def callback_arguments(options: Mapping[str, Any]) -> dict[str, Any]:
    """``PerfCallback``'s keyword arguments for ``options``: ``batch_size_fn``'s import path imported."""
    arguments = dict(options)
    path = arguments.get("batch_size_fn")
    if isinstance(path, str):
        module, _, name = path.partition(":")
        function: Any = importlib.import_module(module)
        for part in name.split("."):
            function = getattr(function, part)
        arguments["batch_size_fn"] = function
    return arguments
