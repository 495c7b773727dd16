"""Argument checks: every bad value fails at construction, naming the parameter, the value and what is allowed."""

import inspect

import pytest

from lightning_perf import PerfCallback, Schedule
from lightning_perf.config import STAGES

# Every argument of PerfCallback, with a bad value and the message it gets (a test checks none is missing).
BAD_ARGUMENTS = [
    ({"schedule": {"active": 0}}, r"schedule\.active=0: must be an integer >= 1"),
    ({"schedule": {"wait": -1}}, r"schedule\.wait=-1: must be an integer >= 0"),
    ({"schedule": {"warmup": 1.5}}, r"schedule\.warmup=1\.5: must be an integer >= 0"),
    ({"schedule": {"skip_first": True}}, r"schedule\.skip_first=True: must be an integer >= 0"),
    ({"schedule": {"repeat": -2}}, r"schedule\.repeat=-2"),
    ({"schedule": {"actve": 2}}, r"schedule has unknown keys \['actve'\]: allowed keys are"),
    ({"schedule": 3}, r"schedule=3: must be a Schedule, a mapping of its fields, or None"),
    ({"batches": [3, -1]}, r"batches=\[3, -1\]: must be a non-empty list of integers >= 0"),
    ({"batches": []}, r"batches=\[\]: must be a non-empty list"),
    ({"batches": "1,2"}, r"batches='1,2': must be a list of batch indices"),
    ({"stages": ["training"]}, r"stages=\['training'\]: \['training'\] not allowed, each must be one of \['train', "),
    ({"stages": []}, r"stages=\[\]: must be a non-empty list"),
    ({"max_windows": -1}, r"max_windows=-1: must be an integer >= 0"),
    ({"row_limit": 0}, r"row_limit=0: must be an integer >= 1"),
    ({"dirpath": 3}, r"dirpath=3: must be a path or None"),
    ({"record_shapes": "yes"}, r"record_shapes='yes': must be True or False"),
    ({"profile_memory": 1}, r"profile_memory=1: must be True or False"),
    ({"with_stack": None}, r"with_stack=None: must be True or False"),
    ({"with_flops": "no"}, r"with_flops='no': must be True or False"),
    ({"tensorboard_compat": 0}, r"tensorboard_compat=0: must be True or False"),
    ({"sort_by": "cuda_time"}, r"sort_by='cuda_time': must be None \(automatic\) or one of \['self_cpu_time'"),
    ({"log_loss": "yes"}, r"log_loss='yes': must be True or False"),
    ({"batch_size_fn": 3}, r"batch_size_fn=3: must be a callable \(batch -> int\) or None"),
    ({"thresholds": {"dataloader_warnin": 0.2}}, r"thresholds: .*dataloader_warnin"),
    ({"thresholds": {"dataloader_warning": -1}}, r"thresholds: .*dataloader_warning"),
    ({"thresholds": [1]}, r"thresholds=\[1\]: must be a mapping of threshold names to numbers"),
    ({"verbose": 3}, r"verbose=3: must be 0 \(silent\), 1 \(warnings and critical\) or 2 \(everything\)"),
    ({"ranks": [0, -1]}, r"ranks=\[0, -1\]: must be a list of global ranks >= 0, or None \(all ranks\)"),
    ({"ranks": "0"}, r"ranks='0': must be a list of global ranks >= 0"),
    ({"max_trace_mb": 0}, r"max_trace_mb=0: must be a number of MB > 0"),
    ({"max_trace_mb": True}, r"max_trace_mb=True: must be a number of MB > 0"),
    ({"strict": "yes"}, r"strict='yes': must be True, False or None"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_ARGUMENTS)
def test_bad_argument_is_named_with_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PerfCallback(**kwargs)


def test_the_table_covers_every_argument():
    covered = {key for kwargs, _ in BAD_ARGUMENTS for key in kwargs}
    assert set(inspect.signature(PerfCallback.__init__).parameters) - {"self"} == covered


def test_all_problems_are_reported_at_once():
    with pytest.raises(ValueError) as info:
        PerfCallback(schedule={"active": 0, "wait": -1}, stages=["nope"], row_limit=0)
    text = str(info.value)
    assert text.startswith("PerfCallback got invalid arguments:")
    for fragment in ("schedule.active=0", "schedule.wait=-1", "stages=['nope']", "row_limit=0"):
        assert fragment in text


def test_schedule_dataclass_checks_itself():
    with pytest.raises(ValueError, match=r"Schedule got invalid arguments:\n  - schedule\.active=0: must be an integer >= 1"):
        Schedule(active=0)


def test_schedule_accepts_dataclass_or_mapping():
    as_dict = PerfCallback(schedule={"wait": 1, "warmup": 1, "active": 2, "repeat": 2})
    as_class = PerfCallback(schedule=Schedule(wait=1, warmup=1, active=2, repeat=2))
    assert as_dict.config.schedule == as_class.config.schedule == Schedule(wait=1, warmup=1, active=2, repeat=2)
    # Fields left out keep their defaults.
    assert as_dict.config.schedule.skip_first == Schedule().skip_first


def test_no_warmup_is_legal_but_warned_about():
    with pytest.warns(UserWarning, match=r"schedule\.warmup=0: the first recorded batch of each window"):
        PerfCallback(schedule={"warmup": 0})


def test_defaults():
    config = PerfCallback().config
    assert config.schedule == Schedule(skip_first=5, wait=0, warmup=1, active=3, repeat=1)
    assert config.stages == STAGES
    assert config.batches is None
    assert config.max_windows == 5
    assert (config.record_shapes, config.profile_memory, config.with_stack, config.with_flops) == (False,) * 4
    assert config.sort_by is None
    assert config.tensorboard_compat is True


def test_stages_keep_canonical_order_and_accept_a_single_string():
    assert PerfCallback(stages=["validate", "train"]).config.stages == ("train", "validate")
    assert PerfCallback(stages="test").config.stages == ("test",)


def test_batches_are_sorted_and_deduplicated():
    assert PerfCallback(batches=[7, 3, 3, 4]).config.batches == (3, 4, 7)
