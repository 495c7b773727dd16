"""``optimizer_heavy``, ``validation_heavy`` and ``framework_overhead`` on hand-built summaries
(lightning_perf.diagnose.rules_step)."""

from contexts import ctx, cw, facts, gpu_ctx, gw, run

from lightning_perf.diagnose.registry import diagnose
from summaries import W1, W2, epoch

# --- optimizer_heavy ----------------------------------------------------------------------------------------


def test_optimizer_heavy_single_tensor_update_advises_foreach_or_fused():
    context = ctx(
        None,
        cw(W1, optimizer_update_time=0.25, framework_time=0.05),
        cw(W2, optimizer_update_time=0.40, optimizer_update_ops=1600.0, optimizer_foreach=False, framework_time=0.05),
    )
    f = run("optimizer_heavy", context)
    assert f.window == W2 and f.title == "Optimizer update takes 40% of each training step"
    assert "1,600 operators" in f.evidence and "(warning >= 20% and >= 0.50 ms per step)" in f.evidence
    # On CPU `foreach` runs the same per-parameter loop (no faster, measured): only `fused` is advised there.
    assert "fused=True" in f.advice and "foreach=True" not in f.advice and "does not help" in f.advice
    looped = gw(W2, optimizer_update_time=0.40, optimizer_foreach=False)
    on_gpu = run("optimizer_heavy", gpu_ctx(None, looped))
    assert "`torch.optim.AdamW(..., foreach=True)`" in on_gpu.advice and "fused=True" in on_gpu.advice


def test_optimizer_heavy_with_foreach_already_advises_fused_and_fewer_tensors():
    f = run("optimizer_heavy", gpu_ctx(None, gw(optimizer_update_time=0.3)))
    assert "already uses multi-tensor kernels" in f.advice
    assert "fused=True" in f.advice and "Fewer optimizer states" in f.advice
    on_cpu = run("optimizer_heavy", ctx(None, cw(optimizer_update_time=0.3, optimizer_foreach=True)))
    assert "On CPU `foreach` runs the same per-parameter loop" in on_cpu.advice and "fused=True" in on_cpu.advice


def optimizer_ctx(**kw):
    return ctx(None, cw(optimizer_update_time=0.3, optimizer_foreach=True), facts=facts(**kw))


def test_optimizer_heavy_advises_only_what_would_change_the_runs_own_optimizer():
    # Already fused (the trace shows aten::_fused_adam_): no `fused=True` again.
    fused = run("optimizer_heavy", optimizer_ctx(optimizer="Adam", optimizer_fused=True, optimizer_fusable=True))
    assert "already fused (`Adam(..., fused=True)`)" in fused.advice and "fused=True)`," not in fused.advice
    # SGD: fused SGD, never "SGD with momentum instead of Adam".
    sgd = run("optimizer_heavy", optimizer_ctx(optimizer="SGD", optimizer_fused=False, optimizer_fusable=True))
    assert "`torch.optim.SGD(..., fused=True)`" in sgd.advice and "instead of Adam" not in sgd.advice
    assert "SGD with momentum" not in sgd.advice
    # A class with no fused kernels (RMSprop, a library's): no fused advice at all.
    other = run("optimizer_heavy", optimizer_ctx(optimizer="RMSprop", optimizer_fusable=False))
    assert "fused=True" not in other.advice and "`RMSprop` has no fused implementation" in other.advice


# --- validation_heavy ---------------------------------------------------------------------------------------


def test_validation_heavy_counts_every_validation_run_of_the_epoch():
    runs = tuple(epoch(stage="validate", epoch=i, step_time=0.5, batches=20) for i in range(3))
    f = run("validation_heavy", ctx(epoch(step_time=1.0), validation=runs))
    assert f.title == "Validation takes 60% of each training epoch"
    assert "validation 60% of the epoch's step time (1.50 s, training 1.00 s); this epoch 3 runs of 60 batches" in (
        f.evidence
    )
    assert "limit_val_batches" in f.advice and "check_val_every_n_epoch" in f.advice
    assert "val_check_interval" in f.advice  # several runs per epoch


def test_validation_heavy_from_one_training_batch_is_information():
    # Trainer(fast_dev_run=True): one training batch and one validation batch, whose start-up made validation 31%
    # of the epoch in 1 of 6 runs: a warning from one batch each, before.
    smoke = ctx(epoch(step_time=0.02, batches=1), validation=(epoch(stage="validate", step_time=0.2, batches=1),))
    [f] = [f for f in diagnose(smoke) if f.id == "validation_heavy"]
    assert f.severity == "info" and f.evidence.startswith("from 1 batch only (a warning needs 8); ")


