"""The memory breakdown's arithmetic (lightning_perf.summarize.memory), with plain numbers: the CUDA figures that
cannot be measured on this machine."""

from __future__ import annotations

import json
import tempfile

from lightning_perf.diagnose.out_of_memory import memory_parts
from lightning_perf.records import ModelMemory
from lightning_perf.report.memory import memory_line
from lightning_perf.summarize.memory import memory_report
from lightning_perf.summarize.step_summary import summarize_trace

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
    assert memory_line(memory).endswith(
        "; activations are measured on CUDA, or in a training window with profile_memory=True (the parameters are on"
        " cpu)"
    )
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


# ------------------------------------------------------------------ the CPU forward peak of profile_memory=True


def _memory(ts, change, total, device_type=0, tid=1):
    args = {"Device Type": device_type, "Bytes": change, "Total Allocated": total}
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts, "args": args}


def _step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def _backward_node(ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: AddmmBackward0", "pid": 1,
            "tid": 2, "ts": ts, "dur": dur}  # fmt: skip


def test_a_steps_cpu_forward_peak_is_its_largest_rise_before_its_backward():
    events = [
        _step(1, 0, 100),
        _step(2, 100, 100),
        # Step 1 starts at 1000 B: +500 +300 in its forward; its backward frees 800 and allocates 900.
        _memory(10, 500, 1500),
        _memory(20, 300, 1800),
        _memory(30, 10**9, 10**9, device_type=1),  # CUDA's: another allocator
        _backward_node(35, 20),
        _memory(40, -800, 1000, tid=2),
        _memory(50, 900, 1900, tid=2),  # the backward's: left out
        # Step 2 frees 600 first (gradients set to None before the forward), then allocates 1000.
        _memory(110, -600, 1300),
        _memory(120, 1000, 2300),
        _backward_node(135, 20),
        _memory(140, 10**6, 10**6 + 2300, tid=2),
        _memory(250, 10**6, 10**6 + 2300),  # after the steps
    ]
    summary = summarize_trace({"traceEvents": events}, window="w")
    # Step 1: 1800 - 1000 = 800; step 2: 2300 - 1300 = 1000 (not above the 1900 it began at: 400).
    assert summary.cpu_forward_peak == 1000
    without = [e for e in events if e.get("name") != "[memory]" or e["args"]["Device Type"] != 0]
    assert summarize_trace({"traceEvents": without}, window="w").cpu_forward_peak is None


def test_a_real_profiles_cpu_forward_peak_holds_the_activations_but_not_the_new_gradients():
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
    x = torch.randn(256, 64)

    def step():
        output = model(x)
        model.zero_grad(set_to_none=True)  # as Lightning's closure does: after the forward, before the backward
        output.square().mean().backward()

    step()  # gradients from before the profile: their free is not in it
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(2):
            step()
            prof.step()
    trace = json.loads(_export(prof))
    peak = summarize_trace(trace, window="w").cpu_forward_peak
    # The Linear's and the ReLU's outputs of 256 x 1024 floats (1 MiB each) are alive together in the forward;
    # not the gradients (260 KiB), nor the backward's temporaries.
    hidden = 256 * 1024 * 4
    assert 2 * hidden <= peak <= 2 * hidden + 4 * 1024, peak  # and the 1 KiB outputs of the last Linear, square


def _export(prof) -> str:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return open(f.name, encoding="utf-8").read()
