"""
Analysing a directory of many ranks
===================================

How long ``lightning-perf analyze DIR`` takes on a directory of N ranks' traces, serially and with ``--jobs``,
next to Holistic Trace Analysis parsing the same directory (``TraceAnalysis(trace_dir=DIR)``, which reads every
rank's trace, in parallel processes of its own), timed in one run.

The directory is built from one of the shared real traces (default: ``sampled_128rank_rank0.json.gz`` and
``sampled_128rank_rank1.json.gz`` of ``../shared/fixtures/gpu-traces``, two ranks of a 128-rank job), copied N
times with each copy's ``distributedInfo.rank`` set to its own rank (``rank<N>.json.gz``), so that both tools
see N distinct ranks of one run.

The two do not do the same work: ``analyze`` summarizes each trace, runs the trace rules, the collectives
table and the cross-rank table; HTA only parses into its dataframes (what its user waits for before any of
its analyses). Each is timed as a fresh process (``python -m lightning_perf analyze``, ``python -c`` for
HTA), what a user waits for, imports included.

Run it from the repository root::

    python benchmarks/analyze_ranks.py                       # 128 ranks; jobs 1 and 2; HTA where importable
    python benchmarks/analyze_ranks.py --ranks 32 --jobs 1 2 4 --repeat 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "gpu-traces"
SOURCES = ("sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz")


def build(directory: Path, ranks: int, sources: list[Path]) -> None:
    """``ranks`` traces in ``directory``, copies of ``sources`` in turn, each with its own rank."""
    traces = [json.loads(gzip.decompress(path.read_bytes())) for path in sources]
    for rank in range(ranks):
        trace = traces[rank % len(traces)]
        trace["distributedInfo"] = {**trace.get("distributedInfo", {}), "rank": rank, "world_size": ranks}
        (directory / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode(), compresslevel=1))


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=128)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-hta", action="store_true")
    args = parser.parse_args()
    sources = [FIXTURES / name for name in SOURCES]
    if not all(path.exists() for path in sources):
        sys.exit(f"the shared traces are not at {FIXTURES}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "ranks"
        directory.mkdir()
        build(directory, args.ranks, sources)
        size = sum(p.stat().st_size for p in directory.iterdir())
        print(f"{args.ranks} ranks, {size / 2**20:.1f} MiB gzipped, on {os.cpu_count()} CPUs; median of {args.repeat}")
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for jobs in args.jobs:
                command = [sys.executable, "-m", "lightning_perf", "analyze", str(directory), "--jobs", str(jobs)]
                runs.setdefault(f"lightning-perf analyze --jobs {jobs}", []).append(timed(command))
            if not args.no_hta:
                hta = f"from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir={str(directory)!r})"
                try:
                    runs.setdefault("HTA TraceAnalysis (parse)", []).append(timed([sys.executable, "-c", hta]))
                except subprocess.CalledProcessError:
                    print("HTA could not parse the directory (is it installed?)")
                    args.no_hta = True
        for name, seconds in runs.items():
            print(f"  {name:36s} {statistics.median(seconds):6.2f} s  ({min(seconds):.2f}..{max(seconds):.2f})")


if __name__ == "__main__":
    main()
