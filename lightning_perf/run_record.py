"""
The run's record
================

What ``perf_report.json``'s ``"run"`` object holds: facts about the run, read once at setup
(:func:`~lightning_perf.collect.run_info.run_info`), and what later hooks add (the DataLoaders, the optimizer, the
FLOP count, the memory breakdown, the profiling's cost). A JSON object, not a dataclass: the report keeps
what each Lightning and torch version gives. These ``TypedDict`` declarations are its schema, for the
documentation (generated from their ``Attributes:``) and for the test that compares them with a real run's
report, key by key.
"""

from __future__ import annotations

from typing import Any, TypedDict


class LoaderInfo(TypedDict, total=False):
    """One stage's DataLoader, as ``run.dataloaders.<stage>``: the settings that decide input performance.

    Attributes:
        num_workers: The DataLoader's ``num_workers``.
        pin_memory: Its ``pin_memory``.
        persistent_workers: Its ``persistent_workers``.
        prefetch_factor: Its ``prefetch_factor`` (``null`` without workers).
        batch_size: Its ``batch_size`` (``null`` with a batch sampler).
        drop_last: Its ``drop_last``.
        dataset: The dataset's kind: ``"map"`` (``__getitem__``), ``"iterable"`` (an ``IterableDataset``).
        shared_state: What the dataset shares with the LightningModule (an attribute of both), or ``null``.
        dataset_class: The dataset's class name.
        dataset_library: The installed package the dataset's class comes from (a library's), or ``null`` for
            the user's own code.
        dataset_length: ``len(dataset)`` of a map-style dataset; ``null`` for an iterable one or one without a
            length.
        built_by: The installed library whose hook built the DataLoader (a LightningModule's or
            LightningDataModule's ``*_dataloader`` of that library's class), or ``null`` where the user's code did
            or it was passed to the Trainer call.
        builder: That hook, as ``"Class.train_dataloader"``, or ``null``.
        iterable_class: Where the stage has no torch DataLoader, the class of the iterable the Trainer iterates
            instead (a library's batch generator): its batches are made in the training process between the steps,
            and no other key is there.
        iterable_library: The installed package that class comes from, or ``null`` for the user's own code.
    """

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    batch_size: int | None
    drop_last: bool
    dataset: str | None
    shared_state: str | None
    dataset_class: str | None
    dataset_library: str | None
    dataset_length: int | None
    built_by: str | None
    builder: str | None
    iterable_class: str
    iterable_library: str | None


class RunInfo(TypedDict, total=False):
    """``perf_report.json``'s ``"run"``: the run's versions, device, distribution and settings.

    Attributes:
        torch: torch's version.
        lightning: The version of the Lightning package the Trainer comes from.
        lightning_package: That package: ``"lightning"`` or ``"pytorch_lightning"``.
        device: The device type: ``"cpu"``, ``"cuda"``, ...
        device_name: The GPU's name, or the CPU's.
        world_size: The processes (ranks) of the run.
        num_nodes: The machines of the run.
        precision: The Trainer's ``precision`` (``"32-true"``, ``"bf16-mixed"``, ...).
        strategy: The strategy's class (``"DDPStrategy"``, ``"SingleDeviceStrategy"``, ...).
        cpu_count: The CPUs this process may run on.
        cpu_quota: A container's CPU limit (cgroup ``cpu.max``), in CPUs, or ``null``.
        torch_threads: torch's intra-op threads at setup.
        float32_matmul_precision: ``torch.get_float32_matmul_precision()``: ``"high"`` or ``"medium"`` allow
            TF32 matmuls.
        max_epochs: The epochs the call plans (1 for ``validate``, ``test``, ``predict``).
        val_check_steps: Training batches between validation runs, or ``null``.
        compiled_modules: The modules ``.compile()`` was called on, or ``null``.
        manual_optimization: The LightningModule optimizes manually (``automatic_optimization=False``): its
            training batches' phases split only what its hooks allow (``records.MANUAL_NOTE``).
        progress_bar: The progress bar's class, or ``null`` where none draws.
        progress_bar_refresh: Its ``refresh_rate``, or ``null``.
        dataloaders: Each stage's DataLoader (:class:`LoaderInfo`), by stage.
        optimizer_info: The first optimizer: ``class``, ``fused``, ``foreach``, ``fusable`` (a torch optimizer
            with a fused implementation), and ``built_by`` and ``builder``: the installed library whose
            ``configure_optimizers`` built it and that hook (``"PLForecastingModule.configure_optimizers"``), or
            ``null`` where the user's code did.
        peak_flops: The per-device peak that MFU divides by (FLOP/s), or ``null`` when unknown.
        flops: Absent until a batch's FLOPs are counted: ``by_module`` (``[[module, forward FLOPs], ...]``),
            ``forward``, ``counted`` (``[{flops, samples, shape}, ...]``) and ``uncounted`` (``[[op, calls],
            ...]``).
        memory: What fills memory (parameters, gradients, optimizer state, activations; see Memory), once
            counted.
        profiling: What the profiling cost so far: ``budget``, ``seconds``, ``run_seconds``, ``share``,
            ``windows``, ``skipped``, ``flops_held``.
        advice_trials: Absent until a finding's advised setting is tried on the run's data (``PerfCallback(
            try_advice=True)``): each trial's record (see AdviceTrial), by the rule whose advice it tried.
    """

    torch: str
    lightning: str
    lightning_package: str
    device: str
    device_name: str | None
    world_size: int
    num_nodes: int
    precision: str
    strategy: str
    cpu_count: int | None
    cpu_quota: float | None
    torch_threads: int
    float32_matmul_precision: str
    max_epochs: int | None
    val_check_steps: int | None
    compiled_modules: list[str] | None
    manual_optimization: bool
    progress_bar: str | None
    progress_bar_refresh: int | None
    dataloaders: dict[str, LoaderInfo]
    optimizer_info: dict[str, Any]
    peak_flops: float | None
    flops: dict[str, Any]
    memory: dict[str, Any]
    profiling: dict[str, Any]
    advice_trials: dict[str, dict[str, Any]]
