"""
Distributed rules
=================

``communication_bound`` (the step waits for collectives), ``small_collectives`` (many small ones a step),
``low_bus_bandwidth`` (large ones far below the link's bandwidth), ``fsdp_all_gathers`` (FSDP's parameter
gathers in the open) and ``rank_straggler`` (one rank slows the rest).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from lightning_perf.diagnose.links import Link, node_link
from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import (
    accumulation,
    finding,
    in_window,
    on_cuda,
    reaches,
    stage_name,
    step_method,
    strongest,
)
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import CollectiveStats, TraceSummary, share
from lightning_perf.units import bandwidth, limit, ms, percent, signed_size, times


def communication_bound(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Collective communication that no compute hides takes a large share of the step.

    Notes:
        1. Only for distributed runs (``world_size > 1``) or traces that show communication.
        2. Per window: ``communication_exposed_time`` / step time.
        3. Fires, as a warning, at ``communication`` in the window with the largest share among those with
           ``communication_min_time`` or more of it per step.
        4. The rules run on rank zero, whose windows are ``ctx.windows``; where rank zero is the late rank, it
           spends least of its step in collectives and the others wait for it. So where rank zero's windows fall
           short, the rank that spends most (``ctx.rank_waits``) is judged on the same limits, its time taken as
           its share of rank zero's step (a step ends at a collective on every rank at once).
        5. Advice fits the stage (only training synchronizes gradients) and the device (NCCL on GPUs, gloo on
           CPUs).
    """
    windows = [
        w
        for w in ctx.windows
        if w.communication_exposed_time is not None and reaches(w.communication_exposed_time, t.communication_min_time)
    ]
    if ctx.facts.world_size <= 1 and not any(w.communication_time is not None for w in ctx.windows):
        return None
    limits = f"(warning >= {limit(t.communication)} and >= {ms(t.communication_min_time)} per step)"
    best = strongest(windows, lambda w: share(w.communication_exposed_time, w))
    if best is not None and reaches(best[1], t.communication):
        window, value = best
        measured = (
            f"communication with no compute overlapping it {percent(value)} of the step"
            f" ({ms(window.communication_exposed_time or 0.0)} of {ms(window.step_time)}, communication"
            f" {ms(window.communication_time or 0.0)} in all) {in_window(window, len(ctx.windows))} {limits}"
        )
    else:
        other = _another_ranks_wait(ctx, t)
        if other is None:
            return None
        window, value, rank, zero = other
        measured = (
            f"rank {rank} spends {percent(value)} of its step in collectives with no compute overlapping it"
            f" (about {ms(value * window.step_time)} of the {ms(window.step_time)} step"
            f" {in_window(window, len(ctx.windows))}; rank 0 {percent(zero)}) {limits}"
        )
    evidence = [measured, f"world_size={ctx.facts.world_size}"]
    split = wait_or_transfer(ctx.rank_waits, t, ctx.windows)
    if split is not None:
        evidence.append(split[1])
    if ctx.stage == "train":
        advice = _gradient_sync_advice(ctx)
    else:
        sources = [
            "metrics synced on every step (torchmetrics' `dist_sync_on_step=True`)",
            f"`self.all_gather` in `{step_method(ctx.stage)}`",
            "a sharded strategy (FSDP, DeepSpeed stage 3) gathering the weights for each forward",
        ]
        if ctx.stage != "predict":  # predict does not log
            sources.insert(
                0,
                "`self.log(..., on_step=True, sync_dist=True)` (without `on_step=True` Lightning syncs a logged"
                " value once, at the epoch's end)",
            )
        advice = [
            f"{stage_name(ctx.stage)} synchronizes no gradients: the collectives come from the step itself:"
            f" {'; '.join(sources)}. Gather once per epoch instead of once per batch."
        ]
    if split is not None and split[0] == "wait":
        advice.insert(0, "Most of it is waiting for a late rank: make that rank's step as short as the others' first.")
    if on_cuda(ctx):
        advice.append(
            "Check the interconnect: `NCCL_DEBUG=INFO` shows whether NCCL uses NVLink/InfiniBand or falls back"
            " to TCP sockets."
        )
    else:
        advice.append("On CPU (gloo) the trace shows no overlap with compute: all of the collectives' time counts.")
    return finding(
        ctx,
        "communication_bound",
        "warning",
        f"{stage_name(ctx.stage)} waits on communication {percent(value)} of each step",
        evidence,
        advice,
        window,
    )


