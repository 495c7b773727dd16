"""The thresholds' overrides, the registry's order and error handling, and that the diagnose package imports
neither torch nor lightning."""

import dataclasses
import re

import pytest
from contexts import (
    ROOT,
    GiB,
    ctx,
    facts,
    gpu_ctx,
    gw,
    run,
    spread,
    with_history,
)

from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.registry import RULES, diagnose
from lightning_perf.diagnose.thresholds import Thresholds
from purity import heavy_modules_loaded_by, imported_modules
from summaries import epoch, gpu_epoch, window

# --- thresholds ---------------------------------------------------------------------------------------------


def test_a_custom_threshold_changes_what_fires():
    data_bound = ctx(epoch(data_wait_fraction=0.15, data_wait=0.15))
    assert run("dataloader_bound", data_bound) is not None
    assert run("dataloader_bound", data_bound, dataloader_warning=0.2) is None
    f = run("dataloader_bound", data_bound, dataloader_critical=0.15)
    assert f.severity == "critical" and "critical >= 15%" in f.evidence
    assert diagnose(data_bound, Thresholds(dataloader_warning=0.2)) == []


def test_overrides_from_the_class_start_at_the_defaults_and_from_an_instance_at_its_values():
    assert Thresholds.with_overrides({}) == Thresholds()
    custom = Thresholds(validation=0.5)
    assert custom.with_overrides({"h2d_copy": 0.2}) == Thresholds(validation=0.5, h2d_copy=0.2)
    assert Thresholds.with_overrides({"memory_growth_epochs": 4.0}).memory_growth_epochs == 4  # 4.0 from YAML


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dataloader_warn": 0.2}, r"dataloader_warn=0\.2: unknown threshold \(known: dataloader_warning, "),
        ({"dataloader_warning": 1.5}, r"dataloader_warning must be a fraction between 0 and 1, got 1\.5 \(number\)"),
        ({"h2d_copy": -0.1}, r"h2d_copy must be a fraction between 0 and 1, got -0\.1 \(number\)"),
        ({"validation": "30%"}, r"validation must be a fraction between 0 and 1, got '30%' \(string\)"),
        ({"framework_overhead": True}, r"framework_overhead must be a fraction between 0 and 1, got True \(boolean\)"),
        ({"communication": float("nan")}, r"communication must be a fraction between 0 and 1, got nan \(number\)"),
        ({"rank_straggler": 0.9}, r"rank_straggler must be a ratio >= 1, got 0\.9 \(number\)"),
        ({"launch_kernel_time": -1e-6}, r"launch_kernel_time must be a number of seconds >= 0, got -1e-06"),
        ({"step_spike_count": 2.5}, r"step_spike_count must be an integer >= 1, got 2\.5 \(number\)"),
        (
            {"memory_growth_bytes": -1},
            r"memory_growth_bytes must be a number of bytes, an integer >= 0, got -1 \(integer\)",
        ),
        ({"dataloader_warning": 0.5}, r"dataloader_warning=0\.5 > dataloader_critical=0\.3: dataloader_warning must"),
        ({"device_busy_critical": 0.9}, r"device_busy_critical=0\.9 > device_busy_warning=0\.8"),
    ],
)
def test_bad_overrides_are_named_with_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ValueError, match=message):
        Thresholds.with_overrides(overrides)


def test_all_bad_overrides_are_reported_in_one_message():
    with pytest.raises(ValueError, match=r"^Invalid threshold overrides: ") as info:
        Thresholds.with_overrides({"nope": 1, "dataloader_warning": 2, "rank_straggler": "x"})
    message = str(info.value)
    assert message.startswith("Invalid threshold overrides: ")
    parts = (
        "nope=1: unknown",
        "dataloader_warning must be a fraction between 0 and 1, got 2 (integer)",
        "rank_straggler must be a ratio >= 1, got 'x' (string)",
    )
    assert all(part in message for part in parts)
    assert "cpu_threads_warning" in message  # the known keys are listed


