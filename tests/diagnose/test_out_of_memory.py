"""``out_of_memory`` and its cures (lightning_perf.diagnose.out_of_memory), with plain numbers: no trainer."""

from __future__ import annotations

from lightning_perf.diagnose.out_of_memory import memory_cures, out_of_memory_finding
from summaries import ADAM_MEMORY

GIB = 1 << 30

# A 1B-parameter fp32 model with AdamW on an 80 GiB GPU: 4 GiB of parameters, 4 of gradients, 8 of state, 50 of
# activations, 6 reserved but not allocated.
MEMORY = {
    **ADAM_MEMORY,
    "device": "cuda",
    "optimizers": ["AdamW"],
    "activations": 50 * GIB,
    "allocator_overhead": 6 * GIB,
}
FAILURE = {
    "stage": "train",
    "epoch": 2,
    "batch": 17,
    "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.",
    "batch_shapes": [[64, 512], [64]],
    "requested": 20 * GIB,
    "free": 2 * GIB,
}


def test_each_cure_saves_what_the_breakdown_predicts():
    cures = {c.text: c.saving for c in memory_cures(MEMORY, world_size=4, precision="32-true")}
    assert list(cures.values()) == sorted(cures.values(), reverse=True)
    fsdp = next(s for text, s in cures.items() if "FSDPStrategy" in text)
    assert fsdp == 16 * GIB * 3 // 4  # parameters, gradients and state over 4 ranks: 12 GiB
    assert next(s for text, s in cures.items() if "SGD" in text) == 4 * GIB  # Adam's second moment
    assert next(s for text, s in cures.items() if "bf16-true" in text) == 4 * GIB  # half of 4 + 4 GiB fp32
    # Half the activations, less autocast's bf16 copies of the 4 GiB of fp32 weights.
    assert next(s for text, s in cures.items() if "bf16-mixed" in text and "activations" in text) == 23 * GIB
    assert next(s for text, s in cures.items() if "accumulate_grad_batches=2" in text) == 25 * GIB
    assert next(s for text, s in cures.items() if "expandable_segments" in text) == 6 * GIB
    # One device, bf16 already: no sharding, no bf16-mixed; a model with no state and no activations: no cure
    # that shrinks either.
    # Two CPU processes (gloo): Lightning runs FSDP on GPUs only, so no sharding is advised.
    assert not any("FSDP" in text for text, _, _ in memory_cures({**MEMORY, "device": "cpu"}, world_size=2))
    single = memory_cures(MEMORY, world_size=1, precision="bf16-mixed")
    assert not any("FSDP" in text or 'bf16-mixed")`: activations' in text for text, _, _ in single)
    bare = {**MEMORY, "optimizer_state": {"total": 0, "by_entry": {}}, "activations": None, "allocator_overhead": 0}
    assert [text for text, _, _ in memory_cures(bare)] == [next(t for t in cures if "bf16-true" in t)]


def test_the_finding_says_where_and_puts_the_cures_that_fit_first():
    f = out_of_memory_finding(FAILURE, MEMORY, world_size=1, precision="32-true")
    assert (f.id, f.severity, f.stage, f.epoch) == ("out_of_memory", "critical", "train", 2)
    assert f.title == "Training ran out of memory at epoch 2, batch 17"
    assert (
        "the batch's tensors: [64, 512], [64]" in f.evidence and "it needed 18.0 GiB more than was free" in f.evidence
    )
    assert "activations and temporaries 50.0 GiB" in f.evidence
    # 18 GiB short: only the activation cures (25 GiB each) fit; they come first, the others after.
    cures = f.advice.removeprefix("Cures, with their predicted savings: ").split("; ")
    assert [c.endswith("(predicted to fit)") for c in cures[:2]] == [True, True], cures
    assert not any("predicted to fit" in c for c in cures[2:]) and "SGD" in f.advice


def test_without_a_breakdown_the_advice_is_the_general_one():
    f = out_of_memory_finding({**FAILURE, "batch": None, "batch_shapes": []}, None)
    assert f.title == "Training ran out of memory at epoch 2" and "accumulate_grad_batches" in f.advice


def test_checkpointing_names_the_blocks_that_save_the_most():
    memory = {**MEMORY, "blocks": [["encoder.layers.0", 3 * GIB], ["encoder.layers.1", 3 * GIB]]}
    cure = next((text, s) for text, s, _ in memory_cures(memory) if "checkpointing" in text)
    assert cure[0].startswith("activation checkpointing around `encoder.layers.0`, which saves 3.0 GiB a batch")
    assert "and next `encoder.layers.1` (3.0 GiB)" in cure[0] and cure[1] == 3 * GIB
    off_cuda = {**memory, "activations": None}  # the saving is the block's, where activations are not measured
    assert {c.text: c.saving for c in memory_cures(off_cuda)}[cure[0]] == 3 * GIB
