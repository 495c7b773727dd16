"""
Diagnosis
=========

Pure rules over plain summaries: each takes a :class:`~lightning_perf.diagnose.model.StageEpoch` and the
:class:`~lightning_perf.diagnose.thresholds.Thresholds`, and returns a
:class:`~lightning_perf.diagnose.model.Finding` or ``None``; a summary rule (``low_mfu``) also reads the
other rules' findings of the same epoch. Nothing in this package imports torch or
lightning (a test checks it), so every rule is tested without a trainer, and the offline CLI runs the same
rules on saved reports and traces.
"""
