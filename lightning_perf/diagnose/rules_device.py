"""
Compute device rules
====================

How well the step keeps its compute device busy: ``host_sync``, ``device_idle``, ``launch_bound`` and
``precision`` on a GPU, ``launch_bound`` on a CPU (``cpu_threads`` is :mod:`~lightning_perf.diagnose.cpu_threads`).
"""

from __future__ import annotations

from lightning_perf.diagnose.model import Finding, Severity, StageEpoch
from lightning_perf.diagnose.rule_helpers import (
    FP32_PRECISIONS,
    below,
    compile_lever,
    finding,
    in_window,
    on_cuda,
    reaches,
    stage_name,
    step_method,
    strongest,
)
from lightning_perf.diagnose.step_tried import precision_setting, tried_step_advice
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import TraceSummary, share
from lightning_perf.units import count, limit, ms, percent, us

# Tensor-core GPUs without bf16 or TF32 (Volta, Turing): there, only fp16 ("16-mixed") uses the tensor cores.
PRE_AMPERE_NAMES = ("V100", "GV100", "TITAN V", "T4", "TITAN RTX", "RTX 20", "QUADRO RTX")
# What the summary counts as a tiny operator, in seconds, for the evidence's text: the summary's own cutoff
# (lightning_perf.summarize.step_summary.TINY_OP_US), which this package cannot import (numpy); a test holds them equal.
TINY_OP_TIME = 20e-6


def _count(value: float) -> str:
    """A per-step count: ``3.0`` -> ``"3"``, ``2.25`` -> ``"2.2"``."""
    return f"{round(value, 1):g}"


def _syncing(window: TraceSummary, t: Thresholds) -> bool:
    idle = share(window.sync_idle_time, window)
    return (
        window.syncs_per_step is not None
        and idle is not None
        and reaches(window.syncs_per_step, t.host_sync_per_step)
        and reaches(idle, t.host_sync_idle)
        and reaches(window.sync_idle_time or 0.0, t.host_sync_min_idle)
    )


