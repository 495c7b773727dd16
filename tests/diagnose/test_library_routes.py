"""Advice through the library that builds the DataLoader or the optimizer (lightning_perf.diagnose.library_routes):
the user is told how that library lets them pass the setting, or what to subclass. Pure, on hand-made summaries."""

from __future__ import annotations

import dataclasses

from test_advice_tried import FACTS, judge
from test_optimizer_tried import heavy, tried

from lightning_perf.diagnose.library_routes import loader_route, optimizer_route, routed, samples_route

SET = "`DataLoader(num_workers=2, persistent_workers=True)`"


def test_a_dataloader_the_user_builds_keeps_the_advice_as_written() -> None:
    # A library's dataset (a torchvision one) in the user's own DataLoader: theirs to set.
    advice = judge({}, dataclasses.replace(FACTS, dataset_library="torchvision")).advice
    assert SET in advice and "builds this DataLoader" not in advice
    assert loader_route(FACTS, "num_workers=2") is None


def test_darts_is_told_to_pass_dataloader_kwargs_to_fit() -> None:
    facts = dataclasses.replace(FACTS, dataset_library="darts", loader_built_by="darts")
    advice = judge({}, facts).advice
    route = (
        'darts builds this DataLoader inside the model\'s `fit`: pass `dataloader_kwargs={"num_workers": 2,'
        ' "persistent_workers": True}` to `fit(...)`'
    )
    assert route in advice and advice.index(SET) < advice.index(route)  # right after the setting it routes


def test_neuralforecast_is_told_to_pass_dataloader_kwargs_to_the_model() -> None:
    facts = dataclasses.replace(
        FACTS, loader_built_by="neuralforecast", loader_builder="TimeSeriesDataModule.train_dataloader"
    )
    assert (
        "neuralforecast builds this DataLoader in `TimeSeriesDataModule.train_dataloader` from the model's"
        ' `dataloader_kwargs`: pass `dataloader_kwargs={"num_workers": 2, "persistent_workers": True}` to the'
        " model's constructor"
    ) in judge({}, facts).advice


def test_lightnings_demo_datamodule_is_told_to_take_the_setting_in_its_constructor() -> None:
    facts = dataclasses.replace(FACTS, loader_built_by="lightning", loader_builder="MNISTDataModule.train_dataloader")
    assert (
        "Lightning's demo `MNISTDataModule` builds this DataLoader from its constructor's arguments: pass"
        " `num_workers=2, persistent_workers=True` to `MNISTDataModule(...)` where it takes them"
    ) in judge({}, facts).advice


def test_pytorch_forecasting_loaders_are_known_by_their_dataset() -> None:
    # The user made them with `to_dataloader` and passed them in: no library hook built them.
    advice = judge({}, dataclasses.replace(FACTS, dataset_library="pytorch_forecasting")).advice
    assert "`to_dataloader(train=True, batch_size=..., num_workers=2, persistent_workers=True)`" in advice


def test_another_librarys_hook_is_named_with_the_class_to_subclass() -> None:
    facts = dataclasses.replace(
        FACTS, dataset_library="tabkit", loader_built_by="tabkit", loader_builder="TabularDataModule.train_dataloader"
    )
    assert (
        "`TabularDataModule.train_dataloader` of the installed package `tabkit` builds this DataLoader: pass"
        " `num_workers=2, persistent_workers=True` where `tabkit` takes DataLoader arguments, or subclass"
        " `TabularDataModule` and override `train_dataloader` to pass it."
    ) in judge({}, facts).advice


def test_an_optimizer_a_library_builds_is_routed_through_its_options() -> None:
    assert "optimizer_params" not in heavy(None).advice  # the user's own configure_optimizers: as written
    for library, expected in (
        ("pytorch_forecasting", 'pass `optimizer_params={"fused": True}` to `from_dataset(...)`'),
        ("darts", 'pass `optimizer_kwargs={"fused": True}` to the model\'s constructor'),
        # optimizer_kwargs alone are ignored, with a warning (applied on NHITS: the optimizer's p50 6.7-8.4 ms to
        # 2.4-3.6 ms a step, and the finding gone)
        ("neuralforecast", 'pass `optimizer=torch.optim.Adam, optimizer_kwargs={"fused": True}`'),
    ):
        f = heavy(None, optimizer_built_by=library)
        assert "`torch.optim.Adam(..., fused=True)`" in f.advice and expected in f.advice, f.advice
    unknown = optimizer_route(
        dataclasses.replace(FACTS, optimizer_built_by="tabkit", optimizer_builder="TabModel.configure_optimizers"),
        "fused=True",
    )
    assert unknown == (
        "`TabModel.configure_optimizers` of the installed package `tabkit` builds the optimizer: pass `fused=True`"
        " where `tabkit` takes the optimizer's arguments, or subclass `TabModel` and override"
        " `configure_optimizers` to pass it."
    )


def test_withdrawn_advice_gets_no_route() -> None:
    f = heavy(tried(0.98), optimizer_built_by="darts")
    assert "optimizer_kwargs" not in f.advice and f.severity == "info"


def test_pyg_datamodules_pass_their_keyword_arguments_on() -> None:
    facts = dataclasses.replace(
        FACTS, loader_built_by="torch_geometric", loader_builder="LightningNodeData.train_dataloader"
    )
    assert loader_route(facts, "num_workers=2") == (
        "PyG's `LightningNodeData` builds this DataLoader and passes its keyword arguments on to it:"
        " `LightningNodeData(..., num_workers=2)`."
    )


def test_where_a_library_builds_the_loader_from_its_own_dataset_a_list_of_samples_is_out_of_reach() -> None:
    lines = ["Make the samples once: ... then `DataLoader(samples, ...)` with ...", "Other advice."]
    darts = dataclasses.replace(FACTS, dataset_library="darts", loader_built_by="darts")
    route = samples_route(darts)
    assert route is not None and "`fit_from_dataset(train_dataset, ...)`" in route
    assert routed(lines, "`DataLoader(samples, ...)`", route) == [lines[0], route, lines[1]]
    assert samples_route(dataclasses.replace(FACTS, dataset_library="pytorch_forecasting")) is None  # theirs to build
    assert routed(lines, "`DataLoader(samples, ...)`", None) == lines
