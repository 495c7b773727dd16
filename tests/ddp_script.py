"""A real two-process run for tests/callback/test_distributed.py: ``python ddp_script.py ROOT STRATEGY SCENARIO``.

Scenarios: ``plain``; ``straggler`` (rank 1 sleeps 20 ms every step); ``communication`` (large parameters,
tiny compute: the gradient all-reduce dominates); ``sync_every_step`` (12 values logged with ``sync_dist=True``
every step) and ``sync_every_epoch`` (the same, reduced once per epoch); ``raises`` (rank 1 raises in its third
step); ``multinode`` (``num_nodes=2``: the script forks all 4 processes and sets ``NODE_RANK`` and ``LOCAL_RANK``
in each, as a cluster's launcher would); ``raises_late`` (rank 1 raises at its first epoch end, after
PerfCallback's hook, while rank zero waits in the reduction its progress bar started); ``orders`` (a metric
logged with ``sync_dist=True, prog_bar=True``, and a progress bar, a checkpoint and early stopping before and
after PerfCallback: one fit per order, in one launch; then the first order's callback fits again);
``exchange`` (no Trainer: ``RankExchange`` itself, on two processes it spawns); ``budget`` (the default schedule under
a budget that each rank would keep differently). Prints one ``RESULT {...}``
JSON line per rank (and per fit in ``orders``). ``SCENARIO`` may be several, separated by commas: one fit after
another in the same ranks, each under ``ROOT/SCENARIO``.
"""

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, RichProgressBar, TQDMProgressBar

from lightning_perf import PerfCallback
from lightning_perf.collect.run_info import launched_ranks
from models import TinyModel, trainer


class Scenario(TinyModel):
    def __init__(self, scenario: str) -> None:
        super().__init__(n=64, batch_size=4)
        self.scenario = scenario
        if scenario == "communication":
            self.big = nn.Linear(1024, 1024)  # 4 MiB of gradients to all-reduce every step, no real compute

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.scenario == "straggler" and self.global_rank == 1:
            time.sleep(0.02)
        if self.scenario == "raises" and self.global_rank == 1 and batch_idx == 2:
            raise RuntimeError("rank 1 failed")
        if self.scenario == "communication":
            loss = loss + 0 * sum(p.sum() for p in self.big.parameters())
        if self.scenario == "sync_every_step":  # 12 values all-reduced every step (Lightning: on_step in training)
            for k in range(12):
                self.log(f"m{k}", loss * k, sync_dist=True)
        if self.scenario == "sync_every_epoch":  # small_collectives' advice applied: reduced once, at the epoch end
            for k in range(12):
                self.log(f"m{k}", loss * k, sync_dist=True, on_step=False, on_epoch=True)
        return loss


class SyncedMetric(TinyModel):
    """Logs an epoch metric synced across ranks and shown in the progress bar, in training and validation:
    Lightning reduces it across the ranks when it is first read, which the progress bar does on rank zero
    only, at the epoch end, before or after PerfCallback's hook by the order of the callbacks."""

    def __init__(self) -> None:
        super().__init__(n=48, batch_size=4)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("m", loss, sync_dist=True, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        loss = super().validation_step(batch, batch_idx)
        self.log("val_m", loss, sync_dist=True, prog_bar=True, on_epoch=True)
        return loss


class RaisesLate(SyncedMetric):
    def on_train_epoch_end(self) -> None:
        if self.global_rank == 1:
            raise RuntimeError("rank 1 failed")


ORDERS = {
    "tqdm_first": lambda perf: [TQDMProgressBar(), perf],
    "tqdm_last": lambda perf: [perf, TQDMProgressBar()],
    "rich_first": lambda perf: [RichProgressBar(), perf],
    "rich_last": lambda perf: [perf, RichProgressBar()],
}


def _orders(root: str, strategy: str) -> None:
    """One fit per callback order, then a second fit with the first order's callback."""
    refit = None
    for name, order in ORDERS.items():
        perf = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 1}, stages=["train", "validate"])
        refit = refit or perf
        callbacks = [
            ModelCheckpoint(monitor="val_m"),
            *order(perf),
            EarlyStopping(monitor="val_m", patience=5),
        ]
        _fit(f"{root}/{name}", strategy, callbacks, perf, name, SyncedMetric(), "orders")
    _fit(f"{root}/refit", strategy, [TQDMProgressBar(), refit], refit, "refit", SyncedMetric(), "orders")


