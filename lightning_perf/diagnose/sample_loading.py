"""
Per-sample loading
==================

What ``dataloader_bound`` advises when the wait is a dataset doing its work one sample at a time: an
in-memory dataset whose ``__getitem__`` converts and normalises each sample (what torchvision's ``ToTensor``
and ``Normalize`` do), read by the DataLoader in the training process (``num_workers=0``). Workers do not
pay there (each batch costs the training process about as much to receive from a worker as to make), but
the per-sample calls themselves can go: the same transform on the whole batch costs about what it costs on
one sample, for small samples.

The measurement, from a profiler window (:class:`~lightning_perf.records.TraceSummary`):

- ``D``: the DataLoader's ``__next__`` time per step; ``B``: the batch size; ``D / B``: the fetch time per
  sample.
- ``n``: the top-level torch operators inside those spans per step (``dataloader_ops_per_step``). Where
  ``n >= B`` the dataset makes at least one torch call per sample: its cost grows with the batch, call by
  call.

The prediction: loading the batch at once (a ``__getitems__`` on the dataset, which the DataLoader calls with
the batch's indices since torch 2.0, or the transform moved to ``on_after_batch_transfer``) makes about one
sample's calls per batch (``n / B``), so the DataLoader takes toward ``D / B`` per batch instead of ``D``:

- **Up to** ``D (1 - 1/B)`` per batch: the batched operators still do every sample's work, and ``D`` is the
  profiled time, which the profiler inflates most for many tiny calls.
- **At least** ``CALL_SAVING`` per call removed (``n - n / B``): what a call costs beyond its work.

Both at most the epoch's steady wait per batch. The advice is given only where the least saving reaches
``MIN_SAVING``: a dataset that only indexes its tensors sample by sample (two calls per sample) makes too few
calls for batching to pay, however slow the window shows them.

Measured on this project's 2-CPU machine with torch 2.13:

- ``tests/callback/test_advice_applied.py``: an in-memory dataset of 3x8x8 images, ``B = 64``, six calls per
  sample: 3.9 ms per batch in the DataLoader's window, 0.46 ms batched (the upper bound's 0.06 ms: the batched
  operators on 64 samples are not free).
- Lightning's ``backbone_image_classifier.py`` example: a ``TensorDataset`` of 1x28x28 images, ``B = 32``, 66
  calls a batch; 0.61-0.93 ms per batch in its windows, 0.32 ms unprofiled in the program (``__next__``'s
  median), 0.20 ms alone against 0.09-0.13 ms with a ``__getitems__`` indexing both tensors at once. The
  upper bound said 0.60 ms less per batch; applied, the run took 1.738 s against 1.736 s.

A dataset whose class an installed library defines (pytorch-forecasting's ``TimeSeriesDataSet``: a pandas row,
encoder normalisation and 62 torch calls per sample) is not the user's to batch. There the advice is to make
the samples once and train from the list, where they are the same every epoch: the same bounds per batch, for
the whole dataset's loading paid once (``len(dataset)`` samples at the window's time per sample: ten epochs'
loading where ``limit_train_batches=0.1`` loads a tenth of it an epoch), so only for a stage that runs more than
one epoch, and the advice says after how many epochs it repays itself. Measured on
pytorch-forecasting 1.8.0's TemporalFusionTransformer (``benchmarks/downstream_libraries.py``'s data, 16
batches of 32 an epoch, 2 CPUs): 25 ms a batch in ``__getitem__``, 3 ms in its collate; the fit with cached
samples reached the same losses in 3.39 s against 3.97 s (4 epochs, median of 6 alternating rounds, faster in
each) and 7.1 s against 10.0 s (10 epochs, 3 rounds): ``benchmarks/forecasting_cached.py``. The prediction was
up to 0.30 s an epoch less, after about 0.35 s once.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_perf.diagnose.loading import CPU_BOUND
from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.rule_helpers import strongest
from lightning_perf.records import TraceSummary
from lightning_perf.units import ms, seconds_or_ms, us

# Per-sample work is named only where batching would save at least this per batch (seconds): below it the
# DataLoader's own per-batch machinery (sampler, fetch, collate: 0.1-0.3 ms on a 2-CPU machine) is of the same
# size, and the saving is noise (our judgment).
MIN_SAVING = 0.2e-3
# What batching saves at least per torch call it removes (seconds): a call's cost beyond its work. Measured on a
# 2-CPU machine, torch 2.13, one thread: a batch of 32 from a two-tensor `TensorDataset` (66 calls) took
# 0.20-0.22 ms sample by sample and 0.09-0.13 ms with a `__getitems__` indexing both tensors at once, 1.5-2 us
# per call removed; tiny operators alone take 1-10 us (a select 3.2 us, a flip 6 us, a multiply 10 us).
CALL_SAVING = 1.5e-6


@dataclass(frozen=True, kw_only=True)
class PerSampleLoading:
    """A window's evidence of per-sample loading, and what batching it is predicted to save.

    Attributes:
        window: The window that shows it (the one with the most DataLoader time per step).
        batch_size: Samples per batch.
        loader_time: The DataLoader's time per batch in that window (seconds).
        calls_per_sample: Top-level torch calls per sample inside the DataLoader.
        saving: Predicted time saved per batch by loading whole batches, at most (seconds).
        least: Predicted time saved per batch, at least: the calls removed at ``CALL_SAVING`` each (seconds).
        dataset_class: The dataset's class, by name (``RunFacts.dataset_class``).
        library: The installed package that defines it; ``None`` for the user's own code.
        dataset_length: ``len(dataset)`` (``RunFacts.dataset_length``); ``None``: unknown.
        epochs: The epochs the stage runs (``RunFacts.epochs``); ``None``: unknown.
    """

    window: TraceSummary
    batch_size: int
    loader_time: float
    calls_per_sample: float
    saving: float
    least: float = 0.0
    dataset_class: str | None = None
    library: str | None = None
    dataset_length: int | None = None
    epochs: int | None = None

    @property
    def per_sample(self) -> float:
        """The DataLoader's time per sample (seconds)."""
        return self.loader_time / self.batch_size


