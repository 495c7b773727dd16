"""The torch.compile rules on hand-built CompileStats (no torch, no trainer): ``compile_graph_breaks``,
``compile_recompiles`` and ``compile_time`` fire at their thresholds with the right severity, carry Dynamo's
reason, guard and file:line, and advise per class of reason and guard; ``step_time_unstable`` leaves compile
steps out. The strings are Dynamo's, as torch 2.13 writes them."""

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.registry import RULE_IDS, RULES, diagnose
from lightning_perf.diagnose.rules_compile import break_class, guard_class
from lightning_perf.diagnose.rules_unstable import _p50_p90
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import GraphBreak, Recompile
from lightning_perf.summarize.steps import percentile
from summaries import CPU, compile_stats, epoch

COMPILE_RULES = ("compile_graph_breaks", "compile_recompiles", "compile_time")
ITEM = "Unsupported Tensor.item() call with capture_scalar_outputs=False"
FORWARD = "forward (/tmp/model.py:30)"
DYN = "g (/tmp/dyn2.py:20)"
SHAPE = "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 2"
TRAINING = "0/0: L['self'].training == True"


def cctx(compile=None, epoch_=None, **kw) -> StageEpoch:
    """A healthy CPU epoch of 100 steps of 10 ms, with what torch.compile did in it."""
    return StageEpoch(
        epoch=epoch_ or epoch(),
        facts=kw.pop("facts", CPU),
        step_times=kw.pop("step_times", (0.01,) * 100),
        compile=compile,
        **kw,
    )


def run(rule_id, context, **overrides):
    return RULES[rule_id](context, Thresholds.with_overrides(overrides))


def breaks(*sites: GraphBreak, **kw):
    return compile_stats(breaks=sum(s.count for s in sites), break_sites=sites, graphs=len(sites) + 1, **kw)


def recompiles(*guards: Recompile, **kw):
    return compile_stats(recompiles=sum(g.count for g in guards), recompile_guards=guards, **kw)


# --- no compile, no finding --------------------------------------------------------------------------------


@pytest.mark.parametrize("rule_id", COMPILE_RULES)
def test_nothing_compiled_means_no_compile_finding(rule_id):
    assert run(rule_id, cctx()) is None


def test_a_clean_compile_gets_no_warning():
    # one graph compiled at batch 0 (3 s), one recompile at the smaller last batch (automatic dynamic shapes)
    steps = (3.0, *(0.01,) * 98, 0.6)
    stats = compile_stats(
        graphs=2, recompiles=1, seconds=3.5, steps=(0, 99), recompile_guards=(Recompile(FORWARD, SHAPE, 1),)
    )
    context = cctx(stats, epoch(step_time=sum(steps), step_time_p90=percentile(steps, 90)), step_times=steps)
    found = diagnose(context)
    assert [f.id for f in found if f.severity != "info"] == []
    assert [f.id for f in found] == ["compile_time"]  # compiling was 77% of the first epoch: info


def test_the_registry_lists_the_compile_rules_after_step_time_unstable():
    i = RULE_IDS.index("step_time_unstable")
    assert RULE_IDS[i + 1 : i + 4] == COMPILE_RULES


# --- compile_graph_breaks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "overrides", "fires"),
    [(1, {}, True), (0, {}, False), (1, {"compile_breaks": 2}, False), (2, {"compile_breaks": 2}, True)],
)
def test_graph_breaks_fire_at_their_threshold(count, overrides, fires):
    stats = compile_stats(breaks=count, break_sites=(GraphBreak(ITEM, "/tmp/model.py:29", count),) if count else ())
    f = run("compile_graph_breaks", cctx(stats), **overrides)
    assert (f is not None) == fires
    if fires:
        assert f.severity == "warning"


