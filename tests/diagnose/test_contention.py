"""``cpu_contention`` and what a busy machine does to the other findings (lightning_perf.diagnose.contention),
and ``cpu_threads`` (lightning_perf.diagnose.cpu_threads). Pure: no trainer, no torch. The real busy machine is
tests/callback/test_busy_machine.py."""

from __future__ import annotations

import dataclasses

import pytest
from contexts import ctx, facts, run

from lightning_perf.diagnose import contention
from lightning_perf.diagnose.model import RunFacts, StageEpoch
from lightning_perf.diagnose.registry import RULES, diagnose
from lightning_perf.diagnose.thresholds import Thresholds
from summaries import CPU, epoch, window

TWO_CPUS = dataclasses.replace(CPU, cpu_count=2, torch_threads=1, num_workers=0)


def judge(cpu_wait: float | None, facts: RunFacts = TWO_CPUS, **kw):
    context = StageEpoch(epoch=epoch(**{"cpu_wait_share": cpu_wait, "wall_time": 2.0, **kw}), facts=facts)
    return RULES["cpu_contention"](context, Thresholds())


@pytest.mark.parametrize(("share", "severity"), [(None, None), (0.05, None), (0.1, "warning"), (0.5, "critical")])
def test_fires_from_a_tenth_of_the_epoch_waiting_for_a_cpu(share, severity):
    f = judge(share)
    assert (f.severity if f else None) == severity


def test_load_from_outside_the_run_is_named_as_such():
    f = judge(0.62, other_cpu_load=1.9)
    assert f.title == "Training waited for a CPU 62% of the time: the machine is busy"
    assert "waited for a CPU 62% of the epoch (1.24 s of 2.00 s)" in f.evidence
    assert "this process may use 2 CPUs" in f.evidence and "1 torch thread and 0 DataLoader workers" in f.evidence
    assert "The load comes from outside this run" in f.advice and "set_num_threads" not in f.advice


def test_whose_load_it_was_is_not_guessed_where_it_was_not_measured():
    f = judge(0.62)
    assert f.title == "Training waited for a CPU 62% of the time" and f.severity == "critical"
    assert "not known (other processes' CPU time was not measured)" in f.advice


def test_a_short_epochs_outside_load_is_not_told_from_its_ticks():
    # Lightning's bug_report_model: 1-batch validation epochs pooled to 16 ms on 2 idle CPUs read "other processes
    # used 1.7 CPUs" (ticks of 10 ms) and were titled "the machine is busy"; its wait was 0.3 ms a batch.
    short = StageEpoch(
        epoch=epoch(cpu_wait_share=0.14, wall_time=0.016, other_cpu_load=1.7, batches=8),
        facts=dataclasses.replace(TWO_CPUS, torch_threads=2),
    )
    f = RULES["cpu_contention"](short, Thresholds())
    assert f.title == "Training waited for a CPU 14% of the time" and f.severity == "info"
    assert "used 1.7 CPUs meanwhile (too short to tell from none" in f.evidence
    assert "0.28 ms a batch: below 1.00 ms" in f.evidence
    # The same load over 0.2 s is told (+-0.2 CPUs): the machine is busy, whatever the wait per batch.
    long = dataclasses.replace(short, epoch=dataclasses.replace(short.epoch, wall_time=0.2))
    f = RULES["cpu_contention"](long, Thresholds())
    assert f.title.endswith("the machine is busy") and f.severity == "warning"
    # Idle over 0.4 s (+-0.1 CPUs): the run's own threads, below the 0.25 CPUs a 14% wait asks of the others.
    idle = dataclasses.replace(short, epoch=dataclasses.replace(short.epoch, wall_time=0.4, other_cpu_load=0.05))
    f = RULES["cpu_contention"](idle, Thresholds())
    assert f.title.endswith("the run's own threads crowd it") and f.severity == "warning"  # 7 ms a batch
    many = dataclasses.replace(idle, epoch=dataclasses.replace(idle.epoch, batches=100))
    assert RULES["cpu_contention"](many, Thresholds()).severity == "info"  # 0.56 ms a batch


