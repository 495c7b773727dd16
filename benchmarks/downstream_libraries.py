"""
Downstream libraries
====================

What :class:`~lightning_perf.PerfCallback` does to a training run that a downstream library builds around
Lightning, on a tiny model of each library that is installed (each one missing is skipped with a message):

* ``pyg``: torch_geometric, a 2-layer GCN with global mean pooling over ``torch_geometric.loader.DataLoader``
  batches of 200 random graphs (10-30 nodes; 160 train, 40 validation), batch 16: a batch is a
  ``torch_geometric.data.Batch`` whose samples are its ``num_graphs``;
* ``transformers``: Hugging Face transformers, a randomly initialised ``BertForSequenceClassification``
  (hidden 32, 2 layers, 2 heads, vocabulary 1000, sequence 32) in a LightningModule, AdamW with
  ``get_linear_schedule_with_warmup``, batches of 16 as a ``BatchEncoding`` of ``input_ids``,
  ``attention_mask`` and ``labels``;
* ``forecasting``: pytorch-forecasting, a ``TemporalFusionTransformer.from_dataset`` (hidden 8) on a
  synthetic ``TimeSeriesDataSet`` (4 series of 200 steps, encoder 24, prediction 6), batch 32: a batch is
  ``(x: dict of tensors, (target, weight))``.

Nothing is downloaded: random data and randomly initialised models. Every library here builds on
``lightning.pytorch``, so the plain ``PerfCallback`` is used. In each round, for each library, three fresh
Trainers fit the same seeded model on the same data (``lightning.seed_everything(0)``), one after another
(after one uncounted run of each, so that lazy imports and first calls land in none of the figures):

    (a) a bare Trainer;
    (b) ``PerfCallback(batches=[1000000])``: no profiler window ever opens (its FLOP count of the first
        batch still runs), so (b) - (a) is the callback's cost outside windows;
    (c) ``PerfCallback()``: its defaults (skip 5 batches, warm up 1, record 1, in each epoch).

A timing callback, first in the callback list, reads ``time.perf_counter()`` at every
``on_train_batch_start``; a step is the time from one batch's start to the next's in the same epoch.

Run it from the repository root::

    python benchmarks/downstream_libraries.py                          # 3 rounds, every installed library
    python benchmarks/downstream_libraries.py --libraries pyg --rounds 5 --threads 1

Reading the output:

* ``fit s``: median wall time of ``trainer.fit`` over the rounds, with its min..max.
* ``median step``: each configuration's median step, pooled over rounds, leaving out each epoch's first 2
  steps (data-loader start, the counted FLOPs batch) and, for (c), the steps from the one before each window's
  warm-up to the one after its last recorded batch; ``(b)-(a) per batch`` is the callback's per-batch cost
  outside windows (with the min..max over rounds of the same difference per round: the noise).
* ``other load``: the CPU time other processes used during the runs, as a share of all CPUs. Above a few %
  the step times are disturbed: trust a difference only as far as its per-round range agrees.
* ``identical``: whether (b) and (c) end with the same parameters (a digest of the ``state_dict``) and the
  same last logged loss as (a), in every round.
* ``batch size``: what the callback counted per measured batch (``samples / (batches - profiled_batches)``
  of each training epoch in ``perf_report.json``), next to the true number of samples per batch; ``None``
  where the callback could not tell. ``FLOPs/batch``: its counted FLOPs of a training batch, forward and
  backward (``flops_per_batch``), and per sample where the batch size is known.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib
import importlib.metadata
import io
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from lightning_perf import PerfCallback
from machine import cpu_busy_seconds

CONFIGS = ("a", "b", "c")
LABELS = {"a": "bare Trainer", "b": "PerfCallback(), no window", "c": "PerfCallback()"}
SKIP_STEPS = 2  # first steps of each epoch left out of the medians in every configuration
NO_WINDOW = 1_000_000  # a batch index no epoch reaches: (b) never opens a profiler window


class StepTimer(Callback):
    """``time.perf_counter()`` at every ``on_train_batch_start``, with the epoch and batch index."""

    def __init__(self) -> None:
        self.starts: list[tuple[int, int, float]] = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.starts.append((trainer.current_epoch, batch_idx, time.perf_counter()))

    def steps(self, excluded: set[tuple[int, int]]) -> list[float]:
        out = []
        for (e0, b0, t0), (e1, _b1, t1) in zip(self.starts, self.starts[1:], strict=False):
            if e0 == e1 and b0 >= SKIP_STEPS and (e0, b0) not in excluded:
                out.append(t1 - t0)
        return out


# ---------------------------------------------------------------------------------------------- libraries


@dataclass
class Case:
    """One library's tiny training: what to build, and how many samples a batch really holds."""

    name: str
    package: str  # the distribution whose version is printed
    build: Callable[[], tuple[pl.LightningModule, Any, Any]]  # -> model, train loader, val loader
    true_batch_size: Callable[[Any], int]
    epochs: int = 2
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)


