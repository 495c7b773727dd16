"""What the report's ``run`` holds over several Trainer calls (:func:`call_run_info`): no Trainer needed."""

from lightning_perf.hooks.run_setup import call_run_info

FIT = {"max_epochs": 200, "val_check_steps": None, "precision": "32-true", "dataloaders": {}}
TEST = {"max_epochs": 1, "val_check_steps": None, "precision": "32-true", "dataloaders": {}}
LOADERS = {"train": {"num_workers": 0}, "validate": {"num_workers": 0}}


def test_a_first_call_reports_its_own_facts_and_plan():
    run, plan = call_run_info({}, TEST, fit=False)
    assert run == TEST
    assert plan == {"max_epochs": 1, "val_check_steps": None}


def test_a_test_call_after_fit_keeps_the_fits_plan_and_is_diagnosed_with_its_own():
    fitted = {**FIT, "dataloaders": LOADERS, "optimizer_info": {"class": "SGD"}, "flops": {"forward": 1}}
    run, plan = call_run_info(fitted, TEST, fit=False)
    assert run["max_epochs"] == 200
    assert run["optimizer_info"] == {"class": "SGD"}
    assert run["dataloaders"] is LOADERS  # the test call adds its own to the same mapping
    assert run["flops"] == {"forward": 1}
    assert plan["max_epochs"] == 1
    assert {**run, **plan}["max_epochs"] == 1  # what the test epoch's rules read


def test_a_later_fit_replaces_the_plan_and_keeps_what_was_measured():
    fitted = {**FIT, "dataloaders": LOADERS, "optimizer_info": {"class": "SGD"}, "flops": {"forward": 1}}
    run, plan = call_run_info(fitted, {**FIT, "max_epochs": 5}, fit=True)
    assert run["max_epochs"] == plan["max_epochs"] == 5
    assert "optimizer_info" not in run  # set again at the fit's start, with the optimizer it configures
    assert run["dataloaders"] is LOADERS
    assert run["flops"] == {"forward": 1}
