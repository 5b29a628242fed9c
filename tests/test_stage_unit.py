"""One unit of a stage runs once (``stages.unit.run_once``): kept while its record carries its key and its
outputs are intact, made again otherwise, and its record written only after its outputs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from omnipack.stages.unit import run_once


@dataclass
class Made:
    key: str
    value: int

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Made:
        return cls(d["key"], d["value"])


def test_a_unit_is_kept_while_its_key_and_outputs_hold(tmp_path):
    record_path, output = tmp_path / "unit" / "rec.json", tmp_path / "out.bin"
    made: list[int] = []

    def make() -> Made:
        made.append(1)
        output.write_bytes(b"x" * len(made))
        return Made("", len(made))

    def once(key: str) -> tuple[Made, bool]:
        return run_once("test", 0, record_path, key, Made.from_json, lambda r: output.is_file(), make)

    first, kept = once("a")
    assert not kept and first == Made("a", 1)  # keyed by run_once, written in its folder
    assert json.loads(record_path.read_text()) == {"key": "a", "value": 1}
    assert once("a") == (Made("a", 1), True) and len(made) == 1  # nothing made again
    output.unlink()  # an output lost since: made again
    assert once("a") == (Made("a", 2), False)
    assert once("b") == (Made("b", 3), False)  # other settings: made again
    assert json.loads(record_path.read_text()) == {"key": "b", "value": 3}


def test_a_failed_unit_leaves_no_record(tmp_path):
    record_path = tmp_path / "rec.json"

    def make() -> Made:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_once("test", 0, record_path, "a", Made.from_json, lambda r: True, make)
    assert not record_path.exists()
