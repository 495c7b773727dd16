"""``dataloader_bound`` on the shapes of Lightning's public examples (``examples/pytorch/``), as they were run on
this project's 2-CPU machine: what each measured, and what the finding must say of it. Pure: the epochs are
built with :func:`~lightning_perf.summarize.steps.summarize_epoch` from per-batch times, and judged through
:func:`~lightning_perf.diagnosis_context.epoch_context` as the callback judges them (pooling included)."""

from __future__ import annotations

import dataclasses
import re

from advice import settings
from lightning_perf.diagnose.model import Finding, RunFacts
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnosis_context import epoch_context
from lightning_perf.records import EpochSummary, TraceSummary
from lightning_perf.summarize.steps import summarize_epoch
from summaries import window


def measured(
    waits: list[float], compute: float, *, epoch: int = 0, batch_size: int = 32, stage: str = "train", **kw
) -> EpochSummary:
    """An epoch whose batches waited ``waits`` (seconds, in order) and computed ``compute`` each."""
    summary = summarize_epoch(
        stage=stage,
        epoch=epoch,
        data_wait=waits,
        compute=[compute] * len(waits),
        batch_sizes=[batch_size] * len(waits),
    )
    return dataclasses.replace(summary, **kw)


def dataloader_bound(
    summary: EpochSummary,
    facts: RunFacts,
    *windows: TraceSummary,
    history: tuple[EpochSummary, ...] = (),
) -> Finding | None:
    context = epoch_context(summary, history=list(history), windows=list(windows), facts=facts)
    return next((f for f in diagnose(context) if f.id == "dataloader_bound"), None)


def per_batch(text: str) -> list[str]:
    """The "(N ms per batch" figures quoted in ``text``."""
    return re.findall(r"\((\d+\.\d+ ms) per batch", text)


# --- PPO (reinforce_learn_ppo.py) ---------------------------------------------------------------------------

# An IterableDataset whose generator (a bound method of the module) runs a 2048-step environment rollout on its
# first `next()` of each epoch, then yields 4 batches of 512 from it; no workers, torch on 2 threads, 2 CPUs.
# Measured: the first batch waited 1.1-1.2 s, the others 5-8 ms, against 22-30 ms of compute.
PPO = RunFacts(
    device="cpu",
    cpu_count=2,
    torch_threads=2,
    num_workers=0,
    pin_memory=False,
    persistent_workers=False,
    batch_size=512,
    dataset="iterable",
    shared_state="`dataset.generate_batch` is the LightningModule's method `generate_trajectory_samples`",
    epochs=8,
)


def ppo_epoch(epoch: int = 0, batches: int = 10) -> EpochSummary:
    return measured([1.150] + [0.005] * (batches - 1), 0.025, epoch=epoch, batch_size=512, loading_cpu_share=1.0)


def test_an_iterable_datasets_first_fetch_without_workers_is_its_own_work_not_start_up():
    # The rollout is the dataset's code: no worker starts there. Leaving it out as "start-up" made the advice
    # say 4.70 ms per batch where the evidence said 292.86 ms.
    f = dataloader_bound(ppo_epoch(), PPO)
    assert f is not None and f.severity == "critical"
    assert "start-up" not in f.evidence and "start-up" not in f.advice
    assert per_batch(f.evidence) == per_batch(f.advice) == ["119.50 ms"]  # (1.150 + 9 * 0.005) / 10
    assert "the first batch waited 1150.00 ms (95% of the wait, the dataset's own code: no worker starts" in (
        f.evidence
    )
    assert "95% of it in each epoch's first batch, which waited 1150.00 ms)" in f.advice and "do not add" in f.advice


def test_an_iterable_dataset_without_shared_state_keeps_its_first_fetch_in_the_wait_too():
    facts = dataclasses.replace(PPO, shared_state=None)
    f = dataloader_bound(ppo_epoch(), facts)
    assert "start-up" not in f.evidence and "Most of the wait is the first batch" not in f.advice
    assert "the dataset's own code" in f.evidence


def test_an_iterable_datasets_slow_first_batch_outweighs_windows_that_cannot_see_it():
    # An IterableDataset whose `__iter__` sleeps 200 ms an epoch, 16 batches of 2 ms: its window shows the
    # DataLoader small (it never holds an epoch's first batch). The title said "between batches, outside the
    # DataLoader" and the advice the progress bar, while the evidence said most of the wait was the first batch.
    facts = dataclasses.replace(PPO, shared_state=None, torch_threads=1, progress_bar="TQDMProgressBar")
    facts = dataclasses.replace(facts, progress_bar_refresh=1)
    f = dataloader_bound(
        measured([0.200] + [0.0005] * 15, 0.002), facts, window(step_time=0.0025, dataloader_time=0.0001)
    )
    assert f.title == "Training waits for data 86% of the time"
    assert "Most of the wait is each epoch's first batch (199.50 ms more than the others, 96% of the wait)" in (
        f.advice
    )
    assert "once in `setup`" in f.advice and "progress bar" not in f.advice and "ProfilerStep" not in f.advice