class NodeRanks(Callback):
    """Prints, on every rank (under ddp_spawn too, where the script's own RESULT comes from the launcher alone), how
    many of the node's other ranks ``perf`` knows: their CPU time is the run's own, children or not."""

    def __init__(self, perf: PerfCallback, scenario: str) -> None:
        self.perf, self.scenario = perf, scenario

    def on_train_end(self, trainer, pl_module) -> None:
        known = len(self.perf._staging.node_ranks)  # what the test checks
        line = {"rank": trainer.global_rank, "scenario": self.scenario, "node_ranks": known}
        print("NODE " + json.dumps(line), flush=True)


def _fit(root, strategy, callbacks, perf, name, model, scenario) -> None:
    t = trainer(
        root,
        callbacks,
        strategy=strategy,
        devices=2,
        max_epochs=2,
        limit_train_batches=4,
        limit_val_batches=3,
        enable_progress_bar=True,
        enable_checkpointing=True,
    )
    t.fit(model)
    result = {
        "rank": t.global_rank,
        "scenario": scenario,
        "order": name,
        "windows": [w.trace_path for w in perf.windows],
        "dirpath": perf.dirpath,
    }
    print("RESULT " + json.dumps(result), flush=True)


def _budget(root: str, strategy: str) -> None:
    """The default schedule under a budget, whose later windows each rank would decide differently: rank 1's budget
    is too small for any, rank 0's leaves room after every window (in the training loop, rank 0 starts as the main
    process, without LOCAL_RANK)."""
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    perf = PerfCallback(profile_budget=0.9 if rank == 0 else 0.0001, max_windows=3)
    t = trainer(root, [perf], strategy=strategy, devices=2, max_epochs=5, limit_val_batches=8)
    t.fit(TinyModel(n=64, batch_size=2))
    result = {
        "rank": t.global_rank,
        "scenario": "budget",
        "windows": [w.name for w in perf.windows],
        "dirpath": perf.dirpath,
    }
    print("RESULT " + json.dumps(result), flush=True)


def _exchange_rank(rank: int, port: int) -> None:
    """RankExchange on its own, on each of two processes (see test_distributed's test of it)."""
    import torch.distributed as dist

    from lightning_perf.collect.ranks import RankExchange
    from lightning_perf.summarize.ranks import FIELDS

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    values, result, polled = [rank + 0.5] * len(FIELDS), {"rank": rank}, []
    exchange = RankExchange.open()
    # 1. Rank zero first enters a collective alone (a progress bar's reduction): rank 1 issues its gather,
    #    is not held in it, and joins that collective; then rank zero's gather ends.
    if rank == 0:
        dist.all_reduce(torch.ones(1))
        exchange.issue(values, payload="epoch0")
        result["rows"] = [[r.rank, r.step_time_p50] for r in exchange.wait(60)]
    else:
        exchange.issue(values, payload="epoch0")
        result["issued_without_waiting"] = True
        dist.all_reduce(torch.ones(1))
    # 2. Rank 1 comes late: rank zero's wait gives up, and poll sees the gather end later on either rank.
    if rank == 0:
        exchange.issue(values, payload="epoch1")
        result["late"] = exchange.wait(0.2)
        dist.barrier()
    else:
        dist.barrier()
        exchange.issue(values, payload="epoch1")
    deadline = time.monotonic() + 60
    while "epoch1" not in polled and time.monotonic() < deadline:
        polled += exchange.poll()
        time.sleep(0.01)
    result["polled"] = polled
    result["drained"] = exchange.drain(10)
    exchange.close()
    # 3. A second exchange (a second fit); rank 1 leaves a gather in flight that rank zero never joins: its
    #    drain gives up and hands it back all the same, and its close does not block on it.
    exchange = RankExchange.open()
    exchange.issue(values, payload="again")
    if rank == 0:
        result["again"] = [r.rank for r in exchange.wait(60)]
    else:
        exchange.issue(values, payload="never")
    dist.barrier()
    result["last_drain"] = exchange.drain(0.2)
    if rank == 1:
        exchange.close()
    dist.barrier()
    if rank == 0:
        exchange.close()  # after rank 1's: rank zero's group stays up meanwhile, so rank 1's gather stays in flight
    dist.barrier()
    if rank == 1:  # rank zero's close ends rank 1's gather (failed): its holder lets the group go
        from lightning_perf.collect.ranks import HOLDER_THREAD

        for holder in [t for t in threading.enumerate() if t.name == HOLDER_THREAD]:
            holder.join(30)
        result["held"] = [t.name for t in threading.enumerate() if t.name == HOLDER_THREAD]
    dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)


