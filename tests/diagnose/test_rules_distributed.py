"""``communication_bound``, ``rank_straggler``, ``small_collectives``, ``low_bus_bandwidth`` and ``fsdp_all_gathers``
on hand-built summaries and a real two-rank A100 trace (lightning_perf.diagnose.rules_distributed)."""

import dataclasses

import pytest
from contexts import DDP2, ctx, cw, facts, fsdp, gpu_ctx, gpu_window, gw, run, scalar_reduces, slow_reduce

from lightning_perf.diagnose.links import INFINIBAND, node_link
from lightning_perf.diagnose.registry import diagnose
from lightning_perf.diagnosis_context import trace_context
from lightning_perf.readers import load_trace
from lightning_perf.summarize import step_summary
from lightning_perf.summarize.collectives import collective_stats
from summaries import ADAM_MEMORY, GPU, W1, W2, epoch

# --- communication_bound and rank_straggler -------------------------------------------------------------------


def test_communication_bound_names_the_window_and_ddp_settings():
    comm = dict(step_time=1.0, device_busy=0.9, communication_time=0.4)
    context = gpu_ctx(
        None,
        gpu_window(W1, communication_exposed_time=0.2, **comm),
        gpu_window(W2, communication_exposed_time=0.3, **comm),
        facts=facts(GPU, world_size=8),
    )
    f = run("communication_bound", context)
    assert f.window == W2 and "30% of the step" in f.evidence
    assert "(warning >= 15% and >= 0.50 ms per step)" in f.evidence
    for pattern in ("gradient_as_bucket_view=True", "bucket_cap_mb", "static_graph=True", "accumulate_grad_batches"):
        assert pattern in f.advice
    assert "NCCL_DEBUG" in f.advice


def gradient_sync(**kw) -> str:
    """communication_bound's advice on two CPU ranks whose steps spend 30% in the gradients' all-reduce."""
    window = cw(W1, communication_time=0.3, communication_exposed_time=0.3)
    return run("communication_bound", ctx(None, window, facts=facts(world_size=2, **kw))).advice


def trainable(nbytes: int) -> dict:
    """run.memory of a model with ``nbytes`` of trainable parameters, whose gradients were unset when counted (0 B:
    Lightning's PPO example, which optimizes manually, read so)."""
    parameters = {**ADAM_MEMORY["parameters"], "total": nbytes, "trainable": nbytes}
    return {**ADAM_MEMORY, "parameters": parameters, "gradients": 0}


def test_gradient_sync_advice_leads_with_fewer_syncs_and_overlaps_only_large_gradients():
    # Lightning's transformer example, 47 MB of gradients: fewer syncs first, then DDP's buckets.
    large = gradient_sync(memory=trainable(47 * 2**20))
    assert large.startswith("Sync gradients less often: `Trainer(accumulate_grad_batches=N)`")
    assert "`DDPStrategy(gradient_as_bucket_view=True, static_graph=True)`" in large
    # BoringModel's 264 B: the all-reduce is its latency, which no bucket setting shortens (measured: no gain).
    small = gradient_sync(memory=trainable(264))
    assert "The gradients are 264 B in all (as the trainable parameters)" in small and "DDPStrategy(" not in small


def test_a_module_that_optimizes_manually_is_advised_nothing_lightning_refuses_or_that_breaks_its_graph():
    # Lightning's PPO example (manual optimization, two optimizers): `static_graph=True` failed with "training graph
    # has changed", `Trainer(accumulate_grad_batches=2)` with a MisconfigurationException.
    advice = gradient_sync(manual_optimization=True, memory=trainable(47 * 2**20))
    assert "Trainer(accumulate_grad_batches" not in advice.replace("refuses `Trainer(accumulate_grad_batches)`", "")
    assert "self.trainer.strategy.block_backward_sync()" in advice
    assert "static_graph=True)" not in advice and "gradient_as_bucket_view=True)" in advice


def test_communication_in_a_trace_counts_without_world_size():
    w = cw(communication_time=0.3, communication_exposed_time=0.3)
    f = run("communication_bound", ctx(None, w))
    assert f is not None and "gloo" in f.advice


