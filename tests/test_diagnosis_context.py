"""The diagnosis context (``lightning_perf.diagnosis_context``) and the rank summaries (``summarize.ranks``),
built by hand from plain records: no trace file, no trainer."""

from __future__ import annotations

import dataclasses
import math

import msgspec
import pytest

from lightning_perf.diagnose import registry
from lightning_perf.diagnose.loading import loading
from lightning_perf.diagnose.model import Finding, RunFacts
from lightning_perf.diagnose.registry import CROSS_RANK_RULES, RULES, diagnose
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.diagnosis_context import (
    cross_rank_findings,
    epoch_context,
    ranks_context,
    run_facts,
    trace_context,
    trace_notes,
    trace_stage,
)
from lightning_perf.records import RankSummary
from lightning_perf.summarize.events import KinetoTrace, distributed_info
from lightning_perf.summarize.ranks import (
    FIELDS,
    rank_summaries,
    rank_summary_of_trace,
    rank_values,
    rank_work_times,
)
from lightning_perf.summarize.steps import summarize_epoch
from purity import heavy_modules_loaded_by
from summaries import window

# perf_report.json's "run", as the callback's run info writes it: every fact a RunFacts holds, each with a
# value of its own, so that a fact read from the wrong key shows.
RUN = {
    "torch": "2.13.0",
    "lightning": "2.6.0",
    "device": "cuda",
    "device_name": "NVIDIA A100",
    "precision": "bf16-mixed",
    "strategy": "DDPStrategy",
    "world_size": 8,
    "num_nodes": 2,
    "cpu_count": 12,
    "cpu_quota": 6.5,
    "val_check_steps": 100,
    "optimizer_info": {
        "class": "SGD",
        "fused": False,
        "foreach": None,
        "fusable": True,
        "built_by": "darts",
        "builder": "PLForecastingModule.configure_optimizers",
    },
    "torch_threads": 6,
    "max_epochs": 7,
    "peak_flops": 312e12,
    "compiled_modules": "`LightningModule`",
    "progress_bar": "TQDMProgressBar",
    "progress_bar_refresh": 1,
    "manual_optimization": True,
    "memory": {"parameters": {"total": 4}, "gradients": 4, "optimizer_state": {"total": 8}, "optimizers": ["SGD"]},
    "dataloaders": {
        "train": {
            "num_workers": 3,
            "pin_memory": True,
            "persistent_workers": False,
            "batch_size": 64,
            "dataset": "iterable",
            "shared_state": "`self.buffer` of the LightningModule",
            "dataset_class": "TimeSeriesDataSet",
            "dataset_library": "pytorch_forecasting",
            "built_by": "torch_geometric",
            "builder": "LightningDataset.train_dataloader",
            "dataset_length": 5120,
            # (a real run has these only where the stage iterates no DataLoader, and then none of the above)
            "iterable_class": "IterableSlice",
            "iterable_library": "gluonts",
        },
        "validate": {"num_workers": 0, "pin_memory": False, "persistent_workers": None, "batch_size": 128},
    },
}


def _epoch(stage: str = "train", epoch: int = 0, *, steps: int = 4, step: float = 0.010, wait: float = 0.001):
    return summarize_epoch(
        stage=stage, epoch=epoch, data_wait=[wait] * steps, compute=[step - wait] * steps, batch_sizes=[8] * steps
    )


def _rank(rank: int, step: float | None, communication: float | None = None, **kw) -> RankSummary:
    values = dict.fromkeys(FIELDS) | {"step_time_p50": step, "communication_share": communication} | kw
    return RankSummary(rank=rank, **values)


# --- run facts ------------------------------------------------------------------------------------------------


def test_run_facts_reads_the_run_and_the_stages_dataloader():
    assert run_facts(RUN, "train") == RunFacts(
        device="cuda",
        device_name="NVIDIA A100",
        precision="bf16-mixed",
        world_size=8,
        num_nodes=2,
        strategy="DDPStrategy",
        cpu_count=12,
        cpu_quota=6.5,
        val_check_steps=100,
        optimizer="SGD",
        optimizer_fused=False,
        optimizer_fusable=True,
        optimizer_built_by="darts",
        optimizer_builder="PLForecastingModule.configure_optimizers",
        torch_threads=6,
        num_workers=3,
        pin_memory=True,
        persistent_workers=False,
        batch_size=64,
        dataset="iterable",
        shared_state="`self.buffer` of the LightningModule",
        dataset_class="TimeSeriesDataSet",
        dataset_library="pytorch_forecasting",
        loader_built_by="torch_geometric",
        loader_builder="LightningDataset.train_dataloader",
        dataset_length=5120,
        iterable_class="IterableSlice",
        iterable_library="gluonts",
        epochs=7,
        peak_flops=312e12,
        compiled_modules="`LightningModule`",
        progress_bar="TQDMProgressBar",
        progress_bar_refresh=1,
        memory=RUN["memory"],
        manual_optimization=True,
    )
    validate = run_facts(RUN, "validate")
    assert (validate.num_workers, validate.pin_memory, validate.batch_size) == (0, False, 128)
    assert validate.dataset is None and validate.device == "cuda" and validate.epochs == 7


