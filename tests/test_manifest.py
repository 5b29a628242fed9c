from __future__ import annotations

import json

import pytest

from omnipack.manifest import ManifestError, read_manifest, validate_record

ASSISTANT = {"role": "assistant", "content": "ok"}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"id": "a"}, "'messages' is a required property"),
        ({"id": "a", "messages": [ASSISTANT]}, "assistant-only conversation: no user turn"),
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


def test_byte_order_mark_and_crlf_are_tolerated(tmp_path):
    p = tmp_path / "m.jsonl"
    line = json.dumps({"id": "x", "messages": [{"role": "user", "content": "q"}, ASSISTANT]})
    p.write_bytes(("\ufeff" + line + "\r\n" + line.replace('"x"', '"y"') + "\r\n").encode())
    samples = list(read_manifest([p]))
    assert [(s.sample_id, s.error) for s in samples] == [("x", None), ("y", None)]


def test_overlong_line_is_rejected_unread_and_reading_goes_on(tmp_path):
    p = tmp_path / "m.jsonl"
    good = {"id": "a", "messages": [{"role": "user", "content": "q"}, ASSISTANT]}
    huge = {"id": "b", "messages": [{"role": "user", "content": "x" * 3_000_000}, ASSISTANT]}
    lines = [json.dumps(good), json.dumps(huge), json.dumps({**good, "id": "c"})]
    p.write_text("\n".join(lines))  # no newline at the end
    samples = list(read_manifest([p], max_line_bytes=1 << 20))
    assert [s.index for s in samples] == [0, 1, 2]
    assert [s.source for s in samples] == ["m.jsonl:1", "m.jsonl:2", "m.jsonl:3"]
    assert samples[0].error is None and samples[2].error is None and samples[2].sample_id == "c"
    assert samples[1].record is None
    assert (
        samples[1].error
        == f"line of {len(lines[1]) + 1} bytes is over the 1048576-byte limit (max_line_bytes); not read"
    )
    # a line exactly at the cap is read
    exact = list(read_manifest([p], max_line_bytes=len(lines[1])))
    assert exact[1].error is None and exact[1].sample_id == "b"


def test_invalid_utf8_line_is_rejected_and_reading_goes_on(tmp_path):
    p = tmp_path / "m.jsonl"
    line = json.dumps({"id": "x", "messages": [{"role": "user", "content": "q"}, ASSISTANT]}).encode()
    p.write_bytes(b'{"id": "\xff"}\n' + line + b"\n")
    samples = list(read_manifest([p]))
    assert samples[0].error == "invalid UTF-8 at byte 8" and samples[1].error is None


@pytest.mark.parametrize(
    "record",
    [
        {"id": True, "messages": [ASSISTANT]},
        {"id": 1.5, "messages": [ASSISTANT]},
        {"id": "a", "messages": [ASSISTANT], "meta": []},
        {"id": "a", "messages": [{"role": "user", "content": [{"type": "image", "image": ""}]}, ASSISTANT]},
        {"id": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}, ASSISTANT]},
        {"id": "a", "messages": [{"role": "user", "content": None}, ASSISTANT]},
        {"id": "a", "messages": [{"role": "user"}, ASSISTANT]},
        {"id": "a", "messages": [ASSISTANT, "text"]},
        ["not", "a", "record"],
    ],
)
def test_fast_path_never_accepts_what_the_schema_rejects(record):
    from omnipack.inputs.records import _plainly_valid, _validator

    assert not _plainly_valid(record)
    assert list(_validator().iter_errors(record))


def test_fast_path_agrees_with_the_schema_on_generated_records():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from omnipack.inputs.records import _plainly_valid, _validator

    scalar = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3)
    )
    kind = st.sampled_from(["text", "image", "video", "audio", "gif"])
    part = st.fixed_dictionaries(
        {"type": kind}, optional={"text": scalar, "image": scalar, "video": scalar, "audio": scalar}
    )
    # Near-valid records half the time (string content, one role off), so both branches are exercised.
    text = st.text(min_size=1, max_size=3)
    roles = st.sampled_from(["system", "user", "assistant", "assistant", "robot"])
    content = st.one_of(text, scalar, st.lists(part, min_size=1, max_size=3), st.lists(part, max_size=3))
    message = st.fixed_dictionaries({"role": roles}, optional={"content": content})
    near_valid_message = st.fixed_dictionaries({"role": roles, "content": content})
    full = st.fixed_dictionaries(
        {
            "id": st.one_of(text, st.integers(), scalar),
            "messages": st.lists(near_valid_message, min_size=1, max_size=3),
        },
        optional={"meta": st.one_of(st.just({}), scalar)},
    )
    partial = st.fixed_dictionaries(
        {},
        optional={
            "id": scalar,
            "messages": st.lists(message, max_size=3),
            "meta": st.one_of(scalar, st.just({})),
        },
    )
    record = st.one_of(full, full, partial)
    accepted = []

    @settings(max_examples=400)
    @given(record)
    def check(r):
        if _plainly_valid(r):
            accepted.append(r)
            assert not list(_validator().iter_errors(r))

    check()
    assert len(accepted) >= 5  # the fast path was taken, so its agreement with the schema was checked
