"""
The callback's units
====================

What :class:`~lightning_perf.PerfCallback` wires together, one concern each, at the top of the layers
(hooks -> collect -> summarize -> diagnose -> report):

- :mod:`.stage_hooks`: which Lightning hook is which stage event;
- :mod:`.stage_events`: the stage events wired to the units below (each epoch's and batch's measurement, its
  windows, its report), the part of the callback that runs at every batch;
- :mod:`.window_control`: which batches to record, and the one open window (framework-free: no Lightning, no
  torch; unit-tested with a fake window);
- :mod:`.profiler_windows` and :mod:`.window_close`: the real windows, made, then saved through the per-window
  pipeline (waited for on a worker thread), which :mod:`.window_process` runs in a child process;
- :mod:`.epoch_report`: each stage epoch measured, diagnosed and reported;
- :mod:`.rank_staging`: what the ranks exchange at each epoch's end, and the traces published once all wrote;
- :mod:`.run_state`: what a checkpoint keeps;
- :mod:`.run_setup`: where the output goes, and the profilers we cannot run beside;
- :mod:`.results_view`: what the callback has measured, read back (its public properties);
- :mod:`.error_policy`: what a failure of our own does (``strict``), and what is said only once.
"""
