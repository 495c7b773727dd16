"""
CPU threads
===========

Whether a compute-bound CPU run computes on as many threads as it has CPUs: ``cpu_threads``.
"""

from __future__ import annotations

from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import below, cpus_per_process, finding, reaches
from lightning_perf.diagnose.step_tried import thread_setting, tried_step_advice
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.units import limit, ms, percent


def cpu_threads(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """A compute-bound CPU run computes on fewer threads than it has CPUs.

    Notes:
        1. Only on CPU (``RunFacts.device == "cpu"``), with the thread and CPU counts known, the step
           compute-bound (data wait below ``dataloader_warning``) and long enough for threads to matter (median
           ``cpu_threads_min_step`` or more).
        2. This process's share of the CPUs is ``cpu_count // world_size``, less one per DataLoader worker.
           Fires when ``torch_threads`` is below that share.
        3. Warning when the threads are below ``cpu_threads_warning`` of the share and there are no
           DataLoader workers; otherwise info (torch's default is the physical cores, often half the logical
           CPUs, where hyperthreads add little; workers may need the cores).
        4. Where the advised count was tried on one real step (``StageEpoch.advice_trials``,
           :mod:`~lightning_perf.diagnose.step_tried`), the advice leads with the measurement; one not
           ``advice_trial_min_gain`` times as fast is withdrawn, and the finding is ``info``.
    """
    facts = ctx.facts
    threads, cpus = facts.torch_threads, facts.cpu_count
    per_process = cpus_per_process(facts)  # None exactly when cpus is
    if facts.device != "cpu" or threads is None or cpus is None or per_process is None:
        return None
    if reaches(ctx.epoch.data_wait_fraction, t.dataloader_warning) or below(
        ctx.epoch.step_time_p50, t.cpu_threads_min_step
    ):
        return None
    workers = facts.num_workers or 0
    available = max(1, per_process - workers)
    if threads >= available:
        return None
    weak = workers > 0 or reaches(threads / per_process, t.cpu_threads_warning)
    evidence = [
        f"torch computes on {threads} thread{'s' if threads != 1 else ''} with {per_process} CPUs for this"
        " process"
        + (f" ({cpus} shared by {facts.world_size} processes)" if facts.world_size > 1 else "")
        + (f", {workers} of them for DataLoader workers" if workers else ""),
        f"compute-bound: data wait {percent(ctx.epoch.data_wait_fraction)} (< {limit(t.dataloader_warning)}),"
        f" median step {ms(ctx.epoch.step_time_p50)} (>= {ms(t.cpu_threads_min_step)})",
        f"warning below {limit(t.cpu_threads_warning)} of the CPUs without DataLoader workers, else info",
    ]
    advice = [
        f"Call `torch.set_num_threads({available})` at the start of the script, or unset `OMP_NUM_THREADS`"
        " (launchers often set it to 1)."
    ]
    if workers:
        advice.append(f"That leaves one CPU to each of the {workers} DataLoader workers.")
    elif weak:
        advice.append("Gains are smaller on hyperthreaded CPUs, where torch's default already uses each core once.")
    advice, withdrawn = tried_step_advice(
        ctx.advice_trials, "cpu_threads", advice, t.advice_trial_min_gain, thread_setting(advice), kept=[]
    )
    return finding(
        ctx,
        "cpu_threads",
        "info" if weak or withdrawn else "warning",
        f"torch computes on {threads} of {per_process} CPUs",
        evidence,
        advice,
    )