def test_graph_breaks_show_the_top_reasons_with_file_and_line():
    stats = breaks(
        GraphBreak("Data-dependent branching", "/tmp/model.py:40", 1),
        GraphBreak(ITEM, "/tmp/model.py:29", 4),
        GraphBreak("Failed to trace builtin operator", "/tmp/model.py:33", 2),
        GraphBreak("Unsupported method call", "/tmp/util.py:7", 1),
    )
    f = run("compile_graph_breaks", cctx(stats))
    assert f.title == "Training hits 8 graph breaks in torch.compile"
    assert "8 graph breaks found while compiling 5 graphs this epoch (warning >= 1)" in f.evidence
    assert (
        f'top reasons: "{ITEM}" at /tmp/model.py:29 (4x); "Failed to trace builtin operator" at /tmp/model.py:33'
        ' (2x); "Data-dependent branching" at /tmp/model.py:40 (1x) and 1 more'
    ) in f.evidence
    assert "/tmp/util.py:7" not in f.evidence  # only the three most frequent
    # one advice per reason, each naming where it applies, most frequent first
    assert f.advice.index("At /tmp/model.py:29: ") < f.advice.index("At /tmp/model.py:33: ")
    assert "At /tmp/model.py:40: Python control flow" in f.advice


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (ITEM, "scalar"),
        ("Tensor.tolist() with non-integer tensor", "scalar"),
        ("Data dependent operator", "scalar"),
        ("logging.Logger method not supported for non-export cases", "logging"),
        ("Unsupported function call: print", "logging"),
        ("Data-dependent branching", "control_flow"),
        ("generic_jump TensorVariable()", "control_flow"),
        ("Dynamic shape operator", "output_shape"),
        ("Attempted to call function marked as skipped", "call"),
        ("Attempted to inline function marked as skipped", "call"),
        ("Failed to trace builtin operator", "call"),
        ("Unsupported method call", "call"),
        ("Skip calling `torch.compiler.disable()`d function", "disabled"),
        ("Call to `torch._dynamo.graph_break()`", "explicit"),
        ("Something torch 3.0 says", "unknown"),
        ("", "unknown"),
        (None, "unknown"),
    ],
)
def test_break_class(reason, expected):
    assert break_class(reason) == expected


# Words only one class's graph-break advice holds.
SIGNATURES = {
    "scalar": "capture_scalar_outputs",
    "logging": "move `self.log`",
    "control_flow": "torch.cond",
    "output_shape": "capture_dynamic_output_shape_ops",
    "call": "one clean break",
    "disabled": "as intended",
    "explicit": "graph_break()",
    "unknown": "TORCH_LOGS=graph_breaks",
}


@pytest.mark.parametrize(
    ("reason", "advice"),
    [
        (ITEM, ("keep the value a tensor", "`torch.where`", "`torch._dynamo.config.capture_scalar_outputs = True`")),
        ("Tensor.tolist() with non-integer tensor", ("keep the value a tensor",)),
        (
            "logging.Logger method not supported for non-export cases",
            ("move `self.log`", "compiles `training_step` too", "log them in `on_train_batch_end`"),
        ),
        ("Data-dependent branching", ("`torch.cond(",)),
        ("Dynamic shape operator", ("capture_dynamic_output_shape_ops",)),
        ("Attempted to call function marked as skipped", ("`torch.compiler.disable`", "torch equivalent")),
        ("Failed to trace builtin operator", ("`torch.compiler.disable`", "`print`")),
        ("Skip calling `torch.compiler.disable()`d function", ("as intended",)),
        ("Call to `torch._dynamo.graph_break()`", ("remove it",)),
        ("Something torch 3.0 says", ("`TORCH_LOGS=graph_breaks`", "`torch._dynamo.explain")),
    ],
)
def test_graph_break_advice_follows_the_reason_and_names_its_place(reason, advice):
    f = run("compile_graph_breaks", cctx(breaks(GraphBreak(reason, "/tmp/model.py:29", 1))))
    assert f.advice.startswith("At /tmp/model.py:29: ")
    for words in advice:
        assert words in f.advice, f.advice
    kind = break_class(reason)  # one advice: no other class's
    assert [k for k, words in SIGNATURES.items() if k != kind and words in f.advice] == [], f.advice


def test_logging_advice_names_the_stages_own_step():
    stats = breaks(GraphBreak("logging.Logger method not supported for non-export cases", "/tmp/m.py:3", 1))
    f = run("compile_graph_breaks", cctx(stats, epoch(stage="validate")))
    assert "compiles `validation_step` too" in f.advice and "`on_validation_batch_end`" in f.advice
    assert "training_step" not in f.advice and "on_train_batch_end" not in f.advice


