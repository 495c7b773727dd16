"""The site's generated reference has text for every item, and its checks catch an item that loses it.

docs/reference.py generates the findings catalogue (rules and thresholds), the CLI's flags and the report's
fields; mkdocstrings renders the options from ``PerfCallback``'s docstring. Each check here is what
``make docs`` also fails on; the tests that delete one item's text show that the check sees it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import re
import sys
from typing import TypedDict

import pytest
from markdown_blocks import ROOT

from lightning_perf.callback import PerfCallback
from lightning_perf.diagnose import thresholds as thresholds_module
from lightning_perf.diagnose.registry import RULE_IDS
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.readers import load_report
from lightning_perf.report.findings import docs_section
from lightning_perf.run_record import LoaderInfo, RunInfo
from models import TinyModel, trainer

DOCS = ROOT / "docs"


def _load_reference():
    spec = importlib.util.spec_from_file_location("reference", DOCS / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference"] = module
    spec.loader.exec_module(module)
    return module


reference = _load_reference()


def test_every_option_has_its_args_entry() -> None:
    params = [name for name in inspect.signature(PerfCallback.__init__).parameters if name != "self"]
    documented = reference.doc_entries(PerfCallback.__doc__, "Args")
    missing = [name for name in params if not documented.get(name)]
    assert not missing, f"PerfCallback options without an Args: entry in its docstring: {missing}"
    assert not set(documented) - set(params), "Args: entries for options PerfCallback does not take"


def test_the_generated_reference_lacks_nothing() -> None:
    assert reference.problems(DOCS) == []


def test_every_rule_has_its_section_and_every_threshold_its_source() -> None:
    page = (DOCS / "findings.md").read_text()
    for rule_id in RULE_IDS:
        assert f"<!-- generated: rule {rule_id} -->" in page
        assert f"{{#{reference.section_anchor(rule_id, page)}}}" in page, f"{rule_id}'s section has no anchor"
    rows = {name for table in reference.threshold_rows().values() for name, *_ in table}
    assert rows == set(Thresholds.names())


def test_a_rule_without_its_docstring_is_reported() -> None:
    def undocumented_rule(ctx: object, thresholds: object) -> None:
        return None

    rules = {**reference.ALL_RULES, "undocumented_rule": undocumented_rule}
    page = (DOCS / "findings.md").read_text()
    assert reference.catalogue_problems(rules=rules, page=page) == [
        "rule undocumented_rule: its docstring has no summary line or no Notes: section",
        "rule undocumented_rule: docs/findings.md has no section for it (<!-- generated: rule ... -->)",
    ]


def test_a_rule_without_its_section_is_reported() -> None:
    page = (DOCS / "findings.md").read_text().replace("<!-- generated: rule host_sync -->", "")
    assert reference.catalogue_problems(page=page) == [
        "rule host_sync: docs/findings.md has no section for it (<!-- generated: rule ... -->)"
    ]


def test_a_threshold_without_its_meaning_is_reported() -> None:
    doc = "\n".join(
        line for line in inspect.cleandoc(Thresholds.__doc__ or "").splitlines() if "h2d_min_time:" not in line
    )
    assert reference.catalogue_problems(doc=doc) == ["threshold h2d_min_time: no entry in Thresholds' Args:"]


def test_a_threshold_without_its_source_is_reported() -> None:
    lines = inspect.getsource(thresholds_module).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# --- h2d_copy")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("H2D_COPY = "))
    source = "\n".join(lines[:start] + lines[end:])  # h2d_copy's comment deleted
    assert reference.catalogue_problems(source=source) == [
        "threshold h2d_copy: no comment above its constant in thresholds.py giving its source"
    ]


def test_a_flag_without_help_is_reported() -> None:
    parser = reference.build_parser()
    sub = reference._subcommands(parser)["compare"][1]
    sub.add_argument("--undocumented", action="store_true")
    assert reference.cli_problems(parser) == ["lightning-perf compare --undocumented: no help"]
    assert "`--fail-if-slower` `PCT`" in reference.cli_reference()
    assert "--precision" not in reference.cli_reference().split("lightning-perf compare")[1], "a suppressed flag"


def test_a_report_field_without_its_attributes_entry_is_reported() -> None:
    @dataclasses.dataclass
    class Record:
        """A record.

        Attributes:
            kept: Documented.
        """

        kept: int
        lost: int

    assert reference.schema_problems((Record,)) == ["Record.lost: no entry in its Attributes:"]


def test_the_run_objects_schema_holds_every_key_a_real_run_writes_and_no_other(tmp_path) -> None:
    # A fit whose FLOPs are counted at once (no budget), whose memory is measured, and whose data wait (20 ms a
    # sample) has its advised DataLoader setting tried: every key of "run" there.
    callback = PerfCallback(profile_budget=None, verbose=0)
    fit = trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=8, limit_val_batches=2)
    fit.fit(TinyModel(sleep_s=0.02))
    run = load_report(callback.report_path)["run"]
    assert set(run) == set(RunInfo.__annotations__)
    # (a stage that iterates no DataLoader has the iterable's two keys instead: tests/collect/test_loader.py)
    iterable = {"iterable_class", "iterable_library"}
    assert set(run["dataloaders"]["train"]) == set(LoaderInfo.__annotations__) - iterable
    assert not reference.schema_problems((RunInfo, LoaderInfo))


def test_a_run_key_without_its_attributes_entry_is_reported() -> None:
    class Run(TypedDict, total=False):
        """The run.

        Attributes:
            kept: Documented.
        """

        kept: int
        lost: str

    assert reference.schema_problems((Run,)) == ["Run.lost: no entry in its Attributes:"]


def test_every_marker_expands() -> None:
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for match in reference.MARKER.finditer(text):
            assert reference.generated(match.group(1), match.group(2)).strip(), f"{page.name}: {match.group(0)}"
    with pytest.raises(ValueError, match="no generated block 'rule' nonexistent"):
        reference.generated("rule", "nonexistent")


def test_every_cli_command_is_generated() -> None:
    text = reference.cli_reference()
    for command in ("report", "analyze", "compare"):
        assert f"### `lightning-perf {command}`" in text
    assert isinstance(reference.build_parser(), argparse.ArgumentParser)


def test_site_config_names_every_page() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    pages = {page.name for page in DOCS.glob("*.md")}
    assert {page for page in pages if f": {page}" not in config} == set()


@pytest.mark.parametrize("rule_id", [*RULE_IDS, "out_of_memory"])
def test_each_finding_names_a_section_the_site_has(rule_id: str) -> None:
    # The console's "docs:" line under each finding leads to its section: the page exists, with that anchor.
    page, _, anchor = docs_section(rule_id).partition("#")
    text = (ROOT / page).read_text(encoding="utf-8")
    assert re.search(rf"^#+ .*\{{#{anchor}\}}$", text, re.MULTILINE), f"{page} has no section {{#{anchor}}}"