def per_sample_loading(ctx: StageEpoch, steady_wait: float) -> PerSampleLoading | None:
    """The epoch's per-sample loading, when a window shows it, the loading is on the CPU, and batching would
    save at least :data:`MIN_SAVING` per batch, counted in the calls it removes (:data:`CALL_SAVING` each);
    ``steady_wait`` (the epoch's mean wait per batch after the first) caps the saving. For a library's dataset,
    only where the stage runs more than one epoch (making the samples once costs the whole dataset's loading, at
    least one epoch's)."""
    batch_size = _batch_size(ctx)
    on_cpu = ctx.epoch.loading_cpu_share
    if batch_size is None or batch_size < 2 or (on_cpu is not None and on_cpu < CPU_BOUND):
        return None
    if ctx.facts.dataset_library and ctx.facts.epochs == 1:
        return None
    best = strongest(
        (w for w in ctx.windows if w.dataloader_ops_per_step is not None and w.dataloader_time > 0),
        lambda w: w.dataloader_time,
    )
    if best is None:
        return None
    window, loader_time = best
    ops = window.dataloader_ops_per_step or 0.0
    calls = ops / batch_size
    if calls < 1:
        return None
    saving = min(loader_time * (1 - 1 / batch_size), steady_wait)
    least = min((ops - calls) * CALL_SAVING, saving)
    if least < MIN_SAVING:
        return None
    return PerSampleLoading(
        window=window,
        batch_size=batch_size,
        loader_time=loader_time,
        calls_per_sample=calls,
        saving=saving,
        least=least,
        dataset_class=ctx.facts.dataset_class,
        library=ctx.facts.dataset_library,
        dataset_length=ctx.facts.dataset_length,
        epochs=ctx.facts.epochs,
    )