def test_lightnings_log_is_logging_though_it_is_a_disabled_function():
    # As the collector words a break inside LightningModule.log (torch.compiler.disable'd), at the user's line.
    reason = "Skip inlining `torch.compiler.disable()`d function (inside lightning `log`)"
    assert break_class(reason) == "logging"
    assert break_class("Skip inlining `torch.compiler.disable()`d function") == "disabled"


def test_reasons_of_one_class_share_their_advice_and_name_every_place():
    stats = breaks(
        GraphBreak(ITEM, "/tmp/a.py:3", 2), GraphBreak("Tensor.tolist() with non-integer tensor", "/tmp/b.py:9", 1)
    )
    f = run("compile_graph_breaks", cctx(stats))
    assert f.advice.count("keep the value a tensor") == 1 and "At /tmp/a.py:3 and /tmp/b.py:9: " in f.advice


def test_breaks_without_a_place_or_reason_still_get_advice():
    f = run("compile_graph_breaks", cctx(breaks(GraphBreak(ITEM, None, 1))))
    assert f.advice.startswith("A tensor is read as a Python number") and "an unknown place" in f.evidence
    f = run("compile_graph_breaks", cctx(compile_stats(breaks=2)))  # the count, no sites
    assert f.title == "Training hits 2 graph breaks in torch.compile" and "top reasons" not in f.evidence
    assert f.advice.startswith("`TORCH_LOGS=graph_breaks`")


# --- compile_recompiles ------------------------------------------------------------------------------------


def test_recompiles_fire_at_three_of_one_function():
    assert run("compile_recompiles", cctx(recompiles(Recompile(DYN, "0/0: n == 1", 2)))) is None
    f = run("compile_recompiles", cctx(recompiles(Recompile(DYN, "0/0: n == 1", 3))))
    assert f.severity == "warning" and f.title == "Training recompiles `g` 3 times"
    assert "3 recompiles this epoch, 3 of g (/tmp/dyn2.py:20) (warning >= 3 of one function" in f.evidence
    assert run("compile_recompiles", cctx(recompiles(Recompile(DYN, "0/0: n == 1", 3))), compile_recompiles=4) is None


def test_the_normal_recompiles_of_several_functions_stay_quiet():
    # two compiled functions, each recompiled for the smaller last batch and the switch to eval mode
    guards = [Recompile(fn, guard, 1) for fn in (FORWARD, DYN) for guard in (SHAPE, TRAINING)]
    assert run("compile_recompiles", cctx(recompiles(*guards))) is None


def test_without_guards_the_epochs_total_counts():
    assert run("compile_recompiles", cctx(compile_stats(recompiles=2))) is None
    f = run("compile_recompiles", cctx(compile_stats(recompiles=3)))
    assert f.title == "Training recompiles 3 times" and "`TORCH_LOGS=recompiles`" in f.advice


def test_reaching_the_recompile_limit_is_critical_whatever_the_count():
    stats = recompiles(Recompile(DYN, "0/0: n == 7", 1), limit_reached=True, limit_function=DYN)
    f = run("compile_recompiles", cctx(stats))
    assert f.severity == "critical" and f.title == "Training: `g` hit the recompile limit and runs eager"
    assert "g (/tmp/dyn2.py:20) reached `torch._dynamo.config.recompile_limit`: it runs eager" in f.evidence
    assert "raising the limit only postpones it" in f.advice
    unnamed = run("compile_recompiles", cctx(compile_stats(recompiles=0, limit_reached=True)))
    assert unnamed.severity == "critical" and "a compiled function hit the recompile limit" in unnamed.title


def test_recompiles_show_the_top_failed_guards_with_their_function():
    stats = recompiles(
        Recompile(FORWARD, SHAPE, 1),
        Recompile(DYN, "0/0: n == 1", 7),
        Recompile(FORWARD, TRAINING, 1),
        Recompile(DYN, "0/0: ___check_obj_id(L['cfg'], 1403)", 1),
        limit_reached=True,
        limit_function=DYN,
    )
    f = run("compile_recompiles", cctx(stats))
    assert "10 recompiles this epoch, 8 of g (/tmp/dyn2.py:20)" in f.evidence
    assert "failed guards: `n == 1` in g (/tmp/dyn2.py:20) (7x); `tensor 'x' size mismatch" in f.evidence
    assert "0/0:" not in f.evidence and f.evidence.count("(1x)") == 2  # the top three


