"""What the report's ``run`` holds over several Trainer calls (:func:`call_run_info`) and what a call's end says
(:func:`where_to_look`): no Trainer needed."""

from lightning_perf.hooks.run_setup import call_run_info, where_to_look

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


def test_a_call_without_a_page_says_where_its_report_is(tmp_path):
    # A window-less predict call writes perf_report.json and no page (epoch_report.draw_page): its end still says
    # where the call's report is, once (lightning-perf run on a library that builds a Trainer per predict).
    report = tmp_path / "perf_report-1.json"
    report.write_text("{}")
    page = tmp_path / "report-1.html"
    assert where_to_look(0, str(tmp_path), str(tmp_path), str(page), None, str(report)) == (
        f"lightning-perf: report: {report}"
    )
    page.write_text("<html>")
    assert where_to_look(0, str(tmp_path), str(tmp_path), str(page), None, str(report)) == (
        f"lightning-perf: report (opens offline in a browser): {page}"
    )
