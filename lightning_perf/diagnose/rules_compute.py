"""
Arithmetic rules
================

How much of the device's arithmetic the run uses: ``low_mfu``, the achieved FLOP/s against the GPU's dense
peak (model FLOPs utilization). It is a :data:`~lightning_perf.diagnose.rule_helpers.SummaryRule`: a low MFU
is a symptom whose causes other rules name, so it reads their findings of the same epoch and points at them.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_perf.diagnose.model import SEVERITIES, Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import FP32_PRECISIONS, below, compile_lever, finding, on_cuda, stage_name
from lightning_perf.diagnose.rules_device import PRE_AMPERE_NAMES
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.units import count, flops, flops_rate, limit, percent

# The rules whose findings take time from the step's arithmetic, so lower its achieved FLOP/s: the GPU
# waits (for data, the host, copies, other ranks), runs kernels too short to fill it, runs fp32 without its
# tensor cores, or the step spends its time in work the FLOP counter does not count (Python, the optimizer's
# elementwise update, spikes).
EXPLAINING_RULES = (
    "dataloader_bound",
    "host_sync",
    "device_idle",
    "launch_bound",
    "h2d_copy",
    "precision",
    "optimizer_heavy",
    "framework_overhead",
    "step_time_unstable",
    "communication_bound",
    "rank_straggler",
)


def low_mfu(ctx: StageEpoch, t: Thresholds, found: Sequence[Finding] = ()) -> Finding | None:
    """The GPU does a small share of the arithmetic it could: model FLOPs utilization (MFU) is low.

    Notes:
        1. Only on CUDA, where the epoch's MFU (``EpochSummary.mfu``: its achieved FLOP/s over the device's
           dense peak for the run's dtype) is known. A CPU run is not judged, even with a peak given: its
           peak depends on the vector units and threads in use, which no table knows.
        2. Fires, as info, when MFU is below ``low_mfu``.
        3. Advice names ``found``'s findings (the other rules' findings of the same epoch) that take time
           from the arithmetic (:data:`EXPLAINING_RULES`), most severe first; with none, the usual levers:
           bf16 (when the run is fp32), ``torch.compile`` and a larger batch.
    """
    mfu = ctx.epoch.mfu
    if mfu is None or not on_cuda(ctx) or not below(mfu, t.low_mfu):
        return None
    evidence = [
        _rates(ctx, mfu),
        f"MFU {percent(mfu)} (info below {limit(t.low_mfu)})",
        f"{flops(ctx.epoch.flops_per_batch)} per batch" if ctx.epoch.flops_per_batch is not None else "",
    ]
    explaining = _explaining(found)
    if explaining:
        advice = [
            "This epoch's other findings take time from the arithmetic; fix them first, most severe first: "
            + "; ".join(f"`{f.id}` ({f.title})" for f in explaining)
            + "."
        ]
    else:
        advice = _levers(ctx)
    advice.append(
        "MFU counts the matmuls, convolutions and attention that `torch.utils.flop_counter` knows: a model"
        " whose step is mostly elementwise or normalization work reads low however well it runs."
    )
    return finding(
        ctx,
        "low_mfu",
        "info",
        f"{stage_name(ctx.stage)} reaches {percent(mfu)} of the GPU's peak FLOP/s (MFU)",
        evidence,
        advice,
    )


def _rates(ctx: StageEpoch, mfu: float) -> str:
    """``'119 TFLOP/s achieved against the dense peak 989 TFLOP/s for precision="bf16-mixed" on <GPU>'``; the
    peak from the run's facts, else from the achieved FLOP/s and the MFU."""
    facts, achieved = ctx.facts, ctx.epoch.flops_per_second
    peak = facts.peak_flops
    if peak is None and achieved is not None and mfu > 0:
        peak = achieved / mfu
    parts = [f"{flops_rate(achieved)} achieved"] if achieved is not None else []
    if peak is not None:
        parts.append(
            f"the dense peak {flops_rate(peak)}"
            + (f' for precision="{facts.precision}"' if facts.precision else "")
            + (f" on {facts.device_name}" if facts.device_name else "")
        )
    return " against ".join(parts)


def _explaining(found: Sequence[Finding]) -> list[Finding]:
    """``found``'s findings of :data:`EXPLAINING_RULES`, most severe first, then in catalogue order."""
    chosen = [f for f in found if f.id in EXPLAINING_RULES]
    return sorted(chosen, key=lambda f: -SEVERITIES.index(f.severity))  # stable: catalogue order within a level


def _levers(ctx: StageEpoch) -> list[str]:
    """The usual ways to raise MFU, fitted to the run's precision, GPU and stage."""
    facts, training = ctx.facts, ctx.stage == "train"
    levers = ["No other finding explains it, so the usual levers apply."]
    if facts.precision in FP32_PRECISIONS:
        name = facts.device_name or ""
        if any(marker in name.upper() for marker in PRE_AMPERE_NAMES):
            levers.append(
                f'`Trainer(precision="16-mixed")` runs matmuls on {name}\'s tensor cores (it has neither bf16 nor'
                " TF32), typically 2-8x faster than fp32."
            )
        else:
            levers.append(
                '`Trainer(precision="bf16-mixed")` runs matmuls and convolutions on the tensor cores, typically'
                " 2-8x faster than fp32 (Ampere or newer)."
            )
    lever = compile_lever(
        ctx, None, "fuses elementwise operations into fewer kernels and cuts the host's work per step."
    )
    levers.append(lever[0].upper() + lever[1:])
    batch = f" (now {count(facts.batch_size)})" if facts.batch_size else ""
    levers.append(
        f"A larger `batch_size`{batch} in the {stage_name(ctx.stage).lower()} DataLoader gives each kernel more"
        " work" + (" (scale the learning rate with it)." if training else ".")
    )
    return levers
