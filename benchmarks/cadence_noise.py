"""
How often a cadence is named from noise, and how often a real one is found
==========================================================================

``step_time_unstable`` names a period ("stalls every N batches") from
:func:`lightning_perf.diagnose.cadence.cadence`. This benchmark measures its two errors on hand-built step times:

- **Noise named a cadence**: 3,600 series of 32-200 steps of 10 ms, with random stalls of 5-30 ms on 5-45% of
  them and a relative jitter of 0, 5% or 20%. Nothing in them is periodic; each cadence found is a false one.
- **A real cadence missed**: a stall of 60 ms every 10th step of 130 ms (under 1.5x the step: no spike, no
  spread), over 60 or 80 steps, beside random delays of up to 50 ms on 5-50% of the steps and 10-100 ms on 3%
  (a busy machine); 60 series each.

Pure Python, no torch. Run it from the repository root::

    python benchmarks/cadence_noise.py        # about 20 s on one core
"""

from __future__ import annotations

import random
import time

from lightning_perf.diagnose.cadence import cadence

MIN_EXCESS = 1e-3  # rules_unstable.CADENCE_MIN_EXCESS


def noise(n: int, q: float, jitter: float, seed: int) -> list[float]:
    rng = random.Random(seed * 1000 + n)
    return [0.01 * (1 + rng.gauss(0, jitter)) + (rng.uniform(0.005, 0.03) if rng.random() < q else 0) for _ in range(n)]


def tenth_stall(n: int, busy: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [
        0.13
        + (0.06 if i % 10 == 9 else 0.0)
        + (rng.uniform(0.0, 0.05) if rng.random() < busy else 0.0)
        + (rng.uniform(0.01, 0.1) if rng.random() < 0.03 else 0.0)
        for i in range(n)
    ]


def main() -> None:
    start = time.perf_counter()
    false = [
        (n, q, jitter, seed, found.every)
        for n in (32, 48, 64, 120, 200)
        for q in (0.05, 0.2, 0.3, 0.45)
        for jitter in (0.0, 0.05, 0.2)
        for seed in range(60)
        if (found := cadence(noise(n, q, jitter, seed), MIN_EXCESS)) is not None
    ]
    print(f"noise: {len(false)} cadences named in 3600 series {false}")
    for n in (60, 80):
        found = {}
        for busy in (0.05, 0.1, 0.3, 0.5):
            hits = [cadence(tenth_stall(n, busy, seed), MIN_EXCESS) for seed in range(60)]
            found[busy] = sum(c is not None and c.every == 10 for c in hits)
        print(f"60 ms every 10th of {n} steps: found in {found} of 60 series (by share of steps delayed)")
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