# DDP's first bucket holds 1 MiB of gradients (the others `bucket_cap_mb`, 25 MiB): smaller gradients all-reduce in one
# small bucket, whose time is the collective's latency (its round trips), not its bytes, and no bucket setting
# shortens it. Measured on Lightning's BoringModel (264 B of gradients) under ddp on 2 CPUs, median epoch of 3:
# `gradient_as_bucket_view=True, static_graph=True` 2.51 s against 2.46 s, `accumulate_grad_batches=4` 1.89 s. On
# Lightning's transformer example (47 MB of gradients), the bucket settings 1.03x, twice the batch 1.09x, two
# batches accumulated about 1.1x. The threshold: our judgment, from DDP's first bucket.
SMALL_GRADIENTS = 2**20


def _gradient_sync_advice(ctx: StageEpoch) -> list[str]:
    """How to sync gradients less, first, then to overlap them where they are large enough for DDP's buckets to
    matter; what a module that optimizes manually can use (Lightning refuses ``accumulate_grad_batches`` there,
    and ``static_graph=True`` fails where its graph changes between steps)."""
    facts = ctx.facts
    # The trainable parameters' bytes, which DDP's gradients match: the gradients themselves may be unset when
    # counted (set to None by `zero_grad`, as a module that optimizes manually may leave them).
    manual, gradients = facts.manual_optimization, ((facts.memory or {}).get("parameters") or {}).get("trainable")
    advice = [
        f"Sync gradients less often: {accumulation('N', manual=manual)} syncs them once every N batches"
        + ("" if manual else " (Lightning skips the others with DDP's `no_sync`)")
        + "; a larger batch per device does more compute per sync."
    ]
    if isinstance(gradients, int) and gradients < SMALL_GRADIENTS:
        advice.append(
            f"The gradients are {signed_size(gradients)} in all (as the trainable parameters): their all-reduce costs"
            " its latency, not its bytes,"
            " so DDP's bucket settings (`gradient_as_bucket_view`, `static_graph`, `bucket_cap_mb`) will not shorten"
            " it."
        )
    else:
        advice.append(
            f"Overlap the all-reduce with the backward: `DDPStrategy(gradient_as_bucket_view=True"
            f"{'' if manual else ', static_graph=True'})` and a tuned `bucket_cap_mb` (default 25) let buckets start"
            " while backward still runs"
            + (
                " (not `static_graph=True`: a module that optimizes manually may change its graph between steps)."
                if manual
                else "."
            )
        )
    advice.append("Fewer `self.log(..., sync_dist=True)` calls remove small collectives.")
    return advice


def _another_ranks_wait(ctx: StageEpoch, t: Thresholds) -> tuple[TraceSummary, float, int, float] | None:
    """Rank zero's longest-stepped window, the largest share of its step another rank spends in collectives, that
    rank and rank zero's share, where the share is above rank zero's and reaches ``communication``, and its time
    ``communication_min_time``; else ``None`` (see :func:`communication_bound`, note 4)."""
    waits = ctx.rank_waits or {}
    rank, value = max(waits.items(), key=lambda item: (item[1], -item[0]), default=(0, 0.0))
    zero = waits.get(0, value)
    best = strongest(ctx.windows, lambda w: w.step_time or None)
    if value <= zero or best is None or not reaches(value, t.communication):
        return None
    window = best[0]
    if not reaches(value * window.step_time, t.communication_min_time):
        return None
    return window, value, rank, zero