def host_sync(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The host blocks on the GPU inside the step (CUDA only).

    Notes:
        1. Per window: host-device synchronizations per step, and the device idle time inside them / step
           time.
        2. Fires, as a warning, where both reach ``host_sync_per_step`` and ``host_sync_idle``, and the idle
           time ``host_sync_min_idle`` per step; points at the window with the most idle time.
        3. Advice names the stage's step method and how the stage logs (predict does not).
    """
    if not on_cuda(ctx):
        return None
    best = strongest((w for w in ctx.windows if _syncing(w, t)), lambda w: share(w.sync_idle_time, w))
    if best is None:
        return None
    window, idle = best
    syncs = window.syncs_per_step or 0.0
    evidence = [
        f"{_count(syncs)} host-device syncs per step leave the GPU idle {percent(idle)} of the step"
        f" ({ms(window.sync_idle_time or 0.0)} of {ms(window.step_time)}) {in_window(window, len(ctx.windows))}"
        f" (warning: >= {_count(t.host_sync_per_step)} per step with >= {limit(t.host_sync_idle)} of the step idle"
        f" and >= {ms(t.host_sync_min_idle)} per step)"
    ]
    advice = [_sync_advice(ctx.stage)]
    return finding(
        ctx,
        "host_sync",
        "warning",
        f"{stage_name(ctx.stage)} waits on the GPU {_count(syncs)} times per step",
        evidence,
        advice,
        window,
    )


def _sync_advice(stage: str) -> str:
    """Where syncs come from in ``stage``'s step, and how to remove them."""
    common = (
        " `torch.nonzero` or boolean-mask indexing (`x[mask]`), whose output size the host must read (use"
        " `torch.where` or multiplications instead)."
    )
    debug = ' `torch.cuda.set_sync_debug_mode("warn")` reports each sync with its stack.'
    step = f"`.item()`, `.cpu()`, `.tolist()`, `print(...)` or `if tensor:` in `{step_method(stage)}`"
    if stage == "train":
        return (
            f"Find what makes the host wait in the step: {step}; `self.log(..., sync_dist=True)` on every step;"
            + common
            + ' Log tensors (`self.log("loss", loss)`) and let Lightning reduce them every'
            " `log_every_n_steps`." + debug
        )
    if stage == "predict":
        return (
            f"Find what makes the host wait in the step: {step};" + common + " Lightning itself copies each"
            " batch's predictions to the CPU to return them, one sync per step that is expected:"
            " `trainer.predict(..., return_predictions=False)` drops it when nothing needs them on the host." + debug
        )
    return (
        f"Find what makes the host wait in the step: {step}; `self.log(..., on_step=True, sync_dist=True)`;"
        + common
        + " Log tensors (`self.log(name, value)`): here Lightning reduces them once, at the epoch's end."
        + debug
    )


def _idle_causes(ctx: StageEpoch, window: TraceSummary, t: Thresholds) -> list[tuple[str, str]]:
    """The other signals, in ``window``, that explain device idle time, as ``(cause, fix)`` pairs; each fix
    names the rule that details it."""
    data = max(share(window.dataloader_time, window) or 0.0, ctx.epoch.data_wait_fraction)
    h2d = share(window.h2d_exposed_time, window) or 0.0
    comm = share(window.communication_exposed_time, window) or 0.0
    framework = share(window.framework_time, window) or 0.0
    kernel = window.median_kernel_time
    checks = (
        (
            reaches(data, t.dataloader_warning),
            f"waiting for data ({percent(data)} of the step)",
            "faster input (`num_workers`, see dataloader_bound)",
        ),
        (
            _syncing(window, t),
            f"host-device syncs ({_count(window.syncs_per_step or 0.0)} per step)",
            "no `.item()` in the step (see host_sync)",
        ),
        (
            kernel is not None and below(kernel, t.launch_kernel_time),
            f"kernels shorter than their launch (median {us(kernel or 0.0)})",
            "fused kernels (`torch.compile`, see launch_bound)",
        ),
        (
            reaches(h2d, t.h2d_copy) and h2d > 0,
            f"host-to-device copies ({percent(h2d)} of the step)",
            "pinned memory (`pin_memory=True`, see h2d_copy)",
        ),
        (
            reaches(comm, t.communication)
            and reaches(window.communication_exposed_time or 0.0, t.communication_min_time),
            f"exposed communication ({percent(comm)} of the step)",
            "overlapped gradient sync (`DDPStrategy` buckets, see communication_bound)"
            if ctx.stage == "train"
            else "fewer collectives in the step (see communication_bound)",
        ),
        (
            reaches(framework, t.framework_overhead) and reaches(window.framework_time, t.framework_min_time),
            f"Python outside torch operators ({percent(framework)} of the step)",
            "lighter hooks and logging (`log_every_n_steps`, see framework_overhead)"
            if ctx.stage == "train"
            else "lighter hooks and logging (see framework_overhead)",
        ),
    )
    return [(cause, fix) for fired, cause, fix in checks if fired]


def device_idle(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The GPU runs nothing for a large part of the step (CUDA only).

    Notes:
        1. Per window: time at least one kernel, copy or memset ran / step time.
        2. Fires below ``device_busy_warning``; critical below ``device_busy_critical``; in windows where the
           device also idles ``device_idle_min_time`` per step or more. Points at the least busy such window.
        3. Advice names the other signals that explain the idle time in that window (data wait, syncs,
           short kernels, copies, communication, framework time) and their findings; with none, it says how
           to find the gaps.
    """
    if not on_cuda(ctx):
        return None
    idle_enough = (
        w
        for w in ctx.windows
        if w.device_busy is not None and reaches(w.step_time - w.device_busy, t.device_idle_min_time)
    )
    best = strongest(idle_enough, lambda w: share(w.device_busy, w), lowest=True)
    if best is None or not below(best[1], t.device_busy_warning):
        return None
    window, busy = best
    severity: Severity = "critical" if below(busy, t.device_busy_critical) else "warning"
    evidence = [
        f"GPU busy {percent(busy)} of the step ({ms(window.device_busy or 0.0)} of {ms(window.step_time)})"
        f" {in_window(window, len(ctx.windows))}"
        f" (warning < {limit(t.device_busy_warning)}, critical < {limit(t.device_busy_critical)}, with"
        f" >= {ms(t.device_idle_min_time)} idle per step)"
    ]
    causes = _idle_causes(ctx, window, t)
    if causes:
        evidence.append("explained by " + ", ".join(cause for cause, _ in causes))
        advice = [f"Fill the gaps with {'; '.join(fix for _, fix in causes)}."]
    else:
        advice = [
            "No other signal explains it: the host does not queue work fast enough. Open this window in"
            " TensorBoard's PyTorch Profiler tab (or HTA's idle-time breakdown) to see what the host runs during"
            " the gaps. A larger `batch_size` gives the GPU more work per launch (torch-tb-profiler's advice"
            " below 50% utilization), and " + compile_lever(ctx, window, "cuts the host's work per step.")
        ]
    return finding(
        ctx,
        "device_idle",
        severity,
        f"GPU busy only {percent(busy)} of each {stage_name(ctx.stage).lower()} step",
        evidence,
        advice,
        window,
    )


def launch_bound(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The step is many tiny operations, paced by their launch or dispatch cost rather than their work.

    Notes:
        1. GPU: a window whose median kernel is shorter than ``launch_kernel_time`` while the device is busy
           less than ``launch_device_busy`` of the step; points at the least busy such window.
        2. CPU (``RunFacts.device == "cpu"``): the step's own tiny operators (``TraceSummary.tiny_op_time``:
           top-level operators under 20 us, with the Python gaps that dispatch them, outside the DataLoader's
           spans, whose per-sample work is ``dataloader_bound``'s) take at least ``launch_cpu_tiny_ops`` of
           the step and at least ``launch_cpu_min_time`` per step; points at the window with the largest
           share. How many operators run does not matter: a compute-bound step of thousands of operators
           spends its time in few long ones. Windows from reports without ``tiny_op_time`` are not judged.
        3. Warning.
    """
    stage = stage_name(ctx.stage)
    if on_cuda(ctx):
        candidates = [
            w
            for w in ctx.windows
            if w.median_kernel_time is not None
            and below(w.median_kernel_time, t.launch_kernel_time)
            and (busy := share(w.device_busy, w)) is not None
            and below(busy, t.launch_device_busy)
        ]
        best = strongest(candidates, lambda w: share(w.device_busy, w), lowest=True)
        if best is None:
            return None
        window, busy = best
        median = window.median_kernel_time or 0.0
        evidence = [
            f"median kernel {us(median)} (threshold < {us(t.launch_kernel_time)}),"
            f" {count(window.kernels_per_step or 0)} kernels per step, GPU busy {percent(busy)} of the step"
            f" (threshold < {limit(t.launch_device_busy)}) {in_window(window, len(ctx.windows))}"
        ]
        advice = [
            "Fuse the small operations: "
            + compile_lever(ctx, window, "merges elementwise chains into few kernels")
            + ', and `torch.compile(model, mode="reduce-overhead")` replays the step as a CUDA graph, one launch'
            " for all its kernels. A larger `batch_size` makes each kernel longer for the same launch cost;"
            " replace Python loops over small tensors with batched tensor ops.",
        ]
        title = f"{stage} is launch-bound: median kernel {us(median)}, GPU busy {percent(busy)}"
        return finding(ctx, "launch_bound", "warning", title, evidence, advice, window)
    if ctx.facts.device != "cpu":
        return None
    candidates = [
        w
        for w in ctx.windows
        if w.tiny_op_time is not None
        and reaches(w.tiny_op_time, t.launch_cpu_min_time)
        and (tiny := share(w.tiny_op_time, w)) is not None
        and reaches(tiny, t.launch_cpu_tiny_ops)
    ]
    best = strongest(candidates, lambda w: share(w.tiny_op_time, w))
    if best is None:
        return None
    window, tiny = best
    ops = window.tiny_ops_per_step or 0.0
    evidence = [
        f"{percent(tiny)} of the step ({ms(window.tiny_op_time or 0.0)} of {ms(window.step_time)}) in"
        f" {count(ops)} operators shorter than {us(TINY_OP_TIME)} each and the Python calling them, outside the"
        f" DataLoader {in_window(window, len(ctx.windows))} (warning >= {limit(t.launch_cpu_tiny_ops)} and"
        f" >= {ms(t.launch_cpu_min_time)} per step)"
    ]
    advice = [
        "Vectorize: each eager operator pays microseconds of dispatch however small its tensor, so a Python"
        " loop of tiny tensor ops is all overhead. Express it as whole-tensor operations (batched matmuls,"
        " `torch.stack` once instead of per element, indexing instead of loops); "
        + compile_lever(ctx, window, "fuses what remains")
        + ", and a larger `batch_size` does more work per operator.",
    ]
    title = f"{stage} spends {percent(tiny)} of each step in {count(ops)} tiny operators"
    return finding(ctx, "launch_bound", "warning", title, evidence, advice, window)


def precision(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """fp32 matmuls and convolutions run without tensor cores on a GPU that has them.

    Notes:
        1. Only with Lightning's ``precision="32-true"`` on CUDA, in windows whose device is tensor-core
           capable.
        2. Per window: kernel time of fp32 GEMM/convolution kernels without tensor cores / kernel time.
        3. Fires, as a warning, at ``precision_fp32_gemm`` in the window with the largest share, among those
           where the kernels take ``precision_min_time`` per step or more.
        4. Advice: ``"bf16-mixed"`` and TF32 on Ampere or newer, ``"16-mixed"`` on Volta and Turing.
        5. Where the advised precision was tried on one real step (``StageEpoch.advice_trials``,
           :mod:`~lightning_perf.diagnose.step_tried`), the advice leads with the measurement; one not
           ``advice_trial_min_gain`` times as fast is withdrawn (TF32 stays advised), and the finding is ``info``.
    """
    if not on_cuda(ctx) or ctx.facts.precision not in FP32_PRECISIONS:
        return None
    candidates = [
        w
        for w in ctx.windows
        if w.tensor_core_capable
        and w.kernel_time
        and w.kernel_time > 0
        and w.fp32_gemm_time is not None
        and reaches(w.fp32_gemm_time, t.precision_min_time)
    ]
    best = strongest(candidates, lambda w: (w.fp32_gemm_time or 0.0) / (w.kernel_time or 1.0))
    if best is None or not reaches(best[1], t.precision_fp32_gemm):
        return None
    window, value = best
    name = window.device_name or ctx.facts.device_name
    evidence = [
        f"fp32 matmul/convolution kernels without tensor cores take {percent(value)} of kernel time"
        f" ({ms(window.fp32_gemm_time or 0.0)} of {ms(window.kernel_time or 0.0)} per step)"
        f" {in_window(window, len(ctx.windows))} (warning >= {limit(t.precision_fp32_gemm)} and"
        f" >= {ms(t.precision_min_time)} per step)",
        f'precision="{ctx.facts.precision}"' + (f" on {name}" if name else ""),
    ]
    if name and any(marker in name.upper() for marker in PRE_AMPERE_NAMES):
        advice = [
            f'Use `Trainer(precision="16-mixed")`: on {name} (no bf16 or TF32) only fp16 runs on the tensor'
            " cores; matmuls and convolutions typically run 2-8x faster"
            + (", and Lightning manages the loss scaler." if ctx.stage == "train" else ".")
        ]
    else:
        advice = [
            'Use `Trainer(precision="bf16-mixed")` (Ampere or newer; `"16-mixed"` on V100/T4): matmuls and'
            " convolutions then run on the tensor cores, typically 2-8x faster. Or keep fp32 and let matmuls use"
            ' TF32: `torch.set_float32_matmul_precision("high")` at the start of the script (what Lightning\'s'
            ' "You are using a CUDA device ... that has Tensor Cores" message suggests).'
        ]
    advice, withdrawn = tried_step_advice(
        ctx.advice_trials, "precision", advice, t.advice_trial_min_gain, precision_setting(advice)
    )
    return finding(
        ctx,
        "precision",
        "info" if withdrawn else "warning",
        f"{percent(value)} of GPU time in fp32 matmuls without tensor cores",
        evidence,
        advice,
        window,
    )