@pytest.mark.parametrize(
    ("guard", "expected"),
    [
        ("0/0: n == 1", "value"),
        ("L['x'] == 7", "value"),
        ("0/1: len(L['xs']) == 3", "value"),
        (SHAPE, "shape"),
        ("tensor 'x' stride mismatch at index 1. expected 1, actual 4", "shape"),
        ("tensor 'x' rank mismatch. expected 2, actual 3", "shape"),
        ("2 <= L['x'].size()[0]", "shape"),
        (TRAINING, "mode"),
        ("GLOBAL_STATE changed: grad_mode ", "mode"),
        ("tensor 'x' dtype mismatch. expected Float, actual Half", "tensor"),
        ("tensor 'x' requires_grad mismatch. expected requires_grad=1", "tensor"),
        ("0/0: ___check_obj_id(L['cfg'], 140234)", "object"),
        ("something new", "unknown"),
        (None, "unknown"),
    ],
)
def test_guard_class(guard, expected):
    assert guard_class(guard) == expected


@pytest.mark.parametrize(
    ("guard", "advice"),
    [
        ("0/0: n == 1", ("In g (/tmp/dyn2.py:20): a Python value", "`n == 1`", "pass it as a tensor")),
        (SHAPE, ("`torch._dynamo.mark_dynamic(tensor, dim)`", "`torch.compile(..., dynamic=True)`", "pad or bucket")),
        (SHAPE, ("`DataLoader(drop_last=True)`",)),
        (TRAINING, ("train and eval", "expected")),
        ("0/0: ___check_obj_id(L['cfg'], 140234)", ("create it once",)),
        ("something new", ("`TORCH_LOGS=recompiles`",)),
    ],
)
def test_recompile_advice_follows_the_guard(guard, advice):
    f = run("compile_recompiles", cctx(recompiles(Recompile(DYN, guard, 3))))
    for words in advice:
        assert words in f.advice, f.advice
    assert 'In CI, call `torch.compiler.set_stance("fail_on_recompile")` after a warm-up step' in f.advice
    assert "runs eager" not in f.advice  # the limit was not reached


def test_a_smaller_last_batch_in_evaluation_is_not_dropped():
    f = run("compile_recompiles", cctx(recompiles(Recompile(FORWARD, SHAPE, 3)), epoch(stage="validate")))
    assert "drop_last" not in f.advice and "recompiles once, which is normal" in f.advice


# --- compile_time ------------------------------------------------------------------------------------------


def test_compile_time_is_info_in_the_first_epoch_at_a_tenth():
    f = run("compile_time", cctx(compile_stats(seconds=0.1, graphs=3)))  # a 1 s epoch (no wall time: step time)
    assert f.severity == "info" and f.title == "Compiling takes 10% of this training epoch"
    assert "compiling 0.10 s of the epoch's 1.00 s (10%) (info >= 10% in the stage's first epoch" in f.evidence
    assert "3 graphs compiled, 0 recompiles" in f.evidence and "regional compilation" in f.advice
    assert run("compile_time", cctx(compile_stats(seconds=0.0999))) is None
    assert run("compile_time", cctx(compile_stats(seconds=0.1)), compile_time=0.2) is None
    assert run("compile_time", cctx(compile_stats(seconds=0.0))) is None


def test_compile_time_after_the_first_epoch_is_a_warning():
    stats = compile_stats(seconds=0.5, recompiles=4)
    f = run("compile_time", cctx(stats, epoch(epoch=3), history=(epoch(epoch=2),)))
    assert f.severity == "warning" and f.title == "Compiling takes 50% of training epoch 3: it keeps compiling"
    assert "4 recompiles this epoch (see `compile_recompiles`)" in f.advice and "`TORCH_LOGS=recompiles`" in f.advice


