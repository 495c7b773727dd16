"""Resuming from checkpoints: finished windows are not repeated, numbering and max_windows continue, the
report keeps its history; two PerfCallbacks keep separate state."""

import base64
import dataclasses
import json
import os
import shutil
import zlib

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_perf import PerfCallback
from lightning_perf.hooks import run_state, stage_measure
from lightning_perf.hooks.stage_measure import HISTORY_EPOCHS
from lightning_perf.records import RankSummary, plain
from lightning_perf.report import json_report
from lightning_perf.report.json_report import write_json_atomically
from models import TinyModel, trainer

SCHEDULE = {"skip_first": 1, "warmup": 1, "active": 2}  # records batches 2-3 of each 8-batch epoch


def _perf(**kw):
    return PerfCallback(schedule=SCHEDULE, stages=["train"], **kw)


def test_resuming_from_an_end_of_epoch_checkpoint_continues_windows_and_history(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    first = _perf(max_windows=3)
    trainer(tmp_path / "a", [first, checkpoints], max_epochs=2, enable_checkpointing=True).fit(TinyModel(n=32))
    assert [w.name for w in first.windows] == ["train-epoch000-batches0002-0003", "train-epoch001-batches0002-0003"]

    resumed = _perf(max_windows=3)
    t = trainer(tmp_path / "b", [resumed], max_epochs=4)
    t.fit(TinyModel(n=32), ckpt_path=str(tmp_path / "ckpt" / "epoch=1-step=16.ckpt"))
    # Epochs 0 and 1 are not trained again; only one more window fits under max_windows=3.
    assert [w.name for w in resumed.windows] == [
        "train-epoch000-batches0002-0003",
        "train-epoch001-batches0002-0003",
        "train-epoch002-batches0002-0003",
    ]
    assert [(e.stage, e.epoch) for e in resumed.epochs] == [("train", 0), ("train", 1), ("train", 2), ("train", 3)]
    with open(resumed.report_path, encoding="utf-8") as f:
        report = json.load(f)
    assert [e["epoch"] for e in report["stages"]["train"]["epochs"]] == [0, 1, 2, 3]
    assert len(report["windows"]) == 3
    # The earlier windows keep their analysis, and the earlier epochs their step splits, for the HTML report.
    assert all(w["summary"] is not None and w["operators"] for w in report["windows"])
    assert [e["epoch"] for e in report["stages"]["train"]["epochs"] if "steps" in e] == [0, 1, 2, 3]
    assert os.path.isfile(resumed.page_path)
    # The profiling cost goes on from what the first fit had spent by its checkpoint (its 2 windows).
    assert report["run"]["profiling"]["windows"] == 3


def test_resuming_mid_epoch_does_not_repeat_a_finished_window(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1)
    first = _perf()
    trainer(tmp_path / "a", [first, checkpoints], max_epochs=1, enable_checkpointing=True).fit(TinyModel(n=32))
    mid = tmp_path / "ckpt" / "epoch=0-step=5.ckpt"  # after batch 4 of 8: the window (2-3) is done
    assert mid.exists()

    resumed = _perf()
    with pytest.warns(UserWarning, match=r"its train epoch 0 was measured \(5 batches:"):  # 0-4
        trainer(tmp_path / "b", [resumed], max_epochs=2).fit(TinyModel(n=32), ckpt_path=str(mid))
    assert [w.name for w in resumed.windows] == ["train-epoch000-batches0002-0003", "train-epoch001-batches0002-0003"]
    # The resumed epoch 0 is measured from where it went on: batches 5, 6 and 7.
    resumed_epoch0 = [e for e in resumed.epochs if e.epoch == 0][-1]
    assert resumed_epoch0.batches == 3


def test_two_perf_callbacks_keep_separate_state(tmp_path):
    train_only = PerfCallback(schedule=SCHEDULE, stages=["train"])
    validate_only = PerfCallback(schedule={"skip_first": 0, "active": 1}, stages=["validate"])
    assert train_only.state_key != validate_only.state_key
    t = trainer(tmp_path, [train_only, validate_only], max_epochs=1)
    t.fit(TinyModel(n=32, val_n=16))
    path = tmp_path / "both.ckpt"
    t.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["callbacks"]
    assert {train_only.state_key, validate_only.state_key} <= set(saved)
    assert [w["stage"] for w in _decoded(saved[train_only.state_key])["windows"]] == ["train"]
    assert [w["stage"] for w in _decoded(saved[validate_only.state_key])["windows"]] == ["validate"]


def test_load_state_dict_tolerates_unknown_and_missing_keys():
    callback = PerfCallback()
    callback.load_state_dict({"version": 99, "stages": {"train": {"epoch": 3, "new_field": 1}}, "extra": True})
    assert callback._positions["train"].epoch == 3 and callback.epochs == [] and callback.windows == []


def test_the_per_rank_tables_survive_a_checkpoint(tmp_path):
    # A distributed run's cross-rank table of each epoch is part of the report's history: a resumed run takes it
    # back from the report the checkpoint names.
    first = _perf()
    trainer(tmp_path / "a", [first], max_epochs=1).fit(TinyModel(n=16))
    rows = tuple(
        RankSummary(rank=r, step_time_p50=0.01, step_time_p90=0.02, step_time_max=0.03, data_wait_fraction=0.1,
                    throughput=100.0, host_rss_peak=2**30, cuda_max_allocated=None, cuda_max_reserved=None,
                    communication_share=0.2)
        for r in (0, 1)
    )  # fmt: skip
    first._epochs.ranks[("train", 0)] = rows  # what the epoch's gather gives a 2-process run, and its report keeps
    write_json_atomically(first.report, first.report_path)
    state = json.loads(json.dumps(first.state_dict()))  # plain values, as a checkpoint keeps them
    resumed = _perf()
    resumed.load_state_dict(state)
    [epoch] = resumed.report["stages"]["train"]["epochs"]
    assert epoch["ranks"] == [dataclasses.asdict(r) for r in rows]


def _short_epochs(tmp_path, epochs: int) -> PerfCallback:
    callback = PerfCallback(batches=[100_000], stages=["train"])
    trainer(tmp_path, [callback], max_epochs=epochs, limit_val_batches=0).fit(TinyModel(n=8, batch_size=4))
    return callback


def _decoded(state: dict) -> dict:
    """A version-6 state's JSON text, decoded, with its packed records as ``"recent"``."""
    assert state["version"] == 6 and set(state) == {"version", "state", "recent"}  # two texts: two objects to pickle
    return {**json.loads(state["state"]), "recent": json.loads(zlib.decompress(base64.b64decode(state["recent"])))}


def _positions_text(perf: PerfCallback) -> str:
    """The checkpoint state's text less its profiling numbers (and the records it packs apart)."""
    return json.dumps({k: v for k, v in _decoded(perf.state_dict()).items() if k not in {"profiling", "recent"}})


def test_checkpoint_state_is_bounded_however_long_the_run(tmp_path, every_epoch_alone):
    short, long = _short_epochs(tmp_path / "short", 3), _short_epochs(tmp_path / "long", HISTORY_EPOCHS + 8)
    state = _decoded(long.state_dict())
    assert len(long.epochs) == HISTORY_EPOCHS + 8
    assert state["recent"]["train"] == []  # the report on disk holds every record (written at the fit's end)
    assert not {"epochs", "findings", "ranks", "history"} & set(state)  # the report keeps those, not the checkpoint
    assert state["report_path"] == long.report_path
    assert set(state["stages"]) == set(state["recent"]) == {"train"}  # the stages yet to run hold nothing
    assert state["stages"]["train"] == {
        "epoch": HISTORY_EPOCHS + 7,
        "total_batches": 2 * (HISTORY_EPOCHS + 8),
        "windows_used": 0,
    }
    # A few digits more, the profiling's numbers aside: a float's repr is 3-20 characters (a run the budget let
    # count its FLOPs has spent 0.0169399090082... s where another's 0.0), four of them whatever the run's length.
    assert len(_positions_text(long)) < len(_positions_text(short)) + 10
    assert _decoded(long.state_dict())["profiling"].keys() == _decoded(short.state_dict())["profiling"].keys()
    # Where no report is written (another rank's state, no output directory), the state holds the recent
    # history: bounded by it, not by the run.
    long._epochs.reported.clear()
    state = _decoded(long.state_dict())
    assert [e["epoch"] for e in state["recent"]["train"]] == list(range(8, HISTORY_EPOCHS + 8))


def test_each_record_is_encoded_once_and_an_unchanged_sequence_not_joined_again(tmp_path):
    # A checkpoint at every epoch end encodes only the epoch that is new since the last one.
    run = _short_epochs(tmp_path, 3)
    history = list(run._stages["train"].history)
    texts, encoded = run_state.RecordTexts(), []

    def encode(record):
        encoded.append(record.epoch)
        return plain(record)

    first = texts.array("train", history, encode)
    assert texts.array("train", history, encode) is first and encoded == [0, 1, 2]  # unchanged: nothing to do
    history.append(dataclasses.replace(history[-1], epoch=3))
    assert [e["epoch"] for e in json.loads(texts.array("train", history, encode))] == [0, 1, 2, 3]
    assert encoded == [0, 1, 2, 3]  # the new epoch only
    # The callback's own texts: its next checkpoint has the epoch its history gained, which no report holds yet.
    run._stages["train"].history.append(history[-1])
    run._stages["train"].records += 1
    assert [e["epoch"] for e in _decoded(run.state_dict())["recent"]["train"]] == [3]


def test_the_states_text_is_joined_again_only_where_a_part_changed():
    texts, joins = run_state.RecordTexts(), []
    history, windows = "[1, 2]", "[]"

    def join():
        joins.append(1)
        return f"{history}, {windows}"

    assert texts.joined("a", (history, windows), join) == "[1, 2], []" and len(joins) == 1
    assert texts.joined("a", (history, windows), join) == "[1, 2], []" and len(joins) == 1  # the same texts
    assert texts.joined("b", (history, windows), join) == "[1, 2], []" and len(joins) == 2  # each key its own
    history = "[1, 2, 3]"
    assert texts.joined("a", (history, windows), join) == "[1, 2, 3], []" and len(joins) == 3


def test_the_records_the_report_lacks_are_packed_once_until_they_change(tmp_path):
    # Packed (zlib) when a stage's unreported records change, not at every checkpoint of its carried epochs.
    run = _short_epochs(tmp_path, 3)
    run._epochs.reported.clear()  # as between two rewrites of the report: it lacks every record
    first = run.state_dict()
    assert run.state_dict()["recent"] is first["recent"]  # nothing new: the same bytes, not packed again
    assert [e["epoch"] for e in _decoded(first)["recent"]["train"]] == [0, 1, 2]
    assert len(first["recent"]) < len(json.dumps(_decoded(first)["recent"])) / 2
    run._stages["train"].history.append(dataclasses.replace(run._stages["train"].history[-1], epoch=3))
    run._stages["train"].records += 1
    assert [e["epoch"] for e in _decoded(run.state_dict())["recent"]["train"]] == [0, 1, 2, 3]


def test_a_version_5_checkpoint_with_its_records_in_its_text_still_loads(tmp_path, every_epoch_alone):
    run = _short_epochs(tmp_path, 3)
    run._epochs.reported.clear()
    decoded = _decoded(run.state_dict())
    os.remove(run.report_path)  # the records the state holds are all there is to take back
    resumed = PerfCallback(batches=[100_000], stages=["train"])
    resumed.load_state_dict({"version": 5, "state": json.dumps(decoded)})
    assert [e.epoch for e in resumed.epochs] == [0, 1, 2] and resumed._positions["train"].epoch == 2


def test_a_version_3_checkpoint_with_a_text_per_epoch_still_loads(tmp_path):
    run = _short_epochs(tmp_path, 2)
    decoded = _decoded(run.state_dict())
    stages = {
        stage: {**_v4_position(saved), "history": [json.dumps(plain(e)) for e in _history(run, stage)]}
        for stage, saved in decoded["stages"].items()
    }
    state = {**decoded, "version": 3, "stages": stages}
    os.remove(run.report_path)  # the history is all there is to take back
    resumed = PerfCallback(batches=[100_000], stages=["train"])
    resumed.load_state_dict(state)
    assert resumed._stages["train"].history == run._stages["train"].history
    assert resumed._positions["train"].epoch == run._positions["train"].epoch == 1


def test_a_version_2_checkpoint_with_its_history_as_dicts_still_loads(tmp_path):
    run = _short_epochs(tmp_path, 2)
    decoded = _decoded(run.state_dict())
    stages = {
        stage: {**_v4_position(saved), "history": [plain(e) for e in _history(run, stage)]}
        for stage, saved in decoded["stages"].items()
    }
    state = {**decoded, "version": 2, "stages": stages}
    os.remove(run.report_path)
    resumed = PerfCallback(batches=[100_000], stages=["train"])
    resumed.load_state_dict(state)
    assert resumed._stages["train"].history == run._stages["train"].history


def _v4_position(saved: dict) -> dict:
    return {k: v for k, v in saved.items() if k != "records"}


def _history(run: PerfCallback, stage: str) -> list:
    st = run._stages.get(stage)
    return list(st.history) if st is not None else []


def test_resuming_takes_the_earlier_epochs_from_the_report_or_else_the_states_own(tmp_path, every_epoch_alone):
    run = _short_epochs(tmp_path, HISTORY_EPOCHS + 2)
    state = json.loads(json.dumps(run.state_dict()))
    resumed = PerfCallback(batches=[100_000], stages=["train"])
    resumed.load_state_dict(state)
    assert [e.epoch for e in resumed.epochs] == list(range(HISTORY_EPOCHS + 2))  # from the report on disk
    assert [e.epoch for e in resumed._stages["train"].history] == list(range(2, HISTORY_EPOCHS + 2))
    assert resumed._stages["train"].records == HISTORY_EPOCHS + 2
    assert _decoded(resumed.state_dict())["recent"]["train"] == []  # all on disk

    os.remove(run.report_path)  # e.g. the checkpoint was copied to another machine without its logs
    elsewhere = PerfCallback(batches=[100_000], stages=["train"])
    elsewhere.load_state_dict(state)
    assert elsewhere.epochs == [] and elsewhere._positions["train"].epoch == HISTORY_EPOCHS + 1


def test_a_version_4_checkpoint_still_loads_its_history_and_every_report_epoch(tmp_path, every_epoch_alone):
    run = _short_epochs(tmp_path, 3)
    decoded = _decoded(run.state_dict())
    history = {stage: [plain(e) for e in _history(run, stage)] for stage in decoded["stages"]}
    del decoded["recent"]
    stages = {stage: _v4_position(saved) for stage, saved in decoded["stages"].items()}
    state = {"version": 4, "state": json.dumps({**decoded, "stages": stages, "history": history})}
    resumed = PerfCallback(batches=[100_000], stages=["train"])
    resumed.load_state_dict(state)
    assert [e.epoch for e in resumed.epochs] == [0, 1, 2] and resumed._stages["train"].records == 3
    assert list(resumed._stages["train"].history) == list(run._stages["train"].history)


def _report_copies(tmp_path):
    """A callback after the checkpoint that copies ``perf_report.json`` as each training epoch's end left it."""

    class Copies(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            report = next(c for c in trainer.callbacks if isinstance(c, PerfCallback)).report_path
            if report and os.path.isfile(report):
                shutil.copy(report, tmp_path / f"report-{trainer.current_epoch}.json")

    return Copies()


def test_a_resumed_fit_measures_again_the_epochs_a_run_wrote_past_its_checkpoint(tmp_path):
    # The first run went on to epoch 3 and wrote them all; resumed from epoch 1's checkpoint, epochs 2 and 3 are
    # trained and measured again: the report holds each once, the second time's.
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    trainer(tmp_path / "a", [_perf(), checkpoints], max_epochs=4, enable_checkpointing=True).fit(TinyModel(n=32))
    resumed = _perf()
    trainer(tmp_path / "a", [resumed], max_epochs=4).fit(
        TinyModel(n=32), ckpt_path=str(tmp_path / "ckpt" / "epoch=1-step=16.ckpt")
    )
    assert [(e.stage, e.epoch) for e in resumed.epochs] == [("train", 0), ("train", 1), ("train", 2), ("train", 3)]
    with open(resumed.report_path, encoding="utf-8") as f:
        assert [e["epoch"] for e in json.load(f)["stages"]["train"]["epochs"]] == [0, 1, 2, 3]


def test_a_run_killed_before_its_report_caught_up_resumes_with_the_checkpoints_records(tmp_path, monkeypatch):
    # The report's rewrites are paced: the report on disk may lack the latest epochs a checkpoint counts. A run
    # killed there (no end, no exception hook: the report stays as it was) resumes with those from the state.
    monkeypatch.setattr(json_report, "REWRITE_TIME_SHARE", 1e-9)  # after its first write, the report waits
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    first = _perf()
    run = trainer(
        tmp_path / "a", [first, checkpoints, _report_copies(tmp_path)], max_epochs=3, enable_checkpointing=True
    )
    run.fit(TinyModel(n=32))
    with open(tmp_path / "report-1.json", encoding="utf-8") as f:
        assert [e["epoch"] for e in json.load(f)["stages"]["train"]["epochs"]] == [0]  # as epoch 1 left it
    shutil.copy(tmp_path / "report-1.json", first.report_path)  # killed right after epoch 1's checkpoint
    state = torch.load(tmp_path / "ckpt" / "epoch=1-step=16.ckpt", weights_only=False)["callbacks"][first.state_key]
    assert [e["epoch"] for e in _decoded(state)["recent"]["train"]] == [1]  # what the report lacked
    resumed = _perf()
    resumed.load_state_dict(state)
    assert [e.epoch for e in resumed.epochs] == [0, 1] and resumed._stages["train"].records == 2


def test_a_version_1_checkpoint_still_restores_its_whole_history():
    epoch = {"stage": "train", "epoch": 0, "batches": 2, "samples": 8, "step_time": 0.1, "data_wait": 0.01,
             "step_time_p50": 0.05, "step_time_p90": 0.05, "step_time_max": 0.05, "data_wait_fraction": 0.1,
             "throughput": 80.0}  # fmt: skip
    finding = {"id": "x", "severity": "warning", "title": "t", "evidence": "e", "advice": "a", "stage": "train",
               "epoch": 0}  # fmt: skip
    callback = PerfCallback()
    callback.load_state_dict(
        {"version": 1, "stages": {"train": {"epoch": 0}}, "epochs": [epoch], "findings": [finding]}
    )
    assert [e.epoch for e in callback.epochs] == [0] and [f.id for f in callback.findings_for("train")] == ["x"]
    assert len(callback._stages["train"].history) == 1


def test_the_profilings_numbers_are_written_as_json_writes_them(tmp_path):
    # Written by an f-string (json.dumps cost 33 us in a fit): the same text, and JSON's words where not finite.
    run = _short_epochs(tmp_path, 2)
    run._epochs.budget.load_state_dict({"seconds": 0.1, "run_seconds": 2.5, "windows": 3, "skipped": 1})
    profiling = _decoded(run.state_dict())["profiling"]
    assert {k: v for k, v in profiling.items() if k != "run_seconds"} == {"seconds": 0.1, "windows": 3, "skipped": 1}
    assert profiling["run_seconds"] >= 2.5 and isinstance(profiling["windows"], int)
    run._epochs.budget.load_state_dict({"seconds": float("inf")})
    assert _decoded(run.state_dict())["profiling"]["seconds"] == float("inf")


def test_resuming_from_a_fits_last_checkpoint_keeps_the_group_its_end_measured(tmp_path, monkeypatch):
    # Short epochs carried into one group, measured at the end of the fit, after its last checkpoint: the group
    # ends at the checkpoint, so a fit resumed from it keeps it (a count of the records at the checkpoint did not).
    monkeypatch.setattr(stage_measure, "MEASURE_BURST", 0.0)
    monkeypatch.setattr(stage_measure, "MEASURE_SHARE", 0.0)
    monkeypatch.setattr(stage_measure, "GROUP_SECONDS", float("inf"))
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = PerfCallback(batches=[100_000], stages=["train"])
    trainer(tmp_path / "a", [first, checkpoints], max_epochs=4, enable_checkpointing=True).fit(TinyModel(n=16))
    assert any(e.epochs > 1 for e in first.epochs)  # a group, measured at the end
    resumed = PerfCallback(batches=[100_000], stages=["train"])
    trainer(tmp_path / "b", [resumed], max_epochs=5).fit(
        TinyModel(n=16), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt")
    )
    covered = [n for e in resumed.epochs for n in range(e.epoch - e.epochs + 1, e.epoch + 1)]
    assert covered == list(range(5)), [(e.epoch, e.epochs) for e in resumed.epochs]


def test_resuming_from_a_checkpoint_inside_a_group_says_which_epochs_have_no_record(tmp_path, monkeypatch):
    # Every epoch carried into one group, measured at the fit's end: a checkpoint of epoch 1 was saved while
    # epochs 0-1 were still being measured, and the report (written at the end) holds the group past it.
    monkeypatch.setattr(stage_measure, "MEASURE_BURST", 0.0)
    monkeypatch.setattr(stage_measure, "MEASURE_SHARE", 0.0)
    monkeypatch.setattr(stage_measure, "GROUP_SECONDS", float("inf"))
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}")
    first = PerfCallback(batches=[100_000], stages=["train"])
    trainer(tmp_path, [first, checkpoints], max_epochs=4, enable_checkpointing=True).fit(TinyModel(n=16))
    assert [(e.epoch, e.epochs) for e in first.epochs] == [(3, 4)]
    resumed = PerfCallback(batches=[100_000], stages=["train"])
    with pytest.warns(UserWarning, match=r"its train epochs 0-1 were measured \(8 batches:"):
        trainer(tmp_path, [resumed], max_epochs=4).fit(
            TinyModel(n=16), ckpt_path=str(tmp_path / "ckpt" / "epoch=1.ckpt")
        )
    assert [e.epoch for e in resumed.epochs] == [3]  # epochs 2-3, measured again


def test_resuming_at_a_record_says_nothing_is_missing(tmp_path, recwarn, every_epoch_alone):
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}")
    first = PerfCallback(batches=[100_000])
    # (with the sanity check's validation batches, which no record holds)
    run = dict(max_epochs=3, num_sanity_val_steps=2)
    trainer(tmp_path, [first, checkpoints], enable_checkpointing=True, **run).fit(TinyModel(n=16))
    resumed = PerfCallback(batches=[100_000])
    trainer(tmp_path, [resumed], **run).fit(TinyModel(n=16), ckpt_path=str(tmp_path / "ckpt" / "epoch=1.ckpt"))
    assert not [w for w in recwarn if "the report has no record of them" in str(w.message)]
    assert [e.epoch for e in resumed.epochs if e.stage == "train"] == [0, 1, 2]
