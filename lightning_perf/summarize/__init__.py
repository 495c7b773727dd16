"""Pure functions from records to summaries: no torch, no lightning.

- :mod:`~lightning_perf.summarize.steps`: an epoch's per-batch times to an ``EpochSummary``;
- :mod:`~lightning_perf.summarize.ranks`: the numbers the ranks exchange, and their summaries;
- traces, read into :mod:`~lightning_perf.summarize.events` (typed Kineto events) and sorted out once per trace
  by :mod:`~lightning_perf.summarize.index`: :mod:`~lightning_perf.summarize.operators` (the operator table)
  and :mod:`~lightning_perf.summarize.step_summary` (the per-step ``TraceSummary``, over
  :mod:`~lightning_perf.summarize.step_spans`, :mod:`~lightning_perf.summarize.intervals` and
  :mod:`~lightning_perf.summarize.kernels`).
"""