def _exchange() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Forked: the children start with what this process imported (spawned, each imported Lightning again).
    torch.multiprocessing.start_processes(_exchange_rank, args=(port,), nprocs=2, start_method="fork")


def _node_process(index: int, root: str, port: int) -> None:
    """One of the 4 processes of ``multinode``, with the variables a cluster's launcher sets."""
    node, local = divmod(index, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="4")
    os.environ.update(NODE_RANK=str(node), LOCAL_RANK=str(local))
    _scenario(root, "ddp", "multinode")


def _multinode(root: str) -> None:
    """Two nodes of two processes each, on this machine: forked, each starts with what this process imported (a
    launch of 4 processes importing Lightning each took 22 s here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_node_process, args=(root, port), nprocs=4, start_method="fork")


def main() -> None:
    root, strategy, scenarios = sys.argv[1:4]
    torch.set_num_threads(1)
    if scenarios == "multinode":
        _multinode(root)
        return
    if "," not in scenarios:
        _scenario(root, strategy, scenarios)
        return
    # Several scenarios, one fit after another in the same ranks, each under ROOT/SCENARIO: the test suite pays
    # for the ranks' start (importing Lightning: 5-7 s a process here) once.
    for scenario in scenarios.split(","):
        _scenario(f"{root}/{scenario}", strategy, scenario)


def _scenario(root: str, strategy: str, scenario: str) -> None:
    if scenario == "exchange":
        _exchange()
        return
    if scenario == "orders":
        _orders(root, strategy)
        return
    if scenario == "budget":
        _budget(root, strategy)
        return
    if scenario == "raises_late":
        perf = PerfCallback(schedule={"skip_first": 1, "warmup": 1, "active": 1}, stages=["train"])
        _fit(root, strategy, [TQDMProgressBar(), perf], perf, scenario, RaisesLate(), scenario)
        return
    callback = PerfCallback(schedule={"skip_first": 2, "warmup": 1, "active": 2}, stages=["train"])
    nodes = 2 if scenario == "multinode" else 1  # each process started by _multinode, as a cluster's launcher would
    t = trainer(
        root, [callback, NodeRanks(callback, scenario)], strategy=strategy, devices=2, num_nodes=nodes, max_epochs=2,
        log_every_n_steps=4,
    )  # fmt: skip
    t.fit(Scenario(scenario))
    result = {
        "rank": t.global_rank,
        "scenario": scenario,
        "windows": [w.trace_path for w in callback.windows],
        "findings": [[f.id, f.severity, f.title, f.evidence] for f in callback.findings],
        "dirpath": callback.dirpath,
        "launched": len(launched_ranks(t)),  # the node's ranks this one started: no DataLoader workers of its
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
