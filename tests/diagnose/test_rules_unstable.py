"""``step_time_unstable`` on hand-built step times (lightning_perf.diagnose.rules_unstable)."""

import pytest
from contexts import ctx, run, spread

from lightning_perf.diagnose.model import Finding
from summaries import epoch

# --- step_time_unstable -------------------------------------------------------------------------------------


def _steps(spikes, n=200, base=0.01, spike=0.05):
    return tuple(spike if i in spikes else base for i in range(n))


def test_periodic_spikes_are_named_with_their_period():
    f = run("step_time_unstable", ctx(step_times=_steps({7, 15, 23, 31, 39}, n=40)))
    assert f.title == "Training stalls every 8 batches"
    assert "5 steps >= 3x the median 10.00 ms at batches 7, 15, 23, 31, 39 (every 8 batches)" in f.evidence
    # On a cadence: the program's, judged from 1 ms above the median (an irregular spike needs a scheduler slice).
    assert "(warning >= 3 spikes, each >= 1.00 ms above the median)" in f.evidence
    assert "Something runs every 8 batches" in f.advice and "log_every_n_steps" in f.advice


def test_a_stray_spike_does_not_hide_the_period():
    f = run("step_time_unstable", ctx(step_times=_steps({7, 15, 23, 26, 31, 39}, n=40)))
    assert f.title == "Training stalls every 8 batches"
    assert "at batches 7, 15, 23, 26, 31, 39 (5 of them every 8 batches)" in f.evidence


def test_spikes_on_a_cadence_in_one_stretch_of_the_epoch_are_no_cadence():
    # Every 8 batches in the first 40 of 200, then none: the cycle does not hold across the epoch (the cadence's own
    # tests: tests/diagnose/test_cadence.py).
    f = run("step_time_unstable", ctx(step_times=_steps({7, 15, 23, 31, 39})))
    assert "every" not in f.title and "Irregular stalls" in f.advice


def test_spikes_every_50_batches_point_at_lightnings_logging_cadence():
    f = run("step_time_unstable", ctx(step_times=_steps({49, 99, 149, 199})))
    assert "(50 is Lightning's default `log_every_n_steps`: most likely logging)" in f.advice


def test_irregular_spikes_get_generic_advice():
    f = run("step_time_unstable", ctx(step_times=_steps({5, 17, 60, 61})))
    assert "every" not in f.title and "Irregular stalls" in f.advice and "gc.freeze()" in f.advice


def test_the_first_step_is_warm_up_not_a_spike():
    assert run("step_time_unstable", ctx(step_times=_steps({0, 50, 100}))) is None


# A checkpoint every 8 batches of 1.1-ms steps (Lightning's BoringModel with ModelCheckpoint(every_n_train_steps=8)):
# each save 1.9 ms slower, under a scheduler slice, 2.7x the median: a spread, on a cadence.
CHECKPOINTS = tuple(0.003 if i % 8 == 7 else 0.0011 for i in range(96))


def test_slow_steps_on_a_cadence_are_named_from_1_ms_with_their_period():
    f = run("step_time_unstable", ctx(step_times=CHECKPOINTS))
    assert f.title == "Training stalls every 8 batches"
    assert (
        "every 8 batches (at batches 7, 15, 23, 31, 39, 47, 55, 63, ...) a step 1.90 ms slower than the other batches'"
        " median 1.10 ms, in 12 of 12 cycles (a cadence: each cycle's slow step at the same position, from 1.00 ms"
        " above the others and 2% of the epoch)" in f.evidence
    )
    assert "(warning >= 1.5x and >= 1.00 ms above it)" in f.evidence
    assert "`ModelCheckpoint(every_n_train_steps=...)`" in f.advice


@pytest.mark.parametrize(
    "steps",
    [
        # the same slow steps at random batches: a busy machine's preemptions, under a slice
        tuple(0.003 if i in {3, 9, 10, 22, 29, 41, 44, 58, 66, 67, 80, 91} else 0.0011 for i in range(96)),
        # a cadence of 2: gradient accumulation's optimizer step, or random stalls dense enough to fill its slots
        tuple(0.003 if i % 2 else 0.0011 for i in range(96)),
    ],
    ids=["irregular", "every 2"],
)
def test_slow_steps_under_a_scheduler_slice_off_a_cadence_are_steady(steps):
    assert run("step_time_unstable", ctx(step_times=steps)) is None


