"""
PerfCallback's cost per epoch, in blocks inside one fit
=======================================================

What :class:`~lightning_perf.PerfCallback` costs each epoch of a run of short epochs, measured so that the
machine's drift cancels. This project's 2-CPU machine drifts by 10-30% over seconds (bare fits of one shape
took 3.4-5.1 s on one day): fits compared one after another cannot tell 1.03x from 1.08x. Here one fit runs
``--epochs`` epochs of ``short_epochs.Tiny`` with a new user's Trainer (one training and one validation batch
per epoch, TensorBoard, a checkpoint at every epoch, the default progress bar), and a callback ahead of
``PerfCallback()`` takes it out of ``trainer.callbacks`` at a training epoch's start and puts it back, every
``--block`` epochs. Each "on" block is compared with the "off" block right after it, a fraction of a second
later.

What the comparison holds: PerfCallback's hooks and its checkpoint state at every epoch, and what they make
others do (Lightning's dispatch of its hooks, the logger's events, the checkpoint's size). Not: what it installs
for the whole fit (its loop timers, the compile watch: on in both blocks) and its costs at the fit's start and
end, which a run of seconds spreads.

Paced work (the per-batch scalars, the epochs' measurement and findings, the report file's rewrites,
``hooks/log_pace.py`` and ``GROUP_SECONDS``) spends a share of the run's *wall time*, which both blocks count
while only the "on" blocks do the work: those pay about twice its share. PerfCallback's hooks are timed too (a
wrapper on the instance, about 1 us a call); their calls of 1 ms or more are that paced work, so the output
gives the extra as measured and with half of that work taken off (the extra at its share).

Run it from the repository root::

    python benchmarks/epoch_blocks.py                       # 3000 epochs in blocks of 10: about 40 s
    python benchmarks/epoch_blocks.py --quick               # 600 epochs in blocks of 5: a smoke run
    python benchmarks/epoch_blocks.py --no-checkpoint       # epochs of half the time: no checkpoint in them
    python benchmarks/epoch_blocks.py --baseline silent     # its hooks doing nothing: Lightning's dispatch of them
    python benchmarks/epoch_blocks.py --baseline empty      # an empty Callback on and off
    python benchmarks/epoch_blocks.py --whole --epochs 1000 # one fit with it throughout: its own share of the fit
    OMP_NUM_THREADS=1 python benchmarks/epoch_blocks.py --rounds 2

Reading the output, one line per fit: ``on/off`` is the median over block pairs of the mean epoch's ratio (its
quartiles after it), ``extra`` the median pair's difference in ms per epoch, ``paced`` the hooks' calls of 1 ms
or more per "on" epoch, ``at its share`` the extra less half of that, and ``hooks`` the median calls summed (what
an epoch with no paced work spends in PerfCallback). With ``--whole``: the fit's wall time, the callback's own time
in it (its share), and of that its setup and first 100 epochs (the measurement's burst, the first windows) and its
end (teardown: the last measurement, report and page), which the blocks leave out.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_perf import PerfCallback
from short_epochs import Tiny  # a script beside it: its directory is on sys.path

SKIP_EPOCHS = 100  # the first epochs (the measurement's burst, the first windows) are on and left out
PACED_SECONDS = 1e-3  # a hook call this long is paced work (a group's measurement, findings, report)


class Rotate(Callback):
    """Puts one of ``callbacks`` (``None``: none) in ``trainer.callbacks`` at each training epoch's start, right
    after itself: in the first :data:`SKIP_EPOCHS` epochs those of ``first`` in turn (equal shares), then by blocks
    of ``block`` epochs in ``order``; notes each epoch's start time and which ran in it."""

    def __init__(
        self, callbacks: list[Callback | None], block: int, *, order: tuple[int, ...], first: tuple[int, ...]
    ) -> None:
        self.callbacks, self.block, self.order, self.first = callbacks, block, order, first
        self.starts: list[float] = []
        self.which: list[int] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.starts.append(time.perf_counter())
        epoch = trainer.current_epoch
        if epoch < SKIP_EPOCHS:
            which = self.first[epoch * len(self.first) // SKIP_EPOCHS]
        else:
            which = self.order[((epoch - SKIP_EPOCHS) // self.block) % len(self.order)]
        self.which.append(which)
        present = trainer.callbacks
        for i, callback in enumerate(self.callbacks):
            if callback is None:
                continue
            if i == which and callback not in present:
                present.insert(present.index(self) + 1, callback)  # run in this dispatch, right after us
            elif i != which and callback in present:
                present.remove(callback)


def new_users_trainer(
    callbacks: list[Callback], epochs: int, *, checkpoint: bool, root: str | None = None
) -> pl.Trainer:
    """A new user's Trainer (TensorBoard, the default progress bar, a checkpoint each epoch unless not
    ``checkpoint``), no model summary."""
    return pl.Trainer(
        default_root_dir=root or tempfile.mkdtemp(prefix="epoch_blocks_"),
        max_epochs=epochs,
        callbacks=callbacks,
        enable_model_summary=False,
        enable_checkpointing=checkpoint,
    )


def timed_hooks(callback: Callback, *, call_ends: bool = False) -> dict[str, list[float]]:
    """Wraps every hook Lightning may call on ``callback`` (and its ``state_dict``; ``call_ends``: its ``setup`` and
    ``teardown`` too) on the instance; returns the seconds of each call, by hook, in call order."""
    seconds: dict[str, list[float]] = defaultdict(list)
    for name in dir(Callback):
        if name.startswith("on_") or name == "state_dict" or (call_ends and name in ("setup", "teardown")):
            method = getattr(callback, name)

            @functools.wraps(method)
            def timed(*args: Any, _method: Any = method, _kept: list[float] = seconds[name], **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _method(*args, **kwargs)
                finally:
                    _kept.append(time.perf_counter() - start)

            setattr(callback, name, timed)
    return seconds


class Silent(PerfCallback):
    """``PerfCallback()`` set up as usual, with every hook and ``state_dict`` doing nothing (``--baseline silent``):
    what Lightning's dispatch of its hooks costs."""

    def state_dict(self) -> dict[str, Any]:
        return {}


for _hook in [name for name in dir(Callback) if name.startswith("on_") and name != "on_exception"]:
    setattr(Silent, _hook, lambda self, *args, **kwargs: None)

BASELINES: dict[str, type[Callback]] = {"perf": PerfCallback, "silent": Silent, "empty": Callback}


def one_fit(epochs: int, block: int, *, checkpoint: bool = True, kind: str = "perf") -> dict[str, float]:
    perf = BASELINES[kind]()
    hook_seconds = timed_hooks(perf)
    alternate = Rotate([None, perf], block, order=(1, 0), first=(1,))  # on and off; on in the first epochs
    trainer = new_users_trainer([alternate, perf], epochs, checkpoint=checkpoint)
    with contextlib.redirect_stdout(io.StringIO()):  # the progress bar and the console lines
        trainer.fit(Tiny(1, 1))
    lengths = [b - a for a, b in zip(alternate.starts, alternate.starts[1:], strict=False)]
    blocks: dict[int, list[float]] = defaultdict(list)  # "on" blocks are the even ones
    for i, length in enumerate(lengths[SKIP_EPOCHS:]):
        blocks[i // block].append(length)
    whole = {k: kept for k, kept in blocks.items() if len(kept) == block}
    pairs = [  # each "on" block with the "off" block after it
        (statistics.mean(whole[k]), statistics.mean(whole[k + 1])) for k in whole if k % 2 == 0 and k + 1 in whole
    ]
    if not pairs:
        raise SystemExit(f"no whole block pair in {epochs} epochs of blocks of {block}: raise --epochs")
    ratios = sorted(on / off for on, off in pairs)
    on_epochs = sum(which == 1 for which in alternate.which[SKIP_EPOCHS:])
    calls = [(name, s) for name, kept in hook_seconds.items() for s in kept]
    paced = sum(s for _, s in calls if s >= PACED_SECONDS)
    typical = sum(statistics.median(kept) for kept in hook_seconds.values() if len(kept) > SKIP_EPOCHS)
    extra = statistics.median(on - off for on, off in pairs)
    return {
        "pairs": len(pairs),
        "ratio": statistics.median(ratios),
        "q1": ratios[len(ratios) // 4],
        "q3": ratios[3 * len(ratios) // 4],
        "extra": extra,
        "off_epoch": statistics.median(off for _, off in pairs),
        "paced": paced / on_epochs,
        "hooks": typical,
    }


def whole_fit(epochs: int, *, checkpoint: bool = True) -> dict[str, float]:
    """One fit of ``epochs`` with ``PerfCallback()`` in it throughout: its own time (every hook, ``state_dict``,
    ``setup`` and ``teardown``, timed on the instance) against the fit's wall time, with what the first
    :data:`SKIP_EPOCHS` epochs and the end (``teardown``: the last measurement, report and page) took of it. What
    the blocks leave out: the measurement's burst at a run's start, the windows, the end. Lightning's dispatch of
    the hooks is not in it (``--baseline silent`` measures that)."""
    perf = PerfCallback()
    seconds = timed_hooks(perf, call_ends=True)
    trainer = new_users_trainer([perf], epochs, checkpoint=checkpoint)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(Tiny(1, 1))
    fit = time.perf_counter() - start
    end = sum(seconds.pop("teardown", []))
    first = sum(sum(kept[:SKIP_EPOCHS]) for kept in seconds.values())
    return {"fit": fit, "own": end + sum(sum(kept) for kept in seconds.values()), "first": first, "end": end}


def main() -> None:
    parser = argparse.ArgumentParser(description="PerfCallback's cost per epoch, on and off in blocks inside one fit")
    parser.add_argument("--epochs", type=int, default=3000)
    parser.add_argument("--block", type=int, default=10, help="epochs in each on and off block")
    parser.add_argument("--rounds", type=int, default=1, help="fits, one line each")
    parser.add_argument("--quick", action="store_true", help="600 epochs in blocks of 5")
    parser.add_argument("--no-checkpoint", action="store_true", help="Trainer(enable_checkpointing=False)")
    parser.add_argument(
        "--baseline",
        choices=sorted(BASELINES),
        default="perf",
        help="what goes on and off: PerfCallback() (perf), one whose hooks do nothing (silent), an empty Callback",
    )
    parser.add_argument("--whole", action="store_true", help="one fit with PerfCallback throughout: its own time")
    args = parser.parse_args()
    epochs, block = (600, 5) if args.quick else (args.epochs, args.block)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.whole:
        for _ in range(args.rounds):
            w = whole_fit(epochs, checkpoint=not args.no_checkpoint)
            print(
                f"{epochs} epochs in {w['fit']:.2f} s: PerfCallback's own time {w['own'] * 1e3:.1f} ms"
                f" ({w['own'] / w['fit']:.1%}); its first {SKIP_EPOCHS} epochs {w['first'] * 1e3:.1f} ms, the end"
                f" {w['end'] * 1e3:.1f} ms",
                flush=True,
            )
        return
    checkpoints = "no checkpoint" if args.no_checkpoint else "a checkpoint each"
    shape = f"one training and one validation batch ({checkpoints})"
    print(f"{epochs} epochs of {shape}, {BASELINES[args.baseline].__name__} on and off every {block}")
    for _ in range(args.rounds):
        r = one_fit(epochs, block, checkpoint=not args.no_checkpoint, kind=args.baseline)
        share = r["extra"] - r["paced"] / 2
        print(
            f"on/off {r['ratio']:.3f} ({r['q1']:.3f}-{r['q3']:.3f}, {r['pairs']:.0f} pairs);"
            f" extra {r['extra'] * 1e3:.3f} ms an epoch of {r['off_epoch'] * 1e3:.2f} ms;"
            f" paced {r['paced'] * 1e3:.3f} ms; at its share {share * 1e3:.3f} ms"
            f" ({share / r['off_epoch']:.1%}); hooks {r['hooks'] * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