def test_load_measured_outside_the_run_is_part_of_the_evidence():
    f = judge(0.62, other_cpu_load=1.96)
    assert f.title.endswith("the machine is busy") and "other processes on the machine used 2.0 CPUs" in f.evidence
    assert "The load comes from outside this run" in f.advice


def test_an_idle_machine_puts_the_wait_on_the_runs_own_threads():
    # Two torch threads on two idle CPUs: the intra-op threads spin after each operator, and a training thread
    # waking from a sleeping dataset found no CPU free (13% of the epoch, measured).
    f = judge(0.13, facts=dataclasses.replace(TWO_CPUS, torch_threads=2), other_cpu_load=0.02)
    assert f.title == "Training waited for a CPU 13% of the time: the run's own threads crowd it"
    assert "other processes on the machine used 0.0 CPUs" in f.evidence
    assert "`torch.set_num_threads(1)`" in f.advice and "outside this run" not in f.advice
    one = judge(0.13, other_cpu_load=0.02)  # one torch thread: other threads of the run, to look for
    assert "own threads held the CPUs" in one.advice and "set_num_threads" not in one.advice
    # The suspects are those the run has: no workers named where it has none; under DDP, the node's other ranks.
    assert "DataLoader's 0 workers" not in one.advice and "other ranks" not in one.advice
    spread = dataclasses.replace(TWO_CPUS, cpu_count=8, world_size=2, num_workers=2)
    ranks = judge(0.13, facts=spread, other_cpu_load=0.02)
    assert "(the DataLoader's 2 workers, the run's other ranks on this node and their gloo threads," in ranks.advice


def test_threads_beyond_the_cpus_are_the_runs_own_to_lower():
    f = judge(0.3, facts=dataclasses.replace(TWO_CPUS, torch_threads=2, num_workers=2))
    assert "oversubscribes its CPUs" in f.advice and "`torch.set_num_threads(1)`" in f.advice
    assert "`DataLoader(num_workers=...)` below 2" in f.advice
    # The workers' measured CPU use is said: 3 persistent workers over a dataset that sleeps used 0.4 CPUs.
    sleepy = judge(0.3, facts=dataclasses.replace(TWO_CPUS, torch_threads=2, num_workers=3), worker_cpu=0.8)
    assert "2 torch threads and 3 workers (using 0.4 CPUs in all) on 2 CPUs take turns" in sleepy.advice


def test_a_cgroup_quota_is_part_of_the_evidence():
    f = judge(0.3, facts=dataclasses.replace(TWO_CPUS, cpu_count=1, cpu_quota=1.5))
    assert "this process may use 1 CPU (its cgroup's quota is 1.5 CPUs)" in f.evidence


def busy_epoch(cpu_wait: float, loading_cpu_share: float):
    """An in-memory-like epoch: 60% data wait, a step time spread, on a machine where the thread waited."""
    return epoch(
        data_wait=0.6,
        step_time=1.0,
        data_wait_fraction=0.6,
        cpu_wait_share=cpu_wait,
        wall_time=1.0,
        loading_cpu_share=loading_cpu_share,
        first_data_wait=0.006,
    )


def test_on_a_busy_machine_time_share_findings_are_information_and_contention_comes_first():
    busy = StageEpoch(
        epoch=busy_epoch(0.6, 0.95),
        windows=(window(framework_time=0.005),),  # half of each step outside operators
        facts=TWO_CPUS,
    )
    found = diagnose(busy)
    assert found[0].id == "cpu_contention"
    by_id = {f.id: f for f in found}
    assert by_id["dataloader_bound"].severity == "info" and by_id["framework_overhead"].severity == "info"
    assert by_id["dataloader_bound"].evidence.startswith("measured while the machine was busy")
    quiet = diagnose(dataclasses.replace(busy, epoch=busy_epoch(0.01, 0.95), windows=()))
    assert "cpu_contention" not in {f.id for f in quiet}
    assert {f.id: f.severity for f in quiet}["dataloader_bound"] == "critical"


def test_a_wait_that_is_not_on_a_cpu_is_still_found_on_a_busy_machine():
    # A dataset that sleeps (a disk, the network): the process neither runs nor waits for a CPU in the wait.
    sleepy = StageEpoch(epoch=busy_epoch(0.3, 0.05), facts=TWO_CPUS)
    assert {f.id: f.severity for f in diagnose(sleepy)}["dataloader_bound"] == "critical"


