"""
Training beside the window process
==================================

What the window process costs training while it works: a training step of :mod:`forecaster` (its 30 batches,
median), alone, beside a process that keeps a CPU busy at the window process's priority (nice 19 and Linux's
``SCHED_IDLE``, :mod:`lightning_perf.hooks.window_process`), and beside one at normal priority (for scale). torch's
threads are left as they are: the callback never changes them, since a step on fewer threads gives other last
bits. Run it from the repository root::

    python benchmarks/window_process_beside.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from forecaster import Forecaster, loaders

IDLE_BUSY = (
    "import os\n"
    "os.nice(19)\n"
    "try: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "except (AttributeError, OSError): pass\n"
    "while True: pass\n"
)
NORMAL_BUSY = "while True: pass\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the three settings")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Forecaster()
    optimizer = model.configure_optimizers()
    batches = list(loaders()[0])

    def median_step_ms() -> float:
        times = []
        for batch in batches:
            start = time.perf_counter()
            loss = model._loss(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000

    def beside(code: str | None) -> float:
        if code is None:
            return median_step_ms()
        busy = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.2)
            return median_step_ms()
        finally:
            busy.kill()
            busy.wait()

    median_step_ms()  # first calls out of the way
    settings = {"alone": None, "beside an idle-priority process": IDLE_BUSY, "beside a normal process": NORMAL_BUSY}
    seen: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, code in settings.items():
            seen[name].append(beside(code))
    print(f"{torch.get_num_threads()} torch thread(s) on {os.cpu_count()} CPU(s), median step of 30 batches:")
    for name, values in seen.items():
        print(f"  {name}: {' / '.join(f'{v:.1f}' for v in values)} ms")


if __name__ == "__main__":
    main()
