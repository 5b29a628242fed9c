from __future__ import annotations

import json

from omnipack.cli import main
from omnipack.manifest import validate_record
from omnipack.tools.convert import convert_record


def test_llava_markers_become_content_parts_in_place():
    rec = {
        "id": "l1",
        "image": ["a.jpg", "b.jpg"],
        "conversations": [
            {"from": "human", "value": "<image>\nCompare with <image> please"},
            {"from": "gpt", "value": "They differ."},
        ],
    }
    out = convert_record(rec, 0)
    validate_record(out)
    assert out["messages"][0]["content"] == [
        {"type": "image", "image": "a.jpg"},
        {"type": "text", "text": "\nCompare with "},
        {"type": "image", "image": "b.jpg"},
        {"type": "text", "text": " please"},
    ]
    assert out["messages"][1] == {"role": "assistant", "content": "They differ."}


def test_image_without_marker_goes_before_first_human_text():
    out = convert_record(
        {
            "image": "x.png",
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}],
        },
        7,
    )
    assert out["id"] == "7"
    assert out["messages"][0]["content"][0] == {"type": "image", "image": "x.png"}


def test_cli_converts_and_records_unconvertible_records(tmp_path):
    src = tmp_path / "llava.json"
    src.write_text(
        json.dumps(
            [
                {
                    "id": "ok",
                    "image": "a.png",
                    "conversations": [{"from": "human", "value": "<image> q"}, {"from": "gpt", "value": "a"}],
                },
                {
                    "id": "bad",
                    "image": "a.png",
                    "conversations": [
                        {"from": "human", "value": "<image><image>"},
                        {"from": "gpt", "value": "a"},
                    ],
                },
                {"id": "role", "conversations": [{"from": "bot", "value": "x"}]},
            ]
        )
    )
    out = tmp_path / "m.jsonl"
    assert main(["convert-llava", str(src), str(out)]) == 0
    record = json.loads(src.read_text())[0]
    convert_record(record, 0)
    assert record["conversations"][0]["value"] == "<image> q"  # the caller's record is not edited
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["ok"]
    errors = [json.loads(line) for line in (tmp_path / "m.rejects.jsonl").read_text().splitlines()]
    assert [(e["id"], e["reason"]) for e in errors] == [
        ("bad", "2 <image> markers but 1 image files"),
        ("role", "unknown role 'bot'"),
    ]


def test_malformed_records_are_recorded_not_fatal(tmp_path):
    src = tmp_path / "llava.jsonl"
    good = {"id": "ok", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    lines = [
        json.dumps(good),
        "{broken json",
        json.dumps({"id": "num", "image": 5, "conversations": good["conversations"]}),
        json.dumps({"id": "str", "conversations": ["oops"]}),
        json.dumps({"id": "list-role", "conversations": [{"from": ["human"], "value": "q"}]}),
        json.dumps([1, 2]),
    ]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "m.jsonl"
    assert main(["convert-llava", str(src), str(out)]) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["ok"]
    errors = [json.loads(line) for line in (tmp_path / "m.rejects.jsonl").read_text().splitlines()]
    assert [e["index"] for e in errors] == [1, 2, 3, 4, 5]
    assert "invalid JSON" in errors[0]["reason"] and "image must be a path" in errors[1]["reason"]
    assert "list of objects" in errors[2]["reason"] and "unknown role ['human']" in errors[3]["reason"]
    assert "not an object" in errors[4]["reason"]
