"""
Steps of about 1 ms: where the time goes
========================================

What a default :class:`~lightning_perf.PerfCallback` costs a fit whose steps take about a millisecond (an MLP of
16-32-1 on batches of 8, no ``self.log``, one torch thread: Lightning's own loop is most of each step), split by
part, against two baselines:

    (a) ``bare``: a Trainer with no callback at all (progress bar, checkpointing and model summary off);
    (b) ``empty``: the same with one callback that overrides nothing. Lightning calls every hook of every callback
        (``lightning.pytorch.trainer.call._call_callback_hooks``: a profiler context and an f-string per hook,
        about seven hooks a batch), so (b) - (a) is what *any* callback costs, ours included, and no callback can
        avoid;
    (c) ``always-on``: ``PerfCallback(max_windows=0)``: its per-batch hooks, epoch summaries and report, no window;
    (d) ``default``: ``PerfCallback()``: (c) and its budgeted windows and FLOP count.

Each fit is split from the model's side: ``training_step`` reads the clock, so the fit's wall time is its start
before the first step (``pre``), the steps (``n x median`` of the step-to-step intervals, and ``excess``: what the
intervals took beyond their median: epoch ends, windows, paced scalar writes, the machine's hiccups) and its end
after the last step (``post``: the last epoch's end, teardown, the report). The configurations alternate in ABBA
order in one process (a steady drift of the machine cancels in the ratio of the medians).

``--hooks`` times each per-batch hook's own work inside fits (the clock read around each call), the steadiest of
these figures on a shared machine: what the callback's code itself takes, with no share of what it costs the
model's and Lightning's code around it (caches it took over).

``--blocks N`` measures the per-batch work alone, inside fits: ``PerfCallback(max_windows=0)`` whose batch hooks,
phase marks and optimizer post-hook run for N batches, then do nothing for N (the controller's position kept), and
so on; the median step of the "on" blocks less that of the "off" blocks is what that work costs a step beyond an
empty callback's, the machine's drift cancelled (a bare Trainer toggling nothing reads 0 +- 5 us). Fits of the
same configuration differ by up to 20% in their median step on this project's shared machine; blocks of one fit
do not. ``--parts dispatch`` puts an empty callback in and out of a bare Trainer's callbacks instead: what any
callback costs, on the same footing; ``--parts whole`` leaves the callback's batch hooks undispatched in the off
blocks (each ``None`` on the instance: Lightning skips a hook that is not callable): all it costs a step against
a bare Trainer, Lightning's dispatch included (the issue's "at most 1.02x of bare").

``--calls`` counts the Python calls a training batch makes, bare, with an empty callback and with
``PerfCallback(max_windows=0)`` (``sys.setprofile`` over 20 batches of a fit): the same count on any machine and
any load, where each call costs about 1 us in a fit of 1-ms steps on this project's machine.

Run it from the repository root::

    python benchmarks/short_steps.py                     # 4 rounds of 3 epochs x 3,072 batches: about 3 minutes
    python benchmarks/short_steps.py --rounds 8 --configs abcd
    python benchmarks/short_steps.py --blocks 64 --rounds 2
    python benchmarks/short_steps.py --blocks 64 --parts marks --rounds 2   # the phase marks alone
    python benchmarks/short_steps.py --blocks 64 --parts dispatch --rounds 2  # an empty callback, in and out
    python benchmarks/short_steps.py --hooks --epochs 2 --rounds 2
    python benchmarks/short_steps.py --blocks 64 --parts whole --epochs 2  # all of it against a bare Trainer
    python benchmarks/short_steps.py --calls --batches 400                 # Python calls a batch: deterministic
"""

from __future__ import annotations

import argparse
import collections
import itertools
import logging
import statistics
import sys
import tempfile
import time
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback


class StepTimed(pl.LightningModule):
    """An MLP on random batches of 8; :attr:`starts` holds the clock at each ``training_step``."""

    def __init__(self, batches: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.data = TensorDataset(torch.randn(batches * 8, 16), torch.rand(batches * 8, 1))
        self.starts: list[float] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.starts.append(time.perf_counter())
        x, y = batch
        return nn.functional.binary_cross_entropy_with_logits(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=8)


class Empty(pl.Callback):
    """A callback that overrides nothing: what Lightning's dispatch of its hooks costs."""


class Dispatched(StepTimed):
    """:class:`StepTimed` that puts an :class:`Empty` callback in its Trainer's callbacks for every other block of
    ``block`` batches (``--blocks --parts dispatch``): what Lightning's dispatch of one more callback's hooks costs,
    inside one fit."""

    def __init__(self, batches: int, block: int) -> None:
        super().__init__(batches)
        self.block = block
        self.empty = Empty()

    def on_train_batch_start(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        callbacks = self.trainer.callbacks  # type: ignore[attr-defined]
        on = (batch_idx // self.block) % 2 == 0
        if on and self.empty not in callbacks:
            callbacks.append(self.empty)
        elif not on and self.empty in callbacks:
            callbacks.remove(self.empty)


MARK_HOOKS = ("on_before_zero_grad", "on_before_backward", "on_after_backward")
BATCH_HOOKS = ("on_train_batch_start", *MARK_HOOKS, "on_before_optimizer_step", "on_train_batch_end")


def _nothing(*_: object) -> None:
    """A hook that does nothing."""


class Alternating(PerfCallback):
    """``PerfCallback`` whose per-batch work runs in every other block of ``block`` batches (``--blocks``): its
    training batch hooks (``parts`` "batch"), its phase marks and the optimizer's step post-hook ("marks"), or both
    ("all"), taken off and put back at each block's start; what ``parts`` leaves out runs in every block. With
    "all", the off blocks cost what an empty callback costs (Lightning's dispatch of its hooks). Reaches into the
    callback to keep its position in the off blocks: a benchmark, not an API."""

    def __init__(self, block: int, parts: str = "all") -> None:
        super().__init__(verbose=0, max_windows=0)
        self.block = block
        self.parts = parts
        self.on = self.marking = True
        self.marks = self._phase_marks

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        on = (batch_idx // self.block) % 2 == 0
        marking = on or self.parts == "batch"
        if marking != self.marking and self.marks is not None:  # a block starts: the step post-hook with the marks
            if marking:
                self._step_ends.install(trainer.optimizers, self.marks)
            else:
                self._step_ends.uninstall()
        self.marking = marking
        self._phase_marks = self.marks if marking else None
        self._bind_marks(self._phase_marks)
        if not marking:  # dispatched as an empty callback's hooks are, doing nothing
            for hook in MARK_HOOKS:
                setattr(self, hook, _nothing)
        self.on = on or self.parts == "marks"
        if self.on:
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        if self.on:
            super().on_before_optimizer_step(trainer, pl_module, optimizer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        if self.on:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        else:
            self._control.stages["train"].batch += 1


class Undispatched(StepTimed):
    """:class:`StepTimed` whose Trainer has a ``PerfCallback(max_windows=0)`` that Lightning dispatches no batch
    hook to in every other block of ``block`` batches (``--blocks --parts whole``): each of its batch hooks is
    ``None`` on the instance there (Lightning skips a hook that is not callable), its post-hook off, its position
    kept. The on blocks less the off blocks: the whole per-batch cost against a bare Trainer, dispatch included.
    Toggled at the module's batch end, after the callbacks': a block's batches are whole."""

    def __init__(self, batches: int, block: int) -> None:
        super().__init__(batches)
        self.batches, self.block = batches, block
        self.callback = PerfCallback(verbose=0, max_windows=0)
        self.own: dict[str, object] = {}  # the callback's own hooks on the instance, while they are off
        self.off = False

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        callback = self.callback
        if self.off:
            callback._control.stages["train"].batch += 1
        off = ((batch_idx + 1) // self.block) % 2 == 1 and batch_idx + 1 < self.batches
        if off == self.off:
            return
        self.off = off
        if off:
            self.own = {name: callback.__dict__[name] for name in BATCH_HOOKS if name in callback.__dict__}
        for name in BATCH_HOOKS:
            if off:
                setattr(callback, name, None)
            elif name in self.own:
                setattr(callback, name, self.own[name])
            else:
                delattr(callback, name)
        if off:
            callback._step_ends.uninstall()
        elif callback._phase_marks is not None:
            callback._step_ends.install(self.trainer.optimizers, callback._phase_marks)  # type: ignore[attr-defined]


class CallCounted(StepTimed):
    """:class:`StepTimed` that counts the Python calls made in ``batches`` training batches from its batch
    ``first`` on (``--calls``): ``sys.setprofile`` from one batch's end (after the callbacks') to a later one's, each
    function's calls by its file and name. Deterministic, where a time in this loop moves by a few %."""

    def __init__(self, batches: int, first: int = 300, counted: int = 20) -> None:
        super().__init__(batches)
        self.first, self.counted = first, counted
        self.calls: collections.Counter[str] = collections.Counter()

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if batch_idx == self.first - 1:
            sys.setprofile(self._count)
        elif batch_idx == self.first + self.counted - 1:
            sys.setprofile(None)

    def _count(self, frame, event: str, arg) -> None:
        if event == "call":
            code = frame.f_code
            self.calls[f"{code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_name}"] += 1


def calls(batches: int) -> dict[str, CallCounted]:
    """Each configuration's Python calls a batch (``--calls``), by configuration name."""
    counted = {}
    for key in "abc":
        name, callbacks = CONFIGS[key]
        model = CallCounted(batches)
        _fit(callbacks(), batches, 1, model)
        counted[name] = model
    return counted


class HookTimed(PerfCallback):
    """``PerfCallback(max_windows=0)`` whose per-batch hooks each read the clock around themselves (``--hooks``):
    the callback's own time in a fit, hook by hook (the optimizer's post-hook, one mark, is not in it; each reading
    adds the wrapper's call, about 0.3-0.5 us)."""

    def __init__(self) -> None:
        super().__init__(verbose=0, max_windows=0)
        self.spent: dict[str, list[float]] = {name: [] for name in BATCH_HOOKS}


def _timed_hook(name: str):
    hook = getattr(PerfCallback, name)

    def timed(self: HookTimed, *args, **kwargs) -> None:
        start = time.perf_counter()
        hook(self, *args, **kwargs)
        self.spent[name].append(time.perf_counter() - start)

    return timed


for _name in BATCH_HOOKS:
    setattr(HookTimed, _name, _timed_hook(_name))


CONFIGS = {
    "a": ("bare", list),
    "b": ("empty", lambda: [Empty()]),
    "c": ("always-on", lambda: [PerfCallback(verbose=0, max_windows=0)]),
    "d": ("default", lambda: [PerfCallback(verbose=0)]),
}


def fit(callbacks: list[pl.Callback], batches: int, epochs: int) -> dict[str, float]:
    """One fit's wall time and its parts (module docstring), in seconds."""
    model, start, end = _fit(callbacks, batches, epochs)
    intervals = [b - a for a, b in itertools.pairwise(model.starts)]
    median = statistics.median(intervals)
    return {
        "wall": end - start,
        "pre": model.starts[0] - start,
        "steps": median * len(intervals),
        "excess": sum(intervals) - median * len(intervals),
        "post": end - model.starts[-1],
        "median": median,
    }


def blocks(block: int, batches: int, epochs: int, parts: str = "all") -> tuple[float, float, float]:
    """What the per-batch work costs a step inside one fit (``--blocks``), in seconds: the median over each pair of
    blocks (one on, the next off) of their median steps' difference (the machine's drift and its bursts cancel
    within a pair), and the median step of all the on blocks and of all the off blocks. A step's interval is the
    block of the batch it ends at; each epoch's first two batches are left out."""
    if parts == "dispatch":
        model, _, _ = _fit([], batches, epochs, Dispatched(batches, block))
    elif parts == "whole":
        undispatched = Undispatched(batches, block)
        model, _, _ = _fit([undispatched.callback], batches, epochs, undispatched)
    else:
        model, _, _ = _fit([Alternating(block, parts)], batches, epochs)
    steps: dict[tuple[int, int], list[float]] = {}
    for i, (a, b) in enumerate(itertools.pairwise(model.starts)):
        epoch, index = divmod(i + 1, batches)
        if index >= 2:
            steps.setdefault((epoch, index // block), []).append(b - a)
    pairs = [
        statistics.median(on) - statistics.median(steps[(epoch, k + 1)])
        for (epoch, k), on in steps.items()
        if k % 2 == 0 and (epoch, k + 1) in steps
    ]
    on_steps = [t for (_, k), block_steps in steps.items() if k % 2 == 0 for t in block_steps]
    off_steps = [t for (_, k), block_steps in steps.items() if k % 2 == 1 for t in block_steps]
    return statistics.median(pairs), statistics.median(on_steps), statistics.median(off_steps)


def _fit(
    callbacks: list[pl.Callback], batches: int, epochs: int, model: StepTimed | None = None
) -> tuple[StepTimed, float, float]:
    trainer = pl.Trainer(
        default_root_dir=tempfile.mkdtemp(prefix="short_steps_"),
        max_epochs=epochs,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    model = model or StepTimed(batches)
    start = time.perf_counter()
    trainer.fit(model)
    return model, start, time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds of the configurations (default: 4)")
    parser.add_argument("--batches", type=int, default=3072, help="batches per epoch (default: 3072)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per fit (default: 3)")
    parser.add_argument("--configs", default="abcd", help="which configurations (default: abcd; a is needed)")
    parser.add_argument("--blocks", type=int, default=0, help="time the batch hooks alone, on and off every N batches")
    parser.add_argument(
        "--parts", choices=("all", "batch", "marks", "dispatch", "whole"), default="all", help="what --blocks turns off"
    )
    parser.add_argument("--hooks", action="store_true", help="time each per-batch hook's own work inside fits")
    parser.add_argument("--calls", action="store_true", help="count the Python calls a training batch makes")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    if args.hooks:
        for _ in range(args.rounds):
            callback = HookTimed()
            _fit([callback], args.batches, args.epochs)
            medians = {name[3:]: statistics.median(spent) * 1e6 for name, spent in callback.spent.items() if spent}
            each = " ".join(f"{name} {us:.1f}" for name, us in medians.items())
            print(f"the hooks' own median time, us a batch: {each}; sum {sum(medians.values()):.1f}")
        return
    if args.calls:
        counted = calls(args.batches)
        bare = counted["bare"].calls.total() / counted["bare"].counted
        print("Python calls a training batch (20 batches of a fit, sys.setprofile):")
        for name, model in counted.items():
            each = model.calls.total() / model.counted
            print(f"  {name:<10} {each:7.1f}  ({each - bare:+.1f} on bare)")
        ours = counted["always-on"]
        print("  the callback's own (lightning_perf), a batch:")
        for where, n in ours.calls.most_common():
            if "lightning_perf/" in where:
                print(f"    {n / ours.counted:5.1f} {where.rsplit('lightning_perf/', 1)[-1]}")
        return
    if args.blocks:
        fits = [blocks(args.blocks, args.batches, args.epochs, args.parts) for _ in range(args.rounds)]
        print(f"the per-batch work ({args.parts}), on and off every {args.blocks} batches (one line a fit):")
        for cost, on, off in fits:
            print(
                f"  {cost * 1e6:5.1f} us a step (median of the pairs' differences); median step {on * 1e6:.0f} us on,"
                f" {off * 1e6:.0f} us off; {cost / off:+.1%} of the off blocks' step"
            )
        return
    keys = ["a", *[k for k in args.configs if k != "a" and k in CONFIGS]]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in keys}
    for r in range(args.rounds):
        for k in keys if r % 2 == 0 else keys[::-1]:
            runs[k].append(fit(CONFIGS[k][1](), args.batches, args.epochs))

    def med(k: str, part: str) -> float:
        return statistics.median(run[part] for run in runs[k])

    bare = med("a", "wall")
    print(f"{args.rounds} rounds of {args.epochs} epochs x {args.batches} batches (medians over the rounds)")
    print(f"{'':<10} {'wall':>7} {'ratio':>6} {'step':>8} {'pre':>6} {'steps':>7} {'excess':>7} {'post':>6}")
    for k in keys:
        print(
            f"{CONFIGS[k][0]:<10} {med(k, 'wall'):6.2f}s {med(k, 'wall') / bare:6.3f} {med(k, 'median') * 1e6:6.0f}us"
            f" {med(k, 'pre') * 1e3:4.0f}ms {med(k, 'steps'):6.2f}s {med(k, 'excess') * 1e3:5.0f}ms"
            f" {med(k, 'post') * 1e3:4.0f}ms   walls {[round(run['wall'], 2) for run in runs[k]]}"
        )


if __name__ == "__main__":
    main()