def test_run_facts_sets_every_fact():
    """Every field of RunFacts comes from the run: none is left at its default by a forgotten key."""
    facts = run_facts(RUN, "train")
    unset = [f.name for f in dataclasses.fields(RunFacts) if getattr(facts, f.name) == f.default]
    assert unset == []


@pytest.mark.parametrize(
    "run", [{}, {"dataloaders": {}}, {"dataloaders": {"train": None}}, {"dataloaders": {"test": {"num_workers": 2}}}]
)
def test_run_facts_of_an_unknown_run_or_loader_are_the_defaults(run):
    assert run_facts(run, "train") == RunFacts()


# --- a measured epoch -----------------------------------------------------------------------------------------


def test_epoch_context_holds_the_epoch_as_given():
    summary, earlier = _epoch(epoch=2), (_epoch(epoch=0), _epoch(epoch=1))
    validation = (_epoch("validate", 3),)
    facts = run_facts(RUN, "train")
    context = epoch_context(
        summary,
        history=list(earlier),
        windows=[window()],
        validation=list(validation),
        facts=facts,
        evidence_batches=4,
    )
    assert context.epoch is summary and context.stage == "train"
    assert context.history == earlier and context.validation == validation and context.windows == (window(),)
    assert context.facts is facts
    assert context.step_times == () and context.rank_step_times is None
    assert epoch_context(summary).facts == RunFacts()


def test_an_epoch_of_too_few_batches_is_judged_with_the_latest_epochs():
    # Epochs of one batch each (a library whose batches count series): judged over the stage's recent batches.
    one = [
        summarize_epoch(stage="train", epoch=i, data_wait=[0.03], compute=[0.01], batch_sizes=[4]) for i in range(12)
    ]
    context = epoch_context(one[-1], history=one[:-1], evidence_batches=8)
    pooled = context.epoch
    assert (pooled.epoch, pooled.batches, pooled.samples) == (11, 8, 32)
    assert pooled.step_time == pytest.approx(0.32) and pooled.data_wait_fraction == pytest.approx(0.75)
    assert pooled.first_data_wait == pytest.approx(0.24)  # every batch was its epoch's first: all start-up
    assert epoch_context(one[0], evidence_batches=8).epoch is one[0]  # no history: the epoch as it is


def test_epochs_measured_together_count_as_their_epochs_with_each_first_wait():
    # Five epochs of two batches measured as one record: each first batch waited 10 ms (its DataLoader's start),
    # each other batch 1 ms. The start-up is per epoch, not per record.
    waits, computes = [0.010, 0.001] * 5, [0.002] * 10
    group = summarize_epoch(
        stage="train", epoch=9, data_wait=waits, compute=computes, batch_sizes=[4] * 10, epoch_starts=range(0, 10, 2)
    )
    assert (group.epochs, group.first_data_wait) == (5, pytest.approx(0.05))
    context = epoch_context(group, evidence_batches=8)
    assert context.pooled_epochs == 5
    load = loading(context)
    assert load.epochs == 5 and load.first == pytest.approx(5 * 0.009)  # 9 ms more than a steady batch, each


def test_epoch_context_step_times_leave_profiled_and_unfinished_batches_out():
    context = epoch_context(
        _epoch(),
        data_wait=[0.001, 0.002, 0.003, 0.004, 0.5],  # the last batch started and did not end
        compute=[0.010, 0.020, 0.030, 0.040],
        profiled=[False, True, True, False, False],
    )
    times = context.step_times
    assert len(times) == 4
    assert times[0] == pytest.approx(0.011) and times[3] == pytest.approx(0.044)
    assert math.isnan(times[1]) and math.isnan(times[2])


def test_epoch_context_counts_batches_past_the_profiled_flags_as_not_profiled():
    times = epoch_context(_epoch(), data_wait=[0.001] * 3, compute=[0.01] * 3, profiled=[True]).step_times
    assert math.isnan(times[0]) and times[1:] == pytest.approx([0.011, 0.011])


def test_epoch_context_compares_the_ranks_own_work():
    ranks = [_rank(0, 0.020, communication=0.5), _rank(1, 0.020, communication=0.1), _rank(2, None)]
    context = epoch_context(_epoch(), ranks=ranks)
    assert context.rank_step_times == pytest.approx({0: 0.010, 1: 0.018})  # rank 2 measured nothing


