"""
Training's threads beside one busy process
==========================================

Why :mod:`lightning_perf.collect.threads` lowers torch's thread count while a window is processed: a training
step of :mod:`forecaster` (its 30 batches, median), alone and beside one process that keeps a CPU busy (as the
window process does), with torch's threads at one per usable CPU and at one fewer. Run it from the repository
root::

    python benchmarks/threads_beside.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from forecaster import Forecaster, loaders
from lightning_perf.collect.threads import usable_cpus


def main() -> None:
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

    median_step_ms()  # first calls out of the way
    cpus = usable_cpus()
    for threads in (cpus, max(cpus - 1, 1)):
        torch.set_num_threads(threads)
        alone = median_step_ms()
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.2)
            beside = median_step_ms()
        finally:
            busy.kill()
        print(f"{threads} thread(s) on {cpus} CPU(s): step {alone:.1f} ms alone, {beside:.1f} ms beside a busy process")


if __name__ == "__main__":
    main()
