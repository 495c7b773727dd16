"""The optimizer trial on real torch optimizers: it measures the advised implementation against the current one
on copies, and leaves the training's optimizer, parameters, gradients and state exactly as they were."""

from __future__ import annotations

import torch

from lightning_perf.collect.optimizer_trial import optimizer_copy, try_optimizer_setting


def many_small_parameters(count: int = 400, size: int = 16) -> tuple[list[torch.nn.Parameter], torch.optim.Adam]:
    """An Adam over many small parameters, stepped once so that it has state, with gradients in place."""
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(size, generator=g)) for _ in range(count)]
    optimizer = torch.optim.Adam(params, lr=1e-3, foreach=False)
    for p in params:
        p.grad = torch.randn(size, generator=g)
    optimizer.step()
    return params, optimizer


def snapshot(params, optimizer) -> list[torch.Tensor]:
    state = [v.clone() for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [p.detach().clone() for p in params] + [p.grad.clone() for p in params] + state


def test_fused_adam_over_many_small_parameters_is_measured_and_nothing_of_the_training_moves() -> None:
    params, optimizer = many_small_parameters()
    before = snapshot(params, optimizer)
    groups_before = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    trial = try_optimizer_setting(optimizer, {"fused": True}, rule="optimizer_heavy", written="fused=True", epoch=0)
    assert trial.untried is None and trial.current and trial.advised and trial.ratio
    assert trial.batches == 30 and trial.repetitions == 3 and trial.seconds > 0
    low, high = trial.spread
    assert low <= trial.ratio * 1.5 and high >= trial.ratio / 1.5
    # 400 parameters stepped one by one against one fused kernel: the fused step is faster on any machine (6.2-6.6x
    # on a busy 2-CPU one); the repetitions alternate, so a loaded machine slows both alike.
    assert trial.ratio > 1.3, trial
    after = snapshot(params, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] == groups_before


def test_the_copy_steps_its_own_clones_and_runs_no_hook_of_the_training_optimizer() -> None:
    params, optimizer = many_small_parameters(count=4)
    called = []
    optimizer.register_step_pre_hook(lambda *args: called.append(1))
    made = optimizer_copy(optimizer, {"foreach": True})
    clones = [p for g in made.param_groups for p in g["params"]]
    pairs = zip(clones, params, strict=True)
    assert all(c is not p and torch.equal(c, p) and torch.equal(c.grad, p.grad) for c, p in pairs)
    made.step()
    assert not called and made.param_groups[0]["foreach"] is True and optimizer.param_groups[0]["foreach"] is False
    assert not torch.equal(clones[0], params[0])  # the clone moved, the parameter did not


def test_an_implementation_torch_refuses_is_untried_with_its_reason() -> None:
    _, optimizer = many_small_parameters(count=4)
    # fused=True with differentiable=True: torch refuses the pair at the step.
    trial = try_optimizer_setting(
        optimizer, {"fused": True, "differentiable": True}, rule="optimizer_heavy", written="fused=True", epoch=0
    )
    assert trial.current is None and trial.untried and trial.untried.startswith("torch refused it")


def test_gradients_released_before_a_validation_run_are_stood_in_by_zeros() -> None:
    # Lightning sets every gradient to None before a validation run inside a training epoch, so a fit that
    # validates reaches the epoch's end without gradients: the copies step zeros of each parameter's shape, the
    # same work, and the training's parameters, state and (absent) gradients stay as they were.
    params, optimizer = many_small_parameters()
    optimizer.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in params]
    state = [v.clone() for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    trial = try_optimizer_setting(optimizer, {"fused": True}, rule="optimizer_heavy", written="fused=True", epoch=0)
    assert trial.untried is None and trial.ratio > 1.3, trial
    assert all(p.grad is None for p in params)
    assert all(torch.equal(a, p) for a, p in zip(before, params, strict=True))
    after = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(state, after, strict=True))


def test_where_some_parameters_have_gradients_the_others_stay_without() -> None:
    params, optimizer = many_small_parameters(count=4)
    params[1].grad = None  # unused in the forward: a step skips it
    made = optimizer_copy(optimizer, {})
    assert [p.grad is None for g in made.param_groups for p in g["params"]] == [False, True, False, False]


def test_no_parameter_that_requires_a_gradient_means_nothing_to_try() -> None:
    params, optimizer = many_small_parameters(count=4)
    optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.requires_grad_(False)
    trial = try_optimizer_setting(optimizer, {"fused": True}, rule="optimizer_heavy", written="fused=True", epoch=0)
    assert trial.current is None and "no parameter of the optimizer requires a gradient" in trial.untried
