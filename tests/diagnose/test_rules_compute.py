"""``low_mfu`` on hand-built summaries: it fires below its threshold on a GPU only, shows the achieved and
peak FLOP/s, and its advice names the findings of the same epoch that explain a low MFU (run after them by
the registry) or, with none, the levers that fit the run's precision, GPU and stage."""

import dataclasses

import pytest

import summaries
from lightning_perf.diagnose import registry
from lightning_perf.diagnose.model import Finding, RunFacts, StageEpoch
from lightning_perf.diagnose.registry import RULE_IDS, RULES, SUMMARY_RULES, diagnose
from lightning_perf.diagnose.rules_compute import EXPLAINING_RULES, low_mfu
from lightning_perf.diagnose.thresholds import LOW_MFU, Thresholds
from lightning_perf.records import EpochSummary

H100_BF16 = 989e12  # dense bf16 peak of an H100 SXM, FLOP/s

GPU = dataclasses.replace(summaries.GPU, device_name="NVIDIA H100 80GB HBM3", peak_flops=H100_BF16)
FP32_GPU = dataclasses.replace(GPU, precision="32-true", peak_flops=67e12)
V100 = dataclasses.replace(GPU, device_name="Tesla V100-SXM2-16GB", precision="32-true", peak_flops=15.7e12)
CPU = dataclasses.replace(GPU, device="cpu", device_name="x86_64", precision="32-true", peak_flops=1e12)


def epoch(mfu: float | None, stage: str = "train", peak: float = H100_BF16, **kw) -> EpochSummary:
    """A healthy 100-batch GPU epoch of 10 ms steps whose achieved FLOP/s is ``mfu`` of ``peak``."""
    values = dict(
        stage=stage,
        samples=6400,
        throughput=6400.0,
        flops_per_batch=1.2e12 if mfu is not None else None,
        flops_per_second=mfu * peak if mfu is not None else None,
        mfu=mfu,
    )
    return summaries.gpu_epoch(**{**values, **kw})


def ctx(epoch_: EpochSummary, facts: RunFacts = GPU) -> StageEpoch:
    return StageEpoch(epoch=epoch_, facts=facts, step_times=(0.01,) * 100)


def run(context: StageEpoch, found=(), **overrides) -> Finding | None:
    return low_mfu(context, Thresholds.with_overrides(overrides), found)


def other(rule_id: str, severity="warning", title="a title") -> Finding:
    return Finding(id=rule_id, severity=severity, title=title, evidence="e", advice="a", stage="train", epoch=0)


# --- when it fires -------------------------------------------------------------------------------------------


def test_fires_below_the_threshold_with_achieved_and_peak_flops():
    found = run(ctx(epoch(0.12)))
    assert found is not None
    assert (found.id, found.severity, found.stage, found.epoch, found.window) == ("low_mfu", "info", "train", 0, None)
    assert found.title == "Training reaches 12% of the GPU's peak FLOP/s (MFU)"
    assert found.evidence == (
        '119 TFLOP/s achieved against the dense peak 989 TFLOP/s for precision="bf16-mixed" on NVIDIA H100 80GB'
        " HBM3; MFU 12% (info below 30%); 1.20 TFLOP per batch"
    )


@pytest.mark.parametrize(
    ("mfu", "fires"),
    [(0.2999, True), (0.0, True), (LOW_MFU, False), (0.1 + 0.2, False), (0.30, False), (0.55, False)],
)
def test_fires_below_the_threshold_and_not_at_or_above_it(mfu, fires):
    assert (run(ctx(epoch(mfu))) is not None) is fires


def test_just_below_shows_a_share_rounded_down_under_the_threshold():
    found = run(ctx(epoch(0.2999)))
    assert found is not None and "MFU 29% (info below 30%)" in found.evidence


@pytest.mark.parametrize(
    "context",
    [
        ctx(epoch(0.05), facts=CPU),  # a CPU run is not judged, even with a peak given
        ctx(epoch(None)),  # no peak known, or no batch counted
        ctx(epoch(None, flops_per_second=4e13, flops_per_batch=1e12)),  # FLOP/s but no MFU
    ],
    ids=["cpu with a peak", "mfu unknown", "flops but no mfu"],
)
def test_silent_without_a_known_mfu_on_a_gpu(context):
    assert run(context) is None


def test_the_peak_is_derived_from_the_mfu_when_the_facts_lack_it():
    found = run(ctx(epoch(0.25, peak=312e12), facts=dataclasses.replace(GPU, peak_flops=None)))
    assert found is not None and found.evidence.startswith("78.0 TFLOP/s achieved against the dense peak 312 TFLOP/s")


def test_the_threshold_override_works_and_a_bad_value_is_refused():
    assert run(ctx(epoch(0.4))) is None
    found = run(ctx(epoch(0.4)), low_mfu=0.5)
    assert found is not None and "(info below 50%)" in found.evidence
    assert run(ctx(epoch(0.04)), low_mfu=0.05) is not None
    assert run(ctx(epoch(0.05)), low_mfu=0.05) is None
    with pytest.raises(ValueError, match=r"low_mfu must be a fraction between 0 and 1, got 1\.5 \(number\)"):
        Thresholds.with_overrides({"low_mfu": 1.5})
    with pytest.raises(ValueError, match=r"low_mfu must be a fraction between 0 and 1, got '30%' \(string\)"):
        Thresholds(low_mfu="30%")


# --- advice: the findings of the same epoch, or the usual levers -------------------------------------------