def test_epoch_context_is_what_the_rules_judge():
    """Built from the numbers alone, the context makes the rules fire: validation run inside the training
    epoch, a straggling rank."""
    train = _epoch(steps=100, step=0.010)
    long_validation = (_epoch("validate", 0, steps=50, step=0.040),)
    ranks = [_rank(0, 0.010, communication=0.5), _rank(1, 0.010, communication=0.5), _rank(2, 0.010)]
    facts = RunFacts(world_size=3)
    ids = {f.id for f in diagnose(epoch_context(train, validation=long_validation, ranks=ranks, facts=facts))}
    assert {"validation_heavy", "rank_straggler"} <= ids
    assert not {"validation_heavy", "rank_straggler"} & {f.id for f in diagnose(epoch_context(train, facts=facts))}


# --- a trace alone --------------------------------------------------------------------------------------------


def test_trace_context_makes_the_trace_steps_an_epoch():
    summary = window(steps=5, step_time=0.02)
    context = trace_context(summary, {}, stage="validate")
    epoch = context.epoch
    assert (epoch.stage, epoch.epoch, epoch.batches, epoch.profiled_batches) == ("validate", 0, 5, 0)
    assert epoch.step_time_p50 == epoch.step_time_p90 == epoch.step_time_max == pytest.approx(0.02)
    assert epoch.step_time == pytest.approx(0.1) and epoch.data_wait == epoch.data_wait_fraction == 0.0
    assert epoch.samples is None and epoch.throughput is None
    assert context.windows == (summary,) and context.history == () and context.step_times == ()
    assert context.rank_step_times is None
    assert context.facts == RunFacts(device="cpu", device_name=summary.device_name, world_size=1)
    assert trace_context(summary, {}).stage == "train"


def test_trace_context_facts_are_what_the_trace_tells():
    gpu = window(device_busy=0.008, device_name="Tesla V100-SXM2-16GB")
    facts = trace_context(gpu, {"world_size": 8, "rank": 3}, precision="32-true", world_size=2).facts
    assert facts == RunFacts(device="cuda", device_name="Tesla V100-SXM2-16GB", precision="32-true", world_size=8)
    assert trace_context(gpu, {"world_size": 2}, world_size=4).facts.world_size == 4
    assert trace_context(gpu, {"world_size": None}).facts.world_size == 1


def test_a_trace_of_a_stage_without_a_dataloader_has_its_data_wait_from_its_notes():
    summary = window(steps=4, step_time=0.02)
    notes = {"stage": "train", "iterable_class": "IterableSlice", "iterable_library": "gluonts", "data_wait": 0.015}
    context = trace_context(summary, {}, notes=notes)
    assert (context.facts.iterable_class, context.facts.iterable_library) == ("IterableSlice", "gluonts")
    assert context.epoch.data_wait == pytest.approx(0.06) and context.epoch.data_wait_fraction == pytest.approx(0.75)
    # A data wait without an iterable (a DataLoader's time is in the trace's spans), or past the step: not as given.
    assert trace_context(summary, {}, notes={"data_wait": 0.015}).epoch.data_wait == 0.0
    assert trace_context(summary, {}, notes={**notes, "data_wait": 0.5}).epoch.data_wait_fraction == 1.0
    assert trace_notes({"lightning_perf": notes}) == notes and trace_notes({"lightning_perf": [1]}) == {}


def test_trace_metadata_from_a_decoded_trace_or_a_dict():
    ours = {"traceEvents": [], "distributedInfo": {"rank": 1, "world_size": 2}, "lightning_perf": {"stage": "test"}}
    decoded = msgspec.json.decode(msgspec.json.encode(ours), type=KinetoTrace)
    for trace in (ours, decoded):
        assert distributed_info(trace) == {"rank": 1, "world_size": 2}
        assert trace_stage(trace) == "test"
    for other in ({"traceEvents": []}, {"distributedInfo": [1], "lightning_perf": {"stage": "fit"}}):
        assert distributed_info(other) == {} and trace_stage(other) == "train"


# --- the ranks of a window ------------------------------------------------------------------------------------


def test_rank_summary_of_trace_is_what_one_trace_tells():
    summary = window(step_time=0.02, dataloader_time=0.005, communication_exposed_time=0.004)
    row = rank_summary_of_trace(3, summary)
    assert row == _rank(3, 0.02, communication=pytest.approx(0.2), data_wait_fraction=pytest.approx(0.25))
    assert rank_summary_of_trace(0, window(communication_exposed_time=None)).communication_share is None