def test_the_constructor_checks_too():
    message = r"^Invalid thresholds: h2d_copy must be a fraction between 0 and 1, got 2 \(integer\)$"
    with pytest.raises(ValueError, match=message):
        Thresholds(h2d_copy=2)


def test_every_default_is_a_named_constant_with_a_comment():
    from lightning_perf.diagnose import thresholds

    source = (ROOT / "lightning_perf" / "diagnose" / "thresholds.py").read_text()
    for f in dataclasses.fields(Thresholds):
        constant = f.name.upper()
        assert getattr(thresholds, constant) == f.default, constant
        lines = source[: source.index(f"\n{constant} = ")].rstrip().splitlines()
        while re.match(r"[A-Z0-9_]+ = ", lines[-1]):  # constants of one rule share a comment
            lines.pop()
        assert lines[-1].startswith("#"), constant


# --- registry -----------------------------------------------------------------------------------------------


def test_diagnose_sorts_critical_first_then_by_catalogue_order():
    context = gpu_ctx(
        gpu_epoch(data_wait_fraction=0.15, data_wait=0.15, cuda_max_reserved=79 * GiB),
        gw(framework_time=0.2),
        step_times=spread(0.01, 0.02),
    )
    found = [(f.severity, f.id) for f in diagnose(context)]
    assert found == [
        ("critical", "memory_pressure"),
        ("warning", "dataloader_bound"),
        ("warning", "framework_overhead"),
        ("warning", "step_time_unstable"),
    ]


def test_info_findings_come_last():
    context = ctx(facts=facts(torch_threads=1, num_workers=2), step_times=spread(0.01, 0.02))
    found = [(f.severity, f.id) for f in diagnose(context)]
    assert found == [("warning", "step_time_unstable"), ("info", "cpu_threads")]


def test_a_rule_that_raises_is_skipped_and_reported(monkeypatch):
    def broken(ctx, t):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(RULES, "host_sync", broken)
    errors = []
    context = ctx(epoch(data_wait_fraction=0.5, data_wait=0.5))
    found = diagnose(context, on_error=lambda rule_id, err: errors.append((rule_id, err)))
    assert [f.id for f in found] == ["dataloader_bound"]
    [(rule_id, err)] = errors
    assert rule_id == "host_sync" and isinstance(err, ZeroDivisionError)
    assert [f.id for f in diagnose(context)] == ["dataloader_bound"]  # without on_error: skipped silently


def test_a_rule_may_return_several_findings(monkeypatch):
    def twice(ctx, t):
        return [
            Finding(id="host_sync", severity=s, title="t", evidence="e", advice="a", stage="train", epoch=0)
            for s in ("info", "critical")
        ]

    monkeypatch.setitem(RULES, "host_sync", twice)
    assert [f.severity for f in diagnose(ctx())] == ["critical", "info"]


def test_a_healthy_run_gets_no_warning():
    for context in (ctx(None, window()), gpu_ctx(), with_history(1000, 1001, 1002)):
        assert [f for f in diagnose(context) if f.severity != "info"] == []


# --- no torch, no lightning ---------------------------------------------------------------------------------

FORBIDDEN = {"torch", "lightning", "pytorch_lightning", "numpy"}
# The package's modules below every layer (records, number formatting, value checks) may be imported.
BELOW = [
    ROOT / "lightning_perf" / f"{name}.py"
    for name in ("records", "compile_records", "trial_records", "units", "validation", "docstrings")
]
PURE = [*sorted((ROOT / "lightning_perf" / "diagnose").glob("*.py")), *BELOW]


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_diagnosis_modules_import_neither_torch_nor_lightning(path):
    imported = imported_modules(path)
    roots = {name.split(".")[0] for name in imported}
    assert not roots & FORBIDDEN, sorted(imported)
    assert {name for name in imported if name.startswith("lightning_perf")} <= {
        *(f"lightning_perf.{p.stem}" for p in BELOW),
        *(f"lightning_perf.diagnose.{p.stem}" for p in PURE if p.parent.name == "diagnose"),
    }


def test_importing_the_diagnosis_loads_neither_torch_nor_lightning():
    assert heavy_modules_loaded_by("lightning_perf.diagnose.registry") == []