def test_a_first_batch_longer_than_the_epochs_whole_wait_for_a_cpu_keeps_its_severity():
    # An iterable dataset that sets up 200 ms in __iter__, beside one burner: its steady waits ran on the CPU, but
    # the machine made the run wait 0.15 s in all, less than the first batch's 200 ms beyond a steady batch's.
    iterstart = epoch(
        batches=16,
        step_time=0.64,
        data_wait=0.30,
        data_wait_fraction=0.47,
        first_data_wait=0.2065,
        cpu_wait_share=0.23,
        wall_time=0.66,
        loading_cpu_share=1.0,
    )
    facts = dataclasses.replace(TWO_CPUS, dataset="iterable")
    found = {f.id: f for f in diagnose(StageEpoch(epoch=iterstart, facts=facts))}
    assert found["dataloader_bound"].severity in ("warning", "critical"), found["dataloader_bound"]
    assert found["dataloader_bound"].evidence.startswith("kept on a busy machine"), found["dataloader_bound"]
    assert "more than the machine made the run wait in all" in found["dataloader_bound"].evidence
    # Three such epochs judged together (Lightning's PPO example: a rollout before each epoch's first batch): each
    # first batch's own wait, and the sum that is compared with the machine's wait over the three.
    pooled = dataclasses.replace(iterstart, batches=48, step_time=1.92, data_wait=0.9, first_data_wait=0.6195,
                                 wall_time=1.98)  # fmt: skip
    evidence = RULES["dataloader_bound"](StageEpoch(epoch=pooled, facts=facts, pooled_epochs=3), Thresholds()).evidence
    assert "the first batches of the last 3 epochs waited 206.50 ms each, 200.27 ms beyond a steady batch's" in evidence
    assert "(600.80 ms in all): more than the machine made the run wait in all (455.40 ms)" in evidence
    # The same wait spread over the steady batches is the busy machine's: information.
    spread = dataclasses.replace(iterstart, first_data_wait=0.018)
    assert {f.id: f.severity for f in diagnose(StageEpoch(epoch=spread, facts=facts))}["dataloader_bound"] == "info"


def test_what_a_busy_machine_cannot_explain_keeps_its_severity():
    # While the window recorded, the thread waited 5 ms of each 20 ms step for a CPU. 5 ms outside operators may be
    # all that waiting (not found); 8 ms leaves 3 ms beyond it, less than the wait, which a busy machine's slower
    # CPU may also take (info); 12 ms leaves 7 ms, 47% of the 15 ms the step ran (kept).
    busy = epoch(cpu_wait_share=0.6, wall_time=1.0, data_wait_fraction=0.01)

    def framework(part: float):
        w = window(step_time=0.020, framework_time=part, cpu_wait_time=0.005)
        return {f.id: f for f in diagnose(StageEpoch(epoch=busy, windows=(w,), facts=TWO_CPUS))}.get(
            "framework_overhead"
        )

    assert framework(0.005) is None
    assert framework(0.008).severity == "info"
    kept = framework(0.012)
    assert kept.severity == "warning"
    assert "46% of the step outside any torch operator (7.00 ms of 15.00 ms) once the 5.00 ms" in kept.evidence


def test_contention_names_the_findings_it_made_information_and_those_kept_say_why():
    # One screen, one story: an in-memory data wait made information, 12 ms outside operators in a 20-ms step of
    # which 5 ms waited for a CPU kept. cpu_contention used to say every other time-share finding was information.
    busy = dataclasses.replace(busy_epoch(0.6, 0.95), other_cpu_load=2.0)
    w = window(step_time=0.020, framework_time=0.012, cpu_wait_time=0.005)
    found = {f.id: f for f in diagnose(StageEpoch(epoch=busy, windows=(w,), facts=TWO_CPUS))}
    kept, demoted, contention = found["framework_overhead"], found["dataloader_bound"], found["cpu_contention"]
    assert kept.severity == "warning" and demoted.severity == "info"
    assert kept.evidence.startswith(
        "kept on a busy machine (the training thread waited for a CPU 60% of the epoch), as what it measures, less"
        " the training thread's wait for a CPU while its window recorded, still reaches its threshold; "
    )
    assert contention.advice.endswith(
        "Measured while the machine was busy, this epoch's `dataloader_bound` is information only; `framework_overhead`"
        " keeps its severity: no wait for a CPU explains it (see the evidence)."
    )
    assert "information only" not in diagnose(StageEpoch(epoch=busy, facts=TWO_CPUS))[0].advice.replace(
        "`dataloader_bound` is information only", ""
    )