def test_a_wide_spread_without_spikes():
    f = run("step_time_unstable", ctx(step_times=spread(0.01, 0.025)))
    assert f.title == "Training step time unstable: p90 2.50x the median"
    assert "p90 step 25.00 ms is 2.50x the median 10.00 ms (warning >= 1.5x and >= 4.00 ms above it)" in f.evidence
    assert "bucket" in f.advice
    assert "dataloader_bound" not in f.advice  # 1% data wait: no such finding to point at


# A freshly booted 2-CPU VM, nothing else running: a clean compiled model's 4-ms steps read "p90 2.19x the median", a
# well-tuned one's "1.57x" (warnings). A few steps late by a scheduler slice, or the host taking the vCPU in a burst.
VM_BURST = tuple(0.0088 if i in (12, 13, 14, 15) else 0.004 for i in range(32))


def test_slow_steps_bunched_in_one_stretch_are_information():
    f = run("step_time_unstable", ctx(step_times=VM_BURST))
    assert f.title == "Training step time unstable: p90 2.08x the median" and f.severity == "info"
    assert f.evidence.startswith(
        "the slow steps' time beyond the median is bunched: 100% of it in one quarter of the epoch, in 1 of its 4"
        " quarters (warning: in >= 3, none holding more than half)"
    )
    # The same slow steps spread over the epoch: a warning.
    spread_over = tuple(0.0088 if i in (4, 12, 20, 28) else 0.004 for i in range(32))
    assert run("step_time_unstable", ctx(step_times=spread_over)).severity == "warning"


def test_a_few_spikes_in_a_long_epoch_are_information():
    # Three stalls of 20 ms among 200 steps of 10 ms: 3% of the epoch, as a busy machine's scheduler makes.
    f = run("step_time_unstable", ctx(step_times=_steps({40, 100, 160}, spike=0.03)))
    assert f.title == "Training step time spikes 3 times" and f.severity == "info"
    assert f.evidence.startswith("the slow steps (>= 1.5x the median and 4.00 ms above it) took 2% of the epoch")


def test_a_wide_spread_names_an_uneven_data_wait_where_the_epoch_waits_for_data():
    f = run("step_time_unstable", ctx(epoch(data_wait=0.3, data_wait_fraction=0.3), step_times=spread(0.01, 0.025)))
    assert "an uneven data wait (data wait is 30% of this epoch: `dataloader_bound`)" in f.advice


def short_epochs(first_wait: float, *, epochs: int = 26, per_epoch: int = 4) -> Finding | None:
    """26 epochs of 4 batches judged together, each epoch's first step 5 ms against 0.9 ms, of which
    ``first_wait`` is its data wait (the others wait 0.5 ms): a map-style dataset that sleeps, 3 persistent
    workers (the measured run of test_loader_advice.py's SLEEPING_WORKERS)."""
    steps = tuple(0.005 if i % per_epoch == 0 else 0.0009 for i in range(epochs * per_epoch))
    n = len(steps)
    summary = epoch(batches=n, epochs=epochs, data_wait=epochs * first_wait + (n - epochs) * 0.0005,
                    first_data_wait=epochs * first_wait, step_time=sum(steps))  # fmt: skip
    return run("step_time_unstable", ctx(summary, step_times=steps, pooled_epochs=epochs))


def test_each_short_epochs_slow_first_batch_is_named_as_the_epochs_start_not_a_cadence_of_logging():
    f = short_epochs(0.0046)
    assert f.title == "Training stalls at each epoch's first batch", f.title
    assert "each of them an epoch's first batch (the last 26 epochs of 4 batches)" in f.evidence
    assert f.advice.startswith("Each epoch's first batch waits for data 4.10 ms longer than the others"), f.advice
    assert "persistent_workers=True" in f.advice and "log_every_n_steps" not in f.advice
    # The same steps with no longer wait: something else runs at the epoch's start.
    other = short_epochs(0.0005)
    assert (
        other.advice.startswith("Something runs at the start of every epoch")
        and "`on_train_epoch_start`" in other.advice
    )
    # One long epoch with the same cycle is a cadence of the program's.
    steps = tuple(0.005 if i % 4 == 0 else 0.0009 for i in range(104))
    assert (
        run("step_time_unstable", ctx(epoch(batches=104), step_times=steps)).title == "Training stalls every 4 batches"
    )
