"""
Compiler rules
==============

What ``torch.compile`` did in the stage's epoch (``StageEpoch.compile``, a
:class:`~lightning_perf.records.CompileStats`): ``compile_graph_breaks`` (the compiled code is split),
``compile_recompiles`` (a guard keeps failing, up to the recompile limit, after which the function runs
eager) and ``compile_time`` (compiling costs a share of the epoch), each silent where nothing compiled; and
``compile_unused`` (``.compile()`` was called on a module, yet nothing compiled).

Dynamo's graph-break reasons and failed guards are free text that changes between torch releases: they are
sorted into classes by keywords (:func:`break_class`, :func:`guard_class`), defensively, and a text that
matches none gets general advice (``TORCH_LOGS``, ``torch._dynamo.explain``), never an error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from lightning_perf.diagnose.model import Finding, Severity, StageEpoch
from lightning_perf.diagnose.rule_helpers import batch_end_hook, finding, reaches, stage_name, step_method
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import GraphBreak, Recompile
from lightning_perf.units import count, limit, percent, plural, seconds
from lightning_perf.validation import cut

# The most graph-break reasons and failed guards shown in evidence (the most frequent first).
TOP = 3
# A reason or guard longer than this is cut in evidence (Dynamo's are one line, but a guard may print a
# whole expression).
MAX_TEXT = 100

# Keywords (lowercase) of each class of graph-break reason, tried in this order: the first class with a
# keyword in the reason wins (`Unsupported Tensor.item() call` is a scalar read before it is unsupported).
# The texts are Dynamo's, torch 2.13 (torch/_dynamo/graph_break_registry.json and explain()'s reasons).
# Logging comes first: Lightning's `self.log` is itself a `torch.compiler.disable`d function, which the collector
# words as "... (inside lightning `log`)".
_BREAK_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("logging", ("logging", "logger", "print", "self.log", "log_dict", "lightning `log`")),
    ("disabled", ("compiler.disable",)),
    ("explicit", ("graph_break()",)),
    (
        "scalar",
        (".item()", "tolist()", "capture_scalar_outputs", "scalar output", ".numpy()", "data dependent operator"),
    ),
    ("output_shape", ("dynamic shape operator", "output shape", "capture_dynamic_output_shape_ops", "nonzero")),
    ("control_flow", ("branching", "generic_jump", "data-dependent assertion", "__bool__", "control flow")),
    ("call", ("skipped", "unsupported", "not supported", "failed to trace", "builtin", "not implemented", "c/c++")),
)

# The same for failed guards: train/eval or grad mode switches, a changing shape, a changing tensor
# property, another Python object, a changing Python value. Guards read like "0/0: L['n'] == 3", "tensor
# 'x' size mismatch at index 0. expected 4, actual 2", "L['self'].training == True", "___check_obj_id(...)".
_GUARD_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mode", (".training", "grad_mode", "global_state", "inference_mode")),
    ("shape", ("size mismatch", "stride mismatch", "rank mismatch", ".size()", ".stride()", "shape")),
    ("tensor", ("dtype", "device", "requires_grad", "dispatch key")),
    ("object", ("___check_obj_id", "___check_type_id", "id(", "type(")),
    ("value", ("==", "!=", "len(", "<", ">")),
)

# Dynamo's frame prefix of a guard ("0/0: "), left out of what the user reads.
_FRAME = re.compile(r"^\s*\d+/\d+:\s*")


def _classify(text: str | None, classes: Sequence[tuple[str, tuple[str, ...]]]) -> str:
    lowered = (text or "").lower()
    return next((name for name, words in classes if any(word in lowered for word in words)), "unknown")


def break_class(reason: str | None) -> str:
    """The class of a graph-break reason: ``"scalar"`` (``.item()``, ``.tolist()``), ``"logging"``
    (``self.log``, a logger, ``print``), ``"control_flow"`` (branching on a tensor), ``"output_shape"`` (an
    operator whose output shape depends on the data), ``"call"`` (a call Dynamo cannot trace or skips),
    ``"disabled"`` (a ``torch.compiler.disable``'d function), ``"explicit"`` (``torch._dynamo.graph_break()``),
    or ``"unknown"``."""
    return _classify(reason, _BREAK_CLASSES)


def guard_class(guard: str | None) -> str:
    """The class of a failed guard: ``"mode"`` (train/eval or grad mode), ``"shape"``, ``"tensor"`` (dtype,
    device, ``requires_grad``), ``"object"`` (another Python object or type), ``"value"`` (a Python value), or
    ``"unknown"``. Only the guard's expression counts, not the source line the collector adds after it in
    parentheses (``training=self.training`` in a dropout call's source is no mode switch)."""
    expression = _FRAME.sub("", guard or "").split(" (", 1)[0]
    return _classify(expression, _GUARD_CLASSES)


def compile_steps(ctx: StageEpoch) -> frozenset[int]:
    """The epoch's batches during which something compiled (their step times hold the compile)."""
    return frozenset(ctx.compile.steps) if ctx.compile is not None else frozenset()


def _places(places: Iterable[str | None], preposition: str = "At") -> str:
    """``"At a.py:3 and b.py:7: "``, in first-seen order, for the places torch named; ``""`` for none."""
    named = list(dict.fromkeys(place for place in places if place))
    if not named:
        return ""
    return f"{preposition} " + (named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]) + ": "


def _lead(where: str, sentence: str) -> str:
    """``sentence`` after ``where`` (``"At a.py:3: "``), or capitalized on its own."""
    return where + sentence if where else sentence[:1].upper() + sentence[1:]


def _by_class(items: Sequence[tuple[str, str | None]]) -> dict[str, list[str | None]]:
    """(class, place) pairs grouped by class, classes in first-seen order."""
    grouped: dict[str, list[str | None]] = {}
    for name, place in items:
        grouped.setdefault(name, []).append(place)
    return grouped


def _break_advice(kind: str, ctx: StageEpoch) -> str:
    """What to do about graph breaks of class ``kind`` (a sentence to follow the places it applies to)."""
    if kind == "scalar":
        return (
            "a tensor is read as a Python number (`.item()`, `.tolist()`), which leaves the graph;"
            " keep the value a tensor (tensor operations, `torch.where` instead of an `if` on it), or set"
            " `torch._dynamo.config.capture_scalar_outputs = True` to trace the read into the graph."
        )
    if kind == "logging":
        return (
            "logging or printing inside the compiled code (Lightning's `self.log` is excluded from compiling, so"
            " each call splits the graph); move `self.log`, logger and `print` calls out of it. With"
            f" `torch.compile(model)` passed to the Trainer, Lightning compiles `{step_method(ctx.stage)}` too:"
            " return the values from the step and log them in"
            f" `{batch_end_hook(ctx.stage)}`, or compile only the network (`self.net = torch.compile(self.net)`)"
            " and pass the module uncompiled."
        )
    if kind == "control_flow":
        return (
            "Python control flow depends on a tensor's value (`if x.sum() > 0:`); express both"
            " branches with `torch.cond(pred, true_fn, false_fn, operands)` or `torch.where`, or restructure the"
            " code so that the decision is made outside the compiled code."
        )
    if kind == "output_shape":
        return (
            "an operator's output shape depends on the data (`nonzero`, boolean masking); keep"
            " shapes fixed (`torch.where(mask, x, 0)` instead of `x[mask]`), or set"
            " `torch._dynamo.config.capture_dynamic_output_shape_ops = True`."
        )
    if kind == "call":
        return (
            "a call torch.compile cannot trace (a builtin such as `print`, a library function, or"
            " one marked as skipped); wrap that helper in `torch.compiler.disable` (one clean break instead of"
            " many inside it), or use a torch equivalent."
        )
    if kind == "disabled":
        return (
            "a function disabled with `torch.compiler.disable` breaks the graph where it is"
            " called, as intended; if it runs on every step, make it traceable and remove the decorator."
        )
    if kind == "explicit":
        return "an explicit `torch._dynamo.graph_break()`; remove it when it is no longer needed."
    return (
        "`TORCH_LOGS=graph_breaks` prints each break with its reason and stack, and"
        " `torch._dynamo.explain(fn)(*inputs)` lists them all in one call."
    )


def compile_graph_breaks(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """``torch.compile`` split the compiled code at graph breaks while compiling in this epoch.

    Notes:
        1. Fires, as a warning, at ``compile_breaks`` breaks found in the epoch (Dynamo finds a break each
           time it compiles code that holds it, so the epochs that compile report them).
        2. Evidence: the :data:`TOP` most frequent reasons, each with its file:line and count.
        3. Advice per reason, by its class (:func:`break_class`), naming the places it applies to; an
           unknown reason gets ``TORCH_LOGS=graph_breaks`` and ``torch._dynamo.explain``.
    """
    stats = ctx.compile
    if stats is None or stats.breaks < t.compile_breaks:
        return None
    sites = sorted(stats.break_sites, key=lambda site: -site.count)[:TOP]
    evidence = [
        f"{plural(stats.breaks, 'graph break')} found while compiling {plural(stats.graphs, 'graph')} this epoch"
        f" (warning >= {count(t.compile_breaks)})",
        _sites(sites, len(stats.break_sites)),
    ]
    grouped = _by_class([(break_class(site.reason), site.location) for site in sites]) or {"unknown": [None]}
    advice = [_lead(_places(places), _break_advice(kind, ctx)) for kind, places in grouped.items()]
    return finding(
        ctx,
        "compile_graph_breaks",
        "warning",
        f"{stage_name(ctx.stage)} hits {plural(stats.breaks, 'graph break')} in torch.compile",
        evidence,
        advice,
    )


def _sites(sites: Sequence[GraphBreak], total: int) -> str:
    """The top reasons as evidence: ``"top reasons: "..." at a.py:3 (8x), ..."``."""
    if not sites:
        return ""
    shown = [
        f'"{cut(site.reason, MAX_TEXT)}" at {site.location or "an unknown place"} ({count(site.count)}x)'
        for site in sites
    ]
    more = f" and {total - len(sites)} more" if total > len(sites) else ""
    return "top reasons: " + "; ".join(shown) + more


def torch_wrapper(function: str | None) -> bool:
    """Whether a recompiled "function" is torch's own wrapper of a compiled ``nn.Module``
    (``inner (.../torch/_dynamo/external_utils.py:67)``): every module compiled on its own
    (``torch.compile(nn.Linear(...))``) runs through that one code object, so each module's first compile counts
    as a recompile of it, and all of them count against one ``recompile_limit``."""
    return bool(function) and "torch/_dynamo/" in (function or "").replace("\\", "/")


def library_function(function: str | None) -> bool:
    """Whether a recompiled function is an installed library's (its path is under ``site-packages``), e.g.
    Lightning's ``log`` called from a compiled step: its guards follow the library's state, not the user's."""
    return any(marker in (function or "").replace("\\", "/") for marker in ("site-packages/", "dist-packages/"))


def _recompile_class(recompile: Recompile) -> str:
    return "library" if library_function(recompile.function) else guard_class(recompile.guard)


def _worst_function(stats_guards: Sequence[Recompile], recompiles: int) -> tuple[str | None, int]:
    """The function recompiled most in the epoch and its recompiles; without guards, the epoch's total. Torch's
    module wrapper (:func:`torch_wrapper`) and a library's functions (:func:`library_function`) count only at the
    recompile limit: the wrapper's "recompiles" are the first compiles of separately compiled modules, and a
    library's follow its own state."""
    per_function: dict[str | None, int] = {}
    for guard in stats_guards:
        if not torch_wrapper(guard.function) and not library_function(guard.function):
            per_function[guard.function] = per_function.get(guard.function, 0) + guard.count
    if not per_function:
        return None, 0 if stats_guards else recompiles
    return max(per_function.items(), key=lambda item: item[1])


def _short(function: str | None) -> str:
    """``"forward (model.py:30)"`` -> ``"`forward`"``, for titles."""
    if not function:
        return "a compiled function"
    name = function.split(" (")[0].strip() or function
    return f"`{name[:40]}`"


def _guard_advice(kind: str, guard: str, ctx: StageEpoch) -> str:
    """What to do about recompiles of class ``kind``, for the failed ``guard`` (a sentence to follow the
    functions it applies to)."""
    if kind == "shape":
        last = (
            " when only the last batch is smaller, `DataLoader(drop_last=True)` avoids it (one recompile for it"
            " is normal)"
            if ctx.stage == "train"
            else " a smaller last batch recompiles once, which is normal"
        )
        return (
            f"a tensor's shape changes between calls (`{guard}`); mark the dimension dynamic with"
            " `torch._dynamo.mark_dynamic(tensor, dim)` before the call, or compile with"
            f" `torch.compile(..., dynamic=True)`; pad or bucket sizes to a few fixed ones;{last}."
        )
    if kind == "value":
        return (
            f"a Python value it depends on changes (`{guard}`), and torch.compile specializes on each"
            " value: pass it as a tensor (`torch.tensor(n)`), or make it a constant."
        )
    if kind == "object":
        return (
            f"it gets another Python object each call (`{guard}`); create it once (in `__init__` or"
            " `setup`) and reuse it, or pass its data as tensors."
        )
    if kind == "tensor":
        return (
            f"a tensor's dtype, device or `requires_grad` changes between calls (`{guard}`); cast"
            " and move the inputs the same way every time (e.g. in `on_after_batch_transfer`)."
        )
    if kind == "mode":
        return (
            f"switching between train and eval (or grad) mode recompiles once per compiled"
            f" function (`{guard}`): expected."
        )
    if kind == "library":
        return (
            "library code the compiled code calls (Lightning's `self.log`, for one) recompiles as the library's"
            f" own state changes (`{guard}`): keep that call out of the compiled code (see"
            " `compile_graph_breaks`); its recompiles do not count towards this warning."
        )
    return "`TORCH_LOGS=recompiles` prints each recompile with the guard that failed."


def compile_recompiles(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """``torch.compile`` compiled a function again and again in this epoch, or gave up on it.

    Notes:
        1. Counts the recompiles of the function recompiled most (from the failed guards, by function; the
           epoch's total where torch named none): a normal run recompiles each compiled function up to
           twice (a smaller last batch, a train/eval switch).
        2. Fires, as a warning, at ``compile_recompiles``; critical whenever a function reached
           ``torch._dynamo.config.recompile_limit`` (it runs eager from then on), whatever the count.
        3. Evidence: the recompiles and the :data:`TOP` most frequent failed guards with their function.
           Advice per guard, by its class (:func:`guard_class`), and a CI check
           (``torch.compiler.set_stance("fail_on_recompile")``).
    """
    stats = ctx.compile
    if stats is None:
        return None
    function, worst = _worst_function(stats.recompile_guards, stats.recompiles)
    if not stats.limit_reached and worst < t.compile_recompiles:
        return None
    severity: Severity = "critical" if stats.limit_reached else "warning"
    guards = sorted(stats.recompile_guards, key=lambda guard: -guard.count)[:TOP]
    evidence = [
        f"{plural(stats.recompiles, 'recompile')} this epoch"
        + (f", {count(worst)} of {function}" if function else "")
        + f" (warning >= {count(t.compile_recompiles)} of one function, critical at the recompile limit)",
        f"{stats.limit_function or 'a compiled function'} reached `torch._dynamo.config.recompile_limit`: it runs"
        " eager from then on"
        if stats.limit_reached
        else "",
        "failed guards: "
        + "; ".join(
            f"`{cut(_FRAME.sub('', g.guard or 'unknown'), MAX_TEXT)}` in {g.function or 'an unknown function'}"
            f" ({count(g.count)}x)"
            for g in guards
        )
        if guards
        else "",
    ]
    advice = []
    if stats.limit_reached and torch_wrapper(stats.limit_function):
        advice.append(
            "Modules compiled one by one (`torch.compile(module)` on each) share torch's wrapper code, so each"
            " one's first compile counts against one `torch._dynamo.config.recompile_limit` (8 by default): the"
            " modules past it run eager. Compile their parent module once instead, or raise the limit to the"
            " number of modules compiled."
        )
    elif stats.limit_reached:
        advice.append(
            f"{stats.limit_function or 'A compiled function'} recompiled until"
            " `torch._dynamo.config.recompile_limit` (8 by default) and now runs eager, without the compiled"
            " speed-up: remove the cause below; raising the limit only postpones it."
        )
    first_guard: dict[str, str] = {}
    for g in guards:
        first_guard.setdefault(_recompile_class(g), cut(_FRAME.sub("", g.guard or ""), MAX_TEXT))
    grouped = _by_class([(_recompile_class(g), g.function) for g in guards]) or {"unknown": [function]}
    advice += [
        _lead(_places(functions, "In"), _guard_advice(kind, first_guard.get(kind, ""), ctx))
        for kind, functions in grouped.items()
    ]
    advice.append(
        'In CI, call `torch.compiler.set_stance("fail_on_recompile")` after a warm-up step: any new recompile'
        " then raises an error instead of slowing the run."
    )
    stage = stage_name(ctx.stage)
    title = (
        f"{stage}: {_short(stats.limit_function or function)} hit the recompile limit and runs eager"
        if stats.limit_reached
        else f"{stage} recompiles {_short(function)} {count(worst)} times"
        if function
        else f"{stage} recompiles {count(worst)} times"
    )
    return finding(ctx, "compile_recompiles", severity, title, evidence, advice)


def compile_time(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Compiling took a large share of the epoch.

    Notes:
        1. Share: compile seconds / (the epoch's wall time + the compile seconds before its first batch);
           the epoch's step time stands in for a wall time not measured.
        2. Fires at ``compile_time``: info in the stage's first epoch (a one-time cost), a warning in a later
           one (something keeps compiling).
    """
    stats = ctx.compile
    if stats is None or stats.seconds <= 0:
        return None
    epoch = ctx.epoch
    total = (epoch.wall_time if epoch.wall_time is not None else epoch.step_time) + stats.seconds_before
    if total <= 0:
        return None
    fraction = min(stats.seconds / total, 1.0)
    if not reaches(fraction, t.compile_time):
        return None
    first = not ctx.history
    evidence = [
        f"compiling {seconds(stats.seconds)} of the epoch's {seconds(total)} ({percent(fraction)})"
        f" (info >= {limit(t.compile_time)} in the stage's first epoch, warning >= {limit(t.compile_time)} after it)",
        f"{plural(stats.graphs, 'graph')} compiled, {plural(stats.recompiles, 'recompile')}",
        f"{seconds(stats.seconds_before)} of it before the epoch's first batch" if stats.seconds_before > 0 else "",
    ]
    if first:
        advice = [
            "A one-time cost, won back only if the compiled steps are faster by more than it over the run:"
            " compare the later epochs' step time with an uncompiled run's (`lightning-perf compare`); a short"
            ' run may never win it back. To shorten it: leave out `mode="max-autotune"` (it benchmarks'
            " kernels while compiling); keep inductor's caches between runs (on by default on one machine;"
            " `torch.compiler.save_cache_artifacts()` and `load_cache_artifacts()` carry them to another); for a"
            " model of many identical layers, try regional compilation (the repeated layer compiled, not the"
            " whole model) and measure it: on small models it can compile longer."
        ]
    else:
        cause = (
            f"{plural(stats.recompiles, 'recompile')} this epoch (see `compile_recompiles`)"
            if stats.recompiles
            else "new code paths (a branch taken for the first time) or new functions"
        )
        advice = [
            f"Something keeps compiling after the first epoch: {cause}. `TORCH_LOGS=recompiles` names each"
            " failed guard; a compiled graph is reused only while its guards hold."
        ]
    severity: Severity = "info" if first else "warning"
    stage = stage_name(ctx.stage).lower()
    return finding(
        ctx,
        "compile_time",
        severity,
        f"Compiling takes {percent(fraction)} of "
        + (f"this {stage} epoch" if first else f"{stage} epoch {epoch.epoch}: it keeps compiling"),
        evidence,
        advice,
    )


def compile_unused(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """``nn.Module.compile()`` was called, but nothing compiled: the module runs eager.

    Notes:
        1. ``RunFacts.compiled_modules`` names the modules whose ``.compile()`` was called before the run; it
           compiles the module's ``__call__``, so it compiles only when something *calls* the module. Lightning
           calls a LightningModule's ``*_step`` methods, not the module itself, and Dynamo does not trace a
           torch built-in module's own ``__call__`` (``nn.Sequential(...).compile()`` compiles nothing).
        2. Fires, as a warning, at the end of a training epoch in which nothing compiled in the run so far
           (``StageEpoch.compile`` is ``None``).
    """
    modules = ctx.facts.compiled_modules
    if ctx.stage != "train" or not modules or ctx.compile is not None:
        return None
    return finding(
        ctx,
        "compile_unused",
        "warning",
        "torch.compile was requested but nothing compiled: the model runs eager",
        [f"`.compile()` was called on {modules}, and torch.compile compiled nothing this epoch"],
        [
            "`nn.Module.compile()` compiles the module's `__call__`, so it compiles only when the module is called:"
            " Lightning calls `training_step`, not the LightningModule, and torch's own modules (`nn.Sequential`,"
            " `nn.TransformerEncoderLayer`) do not compile this way. Pass `torch.compile(model)` to"
            " `trainer.fit`, or compile the network the step calls: `self.net = torch.compile(self.net)` (in"
            " `__init__` or `configure_model`)."
        ],
    )