def test_a_sleeping_datasets_queueing_for_a_cpu_is_the_busy_machines_and_the_rest_is_kept():
    # Beside two burners: 92% data wait, 7% of the sampled waits on a CPU, 60% of them queued after a wake. The part
    # neither running nor queued, 92% x 40% x 93% = 34% of the step, sets the severity, and the evidence says why.
    sleepy = dataclasses.replace(busy_epoch(0.6, 0.07), data_wait_fraction=0.92, loading_queue_share=0.6)
    f = {f.id: f for f in diagnose(StageEpoch(epoch=sleepy, facts=TWO_CPUS))}["dataloader_bound"]
    assert f.severity == "critical"
    assert f.evidence.startswith(
        "kept on a busy machine (the training thread waited for a CPU 60% of the epoch), as 34% of the step waited"
        " off the CPU, neither running nor queued for one: no busy machine explains that; "
    )
    assert "used a CPU 7% of the sampled waits (less the 60% of them its thread queued for one)" in f.evidence
    less = dataclasses.replace(sleepy, loading_queue_share=0.95)  # 4% of the step off the CPU: the busy machine's
    assert {f.id: f.severity for f in diagnose(StageEpoch(epoch=less, facts=TWO_CPUS))}["dataloader_bound"] == "info"


def test_per_sample_loading_is_counted_not_timed_and_keeps_its_severity_on_a_busy_machine():
    facts = dataclasses.replace(TWO_CPUS, batch_size=64)
    per_sample = window(step_time=0.0073, dataloader_time=0.0039, dataloader_ops_per_step=386.0)
    found = {f.id: f for f in diagnose(StageEpoch(epoch=busy_epoch(0.6, 0.95), windows=(per_sample,), facts=facts))}
    assert found["dataloader_bound"].severity == "critical" and "__getitems__" in found["dataloader_bound"].advice
    assert found["dataloader_bound"].evidence.startswith(
        "kept on a busy machine (the training thread waited for a CPU 60% of the epoch), as its calls per sample are"
        " counted, not timed"
    )


def test_a_little_python_slowed_by_a_busy_cpu_is_explained():
    # Measured beside two burners: a tiny MLP's 3.5 ms step had 1.37 ms outside operators beyond its 0.48 ms wait
    # for a CPU (0.8 ms on an idle machine, under the rule's 1 ms). A busy SMT sibling slows the CPU up to 2x: a
    # part that is under 1 ms at idle speed is explained; 2.5 ms beyond the wait is not.
    busy = epoch(cpu_wait_share=0.12, wall_time=1.0, data_wait_fraction=0.01)

    def severity(part: float):
        w = window(step_time=0.0035 + part, framework_time=0.00048 + part, cpu_wait_time=0.00048)
        found = {f.id: f for f in diagnose(StageEpoch(epoch=busy, windows=(w,), facts=TWO_CPUS))}
        return found["framework_overhead"].severity

    assert severity(0.00137) == "info"
    assert severity(0.0025) == "warning"


def test_per_sample_loading_whose_time_an_idle_machine_would_not_notice_is_information_when_busy():
    # Measured beside two burners: an in-memory dataset's 27 batches waited 1.32 ms each (33% of the step) while
    # the thread waited for a CPU 50% of the epoch; at idle speed, 0.33 ms: under the rule's 1 ms per batch.
    facts = dataclasses.replace(TWO_CPUS, batch_size=8)
    busy = epoch(
        batches=27,
        step_time=0.108,
        data_wait=27 * 0.00132,
        data_wait_fraction=0.33,
        cpu_wait_share=0.5,
        wall_time=0.25,
        loading_cpu_share=1.04,
    )
    # 20 calls per sample (the 6 measured are too few for batching to pay: sample_loading.CALL_SAVING).
    per_sample = window(step_time=0.008, dataloader_time=0.0004, dataloader_ops_per_step=160.0)
    found = {f.id: f for f in diagnose(StageEpoch(epoch=busy, windows=(per_sample,), facts=facts))}
    assert found["dataloader_bound"].severity == "info", found["dataloader_bound"]
    assert found["dataloader_bound"].evidence.startswith("measured while the machine was busy")
    assert "__getitems__" in found["dataloader_bound"].advice  # the per-sample finding, demoted


