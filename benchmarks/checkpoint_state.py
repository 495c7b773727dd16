"""
What the callback's state adds to a checkpoint
==============================================

Lightning's default ``ModelCheckpoint`` saves every callback's ``state_dict`` at every epoch end, so that a run
of short epochs pays for ours at each one: building it, and ``torch.save`` pickling it (object by object,
through a Python ``persistent_id`` call each) and writing it.

A fit of ``--epochs`` epochs of one training and one validation batch (the tiny MLP of ``short_epochs.py``)
with ``PerfCallback()`` fills the state as a run does (its windows, the records its report lacks). Then, in
alternate blocks of ``--saves`` each, the model's checkpoint is saved to a file with our state (built anew each
time) and without it.

Run it from the repository root (``PYTHONPATH=.``: the checkout's package, not an installed one)::

    PYTHONPATH=. python benchmarks/checkpoint_state.py              # 200 epochs, 3 rounds of 2000 saves

Reading the output: per round, a save's mean time with and without our state, and the difference, what our
state costs each checkpoint; the state's size in characters.

Figures (CHANGELOG, state version 4): on the project's 2-core machine, two runs of the defaults each, 0.1-0.3 ms
a checkpoint for version 3 (a JSON text per history epoch, a dict per window), 0.06-0.19 ms for version 4 (one
text). Version 5 holds no history the report on disk has: 1,514 characters after this fit (version 4: about
50,000), within the noise of a save here (-0.22 to 0.11 ms, one run).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import lightning.pytorch as pl
import torch

from lightning_perf import PerfCallback
from short_epochs import Tiny  # a script beside it: its directory is on sys.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--saves", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        perf = PerfCallback()
        trainer = pl.Trainer(
            default_root_dir=tmp,
            max_epochs=args.epochs,
            callbacks=[perf],
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Tiny(1, 1))
        model, path = trainer.lightning_module.state_dict(), os.path.join(tmp, "saved.ckpt")
        print(f"state: {len(str(perf.state_dict()))} characters, {len(perf.windows)} windows")

        def saves(ours: bool) -> float:
            started = time.perf_counter()
            for _ in range(args.saves):
                callbacks = {perf.state_key: perf.state_dict()} if ours else {}
                torch.save({"state_dict": model, "callbacks": callbacks}, path)
            return (time.perf_counter() - started) / args.saves

        for round_ in range(args.rounds):
            with_ours, without = saves(True), saves(False)
            print(
                f"round {round_}: with our state {with_ours * 1e3:.3f} ms a save, without {without * 1e3:.3f} ms,"
                f" ours {(with_ours - without) * 1e3:.3f} ms"
            )


if __name__ == "__main__":
    main()
