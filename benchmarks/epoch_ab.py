"""
Two versions of PerfCallback, in blocks inside one fit
======================================================

Whether a change made a run of short epochs cheaper, measured so that the machine's drift cancels: one fit of
``epoch_blocks.py``'s shape (one training and one validation batch an epoch, a new user's Trainer) in which a
callback puts in ``trainer.callbacks``, every ``--block`` epochs in turn, nothing, ``PerfCallback()`` of the
revision ``--against`` (a copy of its package, imported under another name), and ``PerfCallback()`` of this
working tree, in the order off, against, this, off, this, against (so that neither always follows the other).
Fits compared one after another on this project's 2-CPU machine move by 10-30%; two blocks of one fit a few
hundred milliseconds apart move by far less. Each fit prints what each version costs over the "off" block of its
triple, the difference between the two (the median of the triples' differences, and their mean), and each
version's hooks (the median calls summed, timed on the instance as ``epoch_blocks.py`` does).

Both versions are set up by the Trainer (each with its own output directory) and each misses the epochs of the
other's blocks; their paced work (the groups' measurement, the scalars) spends a share of the wall time that all
the blocks count, as in ``epoch_blocks.py``, alike for both. The noise of one fit's difference is about 0.15 ms an
epoch here (a fit of the same code against itself: -0.04 to +0.19 ms); run several.

Run it from the repository root::

    python benchmarks/epoch_ab.py --against HEAD --rounds 3   # about 50 s a round
    python benchmarks/epoch_ab.py --against f58c8c0 --no-checkpoint
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import pathlib
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import warnings
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from epoch_blocks import SKIP_EPOCHS, Rotate, Tiny, new_users_trainer, timed_hooks  # a script beside it
from lightning_perf import PerfCallback

ORDER = (0, 1, 2, 0, 2, 1)  # each triple's blocks: 0 off, 1 the revision against, 2 this working tree
COPY = "lightning_perf_against"


def package_at(revision: str) -> type[Callback]:
    """``PerfCallback`` of the package as ``revision`` has it: extracted to a temporary directory and imported as
    :data:`COPY` (its own imports renamed)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="epoch_ab_"))
    archive = subprocess.run(["git", "archive", revision, "lightning_perf"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    (root / "lightning_perf").rename(root / COPY)
    for path in (root / COPY).rglob("*.py"):
        path.write_text(re.sub(r"\blightning_perf\b", COPY, path.read_text(encoding="utf-8")), encoding="utf-8")
    sys.path.insert(0, str(root))
    return importlib.import_module(COPY).PerfCallback  # type: ignore[no-any-return]


def one_fit(against: type[Callback], epochs: int, block: int, *, checkpoint: bool) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="epoch_ab_fit_")
    versions = [against(dirpath=f"{root}/against"), PerfCallback(dirpath=f"{root}/this")]
    hooks = [timed_hooks(v) for v in versions]
    rotate = Rotate([None, *versions], block, order=ORDER, first=(1, 2))
    trainer = new_users_trainer([rotate, *versions], epochs, checkpoint=checkpoint, root=root)  # both set up
    empty_cache = torch.cuda.empty_cache  # each version wraps it; the one out of the callbacks at the end stays
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(Tiny(1, 1))
    torch.cuda.empty_cache = empty_cache
    lengths = [b - a for a, b in zip(rotate.starts, rotate.starts[1:], strict=False)][SKIP_EPOCHS:]
    blocks = [lengths[i : i + block] for i in range(0, len(lengths) - block + 1, block)]
    triples = []
    for k in range(0, len(blocks) - 2, 3):
        means = {ORDER[(k + j) % len(ORDER)]: statistics.mean(blocks[k + j]) for j in range(3)}
        triples.append((means[0], means[1], means[2]))
    if not triples:
        raise SystemExit(f"no whole triple of blocks in {epochs} epochs of blocks of {block}: raise --epochs")
    differences = [this - old for _, old, this in triples]
    return {
        "triples": len(triples),
        "off": statistics.median(off for off, _, _ in triples),
        "against": statistics.median(old - off for off, old, _ in triples),
        "this": statistics.median(this - off for off, _, this in triples),
        "difference": statistics.median(differences),
        "mean": statistics.mean(differences),
        "hooks": [
            sum(statistics.median(kept[SKIP_EPOCHS // 2 :]) for kept in h.values() if len(kept) > SKIP_EPOCHS)
            for h in hooks
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="two versions of PerfCallback in alternate blocks of one fit")
    parser.add_argument("--against", default="HEAD", help="the git revision to compare this working tree with")
    parser.add_argument("--epochs", type=int, default=3000)
    parser.add_argument("--block", type=int, default=10, help="epochs in each block")
    parser.add_argument("--rounds", type=int, default=1, help="fits, one line each")
    parser.add_argument("--no-checkpoint", action="store_true", help="Trainer(enable_checkpointing=False)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    against = package_at(args.against)
    print(f"{args.epochs} epochs in blocks of {args.block}: off, {args.against}, this working tree")
    for _ in range(args.rounds):
        r = one_fit(against, args.epochs, args.block, checkpoint=not args.no_checkpoint)
        print(
            f"{r['triples']} triples; off epoch {r['off'] * 1e3:.2f} ms; extra {args.against}"
            f" {r['against'] * 1e3:.3f} ms, this {r['this'] * 1e3:.3f} ms; this - {args.against}"
            f" {r['difference'] * 1e3:+.3f} ms (mean {r['mean'] * 1e3:+.3f}); hooks {r['hooks'][0] * 1e3:.3f}"
            f" and {r['hooks'][1] * 1e3:.3f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