def test_advice_names_the_explaining_findings_most_severe_first():
    found = run(
        ctx(epoch(0.1)),
        found=[
            other("device_idle", "warning", "GPU busy only 41% of each training step"),
            other("memory_pressure", "warning", "GPU memory 92% full"),  # does not explain a low MFU
            other("dataloader_bound", "critical", "Training waits for data 45% of the time"),
        ],
    )
    assert found is not None
    assert found.advice.startswith(
        "This epoch's other findings take time from the arithmetic; fix them first, most severe first:"
        " `dataloader_bound` (Training waits for data 45% of the time);"
        " `device_idle` (GPU busy only 41% of each training step)."
    )
    assert "memory_pressure" not in found.advice
    assert "bf16" not in found.advice and "torch.compile" not in found.advice


@pytest.mark.parametrize("rule_id", EXPLAINING_RULES)
def test_each_explaining_rule_is_named(rule_id):
    found = run(ctx(epoch(0.1)), found=[other(rule_id)])
    assert found is not None and f"`{rule_id}` (a title)" in found.advice


def test_every_explaining_rule_is_a_rule():
    assert set(EXPLAINING_RULES) <= set(RULES)


def test_without_explaining_findings_the_levers_fit_a_bf16_training_run():
    found = run(ctx(epoch(0.1)), found=[other("memory_growth")])
    assert found is not None
    assert found.advice.startswith("No other finding explains it, so the usual levers apply.")
    assert "precision=" not in found.advice  # already bf16
    assert "`model = torch.compile(model)` before `trainer.fit(model)`" in found.advice
    assert "A larger `batch_size` (now 64) in the training DataLoader" in found.advice
    assert "scale the learning rate" in found.advice
    assert "`torch.utils.flop_counter`" in found.advice  # what MFU counts, in every case


def test_the_levers_offer_bf16_to_an_fp32_run_and_fp16_to_a_gpu_without_bf16():
    fp32 = run(ctx(epoch(0.1, peak=67e12), facts=FP32_GPU))
    assert fp32 is not None and '`Trainer(precision="bf16-mixed")`' in fp32.advice
    volta = run(ctx(epoch(0.1, peak=15.7e12), facts=V100))
    assert volta is not None and '`Trainer(precision="16-mixed")`' in volta.advice
    assert "bf16-mixed" not in volta.advice and "Tesla V100-SXM2-16GB" in volta.advice


def test_the_levers_fit_another_stage():
    found = run(ctx(epoch(0.1, stage="validate"), facts=dataclasses.replace(GPU, batch_size=None)))
    assert found is not None and found.title.startswith("Validation reaches 10%")
    assert "before passing it to the Trainer" in found.advice and "trainer.fit" not in found.advice
    assert "A larger `batch_size` in the validation DataLoader gives each kernel more work." in found.advice
    assert "learning rate" not in found.advice


# --- the registry runs it after the other rules and passes their findings ----------------------------------


def data_bound(mfu: float = 0.1) -> StageEpoch:
    """A GPU epoch waiting for data half of the time (dataloader_bound, critical) with a low MFU."""
    return ctx(epoch(mfu, data_wait=0.5, data_wait_fraction=0.5))


def test_the_registry_lists_it_after_the_other_rules():
    assert (*RULES, "low_mfu") == RULE_IDS and set(SUMMARY_RULES) == {"low_mfu"}


def test_diagnose_passes_the_same_epochs_findings():
    found = diagnose(data_bound())
    assert [(f.severity, f.id) for f in found] == [("critical", "dataloader_bound"), ("info", "low_mfu")]
    assert "`dataloader_bound` (Training waits for data 50% of the time)" in found[-1].advice


def test_diagnose_with_no_other_finding_gives_the_levers():
    [found] = diagnose(ctx(epoch(0.1)))
    assert found.id == "low_mfu" and found.advice.startswith("No other finding explains it")


def test_diagnose_runs_the_other_rules_for_it_when_only_it_is_named():
    [found] = diagnose(data_bound(), rules={"low_mfu"})
    assert found.id == "low_mfu" and "`dataloader_bound`" in found.advice
    assert [f.id for f in diagnose(data_bound(), rules={"dataloader_bound"})] == ["dataloader_bound"]
    with pytest.raises(ValueError, match=r"no rule named 'low_mfus'; the rules are: .*cpu_threads, low_mfu$"):
        diagnose(data_bound(), rules={"low_mfus"})


def test_the_thresholds_reach_it_through_diagnose():
    assert "low_mfu" not in {f.id for f in diagnose(ctx(epoch(0.4)))}
    assert "low_mfu" in {f.id for f in diagnose(ctx(epoch(0.4)), Thresholds(low_mfu=0.5))}


def test_a_broken_rule_leaves_it_running_and_a_broken_summary_rule_is_reported(monkeypatch):
    def broken(*args):
        raise ZeroDivisionError("boom")

    errors = []
    monkeypatch.setitem(RULES, "host_sync", broken)
    found = diagnose(data_bound(), on_error=lambda rule_id, err: errors.append(rule_id))
    assert [f.id for f in found] == ["dataloader_bound", "low_mfu"] and errors == ["host_sync"]
    monkeypatch.setitem(registry.SUMMARY_RULES, "low_mfu", broken)
    errors.clear()
    found = diagnose(data_bound(), on_error=lambda rule_id, err: errors.append(rule_id))
    assert [f.id for f in found] == ["dataloader_bound"] and errors == ["host_sync", "low_mfu"]