def test_other_processes_using_as_many_cpus_as_the_wait_hold_them():
    # Lightning's PPO beside two CPU burners: its 2 torch threads left the burners 0.4 CPUs, and the training
    # thread waited 19% of a 3.86 s epoch ("the run's own threads crowd it", before).
    two = dataclasses.replace(TWO_CPUS, torch_threads=2)
    busy = StageEpoch(epoch=epoch(cpu_wait_share=0.19, wall_time=3.86, other_cpu_load=0.41, batches=4), facts=two)
    assert RULES["cpu_contention"](busy, Thresholds()).title.endswith("the machine is busy")
    idle = StageEpoch(epoch=epoch(cpu_wait_share=0.19, wall_time=3.86, other_cpu_load=0.1, batches=4), facts=two)
    assert RULES["cpu_contention"](idle, Thresholds()).title.endswith("the run's own threads crowd it")


def _stalled(slow: set[int], cpu_wait: float) -> StageEpoch:
    """32 steps of 22 ms, those in ``slow`` 46 ms (as beside two CPU burners: preempted for whole slices), on a
    machine where the training thread waited ``cpu_wait`` of the epoch."""
    steps = tuple(0.046 if i in slow else 0.022 for i in range(32))
    summary = epoch(
        batches=32,
        step_time=sum(steps),
        step_time_p50=0.022,
        step_time_p90=0.046,
        step_time_max=0.046,
        cpu_wait_share=cpu_wait,
        wall_time=sum(steps) / 0.96,
    )
    return StageEpoch(epoch=summary, step_times=steps, facts=TWO_CPUS)


def test_a_few_steps_preempted_for_whole_slices_are_explained_by_the_epochs_wait():
    # Beside two CPU burners, the tests' well-tuned model: p50 22 ms, p90 46 ms, a 26% wait. The mean wait per step
    # (7 ms) explains no 24-ms spread, but the epoch's wait (0.2 s) covers its 4 slowest steps' excess (0.1 s).
    irregular = {3, 12, 17, 29}
    busy = {f.id: f for f in diagnose(_stalled(irregular, 0.26))}
    assert busy["step_time_unstable"].severity == "info", busy["step_time_unstable"]
    assert busy["step_time_unstable"].evidence.startswith("measured while the machine was busy")
    # A wait of 10% (0.08 s) is less than the 4 steps' excess: the spread is more than the machine's doing.
    assert {f.id: f for f in diagnose(_stalled(irregular, 0.10))}["step_time_unstable"].severity == "warning"


def test_slow_steps_on_a_cadence_are_the_programs_however_busy_the_machine():
    found = {f.id: f for f in diagnose(_stalled({7, 15, 23, 31}, 0.5))}
    assert found["step_time_unstable"].severity == "warning"
    assert found["step_time_unstable"].title == "Training stalls every 8 batches"


# ------------------------------------------------------------------------------------ ranks in lockstep


def _ranks(waits: dict[int, float], cpu_wait: float | None = None) -> StageEpoch:
    """Irregular slow steps (:func:`_stalled`) on rank zero, under ranks whose training threads waited ``waits``
    of the epoch (rank zero's own: ``cpu_wait``, or ``waits[0]``)."""
    ctx = _stalled({3, 12, 17, 29}, waits[0] if cpu_wait is None else cpu_wait)
    facts = dataclasses.replace(TWO_CPUS, world_size=len(waits))
    return dataclasses.replace(ctx, rank_cpu_waits=waits, facts=facts)