def _batch_size(ctx: StageEpoch) -> int | None:
    """The DataLoader's ``batch_size``, else the epoch's samples per batch."""
    if ctx.facts.batch_size:
        return ctx.facts.batch_size
    epoch = ctx.epoch
    if epoch.samples and epoch.measured_batches > 0:
        return round(epoch.samples / epoch.measured_batches)
    return None


def per_sample_evidence(found: PerSampleLoading) -> str:
    """The measurement, as evidence."""
    return (
        f"in window {found.window.window} the DataLoader takes {ms(found.loader_time)} per batch of"
        f" {found.batch_size}, {us(found.per_sample)} per sample, in {found.calls_per_sample:.1f} torch calls per"
        " sample: the dataset works one sample at a time"
    )


def per_sample_advice(found: PerSampleLoading, batches: float) -> str:
    """The change that removes per-sample work, with its predicted saving over ``batches`` batches."""
    predicted = (
        f"at least {ms(found.least)} and up to {ms(found.saving)} less per batch (up to"
        f" {seconds_or_ms(found.saving * batches)} per epoch)"
    )
    if found.library:
        return (
            f"`{found.dataset_class}` is code of the installed package `{found.library}`: its samples are made"
            " one at a time there, not in code of yours to batch. Where they are the same every epoch (no random"
            " draws or augmentation in `__getitem__`) and fit in memory, make them once and train from the list:"
            " `samples = [dataset[i] for i in range(len(dataset))]` (in `setup`, or before the fit), then"
            " `DataLoader(samples, ...)` with the DataLoader's `batch_size`, `shuffle`, `drop_last` and"
            f" `collate_fn` as before. Predicted: {_once(found, batches)}, then {predicted}. Where they change every"
            " epoch, only the library's own options make a sample cheaper."
        )
    dataset = f"`{found.dataset_class}`" if found.dataset_class else "the dataset"
    return (
        f"Load whole batches instead of single samples: give {dataset} a `__getitems__(self, indices)` that"
        " indexes and transforms all of a batch's samples at once (the DataLoader calls it with the batch's"
        " indices since torch 2.0; pass a `collate_fn` that takes what it returns, e.g. `collate_fn=lambda b: b`"
        " for a ready batch), or keep `__getitem__` to indexing and move the transform onto the whole batch in"
        f" `LightningModule.on_after_batch_transfer`. Predicted: the DataLoader's {ms(found.loader_time)} per batch"
        f" falls toward one sample's {us(found.per_sample)}: {predicted}."
    )


def _once(found: PerSampleLoading, batches: float) -> str:
    """What making every sample once costs: ``len(dataset)`` samples at the window's time per sample (one epoch's
    ``batches`` where the length is unknown), and the epochs that repay it at the most saved per batch."""
    per_epoch = batches * found.batch_size  # the samples an epoch loads
    length = found.dataset_length
    if not length or per_epoch <= 0:
        return f"about one epoch's loading once ({us(found.per_sample)} a sample)"
    once = length * found.per_sample
    whole = (
        f" ({length} samples at {us(found.per_sample)} a sample: the whole dataset,"
        f" {length / per_epoch:.1f}x the {round(per_epoch)} samples an epoch loads)"
        if length > 1.1 * per_epoch
        else f" ({length} samples at {us(found.per_sample)} a sample: about one epoch's loading)"
    )
    saved = found.saving * batches  # per epoch, at the most
    repaid = once / saved if saved > 0 else None
    if repaid is None:
        payback = ""
    elif found.epochs is not None and repaid > found.epochs:
        payback = f"; repaid after about {repaid:.0f} epochs, more than this run's {found.epochs}"
    else:
        payback = f"; repaid after about {max(repaid, 1):.0f} epoch{'s' if repaid >= 1.5 else ''}"
    return f"about {seconds_or_ms(once)} once{whole}{payback}"