def test_ranks_context_is_a_training_epoch_of_the_median_rank():
    ranks = [_rank(0, 0.010), _rank(1, 0.030), _rank(2, 0.020, communication=0.5), _rank(3, None)]
    context = ranks_context(ranks)
    assert context.stage == "train" and context.epoch.batches == 1
    assert context.epoch.step_time_p50 == pytest.approx(0.015)  # the median of 0.010, 0.030, 0.020 and 0
    assert context.facts == RunFacts(world_size=4)
    assert context.rank_step_times == pytest.approx({0: 0.010, 1: 0.030, 2: 0.010})


def test_cross_rank_findings_name_the_straggler_and_nothing_else():
    ranks = [rank_summary_of_trace(r, window(step_time=step)) for r, step in enumerate((0.010, 0.010, 0.016))]
    [finding] = cross_rank_findings(ranks)
    assert (finding.id, finding.severity, finding.stage, finding.epoch) == ("rank_straggler", "warning", "train", 0)
    assert finding.title.startswith("Rank 2 is 1.6") and finding.title.endswith("slower than the median rank")
    even = [rank_summary_of_trace(r, window()) for r in range(3)]
    assert cross_rank_findings(even) == []
    assert cross_rank_findings(ranks, Thresholds(rank_straggler=2.0)) == []


def test_cross_rank_findings_are_the_registrys_straggler_findings():
    """The same finding as every rule run on the ranks' context, kept to the cross-rank ones (how the CLI
    found them before)."""
    ranks = [rank_summary_of_trace(r, window(step_time=step)) for r, step in enumerate((0.014, 0.010, 0.010, 0.011))]
    everything = diagnose(ranks_context(ranks))
    assert everything and cross_rank_findings(ranks) == [f for f in everything if f.id in CROSS_RANK_RULES]


def test_cross_rank_findings_run_the_cross_rank_rules_alone(monkeypatch):
    def always(ctx, t):
        return Finding(id="always", severity="critical", title="", evidence="", advice="", stage="train", epoch=0)

    monkeypatch.setitem(registry.RULES, "always", always)
    ranks = [rank_summary_of_trace(r, window(step_time=step)) for r, step in enumerate((0.010, 0.010, 0.016))]
    assert "always" in {f.id for f in diagnose(ranks_context(ranks))}
    assert [f.id for f in cross_rank_findings(ranks)] == ["rank_straggler"]


# --- the registry's subsets -----------------------------------------------------------------------------------


def test_diagnose_runs_only_the_rules_named():
    context = epoch_context(_epoch(steps=100), validation=(_epoch("validate", steps=50, step=0.040),))
    assert "validation_heavy" in {f.id for f in diagnose(context)}
    assert diagnose(context, rules=("rank_straggler",)) == []
    assert {f.id for f in diagnose(context, rules={"validation_heavy"})} == {"validation_heavy"}
    assert set(CROSS_RANK_RULES) <= set(RULES)
    with pytest.raises(ValueError, match="no rule named 'rank_stragler'"):
        diagnose(context, rules=["rank_stragler"])


# --- the numbers the ranks exchange ---------------------------------------------------------------------------


def test_rank_values_round_trip_through_rank_summaries():
    summary = dataclasses.replace(_epoch(), host_rss_peak=2.0**30, cuda_max_allocated=None)
    windows = [window(communication_exposed_time=0.001), window(communication_exposed_time=0.003), window()]
    values = rank_values(summary, windows)
    assert len(values) == len(FIELDS) and all(isinstance(v, float) for v in values)
    [back] = rank_summaries([values])
    assert back.rank == 0 and back.host_rss_peak == 2.0**30 and back.cuda_max_allocated is None
    assert back.communication_share == pytest.approx(0.3)  # the largest of the windows'
    for name in ("step_time_p50", "step_time_p90", "step_time_max", "data_wait_fraction", "throughput"):
        assert getattr(back, name) == pytest.approx(getattr(summary, name)), name


def test_rank_values_of_a_rank_that_measured_nothing_are_nan():
    empty = summarize_epoch(stage="train", epoch=0, data_wait=[], compute=[], batch_sizes=[])
    for summary in (None, empty):
        assert all(math.isnan(v) for v in rank_values(summary, []))
    values = rank_values(None, [window(communication_exposed_time=0.002)])
    assert values[FIELDS.index("communication_share")] == pytest.approx(0.2)
    assert rank_summaries([values, rank_values(None, [])])[1] == _rank(1, None)


def test_rank_work_times_leave_out_the_wait_in_collectives():
    assert rank_work_times([_rank(0, 0.02, communication=0.25), _rank(1, 0.01), _rank(2, None)]) == {
        0: pytest.approx(0.015),
        1: 0.01,
    }


def test_the_context_imports_neither_torch_nor_lightning():
    assert heavy_modules_loaded_by("lightning_perf.diagnosis_context") == []
    assert heavy_modules_loaded_by("lightning_perf.summarize.ranks") == []