def test_a_map_datasets_first_batch_and_workers_starting_are_still_start_up():
    # A map-style dataset opening its files on its first item, and workers starting: start-up, left out of the
    # steady wait, as before.
    map_style = dataclasses.replace(PPO, dataset="map", shared_state=None)
    f = dataloader_bound(ppo_epoch(), map_style)
    assert "(start-up 95% of the wait)" in f.evidence and "Most of the wait is the first batch" in f.advice
    workers = dataclasses.replace(PPO, num_workers=2, shared_state=None, persistent_workers=False)
    f = dataloader_bound(dataclasses.replace(ppo_epoch(), worker_cpu=0.5, wall_time=1.4), workers)
    assert "(start-up 95% of the wait)" in f.evidence and "workers starting (1145.00 ms" in f.advice


def test_pooled_epochs_are_said_to_be_pooled_and_their_first_batches_are_one_per_epoch():
    # PPO's epochs have 4 batches: each is judged with the one before (8 batches), and the evidence said "over 8
    # batches" under the later epoch's label, its first wait the two epochs' first waits summed.
    earlier, last = ppo_epoch(0, batches=4), ppo_epoch(1, batches=4)
    f = dataloader_bound(last, PPO, history=(earlier,))
    assert "data wait 92% of step time over the last 2 epochs, 8 batches (291.25 ms per batch)" in f.evidence
    assert "the first batches of the last 2 epochs waited 1150.00 ms each on average" in f.evidence
    assert per_batch(f.advice) == ["291.25 ms"] and "first batch, which waited 1150.00 ms)" in f.advice
    alone = dataloader_bound(last, PPO)  # an epoch not pooled says only its batches
    assert "over 4 batches (291.25 ms per batch)" in alone.evidence and "last 2 epochs" not in alone.evidence


def test_pooled_savings_per_epoch_are_over_one_epochs_batches():
    # Two epochs of 4 batches waiting 10 ms (5 ms of compute) on 8 free CPUs, pooled: "per epoch" is 4
    # batches' saving, not 8's.
    facts = RunFacts(device="cpu", cpu_count=8, torch_threads=1, num_workers=0, persistent_workers=False, epochs=50)
    earlier, last = (measured([0.010] * 4, 0.005, epoch=e, loading_cpu_share=0.95) for e in (0, 1))
    f = dataloader_bound(last, facts, history=(earlier,))
    assert settings(f.advice) == {"num_workers": 2, "persistent_workers": True}
    assert "predicted data wait 1.50 ms per batch instead of 10.00 ms (about 34.00 ms less per epoch)" in f.advice


# --- backbone_image_classifier.py -----------------------------------------------------------------------------

# A TensorDataset of 1x28x28 images behind a `random_split`, batches of 32, no workers, torch on 2 threads, 2 CPUs:
# the DataLoader indexes each sample's two tensors (66 calls a batch, collate's two stacks included). Its windows
# read 0.61-0.93 ms per batch in the DataLoader; unprofiled, `__next__` took 0.32 ms in the program (median), and
# 0.20 ms alone against 0.09-0.13 ms with a `__getitems__` indexing both tensors at once: about 0.1 ms a batch,
# 2% of a 4.8 ms step. Applied, the advice gave 1.738 s against 1.736 s.
BACKBONE = dataclasses.replace(PPO, batch_size=32, dataset="map", shared_state=None, epochs=2)


def backbone_window(stage: str, dataloader_time: float, step_time: float) -> TraceSummary:
    return window(
        f"{stage}-epoch001-batches0006-0008",
        step_time=step_time,
        dataloader_time=dataloader_time,
        dataloader_ops_per_step=66.0,
    )


def test_indexing_samples_one_by_one_is_not_worth_batching_and_nothing_else_helps():
    train = measured([0.00121] * 172, 0.0036, epoch=1, loading_cpu_share=1.0)
    f = dataloader_bound(train, BACKBONE, backbone_window("train", 0.00062, 0.0060))
    assert "__getitems__" not in f.advice and "torch calls per sample" not in f.evidence
    assert f.severity == "info", f  # no change is predicted to help: workers have no CPU, batching saves ~0.1 ms
    validation = measured([0.00255] * 9, 0.0021, stage="validate", loading_cpu_share=1.0)
    f = dataloader_bound(validation, BACKBONE, backbone_window("validate", 0.00093, 0.0055))
    assert "__getitems__" not in f.advice and f.severity == "info", f