def test_the_ranks_waits_are_the_steps_wait_in_lockstep():
    # Lightning's BoringModel under ddp on 2 gloo ranks sharing 2 CPUs: unstable steps on both ranks (p90 1.9-2.4x),
    # while rank zero alone waited 4.5-9.4% of each epoch and nothing explained them. Each rank's preemption
    # stalls every rank at the next collective.
    alone = {f.id: f for f in diagnose(_ranks({0: 0.08}))}
    assert alone["step_time_unstable"].severity == "warning" and "cpu_contention" not in alone
    assert contention.wait_share(_ranks({0: 0.08, 1: 0.15})) == pytest.approx(1 - 0.92 * 0.85)
    found = {f.id: f for f in diagnose(_ranks({0: 0.08, 1: 0.15}))}
    f = found["cpu_contention"]
    assert f.severity == "warning" and f.title.startswith("Training waited for a CPU 21% of the time")
    assert "some rank's training thread waited for a CPU 21% of the epoch (rank 0 8%, rank 1 15%)" in f.evidence
    assert found["step_time_unstable"].severity == "info"
    assert found["step_time_unstable"].evidence.startswith(
        "measured while the machine was busy (some rank's training thread waited for a CPU 21% of the epoch"
    )


def test_ranks_that_hardly_waited_add_nothing():
    # 64 ranks at 1% each would be 47% were every small wait counted: an idle machine's training thread waits
    # 0.0-0.13%.
    many = _ranks(dict.fromkeys(range(64), 0.01))
    assert contention.wait_share(many) == pytest.approx(0.01)
    assert "cpu_contention" not in {f.id for f in diagnose(many)}
    # Rank zero's own wait alone reaches the threshold: its evidence is its own, as on one process.
    alone = {f.id: f for f in diagnose(_ranks({**dict.fromkeys(range(64), 0.01), 0: 0.12}))}
    assert contention.wait_share(_ranks({0: 0.12, 1: 0.01})) == 0.12
    assert alone["cpu_contention"].evidence.startswith("the training thread waited for a CPU 12% of the epoch")


def test_the_data_wait_is_judged_on_rank_zeros_own_wait_for_a_cpu():
    # Another rank's preemption stalls rank zero in the step's collective, not in its DataLoader.
    eight = dataclasses.replace(TWO_CPUS, cpu_count=8, world_size=2)  # CPUs to spare for workers
    busy = StageEpoch(epoch=busy_epoch(0.01, 0.95), facts=eight)
    quiet = {f.id: f for f in diagnose(dataclasses.replace(busy, rank_cpu_waits={0: 0.01, 1: 0.6}))}
    assert quiet["cpu_contention"].severity == "critical"
    assert quiet["dataloader_bound"].severity == "critical"
    assert not quiet["dataloader_bound"].evidence.startswith("measured while")


@pytest.mark.parametrize(("strategy", "lockstep"), [("DDPStrategy", False), ("FSDPStrategy", True)])
def test_evaluation_steps_wait_for_every_rank_only_under_a_sharded_strategy(strategy, lockstep):
    # DDP's validation steps meet no collective; FSDP gathers each unit's parameters for every forward.
    ctx = _ranks({0: 0.05, 1: 0.3})
    ctx = dataclasses.replace(
        ctx,
        epoch=dataclasses.replace(ctx.epoch, stage="validate"),
        facts=dataclasses.replace(ctx.facts, strategy=strategy),
    )
    assert contention.wait_share(ctx) == pytest.approx(1 - 0.95 * 0.7 if lockstep else 0.05)


def _straggling(work: dict[int, float], waits: dict[int, float]) -> StageEpoch:
    """A training epoch of 12-ms steps under ranks whose own work per step is ``work`` and whose training threads
    waited ``waits`` of the epoch for a CPU."""
    busy = epoch(step_time=1.2, step_time_p50=0.012, step_time_p90=0.013, cpu_wait_share=waits[0], wall_time=1.2)
    facts = dataclasses.replace(TWO_CPUS, world_size=len(work))
    return StageEpoch(epoch=busy, facts=facts, rank_step_times=work, rank_cpu_waits=waits)


def test_a_straggler_the_ranks_waits_for_a_cpu_explain_is_information():
    # Identical ranks on a busy machine: "Rank 0 is 1.40x slower than the median rank", and "Rank 1 is 1.30x" on the
    # next run. Rank 0's 14 ms of own work a 12-ms step less its 70% wait (8.4 ms a step) is 5.6 ms; rank 1's 6 ms
    # less 0.6 ms is 5.4 ms: no straggler on CPU time.
    f = {f.id: f for f in diagnose(_straggling({0: 0.014, 1: 0.006}, {0: 0.7, 1: 0.05}))}["rank_straggler"]
    assert f.severity == "info" and f.title == "Rank 0 is 1.40x slower than the median rank"
    assert f.evidence.startswith(
        "measured while the machine was busy (some rank's training thread waited for a CPU 71% of the epoch"
    )