def rank_straggler(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """One rank's steps are slower than the others', and every rank waits for it.

    Notes:
        1. Only for training epochs of distributed runs with per-rank step times
           (``StageEpoch.rank_step_times``: each rank's median step minus the share it spent waiting in
           collectives, its own work; under DDP every rank's step lasts as long as the slowest rank's, so the
           slow rank is the one that waits least).
        2. Measures the slowest rank's time / the median over ranks.
        3. Fires, as a warning, at ``rank_straggler`` when the excess also costs ``rank_straggler_cost`` of
           the step (the median step of this rank, which under DDP is every rank's) and
           ``rank_straggler_min_time``, naming the rank.
    """
    ranks = ctx.rank_step_times
    if ctx.stage != "train" or not ranks or len(ranks) < 2:
        # Only training synchronizes the ranks at every step (the gradient all-reduce); in the other stages a
        # rank's steps do not wait for the others', so per-step differences cost nothing until the epoch's end.
        return None
    median = statistics.median(ranks.values())
    slow, slowest = max(ranks.items(), key=lambda item: (item[1], -item[0]))
    if median <= 0 or not reaches(slowest / median, t.rank_straggler):
        return None
    if not reaches(slowest - median, t.rank_straggler_min_time):
        return None
    step = ctx.epoch.step_time_p50
    if step > 0 and not reaches((slowest - median) / step, t.rank_straggler_cost):
        return None
    ratio = slowest / median
    fastest = min(ranks.values())
    evidence = [
        f"rank {slow}'s own work per step (its median step less its wait in collectives) {ms(slowest)} is"
        f" {times(ratio)} the median over {len(ranks)} ranks ({ms(median)}; fastest {ms(fastest)})"
        f" (warning >= {t.rank_straggler:g}x, and >= {limit(t.rank_straggler_cost)} of the"
        f" {ms(step)} step and >= {ms(t.rank_straggler_min_time)})"
    ]
    split = wait_or_transfer(ctx.rank_waits, t, ctx.windows)
    if split is not None:
        evidence.append(split[1])
    machine = (
        "a slower or throttling GPU, other processes: `nvidia-smi`, `top`"
        if on_cuda(ctx)
        else "other processes or fewer free cores: `top`"
    )
    advice = [
        f"Every rank waits for rank {slow} at each gradient all-reduce. Look at what differs on it:"
        f" its machine ({machine}), its data shard"
        " (larger samples, slower storage, fewer `num_workers` per process than CPUs allow), or rank-dependent"
        " work in the step."
    ]
    if slow == 0:
        advice.append(
            "Rank 0 does extra work in many setups: `rank_zero_only` logging, checkpoint saving, a progress bar;"
            " move it out of the step or make it less frequent."
        )
    return finding(
        ctx,
        "rank_straggler",
        "warning",
        f"Rank {slow} is {times(ratio)} slower than the median rank",
        evidence,
        advice,
    )


def small_collectives(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Many small collectives every step, each paying the link's latency.

    Notes:
        1. Per window, from its collectives (``StageEpoch.collectives``): a kind is small where its mean message
           is under ``small_collective_bytes`` or, where the trace gives no sizes (gloo), its mean call takes
           under ``small_collective_time``.
        2. Fires, as a warning, where the small ones number ``small_collectives_per_step`` or more per step and
           take ``small_collectives_share`` of the step, in the window where they take the largest share.
        3. Advice: Lightning's ``self.log(..., sync_dist=True)`` on every step all-reduces each value (on gloo
           after a barrier): log once per epoch, or without syncing; one tensor for values of one's own.
    """

    def small_in(window: TraceSummary) -> list[CollectiveStats]:
        return [c for c in ctx.collectives.get(window.window, ()) if _small(c, t)]

    def share_of_step(window: TraceSummary) -> float | None:
        small = small_in(window)
        share_ = _per_step(small, exposed=False) / window.step_time if window.step_time > 0 else 0.0
        many = reaches(sum(c.per_step for c in small), t.small_collectives_per_step)
        return share_ if many and reaches(share_, t.small_collectives_share) else None

    best = strongest(ctx.windows, share_of_step)
    if best is None:
        return None
    window, value = best
    small = small_in(window)
    per_step = sum(c.per_step for c in small)
    kinds = ", ".join(f"{c.per_step:g} {c.kind}" for c in sorted(small, key=lambda c: -c.per_step))
    sizes = [c.bytes / c.calls for c in small if c.bytes is not None and c.calls]
    evidence = [
        f"{per_step:g} small collectives a step ({kinds}), {percent(value)} of the {ms(window.step_time)} step"
        f" {in_window(window, len(ctx.windows))} (warning >= {t.small_collectives_per_step} a step and"
        f" >= {limit(t.small_collectives_share)})",
        f"the largest mean message {signed_size(round(max(sizes)))}"
        if sizes
        else f"each under {ms(t.small_collective_time)} (this trace gives no sizes: gloo records none)",
    ]
    advice = [
        f"Each `self.log(name, value, sync_dist=True)` in `{step_method(ctx.stage)}` all-reduces its value"
        " across the ranks on every step (on gloo Lightning adds a barrier before each): log it with"
        " `on_step=False, on_epoch=True` (reduced once, at the epoch's end), or without `sync_dist` for a"
        " per-step curve (rank zero's own value), or accumulate it in a torchmetrics `Metric`, which syncs once"
        " in `compute()`.",
        "Collectives of your own: put the values in one tensor (`torch.stack`) and reduce it once.",
    ]
    return finding(
        ctx,
        "small_collectives",
        "warning",
        f"{stage_name(ctx.stage)} runs {per_step:g} small collectives a step",
        evidence,
        advice,
        window,
    )


def _small(c: CollectiveStats, t: Thresholds) -> bool:
    if c.bytes is not None and c.calls:
        return c.bytes / c.calls < t.small_collective_bytes
    return c.calls > 0 and c.seconds / c.calls < t.small_collective_time


def wait_or_transfer(
    waits: Mapping[int, float] | None, t: Thresholds, windows: Sequence[TraceSummary] = ()
) -> tuple[str, str] | None:
    """Whether the ranks' time in collectives is a wait for a late rank (``"wait"``) or the transfer itself
    (``"transfer"``), or cannot tell (``"unsure"``), and the evidence line that says so; ``None`` for fewer than
    2 ranks.

    Notes:
        1. ``waits``: each rank's share of its step in collectives with no compute overlapping.
        2. A wait where the shares spread by ``communication_wait_spread`` of their median and 5 points: the
           ranks that spend more arrive earlier and wait for the one that spends least (under DDP a collective
           ends on every rank at once). Else every rank spends about the same: the transfer.
        3. Where the ``windows`` the shares come from hold one step each, a spread is one step's order of arrival,
           which changes from step to step: no rank is called late (Lightning's transformer example on 2 CPU
           ranks, the same run five times: shares of 6-16%, a different rank least in different runs).
    """
    if not waits or len(waits) < 2:
        return None
    median = statistics.median(waits.values())
    late, least = min(waits.items(), key=lambda item: (item[1], item[0]))
    most = max(waits.values())
    if most - least >= max(t.communication_wait_spread * median, 0.05):
        if windows and max(w.steps for w in windows) < 2:
            return "unsure", (
                f"the ranks spend {percent(least)}-{percent(most)} of their step in collectives, in windows of one"
                " step: that step's order of arrival, too little to call a rank late (`rank_straggler` judges"
                " every batch)"
            )
        return "wait", (
            f"a wait, not the transfer: the ranks spend {percent(least)}-{percent(most)} of their step in"
            f" collectives, rank {late} the least: the others arrive earlier and wait for it"
        )
    return "transfer", (
        f"the transfer itself, not a wait: every rank spends {percent(least)}-{percent(most)} of its step in"
        " collectives (no rank is late)"
    )


def low_bus_bandwidth(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Large collectives run far below the link's bandwidth.

    Notes:
        1. Per window, the collectives whose bus bandwidth is known (sized NCCL kernels) and whose mean message
           reaches ``low_bus_bandwidth_min_bytes``, where bandwidth, not latency, sets their time.
        2. The link: ``Thresholds.link_bandwidth`` where given, else, in a run of one node, the table's for the
           device (:func:`~lightning_perf.diagnose.links.node_link`); unknown (several nodes, a device the table
           does not name): no finding.
        3. Fires, as a warning, where the slowest such collective's bus bandwidth is below ``low_bus_bandwidth``
           of the link's peak per direction.
        4. A collective kernel's time includes waiting for the other ranks to arrive, so a late rank lowers it
           too: the advice says to rule that out first (``rank_straggler``, ``communication_bound``'s wait).
    """
    if t.link_bandwidth is not None:
        link = Link("the link", t.link_bandwidth, "Thresholds.link_bandwidth")
    elif ctx.facts.num_nodes <= 1 and (known := node_link(ctx.facts.device_name)) is not None:
        link = known
    else:
        return None
    found: list[tuple[float, CollectiveStats, TraceSummary]] = []
    for window in ctx.windows:
        for c in ctx.collectives.get(window.window, ()):
            large = c.bytes is not None and c.calls and c.bytes / c.calls >= t.low_bus_bandwidth_min_bytes
            if large and c.bus_bandwidth is not None:
                found.append((c.bus_bandwidth / link.bandwidth, c, window))
    if not found:
        return None
    value, slowest, window = min(found, key=lambda item: item[0])
    if value >= t.low_bus_bandwidth:
        return None
    per_call = (slowest.bytes or 0) / slowest.calls
    evidence = [
        f"{slowest.kind} ({slowest.group or 'its group'}, {slowest.ranks} ranks): {signed_size(round(per_call))} a call"
        f" at a bus bandwidth of {bandwidth(slowest.bus_bandwidth or 0.0)}, {percent(value)} of {link.name}'s"
        f" {bandwidth(link.bandwidth)} per direction {in_window(window, len(ctx.windows))} (warning <"
        f" {limit(t.low_bus_bandwidth)} on calls of >= {signed_size(t.low_bus_bandwidth_min_bytes)})",
        f"the link's peak: {link.source}",
    ]
    advice = [
        "Rule out a late rank first: a collective kernel's time includes waiting for the other ranks (see"
        " `rank_straggler`, and whether `communication_bound` calls it a wait).",
        "Then the transport: `NCCL_DEBUG=INFO` says which one NCCL uses (NVLink/P2P, SHM, InfiniBand, or `NET/Socket`,"
        " TCP); `nvidia-smi topo -m` shows how the GPUs are linked; `NCCL_P2P_DISABLE=1` or `NCCL_IB_DISABLE=1` left"
        " in the environment forces a slower path; across nodes, `NET/Socket` means TCP in place of InfiniBand."
        " Give the real link's rate as `Thresholds(link_bandwidth=...)` where this table's is not yours"
        " (`lightning_perf.diagnose.links.INFINIBAND` has the InfiniBand rates).",
    ]
    return finding(
        ctx,
        "low_bus_bandwidth",
        "warning",
        f"{stage_name(ctx.stage)}'s {slowest.kind} runs at {percent(value)} of {link.name}'s bandwidth",
        evidence,
        advice,
        window,
    )


def fsdp_all_gathers(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """FSDP's all-gathers wait in the open: the step waits for each unit's parameters.

    Notes:
        1. FSDP's pattern, per window: all-gathers (before each unit's forward and again before its backward) and
           reduce-scatters (after its backward), at least as many all-gathers as reduce-scatters, both every step.
        2. Fires, as a warning, where the all-gathers' exposed time (no compute overlapping them) takes
           ``communication`` of the step and ``communication_min_time`` per step, as ``communication_bound``.
        3. Advice from what the trace shows: prefetching (``forward_prefetch``, ``backward_prefetch``) and
           ``limit_all_gathers``; larger units where the all-gathers are many and small (the wrapping policy);
           ``sharding_strategy="SHARD_GRAD_OP"`` (parameters kept from forward to backward: one all-gather per
           unit instead of two) where memory allows.
    """
    if ctx.stage != "train":  # only training reduce-scatters gradients: the pattern, and the advice, are its
        return None

    def pattern(window: TraceSummary) -> tuple[list[CollectiveStats], list[CollectiveStats]]:
        stats = ctx.collectives.get(window.window, ())
        gathers = [c for c in stats if "allgather" in _plain(c.kind)]
        return gathers, [c for c in stats if "reducescatter" in _plain(c.kind)]

    def exposed_share(window: TraceSummary) -> float | None:
        gathers, scatters = pattern(window)
        gathered, scattered = sum(c.per_step for c in gathers), sum(c.per_step for c in scatters)
        if scattered < 1 or gathered < scattered or window.step_time <= 0:
            return None
        exposed = _per_step(gathers, exposed=True)
        waits = reaches(exposed, t.communication_min_time) and reaches(exposed / window.step_time, t.communication)
        return exposed / window.step_time if waits else None

    best = strongest(ctx.windows, exposed_share)
    if best is None:
        return None
    window, value = best
    gathers, scatters = pattern(window)
    gathered, scattered = sum(c.per_step for c in gathers), sum(c.per_step for c in scatters)
    sizes = [c.bytes / c.calls for c in gathers if c.bytes is not None and c.calls]
    evidence = [
        f"FSDP's pattern: {gathered:g} all-gathers and {scattered:g} reduce-scatters a step"
        f" {in_window(window, len(ctx.windows))}; the all-gathers' exposed time {percent(value)} of the"
        f" {ms(window.step_time)} step (warning >= {limit(t.communication)} and >= {ms(t.communication_min_time)})",
    ]
    if sizes:
        evidence.append(f"{signed_size(round(statistics.mean(sizes)))} an all-gather on average")
    advice = [
        "Start each unit's all-gather before it is needed: `FSDPStrategy(forward_prefetch=True,"
        " backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True)` (`from"
        " torch.distributed.fsdp import BackwardPrefetch`; `limit_all_gathers` keeps the prefetches from filling"
        " memory)."
    ]
    if gathered >= 4 * max(scattered, 1) or (sizes and statistics.mean(sizes) < t.small_collective_bytes):
        advice.append(
            "The all-gathers are many and small: wrap larger units, `FSDPStrategy(auto_wrap_policy={YourBlock})`"
            " with the model's repeated block (a transformer layer), not every `nn.Linear`."
        )
    advice.append(
        "Where memory allows, `FSDPStrategy(sharding_strategy='SHARD_GRAD_OP')` keeps each unit's parameters"
        " from its forward to its backward: one all-gather per unit a step instead of two."
    )
    return finding(
        ctx,
        "fsdp_all_gathers",
        "warning",
        f"{stage_name(ctx.stage)} waits for FSDP's all-gathers {percent(value)} of each step",
        evidence,
        advice,
        window,
    )


def _per_step(stats: list[CollectiveStats], *, exposed: bool) -> float:
    """The collectives' time per step (seconds), all of it or its exposed part."""
    return sum((c.exposed_seconds if exposed else c.seconds) * c.per_step / c.calls for c in stats if c.calls)


def _plain(kind: str) -> str:
    return kind.replace("_", "").lower()
