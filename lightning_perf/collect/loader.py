"""
DataLoader facts
================

What decides whether DataLoader workers would help, besides the DataLoader's own settings
(:func:`lightning_perf.collect.run_info.dataloader_settings`):

- :func:`dataset_facts`: the dataset's kind (map-style or iterable), and whether it shares objects with the
  LightningModule. A worker process gets a copy of the dataset (forked or pickled) when it starts, so a
  dataset that reads state the module changes while it trains (a replay buffer, an environment, a generator
  that is a method of the module) would give each worker a stale copy: workers would silently train on old
  data. An iterable dataset also runs whole in every worker unless it splits itself by
  ``torch.utils.data.get_worker_info()``.
- :func:`dataset_origin`: the dataset's class, and the installed library that defines it (pytorch-forecasting's
  ``TimeSeriesDataSet``, a torchvision dataset): its ``__getitem__`` is then not the user's to rewrite, and the
  advice for per-sample loading changes.

How busy the CPUs and the workers were is :mod:`lightning_perf.collect.cpu`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from lightning_perf.collect.builders import installed_package, loader_builder
from lightning_perf.collect.run_info import dataloader_settings, first_dataloader, stage_dataloaders, stage_iterables

# How deep the dataset's attributes are searched for objects of the module (the dataset, its wrappers'
# datasets such as Subset.dataset, and their attributes).
SEARCH_DEPTH = 3
# Values that cannot carry state the module changes, and objects too common to mean sharing.
_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), range, frozenset)
# torch's wrappers whose items come from the dataset they wrap (``random_split``'s ``Subset``).
_WRAPPERS = ("torch.utils.data.",)


def loader_info(trainer: Any, stage: str) -> dict[str, Any] | None:
    """``run.dataloaders.<stage>`` (:class:`~lightning_perf.run_record.LoaderInfo`): the stage's first DataLoader's
    settings, :func:`dataset_facts`, and who built it (:func:`~lightning_perf.collect.builders.loader_builder`);
    without a DataLoader, the class of the iterable the Trainer iterates instead (:func:`iterable_origin`);
    ``None`` without either."""
    data = stage_dataloaders(trainer, stage)
    loader = first_dataloader(data)
    settings = dataloader_settings(loader)
    if settings is None:
        return iterable_origin(data)
    return {**settings, **dataset_facts(loader, trainer.lightning_module), **loader_builder(trainer, stage)}


def iterable_origin(data: Any) -> dict[str, Any] | None:
    """What a stage without a torch DataLoader iterates: its first iterable's class
    (:func:`~lightning_perf.collect.run_info.stage_iterables`) and the installed library that defines it,
    ``{"iterable_class": str, "iterable_library": str | None}`` (a library's batch generator, such as gluonts'
    ``IterableSlice``: its batches are made in the training process, between the steps); ``None`` where there is
    none."""
    first = next(stage_iterables(data), None)
    if first is None:
        return None
    cls = type(first)
    return {"iterable_class": cls.__qualname__, "iterable_library": installed_package(cls)}


def dataset_facts(dataloader: Any, module: Any) -> dict[str, Any]:
    """The dataset's kind and what it shares with ``module``.

    Args:
        dataloader: A ``torch.utils.data.DataLoader`` (anything with a ``dataset``).
        module: The LightningModule.

    Returns:
        ``{"dataset": "iterable" | "map" | None, "shared_state": str | None}``: ``shared_state`` names the
        first object found both in the dataset and among the module's own attributes (the dataset object
        itself, which modules often hold as ``self.train_set``, does not count), or the module itself; and
        :func:`dataset_origin`'s keys and ``"dataset_length"`` (:func:`dataset_length`; map-style only).
    """
    dataset = getattr(dataloader, "dataset", None)
    if dataset is None:
        return {"dataset": None, "shared_state": None}
    kind = "iterable" if isinstance(dataset, IterableDataset) else "map"
    return {
        "dataset": kind,
        "shared_state": shared_state(dataset, module),
        **dataset_origin(dataset),
        "dataset_length": dataset_length(dataset) if kind == "map" else None,
    }


def dataset_length(dataset: Any) -> int | None:
    """``len(dataset)``: the samples a pass over the whole dataset makes, whatever ``limit_*_batches`` loads of them
    an epoch; ``None`` where it has no length."""
    try:
        return len(dataset)
    except (TypeError, NotImplementedError, ValueError):
        return None


def dataset_origin(dataset: Any) -> dict[str, Any]:
    """The class whose ``__getitem__`` makes the samples, through torch's wrappers (``Subset``), and the installed
    library that defines it.

    Returns:
        ``{"dataset_class": str, "dataset_library": str | None}``: the class's name, and the top-level package of
        its module when that module's file is an installed package's (under ``site-packages`` or
        ``dist-packages``); ``None`` for the user's own code (a script, a project, an editable install).
    """
    for _ in range(SEARCH_DEPTH):
        inner = getattr(dataset, "dataset", None)
        if inner is None or not type(dataset).__module__.startswith(_WRAPPERS):
            break
        dataset = inner
    cls = type(dataset)
    return {"dataset_class": cls.__qualname__, "dataset_library": installed_package(cls)}


def shared_state(dataset: Any, module: Any) -> str | None:
    """The first object ``dataset`` holds that ``module`` holds too, described; ``None`` when none."""
    if module is None:
        return None
    # Callables (transforms, functions) are shared read-only as a rule; a bound method of the module is
    # caught below by its ``__self__``.
    held = {
        id(value): name
        for name, value in _attributes(module)
        if value is not dataset
        and not isinstance(value, _IMMUTABLE)
        and not name.startswith("_")
        and not callable(value)
    }
    for path, value in _reachable(dataset, "dataset", SEARCH_DEPTH, {id(dataset)}):
        if value is module:
            return f"`{path}` is the LightningModule"
        owner = getattr(value, "__self__", None)  # a bound method: a generator or sampler of the module's
        if owner is module:
            return f"`{path}` is the LightningModule's method `{getattr(value, '__name__', '?')}`"
        name = held.get(id(value))
        if name is not None:
            return f"`{path}` is the LightningModule's `{name}`"
    return None


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    try:
        return list(vars(obj).items())
    except TypeError:  # no __dict__ (slots, builtins)
        return []


def _reachable(obj: Any, path: str, depth: int, seen: set[int]) -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of the attributes reachable from ``obj`` (and from partials' functions and
    arguments), breadth of one object at a time, ``depth`` levels deep; each object once."""
    if depth <= 0:
        return
    children: list[tuple[str, Any]] = []
    if isinstance(obj, functools.partial):
        children += [(f"{path}.func", obj.func), *((f"{path}.args[{i}]", a) for i, a in enumerate(obj.args))]
    elif isinstance(obj, (list, tuple)):
        children += [(f"{path}[{i}]", item) for i, item in enumerate(obj[:16])]
    else:
        children += [(f"{path}.{name}", value) for name, value in _attributes(obj)]
    for child_path, value in children:
        if isinstance(value, _IMMUTABLE) or id(value) in seen:
            continue
        seen.add(id(value))
        yield child_path, value
        yield from _reachable(value, child_path, depth - 1, seen)
