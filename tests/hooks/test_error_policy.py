"""What the callback says once: each key's message is shown the first time only, through Lightning's rank-zero
logging and warnings, and a message given as what builds it is built only then."""

import logging
import warnings

import pytest

from lightning_perf.hooks.error_policy import ErrorPolicy


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