def pyg_case() -> Case:
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn import GCNConv, global_mean_pool

    class GCN(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.head = GCNConv(16, 64), GCNConv(64, 64), nn.Linear(64, 2)

        def forward(self, b: Any) -> torch.Tensor:
            h = F.relu(self.c2(F.relu(self.c1(b.x, b.edge_index)), b.edge_index))
            return self.head(global_mean_pool(h, b.batch))

        def training_step(self, b: Any, i: int) -> torch.Tensor:
            loss = F.cross_entropy(self(b), b.y)
            self.log("train_loss", loss, batch_size=b.num_graphs)
            return loss

        def validation_step(self, b: Any, i: int) -> None:
            self.log("val_loss", F.cross_entropy(self(b), b.y), batch_size=b.num_graphs)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    def build() -> tuple[pl.LightningModule, Any, Any]:
        g = torch.Generator().manual_seed(0)
        graphs = []
        for _ in range(200):
            n = int(torch.randint(10, 31, (1,), generator=g))
            x = torch.randn(n, 16, generator=g)
            edges = torch.randint(0, n, (2, 3 * n), generator=g)
            graphs.append(Data(x=x, edge_index=edges, y=torch.tensor([int(x[:, 0].mean() > 0)])))
        return GCN(), DataLoader(graphs[:160], batch_size=16, shuffle=True), DataLoader(graphs[160:], batch_size=16)

    return Case("pyg", "torch_geometric", build, lambda b: int(b.num_graphs), epochs=3)


def transformers_case() -> Case:
    from transformers import BatchEncoding, BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

    seq, vocab = 32, 1000

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            config = BertConfig(
                vocab_size=vocab,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
                num_labels=2,
            )
            self.model = BertForSequenceClassification(config)

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            loss = self.model(**batch).loss
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, i: int) -> None:
            self.log("val_loss", self.model(**batch).loss)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=4, num_training_steps=100)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def collate(rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> BatchEncoding:
        ids, mask, labels = (torch.stack(c) for c in zip(*rows, strict=True))
        return BatchEncoding({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def build() -> tuple[pl.LightningModule, Any, Any]:
        g = torch.Generator().manual_seed(0)
        n = 240
        ids = torch.randint(1, vocab, (n, seq), generator=g)
        lengths = torch.randint(8, seq + 1, (n,), generator=g)
        mask = (torch.arange(seq) < lengths[:, None]).long()
        ids = ids * mask
        labels = (ids[:, 0] % 2).long()
        rows = list(zip(ids, mask, labels, strict=True))
        dl = torch.utils.data.DataLoader
        return (
            Classifier(),
            dl(rows[:192], batch_size=16, shuffle=True, collate_fn=collate),
            dl(rows[192:], batch_size=16, collate_fn=collate),
        )

    return Case("transformers", "transformers", build, lambda b: int(b["input_ids"].shape[0]), epochs=2)


def forecasting_case(
    series: int = 4, hidden_size: int = 8, hidden_continuous_size: int = 4, batch_size: int = 32
) -> Case:
    """pytorch-forecasting's TemporalFusionTransformer on ``series`` synthetic series of 200 steps (131 training
    samples each: 4 series make 16 batches of 32)."""
    import numpy as np
    import pandas as pd
    from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet

    def build() -> tuple[pl.LightningModule, Any, Any]:
        rng = np.random.default_rng(0)
        t = np.arange(200)
        frames = [
            pd.DataFrame(
                {"time_idx": t, "series": str(s), "value": np.sin(t / (5 + s)) + 0.1 * rng.standard_normal(len(t)) + s}
            )
            for s in range(series)
        ]
        df = pd.concat(frames, ignore_index=True)
        df["series"] = df["series"].astype("category")
        cutoff = 160
        train = TimeSeriesDataSet(
            df[df.time_idx <= cutoff],
            time_idx="time_idx",
            target="value",
            group_ids=["series"],
            max_encoder_length=24,
            max_prediction_length=6,
            static_categoricals=["series"],
            time_varying_known_reals=["time_idx"],
            time_varying_unknown_reals=["value"],
        )
        val = TimeSeriesDataSet.from_dataset(train, df, min_prediction_idx=cutoff + 1, stop_randomization=True)
        model = TemporalFusionTransformer.from_dataset(
            train,
            hidden_size=hidden_size,
            attention_head_size=1,
            hidden_continuous_size=hidden_continuous_size,
            dropout=0.1,
            learning_rate=0.03,
        )
        return (
            model,
            train.to_dataloader(train=True, batch_size=batch_size, num_workers=0),
            val.to_dataloader(train=False, batch_size=batch_size, num_workers=0),
        )

    return Case(
        "forecasting",
        "pytorch-forecasting",
        build,
        lambda b: int(b[0]["encoder_cont"].shape[0]),
        epochs=2,
        trainer_kwargs={"limit_train_batches": 12, "gradient_clip_val": 0.1},
    )


CASES: dict[str, Callable[[], Case]] = {
    "pyg": pyg_case,
    "transformers": transformers_case,
    "forecasting": forecasting_case,
}
MODULES = {"pyg": "torch_geometric", "transformers": "transformers", "forecasting": "pytorch_forecasting"}


# ---------------------------------------------------------------------------------------------- runs


@dataclass
class Run:
    config: str
    wall: float
    steps: list[float]
    digest: str
    loss: float | None
    other_load: float | None
    counted: list[float | None] = field(default_factory=list)  # per training epoch: samples per measured batch
    flops_per_batch: float | None = None
    true_batch: int | None = None


def digest(module: nn.Module) -> str:
    h = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def run_once(case: Case, config: str) -> Run:
    gc.collect()
    lightning.seed_everything(0, verbose=False)
    model, train, val = case.build()
    timer = StepTimer()
    callbacks: list[Callback] = [timer]
    perf = None
    if config == "b":
        perf = PerfCallback(batches=[NO_WINDOW], verbose=0)
    elif config == "c":
        perf = PerfCallback(verbose=0)
    if perf is not None:
        callbacks.append(perf)
    with tempfile.TemporaryDirectory(prefix=f"lp-{case.name}-") as root:
        trainer = pl.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            devices=1,
            max_epochs=case.epochs,
            callbacks=callbacks,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            log_every_n_steps=5,
            **case.trainer_kwargs,
        )
        busy0, cpu0, wall0 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
        trainer.fit(model, train, val)
        busy1, cpu1, wall1 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
        excluded: set[tuple[int, int]] = set()
        counted: list[float | None] = []
        flops = None
        if perf is not None:
            warmup = perf.config.schedule.warmup
            for w in perf.windows:
                if w.stage == "train":
                    excluded |= {(w.epoch, b) for b in range(w.first_batch - warmup - 1, w.last_batch + 2)}
            report_path = os.path.join(perf.dirpath, "perf_report.json") if perf.dirpath else None
            if report_path and os.path.exists(report_path):
                with open(report_path) as f:
                    report = json.load(f)
                for e in report["stages"].get("train", {}).get("epochs", []):
                    measured = e["batches"] - e["profiled_batches"]
                    counted.append(e["samples"] / measured if e["samples"] is not None and measured else None)
                    flops = e.get("flops_per_batch") if flops is None else flops
    other = None
    if busy0 is not None and busy1 is not None:
        other = max(0.0, ((busy1 - busy0) - (cpu1 - cpu0)) / ((wall1 - wall0) * (os.cpu_count() or 1)))
    loss = trainer.callback_metrics.get("train_loss")
    return Run(
        config,
        wall1 - wall0,
        timer.steps(excluded),
        digest(model),
        None if loss is None else float(loss),
        other,
        counted,
        flops,
        case.true_batch_size(next(iter(train))),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f} ms"


def bench(name: str, rounds: int) -> None:
    module = MODULES[name]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        print(f"\n== {name}: skipped, {module} is not installed ({exc})")
        return
    case = CASES[name]()
    print(f"\n== {name}: {case.package} {importlib.metadata.version(case.package)}, {case.epochs} epochs")
    runs: dict[str, list[Run]] = {c: [] for c in CONFIGS}
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), warnings.catch_warnings():  # a first run of each, not counted:
        warnings.simplefilter("ignore")  # lazy imports and first calls land in no configuration's figures
        for config in CONFIGS:
            run_once(case, config)
    for _ in range(rounds):
        for config in CONFIGS:
            with contextlib.redirect_stdout(quiet), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runs[config].append(run_once(case, config))
    bare = runs["a"]
    for config in CONFIGS:
        rs = runs[config]
        walls = [r.wall for r in rs]
        steps = [s for r in rs for s in r.steps]
        loads = [r.other_load for r in rs if r.other_load is not None]
        print(
            f"  ({config}) {LABELS[config]:26s} fit s {statistics.median(walls):6.2f} "
            f"({min(walls):.2f}..{max(walls):.2f})  median step {_ms(statistics.median(steps))} "
            f"over {len(steps)} steps  other load {max(loads, default=0):.0%} at most"
        )
    diffs = [statistics.median(b.steps) - statistics.median(a.steps) for a, b in zip(bare, runs["b"], strict=True)]
    pooled = statistics.median([s for r in runs["b"] for s in r.steps]) - statistics.median(
        [s for r in bare for s in r.steps]
    )
    print(
        f"  (b)-(a) per batch outside windows: {pooled * 1e6:+.0f} us (per round {min(diffs) * 1e6:+.0f}.."
        f"{max(diffs) * 1e6:+.0f} us)"
    )
    same = all(r.digest == a.digest and r.loss == a.loss for c in "bc" for r, a in zip(runs[c], bare, strict=True))
    print(f"  identical parameters and loss in every round: {same} (digest {bare[0].digest}, loss {bare[0].loss})")
    c = runs["c"][0]
    per_sample = ""
    counted = [x for x in c.counted if x is not None]
    if c.flops_per_batch and counted:
        per_sample = f", {c.flops_per_batch / statistics.mean(counted):,.0f} per sample"
    print(f"  batch size counted per measured batch, by training epoch: {c.counted}; true: {c.true_batch}")
    print(f"  FLOPs/batch (forward + backward): {c.flops_per_batch and f'{c.flops_per_batch:,.0f}'}{per_sample}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--libraries", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print(
        f"torch {torch.__version__}, lightning {lightning.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, {args.rounds} rounds of (a), (b), (c)"
    )
    for name in args.libraries.split(","):
        if name not in CASES:
            parser.error(f"unknown library {name!r}; one of {', '.join(CASES)}")
        bench(name, args.rounds)


if __name__ == "__main__":
    main()
