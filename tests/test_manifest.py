from __future__ import annotations

import json

import pytest

from omnipack.manifest import ManifestError, read_manifest, resolve_media, validate_record

ASSISTANT = {"role": "assistant", "content": "ok"}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"messages": [ASSISTANT]}, "'id' is a required property"),
        ({"id": "a", "messages": []}, "messages"),
        ({"id": "a", "messages": [{"role": "robot", "content": "x"}, ASSISTANT]}, "unknown role 'robot'"),
        (
            {"id": "a", "messages": [{"role": "user", "content": [{"type": "image"}]}, ASSISTANT]},
            "'image' is a required property",
        ),
        (
            {"id": "a", "messages": [{"role": "user", "content": [{"type": "gif", "gif": "x"}]}, ASSISTANT]},
            "gif",
        ),
        (
            {"id": "a", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
            "empty assistant turn at messages/1",
        ),
        (
            {
                "id": "a",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": [{"type": "image", "image": "x"}]},
                ],
            },
            "empty assistant turn",
        ),
        ({"id": "a", "messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
    ],
)
def test_invalid_records_get_specific_reasons(record, reason):
    with pytest.raises(ManifestError, match=reason):
        validate_record(record)


def test_valid_record_with_string_and_list_content():
    validate_record(
        {
            "id": 3,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "image", "image": "i.png"}],
                },
                ASSISTANT,
            ],
        }
    )


def test_reader_keeps_every_line_and_flags_duplicates_and_bad_json(tmp_path):
    p = tmp_path / "m.jsonl"
    good = {"id": "x", "messages": [{"role": "user", "content": "q"}, ASSISTANT]}
    p.write_text(json.dumps(good) + "\n{not json\n\n" + json.dumps(good) + "\n")
    samples = list(read_manifest([p]))
    assert [s.index for s in samples] == [0, 1, 2]
    assert samples[0].error is None and samples[0].source == "m.jsonl:1"
    assert "invalid JSON" in samples[1].error and samples[1].source == "m.jsonl:2"
    assert "duplicate sample id 'x'" in samples[2].error


def test_media_paths_cannot_escape_the_root(tmp_path):
    (tmp_path / "media").mkdir()
    assert resolve_media(tmp_path / "media", "a/b.png") == (tmp_path / "media" / "a" / "b.png").resolve()
    for ref in ("../x.png", "/etc/passwd", "a/../../x.png"):
        with pytest.raises(ManifestError, match="escapes the media root"):
            resolve_media(tmp_path / "media", ref)


def test_byte_order_mark_and_crlf_are_tolerated(tmp_path):
    p = tmp_path / "m.jsonl"
    line = json.dumps({"id": "x", "messages": [{"role": "user", "content": "q"}, ASSISTANT]})
    p.write_bytes(("\ufeff" + line + "\r\n" + line.replace('"x"', '"y"') + "\r\n").encode())
    samples = list(read_manifest([p]))
    assert [(s.sample_id, s.error) for s in samples] == [("x", None), ("y", None)]
