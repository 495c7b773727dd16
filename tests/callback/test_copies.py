"""What libraries do to a callback around Lightning, on real (tiny, CPU) Trainer runs: deep-copy it with the
trainer's arguments, pickle it (a model's ``save_model()`` that pickles its trainer arguments,
``Trainer(strategy="ddp_spawn")``), ``torch.save`` it, and make a new ``Trainer`` for every short ``predict``
call (one forecast each)."""

import copy
import io
import json
import os
import pickle

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_perf import PerfCallback
from models import TinyModel, trainer

WINDOW_2 = {"skip_first": 1, "warmup": 1, "active": 2}  # records batches 2, 3 of each epoch


def _torch_copy(callback):
    buffer = io.BytesIO()
    torch.save(callback, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda callback: pickle.loads(pickle.dumps(callback)),
    "torch.save": _torch_copy,
}


@pytest.mark.parametrize("how", list(COPIES))
def test_a_used_callback_copies_with_its_results_and_the_copy_runs_again(tmp_path, how):
    perf = PerfCallback(schedule=WINDOW_2, verbose=0)
    model = TinyModel(n=24)
    trainer(tmp_path / "first", [perf], max_epochs=2).fit(model)
    assert len(perf.windows) == 4  # 2 epochs, train and validate

    copied = COPIES[how](perf)

    assert [w.name for w in copied.windows] == [w.name for w in perf.windows]
    assert copied.epochs == perf.epochs and copied.report == perf.report
    t = trainer(tmp_path / "second", [copied], max_epochs=1)  # a library fits the copy it made
    t.fit(model)
    assert len(copied.windows) == 6 and os.path.isfile(copied.page_path)
    assert len(perf.windows) == 4  # the original is left as it was


class PickleEveryEpoch(Callback):
    """Pickles the trainer's callbacks at each training epoch's end, as a library that saves its trainer
    arguments with every checkpoint does."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_train_epoch_end(self, trainer, pl_module):
        perf = next(c for c in trainer.callbacks if isinstance(c, PerfCallback))
        self.sizes.append(len(pickle.dumps(perf)))
        copy.deepcopy(perf)


def test_a_callback_pickles_during_a_run_without_its_open_event_file(tmp_path):
    # logger=False: the callback writes an event file of its own, open during the run.
    perf, pickler = PerfCallback(schedule=WINDOW_2, verbose=0), PickleEveryEpoch()
    trainer(tmp_path, [perf, pickler], max_epochs=2, logger=False).fit(TinyModel(n=24))
    assert len(pickler.sizes) == 2
    assert len(perf.windows) == 4  # the run went on: the copies took nothing from it


def test_a_loop_of_short_predict_calls_writes_one_small_report_per_call(tmp_path, monkeypatch):
    # A forecasting library: one predict per forecast, each in a new Trainer given a deep copy of the user's
    # callbacks. 2 batches per call: too few for the default schedule's window.
    from lightning_perf.report import json_report

    writes: list[str] = []
    write = json_report.write_json_atomically
    monkeypatch.setattr(
        json_report, "write_json_atomically", lambda data, path: (writes.append(path), write(data, path))
    )
    perf, model = PerfCallback(verbose=0), TinyModel(n=8)
    used = []
    for call in range(3):
        used.append(copy.deepcopy(perf))
        trainer(tmp_path / str(call), [used[-1]], log_every_n_steps=50).predict(model)  # the default
    for copied in used:
        assert copied.windows == [] and len(copied.epochs) == 1
        with open(copied.report_path, encoding="utf-8") as f:
            (epoch,) = json.load(f)["stages"]["predict"]["epochs"]
        # A page only where there is something to change (issue 46: 0.7 ms a call for a page repeating the report)
        to_change = any(finding["severity"] != "info" for finding in epoch["findings"])
        files = ["perf_report.json", "report.html"] if to_change else ["perf_report.json"]
        assert sorted(os.listdir(copied.dirpath)) == files  # no event file of ours
        if to_change:  # a busy machine's warning
            with open(copied.page_path, encoding="utf-8") as f:
                page = f.read()
            assert len(page) < 200_000 and "plotly" not in page.lower()  # no Plotly (4.6 MiB) on a page
            assert "No charts on this page" in page
    assert writes == [c.report_path for c in used]  # once per call, at its end
    assert perf.report_path is None  # the user's own instance never ran: the results are in the copies


def test_a_predict_call_with_a_window_gets_its_charts(tmp_path):
    perf = PerfCallback(schedule=WINDOW_2, verbose=0)
    trainer(tmp_path, [perf]).predict(TinyModel(n=24))
    assert len(perf.windows) == 1
    with open(perf.page_path, encoding="utf-8") as f:
        assert 'class="plotly-graph-div"' in f.read()