def test_a_straggler_beyond_the_ranks_waits_keeps_its_warning_and_says_why():
    # Both ranks waited 30% of the epoch (3.6 ms a step): 16.4 ms of own work against 6.4 ms is a straggler still.
    found = diagnose(_straggling({0: 0.020, 1: 0.010}, {0: 0.3, 1: 0.3}))
    f = {f.id: f for f in found}["rank_straggler"]
    assert f.severity == "warning"
    assert "as the ranks' own work per step differs beyond their waits for a CPU; " in f.evidence
    assert "`rank_straggler` keeps its severity" in found[0].advice


def test_a_virtual_machines_steal_time_counts_with_the_wait_and_is_named():
    # The host took the CPUs 20% of a 2-s epoch while the run queue read 4%: a wait for a CPU all the same, which
    # the run queue cannot see. 1 - 0.96 x (1 - 0.195) is 22% (the 10 ms ticks' error, 0.5%, taken out).
    f = judge(0.04, cpu_steal_share=0.2, other_cpu_load=0.0)
    assert (
        f.severity == "warning"
        and f.title == "Training waited for a CPU 22% of the time: the virtual machine's host took the CPU"
    )
    assert "the virtual machine's host took the CPUs 19% of the epoch (steal time, counted with the wait" in f.evidence
    assert f.advice.startswith("The virtual machine's host ran other work on this machine's CPUs (steal time")
    # A little steal beside a large wait is evidence, not the cause; a short epoch's tick is no steal.
    busy = judge(0.3, cpu_steal_share=0.02, other_cpu_load=2.0)
    assert busy.title.endswith(": the machine is busy") and "host took the CPUs 1% of the epoch" in busy.evidence
    assert judge(0.04, cpu_steal_share=0.2, wall_time=0.05) is None
    assert judge(0.04, cpu_steal_share=None) is None


def test_steal_time_makes_the_time_share_findings_information_too():
    # An in-memory data wait on a VM whose host took the CPUs 30% of the epoch: a busy machine's, not the program's.
    stolen = dataclasses.replace(busy_epoch(0.02, 0.95), cpu_steal_share=0.3, wall_time=2.0)
    found = {f.id: f for f in diagnose(StageEpoch(epoch=stolen, facts=TWO_CPUS))}
    assert found["cpu_contention"].title.endswith("the virtual machine's host took the CPU")
    assert found["dataloader_bound"].severity == "info"


# --- cpu_threads --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threads", "workers", "severity"),
    [(1, 0, "warning"), (3, 0, "warning"), (4, 0, "info"), (7, 0, "info"), (8, 0, None),
     (1, 2, "info"), (6, 2, None), (2, 8, None)],
)  # fmt: skip
def test_cpu_threads_severity_follows_the_share_of_cpus_and_the_workers(threads, workers, severity):
    f = run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=threads, num_workers=workers)))
    assert (f.severity if f else None) == severity


def test_cpu_threads_advice_and_distributed_share():
    f = run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=1, num_workers=0)))
    assert f.title == "torch computes on 1 of 8 CPUs" and "`torch.set_num_threads(8)`" in f.advice
    assert "OMP_NUM_THREADS" in f.advice
    # Two processes on 8 CPUs: each one's share is 4.
    f = run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=1, num_workers=0, world_size=2)))
    assert "`torch.set_num_threads(4)`" in f.advice and "8 shared by 2 processes" in f.evidence
    assert run("cpu_threads", ctx(facts=facts(cpu_count=8, torch_threads=4, num_workers=0, world_size=2))) is None


def test_cpu_threads_needs_the_counts():
    assert run("cpu_threads", ctx(facts=facts(torch_threads=None, num_workers=0))) is None
    assert run("cpu_threads", ctx(facts=facts(cpu_count=None, torch_threads=1, num_workers=0))) is None
