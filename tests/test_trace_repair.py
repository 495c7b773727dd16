"""Repairing the JSON torch's trace exporter writes with strings left unescaped, on small texts laid out as
Kineto lays them out (torch 2.13's one field a line, and the older several fields a line)."""

import json

import pytest

from lightning_perf.trace_repair import repair_json
from purity import heavy_modules_loaded_by


def _event(name_line: str, args_line: str = '"External id": 1,"Record function id": 0, "Ev Idx": 0') -> bytes:
    """A trace of one complete event as torch 2.13 exports it, its name line as given."""
    return (
        '{\n  "schemaVersion": 1,\n  "traceEvents": [\n  {\n    "ph": "X",\n    "cat": "user_annotation",\n'
        f'    {name_line}\n    "pid": 7,\n    "tid": 7,\n    "ts": 10.5,\n    "dur": 2.000\n    ,\n'
        f'    "args": {{\n      {args_line}\n    }}\n  }}\n  ]\n}}'
    ).encode()


def _name(data: bytes) -> str:
    return json.loads(data)["traceEvents"][0]["name"]


@pytest.mark.parametrize(
    ("written", "name", "defect"),
    [
        ('"name": "load "shard-3"",', 'load "shard-3"', "an unescaped double quote"),
        ('"name": "C:\\data\\x",', "C:\\data\\x", "an unescaped backslash"),
        ('"name": "tab\there",', "tab\there", "a raw control character"),
        ('"name": "bell\x07",', "bell\x07", "a raw control character"),
        ('"name": "",', "", None),  # valid: untouched
        ('"name": "say \\"hi\\" \\u00e9",', 'say "hi" é', None),  # valid escapes: untouched
    ],
    ids=["quote", "backslash", "tab", "bell", "empty", "valid_escapes"],
)
def test_a_string_torch_left_unescaped_is_escaped_and_reads_as_written(written, name, defect):
    data = _event(written)
    repair = repair_json(data)
    if defect is None:
        assert repair is None
        assert _name(data) == name
        return
    with pytest.raises(json.JSONDecodeError):
        json.loads(data)  # as torch writes it
    assert repair is not None
    assert _name(repair.data) == name
    assert repair.lines == (7,) and repair.values == 1 and repair.first == name
    assert repair.defects == (defect,)
    assert repair.description == f"1 string value held {defect} ({name!r})"
    # Every other line as it was.
    before, after = data.split(b"\n"), repair.data.split(b"\n")
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [6]


def test_several_values_on_one_line_as_older_kineto_writes_them():
    data = (
        b'{"traceEvents": [\n  {\n    "ph": "X", "cat": "cpu_op", "name": "a"b", "pid": 1, "tid": 1,\n'
        b'    "ts": 1, "dur": 2,\n    "args": {\n'
        b'      "Input type": ["", "Scalar"], "Module Hierarchy": "", "Call stack": "C:\\x\\"y"\n    }\n  }\n]}'
    )
    repair = repair_json(data)
    assert repair is not None
    event = json.loads(repair.data)["traceEvents"][0]
    assert (event["name"], event["cat"], event["pid"]) == ('a"b', "cpu_op", 1)
    assert event["args"] == {"Input type": ["", "Scalar"], "Module Hierarchy": "", "Call stack": 'C:\\x\\"y'}
    assert repair.lines == (3, 6) and repair.values == 2
    assert repair.defects == ("an unescaped double quote", "an unescaped backslash")
    assert repair.description == "2 string values held an unescaped double quote and an unescaped backslash ('a\"b')"


def test_a_valid_trace_is_left_alone():
    data = json.dumps({"traceEvents": [{"ph": "X", "name": 'q"\\\t', "ts": 1, "dur": 1}]}, indent=2).encode()
    assert repair_json(data) is None
    assert repair_json(_event('"name": "aten::mm",')) is None


@pytest.mark.parametrize(
    "data",
    [
        _event('"name": "fine",', '"Input type": ["a"b"]'),  # a string in an array: not repaired
        b'{"traceEvents": [\n  {"ph": "X", "name": "unterminated\n',  # cut short
        b"{x}",
    ],
    ids=["in_an_array", "truncated", "not_json"],
)
def test_damage_of_another_kind_is_left_to_the_parser(data):
    repair = repair_json(data)
    with pytest.raises(json.JSONDecodeError):
        json.loads(repair.data if repair is not None else data)


def test_bytes_that_are_not_utf8_pass_through():
    data = _event('"name": "XX"q"",').replace(b"XX", b"\xff")
    repair = repair_json(data)
    assert repair is not None
    assert b'"name": "\xff\\"q\\"",' in repair.data


def test_the_repair_imports_neither_torch_nor_lightning():
    assert heavy_modules_loaded_by("lightning_perf.trace_repair") == []
