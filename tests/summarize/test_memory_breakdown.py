"""The memory breakdown's arithmetic (lightning_perf.summarize.memory), with plain numbers: the CUDA figures that
cannot be measured on this machine."""

from __future__ import annotations

from lightning_perf.diagnose.out_of_memory import memory_parts
from lightning_perf.records import ModelMemory
from lightning_perf.report.memory import memory_line
from lightning_perf.summarize.memory import memory_report

GIB = 1 << 30


def model(device: str = "cuda") -> ModelMemory:
    # A 1B-parameter model in bf16 with fp32 master weights and Adam's fp32 moments (mixed precision by hand).
    return ModelMemory(
        device=device,
        parameters={"bfloat16": 2 * GIB},
        trainable=2 * GIB,
        frozen=0,
        gradients=2 * GIB,
        optimizer_state={"exp_avg": 4 * GIB, "exp_avg_sq": 4 * GIB},
        master_copies=4 * GIB,
        optimizers=("AdamW",),
    )


def test_activations_overhead_and_outside_the_allocator_from_the_devices_figures():
    memory = memory_report(
        model(),
        epoch=3,
        peak_allocated=30 * GIB,  # 16 GiB held by the model: 14 GiB of activations and temporaries
        peak_reserved=34 * GIB,  # 4 GiB cached but not allocated at the peak
        reserved_now=33 * GIB,
        device_used=35 * GIB,  # 2 GiB beyond the allocator: the CUDA context, NCCL
        device_total=80 * GIB,
    )
    assert memory["activations"] == 14 * GIB and memory["allocator_overhead"] == 4 * GIB
    assert memory["outside_allocator"] == 2 * GIB and memory["free"] == 45 * GIB
    assert memory["optimizer_state"]["total"] == 8 * GIB and memory["master_copies"] == 4 * GIB
    assert [name for name, _ in memory_parts(memory)] == [
        "parameters",
        "gradients",
        "optimizer state",
        "master copies",
        "activations and temporaries",
        "allocator overhead",
        "outside the allocator",
        "free",
    ]
    line = memory_line(memory)
    assert "parameters 2.0 GiB (bfloat16), gradients 2.0 GiB" in line
    assert "optimizer state 8.0 GiB (AdamW: exp_avg 4.0 GiB, exp_avg_sq 4.0 GiB), master copies 4.0 GiB" in line
    assert line.endswith(
        "; activations and temporaries 14.0 GiB, allocator overhead 4.0 GiB, outside the allocator 2.0 GiB,"
        " free 45.0 GiB"
    )


def test_off_cuda_only_the_models_parts_are_given():
    memory = memory_report(model("cpu"), epoch=0)
    assert (memory["activations"], memory["allocator_overhead"], memory["outside_allocator"], memory["free"]) == (
        None,
        None,
        None,
        None,
    )
    assert memory_line(memory).endswith("; activations are measured on CUDA only (the parameters are on cpu)")
    # A peak below what the model holds (its gradients freed when the peak was read) is no negative activation.
    assert memory_report(model(), epoch=0, peak_allocated=GIB)["activations"] == 0


def test_the_largest_live_allocations_are_named_by_the_users_call_site():
    from lightning_perf.summarize.memory import largest_allocations

    user = {"filename": "/home/me/train.py", "line": 42, "name": "forward"}
    torch_frame = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125}
    snapshot = {
        "segments": [
            {
                "blocks": [
                    {"state": "active_allocated", "size": 3 * GIB, "frames": [torch_frame, user]},
                    {"state": "active_allocated", "size": GIB, "frames": [user]},
                    {"state": "inactive", "size": 8 * GIB, "frames": [user]},  # cached, not live
                    {"state": "active_allocated", "size": 2 * GIB, "frames": [torch_frame]},  # torch's own
                ]
            }
        ]
    }
    assert largest_allocations(snapshot) == [
        ["/home/me/train.py:42 in forward", 4 * GIB],
        ["/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:125 in None", 2 * GIB],
    ]
