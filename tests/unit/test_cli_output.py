"""Rendering for people (aligned tables, records) and for scripts (JSON, YAML)."""

from __future__ import annotations

import json

import pytest
import yaml

from paddlecloud.output import cell, render_data, render_record, render_table

ROWS = [
    {"name": "alice", "admin": True, "cpu": "4", "note": None},
    {"name": "bartholomew", "admin": False, "cpu": "500m", "note": "two\nlines"},
]


def test_table_columns_line_up_under_their_headers() -> None:
    text = render_table(ROWS, [("NAME", "name"), ("ADMIN", "admin"), ("CPU", "cpu"), ("NOTE", "note")])
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "ADMIN", "CPU", "NOTE"]
    assert lines[1].split() == ["alice", "yes", "4", "-"]
    assert lines[2].split() == ["bartholomew", "no", "500m", "two", "lines"]
    for header in ("ADMIN", "CPU", "NOTE"):
        column = lines[0].index(header)
        # Every row's value starts where its header starts.
        assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines)
    assert all(line == line.rstrip() for line in lines)


def test_table_columns_default_to_every_key_and_empty_tables_can_say_so() -> None:
    text = render_table([{"a": 1}, {"b": [1, 2], "a": {"x": 1}}])
    assert text.splitlines() == ["A    B", "1    -", "x=1  1,2"]
    assert render_table([], [("NAME", "name")], empty="No users.") == "No users.\n"
    assert render_table([], [("NAME", "name")]) == "NAME\n"


def test_wide_characters_count_double() -> None:
    lines = render_table([{"n": "数据", "v": 1}, {"n": "ab", "v": 2}], [("N", "n"), ("V", "v")]).splitlines()
    assert lines[1] == "数据  1"
    assert lines[2] == "ab    2"


def test_records_line_up_their_values() -> None:
    text = render_record({"name": "bob", "cpu": None}, [("User", "name"), ("CPU limit", "cpu")])
    assert text == "User:      bob\nCPU limit: -\n"


def test_cells_stay_on_one_line() -> None:
    assert cell("a\tb\nc") == "a b c"
    assert cell([]) == "-"
    assert cell(False) == "no"


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_json_and_yaml_give_back_the_data_unchanged(fmt: str) -> None:
    data = {"users": [{"name": "ünï", "quota": {"cpu": "4", "gpu": None}, "admin": False}], "next": None}
    text = render_data(data, fmt)
    parsed = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert parsed == data
    assert "ünï" in text  # not escaped: people read it too
    if fmt == "json":
        assert text.startswith('{\n  "users"')  # indent 2
