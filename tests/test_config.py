"""Argument checks: every bad value fails at construction, naming the parameter, the value and what is allowed."""

import inspect

import pytest

from lightning_perf import PerfCallback, Schedule
from lightning_perf.config import STAGES

# Every argument of PerfCallback, with a bad value and the message it gets (a test checks none is missing).
BAD_ARGUMENTS = [
    ({"schedule": {"active": 0}}, r"schedule\.active must be an integer >= 1, got 0 \(integer\)"),
    ({"schedule": {"wait": -1}}, r"schedule\.wait must be an integer >= 0, got -1 \(integer\)"),
    ({"schedule": {"warmup": 1.5}}, r"schedule\.warmup must be an integer >= 0, got 1\.5 \(number\)"),
    ({"schedule": {"skip_first": True}}, r"schedule\.skip_first must be an integer >= 0, got True \(boolean\)"),
    ({"schedule": {"repeat": -2}}, r"schedule\.repeat must be an integer >= 0, got -2"),
    ({"schedule": {"actve": 2}}, r"schedule has unknown keys \['actve'\]: allowed keys are"),
    ({"schedule": 3}, r"schedule must be a Schedule, a mapping of its fields, or None, got 3 \(integer\)"),
    (
        {"batches": [3, -1]},
        r"batches must be a non-empty list of batch indices \(integers >= 0\), or None, got \[3, -1\] \(array\)",
    ),
    ({"batches": []}, r"batches must be a non-empty list of batch indices .*, got \[\] \(array\)"),
    ({"batches": "1,2"}, r"batches must be a non-empty list of batch indices .*, got '1,2' \(string\)"),
    (
        {"stages": ["training"]},
        r"stages must be a stage or a non-empty list of stages, each one of \['train', 'validate', 'test', 'predict'\],"
        r" got \['training'\] \(array\)",
    ),
    ({"stages": []}, r"stages must be a stage or a non-empty list of stages, .*, got \[\] \(array\)"),
    ({"max_windows": -1}, r"max_windows must be an integer >= 0, got -1 \(integer\)"),
    ({"row_limit": 0}, r"row_limit must be an integer >= 1, got 0 \(integer\)"),
    ({"dirpath": 3}, r"dirpath must be a path or None, got 3 \(integer\)"),
    ({"record_shapes": "yes"}, r"record_shapes must be True or False, got 'yes' \(string\)"),
    ({"profile_memory": 1}, r"profile_memory must be True or False, got 1 \(integer\)"),
    ({"with_stack": None}, r"with_stack must be True or False, got None \(null\)"),
    ({"with_flops": "no"}, r"with_flops must be True or False, got 'no' \(string\)"),
    ({"tensorboard_compat": 0}, r"tensorboard_compat must be True or False, got 0 \(integer\)"),
    ({"sort_by": "cuda_time"}, r"sort_by must be None \(automatic\) or one of \['self_cpu_time', .*, got 'cuda_time'"),
    ({"log_loss": "yes"}, r"log_loss must be True or False, got 'yes' \(string\)"),
    ({"batch_size_fn": 3}, r"batch_size_fn must be a callable \(batch -> int\) or None, got 3 \(integer\)"),
    ({"thresholds": {"dataloader_warnin": 0.2}}, r"thresholds: .*dataloader_warnin"),
    ({"thresholds": {"dataloader_warning": -1}}, r"thresholds: .*dataloader_warning"),
    ({"thresholds": [1]}, r"thresholds must be a mapping of threshold names to numbers, got \[1\] \(array\)"),
    (
        {"verbose": 3},
        r"verbose must be 0 \(silent\), 1 \(warnings and critical\) or 2 \(everything\), got 3 \(integer\)",
    ),
    ({"ranks": [0, -1]}, r"ranks must be a list of global ranks >= 0, or None \(all ranks\), got \[0, -1\]"),
    ({"ranks": "0"}, r"ranks must be a list of global ranks >= 0, or None \(all ranks\), got '0' \(string\)"),
    ({"max_trace_mb": 0}, r"max_trace_mb must be a number of MB > 0, got 0 \(integer\)"),
    ({"max_trace_mb": True}, r"max_trace_mb must be a number of MB > 0, got True \(boolean\)"),
    ({"peak_flops": 0}, r"peak_flops must be a number of FLOP/s > 0 or None .*, got 0 \(integer\)"),
    ({"peak_flops": "312e12"}, r"peak_flops must be a number of FLOP/s > 0 or None .*, got '312e12' \(string\)"),
    ({"profile_budget": 0}, r"profile_budget must be a share of the run's time \(> 0 and <= 1\) or 'auto' or None"),
    ({"profile_budget": 1.5}, r"profile_budget must be .*, got 1.5"),
    ({"profile_budget": "off"}, r"profile_budget must be .*, got 'off' \(string\)"),
    ({"strict": "yes"}, r"strict must be True, False or None \(from the environment\), got 'yes' \(string\)"),
    ({"memory_history": "on"}, r"memory_history must be True or False, got 'on' \(string\)"),
    ({"try_advice": 1}, r"try_advice must be True or False, got 1 \(integer\)"),
    ({"live": "yes"}, r"live must be True or False"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_ARGUMENTS)
def test_bad_argument_is_named_with_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PerfCallback(**kwargs)


def test_the_table_covers_every_argument():
    covered = {key for kwargs, _ in BAD_ARGUMENTS for key in kwargs}
    assert set(inspect.signature(PerfCallback.__init__).parameters) - {"self"} == covered


def test_all_problems_are_reported_at_once():
    with pytest.raises(ValueError, match=r"^PerfCallback got invalid arguments:") as info:
        PerfCallback(schedule={"active": 0, "wait": -1}, stages=["nope"], row_limit=0)
    text = str(info.value)
    assert text.startswith("PerfCallback got invalid arguments:")
    for fragment in (
        "schedule.active must be an integer >= 1, got 0",
        "schedule.wait must be an integer >= 0, got -1",
        "stages must be a stage or a non-empty list of stages",
        "got ['nope']",
        "row_limit must be an integer >= 1, got 0",
    ):
        assert fragment in text


def test_schedule_dataclass_checks_itself():
    message = r"Schedule got invalid arguments:\n  - schedule\.active must be an integer >= 1, got 0 \(integer\)$"
    with pytest.raises(ValueError, match=message):
        Schedule(active=0)


def test_a_long_value_is_cut_in_the_message():
    with pytest.raises(ValueError, match="dirpath must be a path or None") as info:
        PerfCallback(dirpath=[0] * 1000)
    assert str(info.value).endswith(f"dirpath must be a path or None, got [{'0, ' * 18}0,... (array)")


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
    assert config.schedule == Schedule(skip_first=5, wait=0, warmup=1, active=1, repeat=1)
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


def test_the_profile_budget_applies_to_the_default_plan_unless_set():
    from lightning_perf.config import DEFAULT_PROFILE_BUDGET

    assert PerfCallback().config.profile_budget == DEFAULT_PROFILE_BUDGET
    assert PerfCallback(batches=[3]).config.profile_budget is None  # a plan of the user's keeps its meaning ...
    assert PerfCallback(schedule={"active": 2}).config.profile_budget is None
    assert PerfCallback(schedule={"active": 2}, profile_budget=0.1).config.profile_budget == 0.1  # ... unless set
    assert PerfCallback(profile_budget=None).config.profile_budget is None
