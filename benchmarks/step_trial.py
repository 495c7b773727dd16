"""
What a step trial measures, against applying its advice
=======================================================

The thread count (``cpu_threads``, ``cpu_contention``) and the precision (``precision``) are tried on one real
step of a copy of the module (issue 48: :mod:`lightning_perf.collect.thread_trial`,
:mod:`lightning_perf.collect.precision_trial`). This benchmark compares each trial's ratio (a step's time, current
over advised) with what applying the setting does to the training's median step.

In each round, for each case: one fit at the case's torch threads (1; ``sleepy``: 2) in fp32 whose first training
epoch's end runs both trials (``torch.set_num_threads`` to the other count, and autocast to bfloat16 on the CPU);
then fits without trials, the setting applied or not, in an order that alternates between rounds: the threads
now in fp32, the other count in fp32, the threads now with ``precision="bf16-mixed"``. A step is the time from one
``on_train_batch_start`` to the next in the same epoch, the first 2 of each epoch left out
(``downstream_libraries.StepTimer``).

Cases: ``wide`` (``tests/callback/test_step_trial_fit.py``'s 4-layer 1024-wide MLP with dropout over a shuffled,
augmented dataset), ``sleepy`` (``tests/models.py``'s TinyModel, 3 layers of 256, over a dataset sleeping 5 ms a
sample, in the training process: ``cpu_contention``'s case, from 2 threads to 1), and the public libraries of
``benchmarks/downstream_libraries.py`` that are installed: ``transformers`` (a tiny BERT), ``pyg`` (a GCN over
torch_geometric batches), ``forecasting`` (pytorch-forecasting's TemporalFusionTransformer).

Run it from the repository root::

    python benchmarks/step_trial.py --rounds 2          # a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys
import tempfile
import warnings
from typing import Any

import lightning
import lightning.pytorch as pl
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "callback")]
from downstream_libraries import CASES, MODULES, Case, StepTimer  # noqa: E402
from lightning_perf.collect.precision_trial import try_precision  # noqa: E402
from lightning_perf.collect.run_info import first_dataloader  # noqa: E402
from lightning_perf.collect.thread_trial import try_threads  # noqa: E402
from lightning_perf.trial_records import AdviceTrial  # noqa: E402


def wide_case() -> Case:
    from test_step_trial_fit import Wide

    def build() -> tuple[pl.LightningModule, Any, Any]:
        model = Wide()
        return model, model.train_dataloader(), None

    return Case("wide", "torch", build, lambda b: int(b[0].shape[0]), epochs=2, trainer_kwargs={"limit_val_batches": 0})


def sleepy_case() -> Case:
    from models import TinyModel

    def build() -> tuple[pl.LightningModule, Any, Any]:
        model = TinyModel(n=96, batch_size=4, sleep_s=0.005, width=256, depth=3)
        return model, model.train_dataloader(), None

    limits = {"limit_val_batches": 0}
    return Case("sleepy", "torch", build, lambda b: int(b[0].shape[0]), epochs=2, trainer_kwargs=limits)


#: Each case's thread counts: the run's own, and the one tried and applied. ``sleepy`` is cpu_contention's case.
THREADS = {"sleepy": (2, 1)}


class Trials(pl.Callback):
    """Both step trials at the first training epoch's end."""

    def __init__(self, threads: int = 2) -> None:
        self.records: dict[str, AdviceTrial] = {}
        self.threads = threads

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.records:
            return
        loader = first_dataloader(trainer.train_dataloader)
        self.records["threads"] = try_threads(
            trainer, loader, self.threads, rule="cpu_threads", written=f"torch.set_num_threads({self.threads})", epoch=0
        )
        self.records["bf16"] = try_precision(
            trainer, loader, "bfloat16", rule="precision", written='precision="bf16-mixed"', epoch=0
        )


def fit(case: Case, threads: int, precision: str, trials: Trials | None = None) -> float:
    """The fit's median step (seconds)."""
    lightning.seed_everything(0, verbose=False)
    model, train, val = case.build()
    timer = StepTimer()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = pl.Trainer(
                default_root_dir=root,
                accelerator="cpu",
                devices=1,
                max_epochs=case.epochs,
                precision=precision,
                callbacks=[timer, *([trials] if trials is not None else [])],
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
                logger=False,
                **{"limit_val_batches": 0, **case.trainer_kwargs},
            )
            trainer.fit(model, train, val)
    finally:
        torch.set_num_threads(before)
    return statistics.median(timer.steps(set()))


def _times(trial: AdviceTrial) -> str:
    if trial.untried is not None or trial.ratio is None:
        return f"untried ({trial.untried})"
    low, high = trial.spread or (trial.ratio, trial.ratio)
    return (
        f"{trial.ratio:5.2f}x ({low:.2f}-{high:.2f}; {trial.current * 1e3:.1f} -> {trial.advised * 1e3:.1f} ms,"
        f" cost {trial.seconds:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", nargs="*", default=["wide", "sleepy", *CASES])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, lightning {lightning.__version__}, {torch.get_num_threads()} threads by default")
    for name in args.cases:
        if name in MODULES and importlib.util.find_spec(MODULES[name]) is None:
            print(f"{name}: not installed, skipped")
            continue
        case = {"wide": wide_case, "sleepy": sleepy_case, **CASES}[name]()
        now, advised = THREADS.get(name, (1, 2))
        settings = [(now, "32-true"), (advised, "32-true"), (now, "bf16-mixed")]
        for r in range(args.rounds):
            trials = Trials(advised)
            fit(case, now, "32-true", trials)
            steps: dict[tuple[int, str], float | None] = {}
            for threads, precision in settings if r % 2 == 0 else list(reversed(settings)):
                try:
                    steps[(threads, precision)] = fit(case, threads, precision)
                except RuntimeError as err:  # e.g. an LSTM oneDNN has no bf16 kernel for on this CPU
                    steps[(threads, precision)] = None
                    print(f"{name}: {threads} threads, {precision} failed: {str(err).splitlines()[0]}")
            base = steps[(now, "32-true")]
            pairs = (
                (f"threads {now} -> {advised}", "threads", (advised, "32-true")),
                ("bf16", "bf16", (now, "bf16-mixed")),
            )
            for label, key, setting in pairs:
                other = steps[setting]
                applied = (
                    f"{base / other:.2f}x ({base * 1e3:.1f} -> {other * 1e3:.1f} ms a step)"
                    if base and other
                    else "failed"
                )
                print(f"{name} round {r}: {label} trial {_times(trials.records[key])}; applied {applied}", flush=True)


if __name__ == "__main__":
    main()
