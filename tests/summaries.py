"""Plain summaries for the rules' tests (no trace, no trainer)."""

from __future__ import annotations

from lightning_perf.records import TraceSummary

W1, W2 = "train-epoch000-batches0006-0008", "train-epoch000-batches0106-0108"


def window(name: str = W1, **kw) -> TraceSummary:
    """A healthy CPU window: 10 ms steps, almost all of it in a few hundred torch operators."""
    values = dict(
        window=name,
        steps=3,
        step_time=0.010,
        dataloader_time=0.0002,
        optimizer_time=0.004,
        optimizer_update_time=0.0005,
        optimizer_update_ops=12.0,
        optimizer_foreach=True,
        host_op_time=0.009,
        framework_time=0.0005,
        ops_per_step=150.0,
        median_op_time=30e-6,
    )
    values.update(kw)
    return TraceSummary(**values)