def test_small_collectives_counts_the_small_ones_a_step_and_advises_logging_once_per_epoch():
    # 12 scalar all-reduces and 6 barriers a step on gloo (Lightning's sync_dist=True on every step), beside
    # one 25 MiB gradient bucket that is no small collective.
    bucket = dataclasses.replace(scalar_reduces(1, 0.02, nbytes=25 * 2**20), kind="allreduce", on_device=False)
    barriers = dataclasses.replace(scalar_reduces(6, 0.003), kind="barrier")
    step = cw(step_time=0.1)
    context = ctx(
        None, step, facts=facts(world_size=2), collectives={W1: (scalar_reduces(12, 0.006), barriers, bucket)}
    )
    f = run("small_collectives", context)
    assert f.title == "Training runs 18 small collectives a step" and f.window == W1
    assert "18 small collectives a step (12 all_reduce, 6 barrier), 9% of the 100.00 ms step" in f.evidence
    assert "gloo records none" in f.evidence
    assert "on_step=False, on_epoch=True" in f.advice and "sync_dist" in f.advice and "`training_step`" in f.advice
    # Fewer than 8 a step, or too little of the step: nothing.
    assert run("small_collectives", ctx(None, step, collectives={W1: (scalar_reduces(7, 0.007),)})) is None
    assert run("small_collectives", ctx(None, step, collectives={W1: (scalar_reduces(12, 0.004),)})) is None
    # With sizes (NCCL): small by their bytes, not their time.
    sized = {W1: (scalar_reduces(10, 0.01, nbytes=4),)}
    assert "the largest mean message 4 B" in run("small_collectives", ctx(None, step, collectives=sized)).evidence
    large = {W1: (scalar_reduces(10, 0.01, nbytes=2**20),)}
    assert run("small_collectives", ctx(None, step, collectives=large)) is None


def test_rank_straggler_names_the_slow_rank():
    f = run("rank_straggler", ctx(facts=facts(world_size=4), rank_step_times={0: 0.010, 1: 0.011, 2: 0.010, 3: 0.020}))
    assert f.title == "Rank 3 is 1.90x slower than the median rank"
    assert (
        "rank 3's own work per step (its median step less its wait in collectives) 20.00 ms is 1.90x the median"
        " over 4 ranks (10.50 ms" in f.evidence
    )
    assert "(warning >= 1.2x, and >= 10% of the" in f.evidence
    assert "rank 3" in f.advice and "rank_zero_only" not in f.advice
    zero = run("rank_straggler", ctx(facts=facts(world_size=2), rank_step_times={0: 0.03, 1: 0.01}))
    assert zero.title.startswith("Rank 0") and "rank_zero_only" in zero.advice


def test_time_in_collectives_is_told_a_wait_for_a_late_rank_or_the_transfer_itself():
    waiting = ctx(facts=facts(world_size=4), rank_step_times={0: 0.010, 1: 0.011, 2: 0.010, 3: 0.020},
                  rank_waits={0: 0.45, 1: 0.40, 2: 0.44, 3: 0.05})  # fmt: skip
    f = run("rank_straggler", waiting)
    assert (
        "a wait, not the transfer: the ranks spend 5%-45% of their step in collectives, rank 3 the least: the"
        " others arrive earlier and wait for it" in f.evidence
    )
    window = cw(communication_time=0.4, communication_exposed_time=0.4)
    same = {0: 0.40, 1: 0.38, 2: 0.41, 3: 0.39}
    f = run("communication_bound", ctx(None, window, facts=facts(world_size=4), rank_waits=same))
    assert "the transfer itself, not a wait: every rank spends 38%-41% of its step in collectives" in f.evidence
    assert "waiting for a late rank" not in f.advice
    late = {0: 0.40, 1: 0.38, 2: 0.41, 3: 0.10}
    f = run("communication_bound", ctx(None, window, facts=facts(world_size=4), rank_waits=late))
    assert "rank 3 the least" in f.evidence and f.advice.startswith("Most of it is waiting for a late rank")
    # From windows of one step each, the spread is that step's order of arrival: no rank is called late.
    one_step = cw(communication_time=0.4, communication_exposed_time=0.4, steps=1)
    f = run("communication_bound", ctx(None, one_step, facts=facts(world_size=4), rank_waits=late))
    assert "in windows of one step: that step's order of arrival, too little to call a rank late" in f.evidence
    assert "waiting for a late rank" not in f.advice and "rank 3 the least" not in f.evidence
    # rank_straggler judges every batch and still fires; its evidence line says the same of the one-step windows.
    f = run("rank_straggler", dataclasses.replace(waiting, windows=(one_step,)))
    assert f is not None and "in windows of one step" in f.evidence and "rank 3 the least" not in f.evidence
    alone = run("communication_bound", ctx(None, window, facts=facts(world_size=2)))
    assert "a wait" not in alone.evidence and "the transfer itself" not in alone.evidence  # ranks unknown