def test_compile_time_reads_the_wall_time_and_the_compiles_before_the_first_batch():
    assert run("compile_time", cctx(compile_stats(seconds=0.5), epoch(wall_time=10.0))) is None  # 5%
    stats = compile_stats(seconds=0.5, seconds_before=0.4)
    f = run("compile_time", cctx(stats, epoch(stage="validate", wall_time=0.6)))
    assert "compiling 0.50 s of the epoch's 1.00 s (50%)" in f.evidence
    assert "0.40 s of it before the epoch's first batch" in f.evidence
    f = run("compile_time", cctx(compile_stats(seconds=30.0)))  # more than the epoch measured: capped
    assert f.title == "Compiling takes 100% of this training epoch"


# --- step_time_unstable knows compile steps ----------------------------------------------------------------


def spiky(*indices: int, spike: float = 0.5, n: int = 100, base: float = 0.01) -> tuple[float, ...]:
    return tuple(spike if i in indices else base for i in range(n))


def summarized(steps, stats=None) -> StageEpoch:
    """The epoch as summarize_epoch sees it: percentiles over every batch, compile steps included."""
    summary = epoch(step_time=sum(steps), step_time_p50=percentile(steps, 50), step_time_p90=percentile(steps, 90))
    return cctx(stats, summary, step_times=steps)


def test_compile_steps_alone_are_no_instability():
    steps = spiky(0, 10, 40, 99)  # the first compile, a recompile, an eval switch's, the smaller last batch
    assert run("step_time_unstable", summarized(steps)) is not None  # without the compile record: spikes
    assert run("step_time_unstable", summarized(steps, compile_stats(steps=(0, 10, 40, 99)))) is None


def test_real_spikes_are_found_besides_the_compile_steps_which_are_named():
    steps = spiky(0, 5, 20, 50, 80, 110, n=120)
    f = run("step_time_unstable", summarized(steps, compile_stats(steps=(0, 5))))
    assert "4 steps >= 3x the median 10.00 ms at batches 20, 50, 80, 110" in f.evidence
    assert "batches 0, 5 compiled (torch.compile): left out" in f.evidence
    assert f.title == "Training stalls every 30 batches"
    # two real spikes are not enough once the compile steps are left out
    assert run("step_time_unstable", summarized(spiky(0, 5, 20, 50), compile_stats(steps=(0, 5)))) is None


def test_a_compile_step_that_was_not_slow_is_not_named():
    steps = spiky(20, 50, 80)
    f = run("step_time_unstable", summarized(steps, compile_stats(steps=(3,))))
    assert "compiled (torch.compile)" not in f.evidence


def test_a_spread_made_only_by_compile_steps_is_none():
    steps = spiky(0, 2, 5, n=20)  # 3 of 20 steps compile: p90 is one of them
    assert run("step_time_unstable", summarized(steps)).title.startswith("Training step time unstable: p90")
    assert run("step_time_unstable", summarized(steps, compile_stats(steps=(0, 2, 5)))) is None


def test_a_real_spread_is_measured_without_the_compile_steps():
    steps = (2.0, *[0.01, 0.01, 0.01, 0.02] * 5)  # batch 0 compiled; a fifth of the others twice the median
    f = run("step_time_unstable", summarized(steps, compile_stats(steps=(0,))))
    p50, p90 = percentile(steps[1:], 50), percentile(steps[1:], 90)
    assert f"p90 step {p90 * 1e3:.2f} ms is 2.00x the median {p50 * 1e3:.2f} ms (compile steps left out)" in f.evidence
    assert "batch 0 compiled (torch.compile): left out" in f.evidence


def test_profiled_compile_steps_and_steps_past_the_end_are_ignored():
    steps = (*spiky(20, 50, 80)[:99], math.nan)
    f = run("step_time_unstable", summarized(steps, compile_stats(steps=(99, 150))))
    assert f is not None and "compiled (torch.compile)" not in f.evidence


