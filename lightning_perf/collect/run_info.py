"""
Run information
===============

What a report needs to say about the run: versions, device, distribution, precision, and the DataLoader
settings that decide input performance. Read from public trainer and DataLoader attributes.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from collections.abc import Iterator
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_perf.collect.builders import hook_builder
from lightning_perf.collect.compile import compile_requested

_NO_BUILDER = {"built_by": None, "builder": None}  # the user's own code built it


def run_info(trainer: pl.Trainer) -> dict[str, Any]:
    device = trainer.strategy.root_device
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine()
    package, version = lightning_package(trainer)
    return {
        "torch": torch.__version__,
        "lightning": version,
        "lightning_package": package,
        "device": device.type,
        "device_name": device_name,
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "precision": str(trainer.precision),
        "strategy": type(trainer.strategy).__name__,
        "cpu_count": cpu_count(),
        "cpu_quota": cpu_quota(),
        "torch_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),  # "high"/"medium": TF32 matmuls
        "max_epochs": planned_epochs(trainer),
        "val_check_steps": val_check_steps(trainer),
        "compiled_modules": compile_requested(trainer.lightning_module),  # `.compile()` called on them
        "manual_optimization": not trainer.lightning_module.automatic_optimization,
        **progress_bar(trainer),
        "dataloaders": {},
    }


def progress_bar(trainer: Any) -> dict[str, Any]:
    """The Trainer's progress bar: its class (``"TQDMProgressBar"``, ``"RichProgressBar"``) and its
    ``refresh_rate`` as the bar reads it (``TQDMProgressBar``: batches between redraws; ``RichProgressBar``:
    redraws a second; ``None`` where it has none), or ``None`` for both where none draws
    (``enable_progress_bar=False``, or a refresh rate of 0)."""
    bar = getattr(trainer, "progress_bar_callback", None)
    if bar is None or not getattr(bar, "is_enabled", False):
        return {"progress_bar": None, "progress_bar_refresh": None}
    rate = getattr(bar, "refresh_rate", None)
    return {
        "progress_bar": type(bar).__name__,
        "progress_bar_refresh": rate if isinstance(rate, int) and not isinstance(rate, bool) else None,
    }


# torch's optimizers with a fused implementation (`fused=True`), on CPU and CUDA (torch >= 2.4).
FUSED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})


def launched_ranks(trainer: Any) -> frozenset[int]:
    """The process ids of the ranks this process launched: under Lightning's ``ddp`` on one node
    (``_SubprocessScriptLauncher``: its ``procs``, "launched child subprocesses"), rank zero starts the node's
    other ranks as its children, which are then no DataLoader workers of its (``EpochCpu``). Empty elsewhere."""
    procs = getattr(getattr(getattr(trainer, "strategy", None), "launcher", None), "procs", None) or ()
    return frozenset(pid for p in procs if isinstance(pid := getattr(p, "pid", None), int))


def optimizer_info(trainer: Any) -> dict[str, Any] | None:
    """The run's first optimizer as configured (``trainer.optimizers``, set before ``on_fit_start``): its class
    name, whether it is fused or multi-tensor (its ``defaults``: ``None`` where it has no such option or leaves it
    to torch), and the library whose ``configure_optimizers`` built it (:func:`hook_builder`); ``None`` without
    one."""
    optimizers = getattr(trainer, "optimizers", None) or []
    if not optimizers:
        return None
    optimizer = optimizers[0]
    defaults = getattr(optimizer, "defaults", {}) or {}
    fused, foreach = defaults.get("fused"), defaults.get("foreach")
    return {
        "class": type(optimizer).__name__,
        "fused": fused if isinstance(fused, bool) else None,
        "foreach": foreach if isinstance(foreach, bool) else None,
        "fusable": type(optimizer).__name__ in FUSED_OPTIMIZERS and type(optimizer).__module__.startswith("torch."),
        **(hook_builder(getattr(trainer, "lightning_module", None), "configure_optimizers") or _NO_BUILDER),
    }


def lightning_package(trainer: Any) -> tuple[str, str]:
    """The package the trainer comes from (``"lightning"``, or ``"pytorch_lightning"`` for the standalone
    package's ``Trainer``) and its version: both may be installed, at different versions."""
    package = type(trainer).__module__.partition(".")[0]
    version = getattr(sys.modules.get(package), "__version__", None)
    if not isinstance(version, str):
        return "lightning", lightning.__version__
    return package, version


def val_check_steps(trainer: Any) -> int | None:
    """N where validation runs every N training batches across epochs (``Trainer(val_check_interval=N,
    check_val_every_n_epoch=None)``), else ``None`` (per epoch, or a fraction of one)."""
    interval = getattr(trainer, "val_check_interval", None)
    if getattr(trainer, "check_val_every_n_epoch", 1) is None and isinstance(interval, int) and interval > 0:
        return interval
    return None


def planned_epochs(trainer: pl.Trainer) -> int | None:
    """The epochs a call plans: a fit's ``Trainer(max_epochs=...)``, ``None`` when unbounded or unset (then
    ``max_steps`` or a callback decides); 1 for ``validate``, ``test`` and ``predict``."""
    if trainer.state.fn is not None and trainer.state.fn.value != "fit":
        return 1
    epochs = trainer.max_epochs
    return epochs if isinstance(epochs, int) and epochs > 0 else None


def cpu_count() -> int | None:
    """CPUs this process may use: its affinity mask where the OS has one, and no more than its cgroup's CPU quota
    allows (rounded up: a quota of 1.5 CPUs runs on 2, each part of the time)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = cpu_quota()
    if quota is not None and count is not None:
        return max(1, min(count, math.ceil(quota)))
    return count


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"
"""cgroup v2's CPU limit of this process's group (a container's): ``"<quota> <period>"`` in microseconds, or
``"max <period>"`` for none."""


def cpu_quota(path: str = CGROUP_CPU_MAX) -> float | None:
    """The CPUs' worth of time this process's cgroup may use per period (``cpu.max``), ``None`` without a
    limit or where it cannot be read (not Linux, cgroup v1)."""
    try:
        with open(path) as f:
            quota, period = f.read().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def stage_iterables(dataloaders: Any) -> Iterator[Any]:
    """Each iterable in what ``trainer.*_dataloader(s)`` holds (one, or lists, tuples and dicts of them), in order."""
    if isinstance(dataloaders, dict):
        dataloaders = list(dataloaders.values())
    if isinstance(dataloaders, (list, tuple)):
        for item in dataloaders:
            yield from stage_iterables(item)
    elif dataloaders is not None:
        yield dataloaders


def first_dataloader(dataloaders: Any) -> DataLoader | None:
    """The first :class:`DataLoader` in what ``trainer.*_dataloader(s)`` holds (:func:`stage_iterables`)."""
    return next((d for d in stage_iterables(dataloaders) if isinstance(d, DataLoader)), None)


def dataloader_settings(dataloader: DataLoader | None) -> dict[str, Any] | None:
    """The settings of a DataLoader that matter for input speed."""
    if dataloader is None:
        return None
    return {
        "num_workers": dataloader.num_workers,
        "pin_memory": dataloader.pin_memory,
        "persistent_workers": dataloader.persistent_workers,
        "prefetch_factor": dataloader.prefetch_factor,
        "batch_size": dataloader.batch_size,
        "drop_last": dataloader.drop_last,
    }


def stage_dataloaders(trainer: pl.Trainer, stage: str) -> Any:
    """The trainer's dataloaders of a stage (public properties; set once the stage's loop has started)."""
    return {
        "train": lambda: trainer.train_dataloader,
        "validate": lambda: trainer.val_dataloaders,
        "test": lambda: trainer.test_dataloaders,
        "predict": lambda: trainer.predict_dataloaders,
    }[stage]()