def test_a_late_rank_zero_leaves_the_others_waiting_in_collectives():
    """Rank zero, whose windows the rules read, is the late rank: its own share is low, the other's is the wait."""
    window = cw(step_time=0.02, communication_time=0.0028, communication_exposed_time=0.0028)
    context = ctx(None, window, facts=facts(world_size=2), rank_waits={0: 0.14, 1: 0.91})
    f = run("communication_bound", context)
    assert f.evidence.startswith(
        "rank 1 spends 91% of its step in collectives with no compute overlapping it (about 18.20 ms of the 20.00 ms"
    )
    assert "rank 0 14%) (warning >= 15% and >= 0.50 ms per step)" in f.evidence
    assert "rank 0 the least" in f.evidence and f.advice.startswith("Most of it is waiting for a late rank")
    # Rank zero's own window over the limit: judged on it, the others' wait in the evidence.
    over = cw(step_time=0.02, communication_time=0.004, communication_exposed_time=0.004)
    f = run("communication_bound", ctx(None, over, facts=facts(world_size=2), rank_waits={0: 0.2, 1: 0.91}))
    assert f.title == "Training waits on communication 20% of each step" and "20%-91%" in f.evidence
    # Every rank under the limit, or rank zero's share unknown: nothing.
    for waits in ({0: 0.1, 1: 0.12}, {1: 0.9}):
        assert run("communication_bound", ctx(None, window, facts=facts(world_size=2), rank_waits=waits)) is None


@pytest.mark.parametrize(
    ("name", "link"),
    [
        ("NVIDIA A100-SXM4-80GB", "NVLink 3"),
        ("NVIDIA A100-PG509-200", "NVLink 3"),  # HGX's SXM4 board, as HTA's 2-rank trace names it
        ("NVIDIA A100-PCIE-40GB", "PCIe 4.0 x16"),
        ("NVIDIA H100 80GB HBM3", "NVLink 4"),
        ("NVIDIA H100 PCIe", "PCIe 5.0 x16"),
        ("NVIDIA H200", "NVLink 4"),
        ("Tesla V100-SXM2-32GB", "NVLink 2"),
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),
    ],
)
def test_the_link_table_names_a_nodes_link_by_its_gpu(name, link):
    found = node_link(name)
    assert (found.name if found else None) == link


def test_infiniband_rates_are_per_port_and_direction():
    assert {name: link.bandwidth for name, link in INFINIBAND.items()} == {
        "EDR": 12.5e9, "HDR": 25e9, "NDR": 50e9, "XDR": 100e9,
    }  # fmt: skip


