"""
Out of memory
=============

``out_of_memory``: the run died of an out-of-memory error. The finding says where (stage, epoch, batch, the
batch's shapes), what memory held (``run.memory``'s breakdown at the failure), and the cures that shrink the part
that dominates, each with its predicted saving in bytes, from the breakdown alone:

- **optimizer state**: on several GPUs, ``FSDPStrategy`` shards parameters, gradients and optimizer state
  over the ranks (saves ``(1 - 1/N)`` of them; Lightning refuses FSDP and DeepSpeed on CPUs, so CPU runs are not
  told to); Adam's two moments become one with SGD and momentum (saves the
  second moment, ``exp_avg_sq``);
- **fp32 parameters and gradients**: ``precision="bf16-true"`` halves them (``"bf16-mixed"`` does not: it keeps
  fp32 weights and casts per op);
- **activations** (measured on CUDA): ``precision="bf16-mixed"`` from fp32 about halves them, as does half the
  batch with ``accumulate_grad_batches=2`` (the same effective batch); activation checkpointing around the block
  that saves the most for the backward (``run.memory.blocks``, counted on the FLOP-counted batch, on any device)
  frees about that, less its input, trading a second forward through it;
- **allocator overhead** (reserved but not allocated): ``expandable_segments`` returns up to all of it.

Where the error says how much it tried to allocate and how much was free (CUDA's message does), a cure whose
saving covers the difference is predicted to fit and comes first. Pure: plain mappings in, a finding out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.rule_helpers import FP32_PRECISIONS, accumulation, stage_name
from lightning_perf.units import signed_size

# The error's message in the evidence, at most this many characters (CUDA's runs to several lines).
MESSAGE_CHARS = 300


class Cure(NamedTuple):
    """A change that shrinks memory: what to do, its predicted saving in bytes, and the parts of the breakdown it
    shrinks (:func:`memory_parts`' names)."""

    text: str
    saving: int
    shrinks: tuple[str, ...]


_ACTIVATIONS = ("activations and temporaries", "activations saved for the backward")
# Where ``run.memory`` has no activations and temporaries: where they are measured.
ACTIVATIONS_UNMEASURED = "activations are measured on CUDA, or in a training window with profile_memory=True"


def memory_parts(memory: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The breakdown's parts in the order they stack, those with bytes only: parameters, gradients, optimizer
    state, master copies, activations (CUDA's peak less the rest, else what the counted batch saved for the
    backward), allocator overhead, outside the allocator, free."""
    activations = memory.get("activations")
    parts = [
        ("parameters", memory["parameters"]["total"]),
        ("gradients", memory["gradients"]),
        ("optimizer state", memory["optimizer_state"]["total"]),
        ("master copies", memory.get("master_copies")),
        ("activations and temporaries", activations),
        ("activations saved for the backward", None if activations else memory.get("activations_saved")),
        ("allocator overhead", memory.get("allocator_overhead")),
        ("outside the allocator", memory.get("outside_allocator")),
        ("free", memory.get("free")),
    ]
    return [(name, value) for name, value in parts if value]


def memory_cures(
    memory: Mapping[str, Any], *, world_size: int = 1, precision: str | None = None, manual: bool | None = None
) -> list[Cure]:
    """The cures for what ``memory`` (``run.memory``) holds, each with its predicted saving in bytes, largest
    first; none where nothing would shrink. ``manual``: the module optimizes manually (how it accumulates)."""
    params, grads = memory["parameters"], memory["gradients"]
    state = memory["optimizer_state"]
    held = params["total"] + grads + state["total"] + memory.get("master_copies", 0)
    cures: list[Cure] = []
    if world_size > 1 and held and memory.get("device") == "cuda":  # Lightning's FSDP and DeepSpeed need GPUs
        cures.append(
            Cure(
                f"shard parameters, gradients and optimizer state over the {world_size} ranks with"
                " `Trainer(strategy=FSDPStrategy(...))` (or `DeepSpeedStrategy(stage=2)` for gradients and state)",
                held * (world_size - 1) // world_size,
                ("parameters", "gradients", "optimizer state", "master copies"),
            )
        )
    second = state["by_entry"].get("exp_avg_sq", 0)
    if second:
        cures.append(
            Cure(
                "an optimizer with one state buffer per parameter instead of Adam's two"
                " (`torch.optim.SGD(..., momentum=0.9)`)",
                second,
                ("optimizer state",),
            )
        )
    fp32 = params["by_dtype"].get("float32", 0)
    if fp32 and params["total"]:
        share = fp32 / params["total"]
        cures.append(
            Cure(
                '`Trainer(precision="bf16-true")`: bf16 parameters and gradients (`"bf16-mixed"` keeps fp32 weights)',
                int((fp32 + grads * share) / 2),
                ("parameters", "gradients"),
            )
        )
    activations = memory.get("activations") or memory.get("activations_saved")
    if activations:
        if precision is None or precision in FP32_PRECISIONS:
            # Autocast keeps a bf16 copy of each fp32 weight its matmuls use until the backward: at most half the
            # fp32 parameters' bytes, taken off (applied on CPU: 1.95 MB saved where this predicts 1.91 MB).
            cures.append(
                Cure(
                    '`Trainer(precision="bf16-mixed")`: activations in bf16, less the bf16 copies of the weights',
                    activations // 2 - fp32 // 2,
                    _ACTIVATIONS,
                )
            )
        cures.append(
            Cure(
                f"half the `batch_size` with {accumulation(2, manual=manual)} (the same effective batch)",
                activations // 2,
                _ACTIVATIONS,
            )
        )
    blocks = [(str(name), int(nbytes)) for name, nbytes in memory.get("blocks") or ()]
    if blocks:
        name, inside = blocks[0]
        others = ", ".join(f"`{n}` ({signed_size(b)})" for n, b in blocks[1:])
        cures.append(
            Cure(
                f"activation checkpointing around `{name}`, which saves {signed_size(inside)} a batch for the backward"
                + (f", and next {others}" if others else "")
                + " (`torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False)` in place of `module(x)`"
                " in `forward`)",
                min(inside, activations) if activations else inside,
                _ACTIVATIONS,
            )
        )
    overhead = memory.get("allocator_overhead")
    if overhead:
        cures.append(
            Cure(
                "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the environment (fragmentation)",
                overhead,
                ("allocator overhead",),
            )
        )
    return sorted((cure for cure in cures if cure.saving > 0), key=lambda cure: -cure.saving)


def out_of_memory_finding(
    failure: Mapping[str, Any],
    memory: Mapping[str, Any] | None,
    *,
    world_size: int = 1,
    precision: str | None = None,
    manual: bool | None = None,
) -> Finding:
    """The ``out_of_memory`` finding (critical) for a failure record (``run.out_of_memory``: ``stage``, ``epoch``,
    ``batch``, ``error``, ``batch_shapes``, ``requested`` and ``free`` where the message says) and the memory
    breakdown at the failure (``None`` where none was counted)."""
    stage, epoch, batch = failure["stage"], failure["epoch"], failure.get("batch")
    where = f"epoch {epoch}" + (f", batch {batch}" if batch is not None else "")
    evidence = [f"{failure['error'][:MESSAGE_CHARS]}"]
    if failure.get("batch_shapes"):
        evidence.append("the batch's tensors: " + ", ".join(f"{list(shape)}" for shape in failure["batch_shapes"]))
    advice: list[str] = []
    if memory is not None:
        evidence.append(
            f"memory held: parameters {signed_size(memory['parameters']['total'])}, gradients"
            f" {signed_size(memory['gradients'])}, optimizer state {signed_size(memory['optimizer_state']['total'])}"
            + (
                f", activations and temporaries {signed_size(memory['activations'])}"
                if memory.get("activations") is not None
                else f" ({ACTIVATIONS_UNMEASURED})"
            )
        )
        short = _shortfall(failure)
        cures = memory_cures(memory, world_size=world_size, precision=precision, manual=manual)
        fits = [cure for cure in cures if short is not None and cure.saving >= short]
        ordered = fits + [cure for cure in cures if cure not in fits]
        if ordered:
            advice.append(
                "Cures, with their predicted savings: "
                + "; ".join(
                    f"{cure.text}: about {signed_size(cure.saving)}{' (predicted to fit)' if cure in fits else ''}"
                    for cure in ordered
                )
                + "."
            )
        if short is not None:
            evidence.append(f"it needed {signed_size(short)} more than was free")
    if not advice:
        advice.append(
            f"Shrink what the step holds: a smaller `batch_size` with {accumulation('N', manual=manual)},"
            ' `Trainer(precision="bf16-mixed")`, or activation checkpointing around the largest blocks.'
        )
    return Finding(
        id="out_of_memory",
        severity="critical",
        title=f"{stage_name(stage)} ran out of memory at {where}",
        evidence="; ".join(evidence),
        advice=" ".join(advice),
        stage=stage,
        epoch=epoch,
    )


def _shortfall(failure: Mapping[str, Any]) -> int | None:
    requested, free = failure.get("requested"), failure.get("free")
    if requested is None or free is None:
        return None
    return max(requested - free, 0)
