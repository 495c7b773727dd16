"""How often ``perf_report.json`` and its page are rewritten at epoch ends (:class:`ReportFile`): on a time budget,
at most every :data:`REWRITE_MIN_SECONDS`, and always at a Trainer call's end or interruption."""

import json
import time

import pytest

from clocks import FakeClock
from lightning_perf import PerfCallback
from lightning_perf.report import json_report
from lightning_perf.report.html.document import Page
from lightning_perf.report.json_report import REWRITE_MIN_SECONDS, REWRITE_TIME_SHARE, ReportFile
from models import TinyModel, trainer


def test_a_cheap_report_is_rewritten_at_most_every_min_interval(tmp_path):
    clock = FakeClock()
    drawn = []
    page = (str(tmp_path / "report.html"), lambda data: drawn.append(data["n"]) or Page("<html>", "", plotly=False))
    report = ReportFile(str(tmp_path / "perf_report.json"), clock=clock, min_interval=5.0, page=page)
    built = []

    def build():
        built.append(clock.now)
        clock.now += 0.002  # 2 ms: the time share alone would let it be rewritten 0.2 s later
        return {"n": len(built)}

    written = []
    for _ in range(100):  # epoch ends 30 ms apart: 3 s in all
        if report.update(build):
            written.append(clock.now)
        clock.now += 0.030
    assert len(written) == 1 and not drawn  # the first epoch end writes the report; the page waits 5 s
    clock.now += 2.1
    assert report.update(build) and len(drawn) == 1 and len(built) == 2  # 5 s on: the page; the report too
    clock.now += 4.9
    assert not report.update(build)
    clock.now += 0.2
    assert report.update(build) and len(drawn) == 2  # due again 5 s after the last rewrite
    report.write({"n": "end"})  # the end of the call (or an interruption) is never held back
    assert json.loads((tmp_path / "perf_report.json").read_text()) == {"n": "end"}
    assert drawn[-1] == "end"


def test_an_expensive_report_keeps_its_time_share_above_the_min_interval(tmp_path):
    clock = FakeClock()
    report = ReportFile(str(tmp_path / "perf_report.json"), clock=clock, min_interval=5.0)

    def build():
        clock.now += 0.100  # 100 ms: due 0.1 / REWRITE_TIME_SHARE = 40 s later, past the 5 s
        return {}

    due = 0.100 / REWRITE_TIME_SHARE
    assert due > 5.0
    assert report.update(build)
    clock.now += due - 1.0
    assert not report.update(build)
    clock.now += 1.1
    assert report.update(build)


def test_a_fit_of_many_short_epochs_rewrites_its_report_within_the_bound(tmp_path, monkeypatch):
    written = []
    write = json_report.write_json_atomically
    monkeypatch.setattr(json_report, "write_json_atomically", lambda data, path: (written.append(1), write(data, path)))
    callback = PerfCallback()
    t = trainer(tmp_path, [callback], max_epochs=40, limit_train_batches=2, limit_val_batches=1)
    start = time.perf_counter()
    t.fit(TinyModel(n=8, val_n=4))
    seconds = time.perf_counter() - start

    # Training's first epoch end writes at once (with the validation run inside it, which does not write on its
    # own), the fit's end writes; between them, at most one rewrite per REWRITE_MIN_SECONDS of the fit (80 epoch
    # ends in all).
    assert 2 <= len(written) <= 2 + seconds / REWRITE_MIN_SECONDS + 1
    with open(callback.report_path, encoding="utf-8") as f:
        report = json.load(f)
    for stage in ("train", "validate"):  # every epoch, some measured together on a slow machine (epoch_report Notes 2)
        assert sum(e["epochs"] for e in report["stages"][stage]["epochs"]) == 40


def test_a_fit_that_measures_validation_only_writes_its_report_at_the_first_validation_end(tmp_path, monkeypatch):
    # Validation inside training's first epoch leaves the write to that epoch's end; where training is not
    # measured (stages=["validate"]), no training epoch end writes it: validation's first end does, at once.
    written = []
    write = json_report.write_json_atomically
    monkeypatch.setattr(
        json_report, "write_json_atomically", lambda data, path: (written.append(data), write(data, path))
    )
    callback = PerfCallback(stages=["validate"])
    trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=2, limit_val_batches=2).fit(TinyModel(n=8, val_n=4))
    first = written[0]
    assert [e["epoch"] for e in first["stages"]["validate"]["epochs"]] == [0]  # written at validation's first end


def test_the_report_is_indented_json_and_a_value_json_cannot_hold_is_written_null(tmp_path):
    import numpy as np
    import torch

    path = tmp_path / "perf_report.json"
    data = {"run": {"loss": float("nan"), "torch": torch.__version__, "p50": np.float64(0.5), "steps": (1, 2)}}
    json_report.write_json_atomically(data, str(path))
    text = path.read_text(encoding="utf-8")
    # NaN as null; a str or float subclass as the builtin; a tuple as a list.
    assert json.loads(text) == {"run": {"loss": None, "torch": str(torch.__version__), "p50": 0.5, "steps": [1, 2]}}
    assert text.startswith('{\n "run": {\n  "loss": null,')  # one space a level, as json.dumps(indent=1)
    with pytest.raises(TypeError, match=r"JSON cannot hold a int64"):
        json_report.write_json_atomically({"n": np.int64(1)}, str(path))  # json cannot either


def test_a_short_fit_draws_its_page_once_at_its_end(tmp_path, monkeypatch):
    from lightning_perf.hooks import epoch_report

    drawn, written = [], []
    draw, write = epoch_report.draw_page, json_report.write_json_atomically
    monkeypatch.setattr(epoch_report, "draw_page", lambda report, **kw: (drawn.append(1), draw(report, **kw))[1])
    monkeypatch.setattr(json_report, "write_json_atomically", lambda data, path: (written.append(1), write(data, path)))
    callback = PerfCallback()
    trainer(tmp_path, [callback], max_epochs=3, limit_train_batches=2, limit_val_batches=1).fit(TinyModel(n=8, val_n=4))
    # The report at the first epoch end and at the fit's end; the page, REWRITE_MIN_SECONDS after the first, only
    # at the end.
    assert len(written) == 2 and len(drawn) == 1
    with open(callback.page_path, encoding="utf-8") as f:
        assert "What fills memory" in f.read()
