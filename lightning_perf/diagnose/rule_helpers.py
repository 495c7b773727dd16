"""
Rule helpers
============

What every bottleneck rule is built from: the :data:`Rule` and :data:`SummaryRule` signatures, threshold
comparisons tolerant of floating point, picking the trace window with the strongest evidence, the run's
device and CPUs, Lightning's names for a stage's methods and hooks (for advice), and the :class:`Finding`
builder. The numbers in evidence are formatted by :mod:`lightning_perf.units`. The rules themselves live one
module per resource: :mod:`~lightning_perf.diagnose.rules_data` (input pipeline),
:mod:`~lightning_perf.diagnose.rules_device` (accelerator and CPU compute), :mod:`~lightning_perf.diagnose.cpu_threads`,
:mod:`~lightning_perf.diagnose.rules_memory`, :mod:`~lightning_perf.diagnose.rules_step` (the training loop),
:mod:`~lightning_perf.diagnose.rules_unstable` (its steadiness), :mod:`~lightning_perf.diagnose.rules_distributed`,
:mod:`~lightning_perf.diagnose.rules_compute` (the arithmetic achieved against the device's peak) and
:mod:`~lightning_perf.diagnose.rules_compile` (what ``torch.compile`` did); :mod:`~lightning_perf.diagnose.registry`
lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from lightning_perf.diagnose.model import Finding, RunFacts, Severity, StageEpoch
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import TraceSummary
from lightning_perf.units import TOLERANCE

# Lightning's precision strings of full fp32 training.
FP32_PRECISIONS = frozenset({"32-true", "32"})

Rule = Callable[[StageEpoch, Thresholds], Finding | Sequence[Finding] | None]
"""A pure function from a stage's epoch and the thresholds to a finding (or ``None``)."""

SummaryRule = Callable[[StageEpoch, Thresholds, Sequence[Finding]], Finding | Sequence[Finding] | None]
"""A rule that also reads the findings every :data:`Rule` made for the same epoch (the third argument, in
catalogue order), to name what explains its own: it runs after them."""

_STAGE_NAMES = {"train": "Training", "validate": "Validation", "test": "Testing", "predict": "Prediction"}


def stage_name(stage: str) -> str:
    """``"train"`` -> ``"Training"``, for titles."""
    return _STAGE_NAMES.get(stage, stage.capitalize())


# Lightning's names, per stage, of the LightningModule's step method and of the hooks' stage part.
_STEP_METHODS = {
    "train": "training_step",
    "validate": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}
_HOOK_STAGES = {"train": "train", "validate": "validation", "test": "test", "predict": "predict"}


def step_method(stage: str) -> str:
    """The LightningModule method that runs a batch of ``stage``: ``"validate"`` -> ``"validation_step"``."""
    return _STEP_METHODS.get(stage, f"{stage}_step")


def batch_end_hook(stage: str) -> str:
    """The hook called after each batch of ``stage``: ``"validate"`` -> ``"on_validation_batch_end"``."""
    return f"on_{_HOOK_STAGES.get(stage, stage)}_batch_end"


def accumulation(n: int | str, *, manual: bool | None) -> str:
    """Gradient accumulation over ``n`` batches, as the run can ask for it: ``Trainer(accumulate_grad_batches=n)``,
    or, where the module optimizes manually (Lightning then refuses that argument), in its ``training_step``."""
    if manual:
        return (
            f"accumulation in `training_step` (step the optimizers every {n} batches, the other backwards inside"
            " `with self.trainer.strategy.block_backward_sync():`; manual optimization refuses"
            " `Trainer(accumulate_grad_batches)`)"
        )
    return f"`Trainer(accumulate_grad_batches={n})`"


def epoch_start_hook(stage: str) -> str:
    """The hook called at the start of each epoch of ``stage``: ``"validate"`` -> ``"on_validation_epoch_start"``."""
    return f"on_{_HOOK_STAGES.get(stage, stage)}_epoch_start"


def epoch_end_hook(stage: str) -> str:
    """The hook called at the end of each epoch of ``stage``: ``"test"`` -> ``"on_test_epoch_end"``."""
    return f"on_{_HOOK_STAGES.get(stage, stage)}_epoch_end"


def reaches(value: float, threshold: float) -> bool:
    """``value >= threshold``, tolerant of floating-point error at the threshold itself."""
    return value >= threshold - TOLERANCE


