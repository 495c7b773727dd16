"""What an out-of-memory error tells (lightning_perf.collect.oom): its kind, through causes; the batch of the step
that raised it, from the traceback; the sizes in CUDA's message."""

from __future__ import annotations

import torch

from lightning_perf.collect.oom import batch_shapes, failed_batch, is_out_of_memory, message_sizes


def training_step(batch, batch_idx):
    raise torch.OutOfMemoryError("CPU ran out")


def test_out_of_memory_errors_are_told_from_others_through_their_causes():
    assert is_out_of_memory(torch.OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: out of memory"))
    assert not is_out_of_memory(ValueError("out of range")) and not is_out_of_memory(RuntimeError("shape mismatch"))
    wrapped = ValueError("wrapped")
    wrapped.__cause__ = torch.OutOfMemoryError("deep")  # `raise ValueError(...) from err`
    assert is_out_of_memory(wrapped)


def test_the_failing_steps_batch_is_read_from_the_traceback():
    batch = {"input_ids": torch.zeros(4, 16, dtype=torch.long), "labels": torch.zeros(4)}

    def loop(batch):  # a frame of Lightning's between the caller and the step
        training_step(batch["input_ids"], 0)

    try:
        loop(batch)
    except torch.OutOfMemoryError as err:
        found = failed_batch(err)
    assert found is batch["input_ids"]  # the step's own argument, not the loop's
    assert batch_shapes(found) == [[4, 16]] and batch_shapes(None) == []


def test_cudas_message_gives_what_was_asked_and_what_was_free():
    message = (
        "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.25 GiB"
        " is free. Including non-PyTorch memory, this process has 77.89 GiB memory in use."
    )
    assert message_sizes(message) == (int(2.5 * 2**30), int(1.25 * 2**30))
    assert message_sizes("DefaultCPUAllocator: out of memory") == (None, None)
