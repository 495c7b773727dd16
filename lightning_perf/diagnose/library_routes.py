"""
Advice through the library that builds the object
=================================================

Where an installed library builds the run's DataLoader or optimizer (``RunFacts.loader_built_by``,
``optimizer_built_by``; :mod:`lightning_perf.collect.builders`), advice written as ``DataLoader(num_workers=2)``
or ``torch.optim.Adam(..., fused=True)`` names a call the user never makes. Each such advice line is followed by
the route: how that library lets the user pass the setting, or what to subclass where it does not.

Notes:
    1. Libraries whose routes are known (:data:`LOADER_ROUTES`, :data:`OPTIMIZER_ROUTES`) get theirs, checked against
       their signatures (pytorch-forecasting 1.8: ``TimeSeriesDataSet.to_dataloader(train, batch_size,
       batch_sampler, **kwargs)`` passes ``kwargs`` to the DataLoader, and ``BaseModel.configure_optimizers`` builds
       ``torch.optim.Adam``/``AdamW`` with ``**optimizer_params``; darts 0.48: ``fit``, ``fit_from_dataset`` and
       ``predict`` take ``dataloader_kwargs``, and the model's ``optimizer_cls`` is built with ``optimizer_kwargs``;
       PyG 2.8: ``LightningDataset``, ``LightningNodeData`` and ``LightningLinkData`` pass ``**kwargs`` to their
       loaders; Lightning's demo ``MNISTDataModule`` takes ``num_workers`` and ``batch_size``).
    2. pytorch-forecasting's loaders are passed to ``fit`` by the user, who made them with ``to_dataloader``: no
       hook of a library built them, so its dataset's class (``RunFacts.dataset_library``) says whose they are.
    3. Another library's hook: the route names the hook and the class to subclass.
    4. The user's own DataLoader over a library's dataset (a torchvision dataset): the advice stands as written.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_perf.diagnose.model import RunFacts

_LIGHTNING_DEMOS = (
    "Lightning's demo `{cls}` builds this DataLoader from its constructor's arguments: pass `{setting}` to `{cls}(...)`"
    " where it takes them (`MNISTDataModule` takes `num_workers` and `batch_size`), else subclass `{cls}` and override"
    " its `*_dataloader` hooks."
)

LOADER_ROUTES = {
    "pytorch_forecasting": (
        "pytorch-forecasting builds this DataLoader in `TimeSeriesDataSet.to_dataloader`, which passes its keyword"
        " arguments on: `to_dataloader(train=True, batch_size=..., {setting})`."
    ),
    "darts": (
        "darts builds this DataLoader inside the model's `fit`: pass `dataloader_kwargs={kwargs}` to `fit(...)` (and"
        " to `predict(...)` for its forecasts)."
    ),
    "torch_geometric": (
        "PyG's `{cls}` builds this DataLoader and passes its keyword arguments on to it: `{cls}(..., {setting})`."
    ),
    "neuralforecast": (
        "neuralforecast builds this DataLoader in `{cls}.train_dataloader` from the model's `dataloader_kwargs`:"
        " pass `dataloader_kwargs={kwargs}` to the model's constructor (`NHITS(..., dataloader_kwargs=...)`)."
    ),
    "lightning": _LIGHTNING_DEMOS,
    "pytorch_lightning": _LIGHTNING_DEMOS,
}
"""How each library lets the user pass DataLoader arguments (Notes 1); ``{setting}`` is the advice's
``name=value, ...``, ``{kwargs}`` the same as a dict, ``{cls}`` the class whose hook built the DataLoader."""

SAMPLES_ROUTES = {
    "darts": (
        "darts builds the DataLoader inside `fit` from its own dataset, so `DataLoader(samples, ...)` is not yours to"
        " call there: `fit_from_dataset(train_dataset, ...)` takes a training dataset you build instead."
    ),
}
"""Where the per-sample advice's ``DataLoader(samples, ...)`` is out of the user's reach, what is in it."""

ITERABLE_ROUTES = {
    "gluonts": (
        "gluonts makes the batches from its transformation of each series at every pass: pass `cache_data=True` to"
        " the estimator's `train(...)` to keep the transformed data after the first (applied on a DeepAR fit of 3"
        " epochs: 3.5-4.5 s to 2.2-2.8 s)."
    ),
}
"""Where a library makes the batches the Trainer iterates (no DataLoader): its own option that makes them cheaper."""

OPTIMIZER_ROUTES = {
    "pytorch_forecasting": (
        "pytorch-forecasting builds the optimizer in `BaseModel.configure_optimizers` with the model's"
        ' `optimizer_params`: pass `optimizer_params={kwargs}` to `from_dataset(...)`, with `optimizer="adam"` (the'
        ' default) or `"adamw"`, torch\'s own.'
    ),
    "darts": (
        "darts builds the optimizer from the model's `optimizer_cls` (torch's `Adam` by default) and"
        " `optimizer_kwargs`: pass `optimizer_kwargs={kwargs}` to the model's constructor, with your learning rate"
        ' (`"lr"`) as before.'
    ),
    "neuralforecast": (
        "neuralforecast builds the optimizer in `BaseModel.configure_optimizers`, and reads the model's"
        " `optimizer_kwargs` only beside an `optimizer` class (alone, they are ignored with a warning): pass"
        " `optimizer=torch.optim.Adam, optimizer_kwargs={kwargs}` to the model's constructor (Adam is its default;"
        " the model's `learning_rate` stays the rate)."
    ),
}
"""How each library lets the user pass optimizer options; ``{kwargs}`` as in :data:`LOADER_ROUTES`."""


def loader_library(facts: RunFacts) -> str | None:
    """The library that built the DataLoader (Notes 2 and 3), or ``None`` where the user did."""
    if facts.loader_built_by is not None:
        return facts.loader_built_by
    return facts.dataset_library if facts.dataset_library == "pytorch_forecasting" else None


def loader_route(facts: RunFacts, setting: str) -> str | None:
    """How to pass the DataLoader ``setting`` (``"num_workers=2, persistent_workers=True"``) where a library builds
    the DataLoader; ``None`` where the user does."""
    library = loader_library(facts)
    if library is None:
        return None
    cls = (facts.loader_builder or "").rpartition(".")[0] or "LightningDataset"
    if library in LOADER_ROUTES:
        return LOADER_ROUTES[library].format(setting=setting, kwargs=_as_dict(setting), cls=cls)
    return _subclass(facts.loader_builder, library, "this DataLoader", f"`{setting}`", "DataLoader arguments")


def optimizer_route(facts: RunFacts, setting: str) -> str | None:
    """How to pass the optimizer option ``setting`` (``"fused=True"``) where a library builds the optimizer; ``None``
    where the user does."""
    library = facts.optimizer_built_by
    if library is None:
        return None
    if library in OPTIMIZER_ROUTES:
        return OPTIMIZER_ROUTES[library].format(kwargs=_as_dict(setting))
    return _subclass(facts.optimizer_builder, library, "the optimizer", f"`{setting}`", "the optimizer's arguments")


def routed(lines: Sequence[str], marker: str, route: str | None) -> list[str]:
    """``lines`` with ``route`` after the first line that holds ``marker``; unchanged without a route or such a
    line."""
    lines = list(lines)
    if route is None:
        return lines
    at = next((i for i, line in enumerate(lines) if marker in line), None)
    return lines if at is None else [*lines[: at + 1], route, *lines[at + 1 :]]


def iterable_route(facts: RunFacts) -> str | None:
    """Where a library makes what a stage without a DataLoader iterates, its own option (:data:`ITERABLE_ROUTES`)."""
    return ITERABLE_ROUTES.get(facts.iterable_library) if facts.iterable_library is not None else None


def samples_route(facts: RunFacts) -> str | None:
    """Where the per-sample advice's ``DataLoader(samples, ...)`` is out of reach, what is in reach."""
    library = loader_library(facts)
    return SAMPLES_ROUTES.get(library) if library is not None else None


def _subclass(builder: str | None, library: str, what: str, setting: str, arguments: str) -> str:
    """The route through a library whose route is not known (Notes 3)."""
    cls, _, hook = (builder or "").rpartition(".")
    built = f"`{builder}` of the installed package `{library}`" if builder else f"the installed package `{library}`"
    override = f", or subclass `{cls}` and override `{hook}` to pass it" if cls and hook else ""
    return f"{built} builds {what}: pass {setting} where `{library}` takes {arguments}{override}."


def _as_dict(setting: str) -> str:
    """``"num_workers=2, fused=True"`` as ``{"num_workers": 2, "fused": True}``."""
    pairs = (part.partition("=") for part in setting.split(","))
    return "{" + ", ".join(f'"{name.strip()}": {value.strip()}' for name, _, value in pairs) + "}"
