"""What the callback says once: each key's message is shown the first time only, through Lightning's rank-zero
logging and warnings, and a message given as what builds it is built only then."""

import inspect
import logging
import warnings

import pytest

from lightning_perf import PerfCallback
from lightning_perf.hooks.error_policy import ErrorPolicy
from models import TinyModel, trainer


def test_a_message_is_said_once_per_key_and_built_only_when_said(caplog):
    policy, built = ErrorPolicy(strict=False), []

    def note() -> str:
        built.append(1)
        return "PerfCallback: the train epochs are short"

    with caplog.at_level(logging.INFO):
        for _ in range(3):  # as at every carried epoch
            policy.info_once("grouped:train", note)
    assert [r.getMessage() for r in caplog.records] == ["PerfCallback: the train epochs are short"]
    assert built == [1]
    with pytest.warns(UserWarning, match="cut short") as record:
        policy.warn_once("shortened:train", lambda: "a window was cut short")
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy.warn_once("shortened:train", lambda: pytest.fail("built again"))  # said: neither built nor shown


def test_a_warning_points_at_the_users_code_not_into_the_package(tmp_path):
    # Where the user built the callback, and where their call to fit ran the hook that warned; not our own line.
    line = inspect.currentframe().f_lineno + 2
    with pytest.warns(UserWarning, match="warmup=0") as built:
        PerfCallback(schedule={"wait": 1, "warmup": 0, "active": 1})
    assert [(w.filename, w.lineno) for w in built] == [(__file__, line)]

    def unsized(batch):
        raise RuntimeError("no size")

    run = trainer(tmp_path, [PerfCallback(stages=["train"], strict=False, batch_size_fn=unsized)])
    line = inspect.currentframe().f_lineno + 2
    with pytest.warns(UserWarning, match="batch_size_fn") as fitted:
        run.fit(TinyModel())
    assert [(w.filename, w.lineno) for w in fitted if "batch_size_fn" in str(w.message)] == [(__file__, line)]
