"""
What fills memory
=================

The run's memory breakdown (``run.memory`` in ``perf_report.json``) from what the model holds
(:class:`~lightning_perf.records.ModelMemory`) and, on CUDA, the allocator's and the device's figures: plain
arithmetic, tested with plain numbers.

- **activations and temporaries**: the training epoch's peak allocated less what the model holds (on CUDA, where
  the peak is measured; the model's parts are counted whole, though gradients are freed between steps under
  ``zero_grad(set_to_none=True)``: at the backward's peak, where the activations meet the gradients, they are
  all there); off CUDA, the most a step's forward allocated in a training window with ``profile_memory=True``
  (:attr:`~lightning_perf.records.TraceSummary.cpu_forward_peak`: activations and the forward's temporaries);
- **allocator overhead**: reserved less allocated at the peak (the caching allocator's fragmentation and cache);
- **outside the allocator**: what the device has in use less what the allocator reserved (the CUDA context,
  NCCL buffers, other processes), from ``torch.cuda.mem_get_info``;
- **free**: the device's size less what it has in use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_perf.records import ModelMemory
from lightning_perf.validation import is_int


def memory_report(
    model: ModelMemory,
    *,
    epoch: int,
    peak_allocated: int | None = None,
    peak_reserved: int | None = None,
    reserved_now: int | None = None,
    device_used: int | None = None,
    device_total: int | None = None,
    blocks: Sequence[tuple[str, int]] = (),
    saved: int | None = None,
    forward_peak: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """``run.memory``: the model's parts, and where the device's figures are given, the rest.

    Args:
        model: What the model holds.
        epoch: The training epoch it was counted at.
        peak_allocated, peak_reserved: The epoch's CUDA allocator peaks (``None`` off CUDA).
        reserved_now, device_used, device_total: The allocator's reserved bytes, the device's bytes in use and its
            size, read together (``None`` off CUDA).
        blocks: The blocks that save the most for the backward, ``(name, bytes a batch)``
            (:class:`~lightning_perf.collect.activations.SavedSizes`): the modules to checkpoint.
        saved: The bytes the FLOP-counted batch saved for the backward in all: its activations, on any device
            (the temporaries and the allocator's share are CUDA's ``activations`` only).
        forward_peak: ``(bytes, window)``: the training windows' largest
            :attr:`~lightning_perf.records.TraceSummary.cpu_forward_peak` and the window it is from: the activations
            and temporaries off CUDA (``profile_memory=True``).
    """
    on_device = model.device == "cuda"
    activations = overhead = outside = free = None
    window = None
    if on_device and peak_allocated is not None:
        activations = max(peak_allocated - model.held, 0)
        if peak_reserved is not None:
            overhead = max(peak_reserved - peak_allocated, 0)
    elif not on_device and forward_peak is not None:
        activations, window = forward_peak
    if device_used is not None and device_total is not None:
        free = max(device_total - device_used, 0)
        if reserved_now is not None:
            outside = max(device_used - reserved_now, 0)
    return {
        "epoch": epoch,
        "device": model.device,
        "parameters": {
            "total": model.trainable + model.frozen,
            "trainable": model.trainable,
            "frozen": model.frozen,
            "by_dtype": dict(model.parameters),
        },
        "gradients": model.gradients,
        "optimizer_state": {"total": sum(model.optimizer_state.values()), "by_entry": dict(model.optimizer_state)},
        "master_copies": model.master_copies,
        "optimizers": list(model.optimizers),
        "activations": activations,
        "activations_window": window,
        "allocator_overhead": overhead,
        "outside_allocator": outside,
        "device_total": device_total,
        "free": free,
        "blocks": [[name, nbytes] for name, nbytes in blocks],
        "activations_saved": saved,
    }


def checked_memory(memory: Any) -> Mapping[str, Any] | None:
    """``memory`` where it has ``run.memory``'s shape (:func:`memory_report`: what the readers and the rules
    index), else ``None``: a report written before it was, or of another shape."""
    if not isinstance(memory, Mapping):
        return None
    parts = (memory.get("parameters"), memory.get("optimizer_state"))
    if not all(isinstance(part, Mapping) and is_int(part.get("total")) for part in parts):
        return None
    if not is_int(memory.get("gradients")) or not isinstance(memory.get("optimizers"), list):
        return None
    return memory


# Frames of these libraries are not a call site of the user's: an allocation is named by the first other frame.
LIBRARY_FRAMES = ("/torch/", "/lightning/", "/pytorch_lightning/", "/lightning_fabric/", "/lightning_perf/")


def largest_allocations(snapshot: Mapping[str, Any], top: int = 5) -> list[list[Any]]:
    """The live allocations of a CUDA allocator snapshot (``torch.cuda.memory._snapshot()``: segments of blocks,
    each with its state, size and the Python frames that allocated it), added up by call site: the innermost frame
    outside torch and Lightning, ``"file:line in function"``; ``[[site, bytes], ...]``, largest first."""
    sites: dict[str, int] = {}
    for segment in snapshot.get("segments") or ():
        for block in segment.get("blocks") or ():
            if block.get("state") != "active_allocated":
                continue
            frames = block.get("frames") or ()
            own = next(
                (f for f in frames if not any(lib in str(f.get("filename", "")) for lib in LIBRARY_FRAMES)), None
            )
            where = frames[0] if own is None and frames else own
            site = f"{where.get('filename')}:{where.get('line')} in {where.get('name')}" if where else "unknown"
            sites[site] = sites.get(site, 0) + int(block.get("size") or 0)
    return [[site, size] for site, size in sorted(sites.items(), key=lambda item: -item[1])[:top]]