@given(st.lists(st.floats(min_value=1e-4, max_value=10.0), min_size=1, max_size=60))
def test_step_percentiles_without_compile_steps_match_the_epochs_own(values):
    p50, p90 = _p50_p90(values)
    assert math.isclose(p50, percentile(values, 50), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(p90, percentile(values, 90), rel_tol=1e-9, abs_tol=1e-12)


def test_thresholds_reject_a_zero_count():
    with pytest.raises(ValueError, match="compile_breaks must be an integer >= 1, got 0"):
        Thresholds.with_overrides({"compile_breaks": 0})
    assert dataclasses.replace(Thresholds(), compile_time=0.5).compile_time == 0.5


# --- the torch.compile lever of other rules, for a run that already compiles ------------------------------------


def test_launch_bound_on_a_compiled_run_points_at_what_compile_left_eager():
    from summaries import window

    tiny = window(tiny_op_time=0.004, tiny_ops_per_step=300.0)
    eager = run("launch_bound", cctx(windows=(tiny,)))
    assert "`model = torch.compile(model)` before `trainer.fit(model)` fuses what remains" in eager.advice
    for compiled in (
        cctx(windows=(dataclasses.replace(tiny, compiled_time=0.004),)),  # the trace shows compiled regions
        cctx(compile=compile_stats(graphs=1), windows=(tiny,)),  # something compiled in the epoch
    ):
        f = run("launch_bound", compiled)
        assert "model = torch.compile(model)" not in f.advice
        assert "already uses `torch.compile`" in f.advice and "`compile_graph_breaks`" in f.advice


def test_a_guard_is_classed_by_its_expression_not_by_the_source_line_after_it():
    # A dropout p that changes every batch, as the collector words it (real: Lightning's project template).
    guard = "self.drop_p == 0.465 (x = F.dropout(x, p=self.drop_p, training=self.training); template.py:36 in forward)"
    assert guard_class(guard) == "value"
    assert guard_class("0/0: L['self'].training == True") == "mode"


def test_modules_compiled_one_by_one_are_no_recompiles_until_their_shared_limit():
    # Real (the autoencoder example with its encoder and decoder compiled on their own): torch's module wrapper
    # "recompiles" once per module and mode; nothing recompiles after the first epoch.
    wrapper = "inner (.venv/lib/python3.11/site-packages/torch/_dynamo/external_utils.py:67)"
    guards = (
        Recompile(wrapper, "args[0] requires_grad mismatch. expected requires_grad=1", 2),
        Recompile(wrapper, "tensor 'args[0]' size mismatch at index 1. expected 784, actual 3", 2),
    )
    assert run("compile_recompiles", cctx(compile_stats(graphs=5, recompiles=4, recompile_guards=guards))) is None
    limit = compile_stats(graphs=9, recompiles=8, recompile_guards=guards, limit_reached=True, limit_function=wrapper)
    f = run("compile_recompiles", cctx(limit))
    assert f.severity == "critical" and "Compile their parent module once instead" in f.advice


def test_compile_unused_fires_when_compile_was_called_and_nothing_compiled():
    facts = dataclasses.replace(CPU, compiled_modules="`LightningModule`")
    f = run("compile_unused", cctx(facts=facts))
    assert f.severity == "warning" and "`LightningModule`" in f.evidence and "torch.compile(self.net)" in f.advice
    assert run("compile_unused", cctx(compile_stats(graphs=1), facts=facts)) is None  # something compiled
    assert run("compile_unused", cctx()) is None  # .compile() never called
    assert run("compile_unused", cctx(facts=facts, epoch_=epoch(stage="validate"))) is None


def test_recompiles_of_library_code_do_not_warn_and_point_at_the_call():
    # Real (Lightning's project template, self.log in a compiled validation_step): Lightning's log recompiles
    # three times as the trainer's state changes.
    log = "log (.venv/lib/python3.11/site-packages/lightning/pytorch/core/module.py:386)"
    guards = (
        Recompile(log, "len(self._trainer.fit_loop.epoch_loop.val_loop._results) != 0", 3),
        Recompile("validation_step (template.py:77)", "tensor 'batch[0]' size mismatch at index 0", 1),
    )
    stats = compile_stats(graphs=6, recompiles=4, recompile_guards=guards)
    assert run("compile_recompiles", cctx(stats)) is None
    f = run("compile_recompiles", cctx(stats), compile_recompiles=1)
    assert "keep that call out of the compiled code" in f.advice and "pass it as a tensor" not in f.advice
