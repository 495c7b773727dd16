"""
Memory breakdown, formatted
===========================

The run's ``run.memory`` (:func:`lightning_perf.summarize.memory.memory_report`) on one line: the console's,
when the model's memory is first counted and when it changes (a new optimizer, layers unfrozen), and a line of
``lightning-perf report``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_perf.diagnose.out_of_memory import ACTIVATIONS_UNMEASURED
from lightning_perf.units import signed_size


def memory_line(memory: Mapping[str, Any]) -> str:
    """``"lightning-perf: memory at training epoch 0: parameters 1.0 MiB (float32), gradients 1.0 MiB, optimizer
    state 2.0 MiB (Adam: exp_avg 1.0 MiB, exp_avg_sq 1.0 MiB, step 8 B); ..."``."""
    params = memory["parameters"]
    dtypes = ", ".join(
        name if len(params["by_dtype"]) == 1 else f"{name} {signed_size(nbytes)}"
        for name, nbytes in params["by_dtype"].items()
    )
    if params["frozen"]:
        dtypes += f"; {signed_size(params['frozen'])} frozen"
    state = memory["optimizer_state"]
    entries = ", ".join(f"{name} {signed_size(nbytes)}" for name, nbytes in state["by_entry"].items())
    optimizers = ", ".join(memory["optimizers"]) or "no optimizer"
    line = (
        f"lightning-perf: memory at training epoch {memory['epoch']}: parameters {signed_size(params['total'])}"
        f" ({dtypes or 'none'}), gradients {signed_size(memory['gradients'])}, optimizer state"
        f" {signed_size(state['total'])} ({optimizers}{': ' + entries if entries else ', no state'})"
    )
    if memory["master_copies"]:
        line += f", master copies {signed_size(memory['master_copies'])}"
    window = memory.get("activations_window")
    device = [
        f"{name} {signed_size(memory[key])}" + (f" (a step of {window})" if key == "activations" and window else "")
        for name, key in (
            ("activations and temporaries", "activations"),
            ("allocator overhead", "allocator_overhead"),
            ("outside the allocator", "outside_allocator"),
            ("free", "free"),
        )
        if memory.get(key) is not None
    ]
    if device:
        return line + "; " + ", ".join(device)
    if memory.get("activations_saved") is not None:
        return line + f"; activations saved for the backward {signed_size(memory['activations_saved'])} a batch"
    return line + f"; {ACTIVATIONS_UNMEASURED} (the parameters are on {memory['device'] or 'no device'})"