def test_low_bus_bandwidth_judges_large_collectives_against_the_nodes_link():
    a100 = facts(GPU, world_size=2, device_name="NVIDIA A100-SXM4-80GB")
    slow = {W1: (slow_reduce(20 * 2**20, 6.56e9),)}
    f = run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=a100, collectives=slow))
    assert f.title == "Training's allreduce runs at 2% of NVLink 3's bandwidth" and f.window == W1
    assert (
        "allreduce (default_pg, 2 ranks): 20.0 MiB a call at a bus bandwidth of 6.56 GB/s, 2% of NVLink 3's 300 GB/s"
        " per direction" in f.evidence
    )
    assert "NCCL_DEBUG=INFO" in f.advice and "late rank" in f.advice
    fast = {W1: (slow_reduce(20 * 2**20, 200e9),)}
    assert run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=a100, collectives=fast)) is None
    small = {W1: (slow_reduce(2**20, 1e9),)}  # latency-bound: not judged
    assert run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=a100, collectives=small)) is None
    # Several nodes: the network's rate, which no trace names, must be given.
    nodes = facts(a100, num_nodes=2, world_size=16)
    assert run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=nodes, collectives=slow)) is None
    given = run("low_bus_bandwidth", gpu_ctx(None, gw(), facts=nodes, collectives=slow), link_bandwidth=100e9)
    assert given.title == "Training's allreduce runs at 6% of the link's bandwidth"
    assert "6% of the link's 100 GB/s per direction" in given.evidence


def test_low_bus_bandwidth_on_the_real_two_rank_a100_trace(gpu_trace):
    path = gpu_trace("a100_nccl_2rank_rank0.json.gz")
    trace = load_trace(path)
    summary = step_summary.summarize_trace(trace, window="w")
    context = trace_context(summary, {}, collectives=collective_stats(trace))
    (f,) = [f for f in diagnose(context) if f.id == "low_bus_bandwidth"]
    assert "19.5 MiB a call at a bus bandwidth of 6.56 GB/s, 2% of NVLink 3's 300 GB/s" in f.evidence


def test_fsdp_all_gathers_in_the_open_get_prefetching_and_wrapping_advice():
    f = run("fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives={W1: fsdp(exposed=0.3)}))
    assert f.title == "Training waits for FSDP's all-gathers 30% of each step" and f.window == W1
    assert "FSDP's pattern: 24 all-gathers and 12 reduce-scatters a step" in f.evidence
    assert "64.0 MiB an all-gather on average" in f.evidence
    assert "forward_prefetch=True" in f.advice and "BackwardPrefetch.BACKWARD_PRE" in f.advice
    assert "limit_all_gathers=True" in f.advice and "SHARD_GRAD_OP" in f.advice
    assert "auto_wrap_policy" not in f.advice  # 64 MiB units are not small
    small = run(
        "fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives={W1: fsdp(exposed=0.3, gather_bytes=2**16)})
    )
    assert "auto_wrap_policy={YourBlock}" in small.advice
    # Hidden all-gathers, or DDP's all-reduces alone: nothing.
    assert run("fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives={W1: fsdp(exposed=0.05)})) is None
    ddp = {W1: (slow_reduce(32 * 2**20, 1e9),)}
    assert run("fsdp_all_gathers", gpu_ctx(None, gw(), facts=DDP2, collectives=ddp)) is None


def test_rank_straggler_ignores_an_excess_too_small_to_cost_the_step():
    # 1.25x the median, but 2 ms of a 40 ms step: the ranks' own work is a small residual beside communication.
    quiet = ctx(epoch(step_time_p50=0.040), facts=facts(world_size=2), rank_step_times={0: 0.008, 1: 0.012})
    assert run("rank_straggler", quiet) is None
    costly = ctx(epoch(step_time_p50=0.012), facts=facts(world_size=2), rank_step_times={0: 0.008, 1: 0.012})
    assert run("rank_straggler", costly).title.startswith("Rank 1")
    assert run("rank_straggler", quiet, rank_straggler_cost=0.04) is not None


def test_rank_straggler_is_about_training_steps_only():
    validation = ctx(epoch(stage="validate"), facts=facts(world_size=2), rank_step_times={0: 0.01, 1: 0.03})
    assert run("rank_straggler", validation) is None


def test_rank_straggler_needs_several_ranks():
    assert run("rank_straggler", ctx(rank_step_times={0: 0.05})) is None
    assert run("rank_straggler", ctx(rank_step_times=None)) is None
