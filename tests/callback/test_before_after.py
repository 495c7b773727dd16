"""The before/after example (examples/before_after) end to end: both configurations for real, then
``lightning-perf compare`` on them."""

import importlib.util
import json
from pathlib import Path

import pytest

from busy import QUIET_CPUS, others_cpus
from lightning_perf.cli import main

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "before_after" / "train.py"

pytestmark = pytest.mark.slow

RUNS = ("before", "after")


@pytest.fixture
def example(one_thread, monkeypatch):
    """The example's ``main``, run in this process (a subprocess each would import Lightning again: 8 s a run
    here). Its ``seed_everything`` sets environment variables, which the fixture restores."""
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # (monkeypatch puts back what was there before)
        monkeypatch.delenv(name, raising=False)
    spec = importlib.util.spec_from_file_location("before_after_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _run(example, config: str, root: Path, capsys) -> Path:
    example(["--config", config, "--root", str(root), "--epochs", "2"])
    out = capsys.readouterr().out
    return Path(out.strip().splitlines()[-1].removeprefix("Run directory: "))


def test_the_fixes_remove_the_findings_and_compare_shows_the_gain(example, tmp_path, capsys):
    runs: dict[str, Path] = {}
    others = {
        config: others_cpus(lambda c=config: runs.setdefault(c, _run(example, c, tmp_path, capsys))) for config in RUNS
    }
    before, after = runs["before"], runs["after"]
    assert main(["compare", str(before), str(after), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["metrics"]["data wait"]["change"].endswith("(better)")  # a share within each run: any load
    # Throughput compares two runs one after the other: another program's load that comes and goes between them
    # can hide the gain (+3.1%, "same", beside a load of about 10 on 2 CPUs), so a busy machine skips that part.
    throughput = result["metrics"]["throughput"]["change"]
    if not throughput.endswith("(better)") and max(others.values()) > QUIET_CPUS:
        pytest.skip(f"throughput {throughput} while other programs used {others} CPUs: a busy machine")
    assert throughput.endswith("(better)"), others
    assert not result["findings"]["new"]
    # The data-wait share of "before" sits near the 30% line between warning and critical on a 2-core
    # machine (33% when examples/before_after/README.md was written, under 30% on a loaded CI runner), so the
    # severity is not asserted: the finding fires on every training epoch before and the share falls by more than
    # half.
    shares = {}
    for name, run in (("before", before), ("after", after)):
        report = json.loads(next(run.rglob("perf_report.json")).read_text())
        epochs = report["stages"]["train"]["epochs"]
        if name == "before":
            assert all("dataloader_bound" in {f["id"] for f in e["findings"]} for e in epochs)
        shares[name] = sum(e["data_wait_fraction"] for e in epochs) / len(epochs)
    assert shares["after"] < shares["before"] / 2, shares
