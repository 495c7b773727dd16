"""A real two-process run for tests/test_distributed.py: ``python ddp_script.py ROOT STRATEGY SCENARIO``.

Scenarios: ``plain``; ``straggler`` (rank 1 sleeps 20 ms every step); ``communication`` (large parameters,
tiny compute: the gradient all-reduce dominates); ``raises`` (rank 1 raises in its third step). Prints one
``RESULT {...}`` JSON line per rank.
"""

import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning_perf import PerfCallback  # noqa: E402
from models import TinyModel, trainer  # noqa: E402


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
        return loss


def main() -> None:
    root, strategy, scenario = sys.argv[1:4]
    torch.set_num_threads(1)
    callback = PerfCallback(schedule={"skip_first": 2, "warmup": 1, "active": 2}, stages=["train"])
    t = trainer(root, [callback], strategy=strategy, devices=2, max_epochs=2, log_every_n_steps=4)
    t.fit(Scenario(scenario))
    result = {
        "rank": t.global_rank,
        "windows": [w.trace_path for w in callback.windows],
        "findings": [[f.id, f.severity, f.title, f.evidence] for f in callback.findings],
        "dirpath": callback.dirpath,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