def test_transforming_samples_one_by_one_is_worth_batching_with_its_least_saving():
    # tests/callback/test_advice_applied.py's Normalized: six calls per sample, 64 a batch: 3.9 ms in the
    # DataLoader's window, 0.46 ms batched. At least the 378 calls beyond one sample's, about 1.5 us each.
    facts = dataclasses.replace(BACKBONE, torch_threads=1, batch_size=64, epochs=3)
    f = dataloader_bound(
        measured([0.0042] * 32, 0.0034, loading_cpu_share=0.95),
        facts,
        window(step_time=0.0073, dataloader_time=0.0039, dataloader_ops_per_step=384.0),
    )
    assert f.severity == "critical" and f.advice.startswith("Load whole batches")
    assert "at least 0.57 ms and up to 3.84 ms less per batch (up to 0.12 s per epoch)" in f.advice


# --- generative_adversarial_net.py --------------------------------------------------------------------------

# 16 workers (not persistent, pin_memory without a GPU) on 2 CPUs, torch on 2 threads, batches of 32 from an
# in-memory TensorDataset. Measured: the workers used 0.1-0.2 CPUs, the first batch waited 0.26-0.51 s (16
# workers starting), the others about 3 ms, against 24-28 ms of compute; one window saw 11% of a step in the
# DataLoader, the next 2%. The same seed gave three advices (num_workers=0, persistent_workers=True, "look outside
# the DataLoader"), one under the title "outside the DataLoader". num_workers=0 made the fit 10.2 s from 13.6 s.
GAN = dataclasses.replace(BACKBONE, num_workers=16, pin_memory=True, epochs=3)


def gan_epoch(epoch: int, first: float, others: float, compute: float, workers_cpus: float) -> EpochSummary:
    summary = measured([first] + [others] * 181, compute, epoch=epoch, loading_cpu_share=1.0)
    wall = summary.step_time + first
    return dataclasses.replace(summary, wall_time=wall, worker_cpu=workers_cpus * wall)


def test_more_workers_than_cpus_are_named_first_and_the_advice_holds_across_epochs():
    gan = [
        (gan_epoch(0, 0.2565, 0.00305, 0.0275, 0.1), window(step_time=0.04037, dataloader_time=0.00479)),
        (gan_epoch(1, 0.513, 0.00278, 0.0238, 0.2), window(step_time=0.025, dataloader_time=0.0005)),
        (gan_epoch(2, 0.30, 0.00290, 0.0250, 0.15), window(step_time=0.026, dataloader_time=0.0006)),
    ]
    found = [dataloader_bound(summary, GAN, win) for summary, win in gan]
    for f in found:
        assert f.title.startswith("Training waits for data") and "outside the DataLoader" not in f.title, f
        assert settings(f.advice) == {"num_workers": 0}, f.advice
        assert f.advice.startswith("Set `DataLoader(num_workers=0)`: 16 workers on 2 CPUs"), f.advice
        assert "persistent_workers=True" not in f.advice and "look at what else runs" not in f.advice
        assert f.severity == "warning"


def test_more_workers_than_cpus_that_compute_are_lowered_to_the_free_cpus():
    # Busy workers (1.5 CPUs' worth) on 2 CPUs, torch on 1 thread: one CPU is free.
    busy = dataclasses.replace(GAN, torch_threads=1)
    f = dataloader_bound(gan_epoch(1, 0.513, 0.00278, 0.0238, 1.5), busy)
    assert settings(f.advice) == {"num_workers": 1} and "16 workers on 2 CPUs" in f.advice


def test_more_workers_than_cpus_waiting_on_io_are_not_lowered():
    # Workers mostly idle and a training process idle too during the wait: I/O, which more workers overlap.
    io = dataclasses.replace(gan_epoch(1, 0.513, 0.00278, 0.0238, 0.1), loading_cpu_share=0.05)
    f = dataloader_bound(io, GAN)
    assert "16 workers on 2 CPUs" not in f.advice and "Set `DataLoader(num_workers=0)`" not in f.advice


def test_too_few_pooled_batches_say_they_are_pooled():
    # PPO's first two epochs: 3 measured batches (one counted FLOPs) and 4, together still under 8.
    earlier = dataclasses.replace(ppo_epoch(0, batches=4), profiled_batches=1)
    f = dataloader_bound(ppo_epoch(1, batches=4), PPO, history=(earlier,))
    assert f.severity == "info" and f.evidence.startswith("from 7 measured batches of the last 2 epochs only")