def below(value: float, threshold: float) -> bool:
    """``value < threshold``, where ``value`` equal to ``threshold`` (within rounding) is not below."""
    return value < threshold - TOLERANCE


def strongest(
    windows: Iterable[TraceSummary], measure: Callable[[TraceSummary], float | None], *, lowest: bool = False
) -> tuple[TraceSummary, float] | None:
    """The window where ``measure`` is highest (``lowest``: lowest), with its value; ``None`` if no window has
    one. Ties go to the earliest window."""
    best: tuple[TraceSummary, float] | None = None
    for window in windows:
        value = measure(window)
        if value is None:
            continue
        if best is None or (value < best[1] if lowest else value > best[1]):
            best = (window, value)
    return best


def on_cpu(part: float, window: TraceSummary) -> tuple[float, float]:
    """``part`` of ``window``'s step (seconds per step) without what waiting for a CPU may hold of it, and the
    step less that wait: ``(max(part - wait, 0), step - wait)``, with ``wait`` the training thread's wait for a
    CPU per step while the window recorded (``TraceSummary.cpu_wait_time``). Unchanged where the wait was not
    measured or was none.

    The thread's time neither running nor queued is no proof of work of the program's own on a busy machine
    (it is not counted): a thread of the process holding the GIL is descheduled there, and the
    training thread blocks on it (measured beside two CPU burners: an in-memory MLP "idle" 0.5-1 ms a step)."""
    waited = min(window.cpu_wait_time or 0.0, window.step_time)
    if waited <= 0:
        return part, window.step_time
    return max(part - waited, 0.0), window.step_time - waited


def on_cpu_share(part: float | None, window: TraceSummary) -> float | None:
    """``part`` over the step, both as :func:`on_cpu` leaves them; ``None`` where either is not there."""
    if part is None:
        return None
    real, step = on_cpu(part, window)
    return real / step if step > 0 else None


def in_window(window: TraceSummary, count: int) -> str:
    """``"in window W"``, noting when it was picked among several."""
    return f"in window {window.window}" + (f" (the strongest of {count} windows)" if count > 1 else "")


def cpus_per_process(facts: RunFacts) -> int | None:
    """The CPUs each process of the run has (its machine's, shared by the processes on that machine: the world
    size over the nodes); ``None``: unknown."""
    if facts.cpu_count is None:
        return None
    per_node = max(facts.world_size // max(facts.num_nodes, 1), 1)
    return max(1, facts.cpu_count // per_node)


def on_cuda(ctx: StageEpoch) -> bool:
    """The run's device is a CUDA GPU."""
    return ctx.facts.device.startswith("cuda")


def compiles(ctx: StageEpoch, window: TraceSummary | None = None) -> bool:
    """Whether the run already uses ``torch.compile``: something compiled in it, or ``window``'s trace holds
    compiled regions."""
    return ctx.compile is not None or (window is not None and window.compiled_time is not None)


def compile_lever(ctx: StageEpoch, window: TraceSummary | None, effect: str) -> str:
    """The advice to compile, ``effect`` being what compiling would do (e.g. "fuses what remains"); for a run
    that already compiles, where the eager remainder comes from instead."""
    if compiles(ctx, window):
        return (
            "the run already uses `torch.compile`: what runs eagerly is what it leaves out, the code around a"
            " graph break (see `compile_graph_breaks`) or under `torch.compiler.disable`; bringing it into the"
            f" compiled region {effect}"
        )
    where = "before `trainer.fit(model)`" if ctx.stage == "train" else "before passing it to the Trainer"
    return f"`model = torch.compile(model)` {where} {effect}"


def finding(
    ctx: StageEpoch,
    rule_id: str,
    severity: Severity,
    title: str,
    evidence: Iterable[str],
    advice: Iterable[str],
    window: TraceSummary | None = None,
) -> Finding:
    """A :class:`Finding` for ``ctx``: evidence parts joined with "; ", advice sentences with spaces."""
    return Finding(
        id=rule_id,
        severity=severity,
        title=title,
        evidence="; ".join(part for part in evidence if part),
        advice=" ".join(part for part in advice if part),
        stage=ctx.stage,
        epoch=ctx.epoch.epoch,
        window=window.window if window is not None else None,
    )