def test_validation_heavy_judges_the_fit_and_names_step_based_validation():
    # Validation every 100 steps across one-batch epochs: one epoch holds a whole run (49% of that epoch), the
    # fit so far 5%: no finding.
    one_run = (epoch(stage="validate", step_time=0.96, batches=20),)
    one_batch = epoch(step_time=1.0, batches=1)
    step_based = facts(val_check_steps=100)
    assert run("validation_heavy", ctx(one_batch, validation=one_run, facts=step_based)) is not None  # per epoch
    fit = ctx(one_batch, validation=one_run, facts=step_based, fit_seconds=(19.0, 0.96))
    assert run("validation_heavy", fit) is None
    heavy = run("validation_heavy", ctx(one_batch, validation=one_run, facts=step_based, fit_seconds=(1.0, 0.96)))
    assert heavy.title == "Validation takes 48% of the fit" and "the fit so far's step time" in heavy.evidence
    assert "every 100 training batches" in heavy.advice and "validates every N epochs" not in heavy.advice


def test_validation_heavy_is_for_training_epochs_only():
    val = (epoch(stage="validate", step_time=5.0),)
    assert run("validation_heavy", ctx(epoch(stage="validate"), validation=val)) is None
    assert run("validation_heavy", ctx(epoch())) is None


# --- framework_overhead -------------------------------------------------------------------------------------


def test_framework_overhead_names_the_window_and_the_usual_suspects():
    context = ctx(None, cw(W1, framework_time=0.2), cw(W2, framework_time=0.5))
    f = run("framework_overhead", context)
    assert f.window == W2 and f.title == "Training spends 50% of each step outside torch operators"
    for pattern in ("sync_dist=True", "TQDMProgressBar(refresh_rate=", "log_every_n_steps", "on_train_batch_end"):
        assert pattern in f.advice


def test_framework_overhead_names_the_stages_own_hook_and_logging():
    heavy = cw(framework_time=0.3)
    validation = run("framework_overhead", ctx(epoch(stage="validate"), heavy))
    assert "`on_validation_batch_end`" in validation.advice
    # Eval logs once per epoch by default, but each `self.log` call costs the same bookkeeping every batch.
    assert "`self.log(...)` in `validation_step`" in validation.advice
    assert "log them once in `on_validation_epoch_end`" in validation.advice
    assert "log_every_n_steps" not in validation.advice  # it paces training's logging only
    prediction = run("framework_overhead", ctx(epoch(stage="predict"), heavy))
    assert "`on_predict_batch_end`" in prediction.advice and "self.log" not in prediction.advice  # predict can't log
    assert "0.3-1 ms" in prediction.advice  # Lightning's own loop, which no setting removes


def test_validation_heavy_counts_the_runs_of_grouped_short_epochs_per_training_epoch():
    # A record of 95 one-batch training epochs and the validation records inside it (one run per epoch, measured
    # in groups of 12, 30, 45 and 8): 95 runs, one per epoch; no `val_check_interval` advice.
    groups = tuple(epoch(stage="validate", epochs=n, step_time=0.002 * n, batches=n) for n in (12, 30, 45, 8))
    f = run("validation_heavy", ctx(epoch(step_time=0.3, batches=95, epochs=95), validation=groups))
    assert "these 95 epochs 95 runs of 95 batches" in f.evidence
    assert "val_check_interval" not in f.advice
    # Two runs per epoch in groups: the advice says 2.
    twice = tuple(epoch(stage="validate", epochs=n, step_time=0.01 * n, batches=n) for n in (10, 10))
    f = run("validation_heavy", ctx(epoch(step_time=0.3, batches=10, epochs=10), validation=twice))
    assert "runs fewer than the 2 validations per epoch" in f.advice and "these 10 epochs 20 runs" in f.evidence


def test_an_update_the_trace_shows_fused_is_not_told_to_fuse():
    # A trace alone (`lightning-perf analyze`): no optimizer class or setting in the facts, its kernels fused.
    fused = cw(W2, optimizer_update_time=0.40, optimizer_update_ops=20.0, optimizer_foreach=True, optimizer_fused=True)
    f = run("optimizer_heavy", ctx(None, fused))
    assert "The update is already fused (its kernels are fused)" in f.advice and "fused=True)`" not in f.advice
