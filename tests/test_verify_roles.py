"""``omnipack verify``'s roles check: the assistant turns recorded at measure time (``.nv-meta/role_spans.parquet``,
from the chat template's turn markers) catch a supervised prompt token that every other check passes (labels,
loss mask, fingerprints, checksums, index and counts all rewritten consistently); damage to the span table
itself is caught by the root digest; a dataset without spans says the check did not run."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from omnipack.cli import main
from omnipack.dataset.codec import decode_row
from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaMeta
from omnipack.text import labels
from omnipack.text.chat import ChatTokenizer, template_messages
from omnipack.tools.verify import run_verify
from tests.test_verify import _all_rows, _meta, _set_arrays
from tests.tools_dataset import edit_json, resign, rewrite_shard

SPANS = Path(".nv-meta") / "role_spans.parquet"


@pytest.fixture
def ds(demo_reference: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo_reference, tmp_path / "ds", ignore=shutil.ignore_patterns("stages")))


def results(root: Path, **kw) -> dict:
    return {r.name: r for r in run_verify(root, **kw)}


def failing(root: Path, **kw) -> dict[str, list[str]]:
    return {n: r.failures for n, r in results(root, **kw).items() if r.status == "fail"}


def _supervise_a_prompt_token(ds: Path) -> dict:
    """Label (and loss mask) on an unsupervised text token of a row's first sample (its label is the next
    token: the row contract holds), fingerprints, shard checksums, index and counts rewritten to agree."""
    shard = sorted(_all_rows(ds))[0]
    where: dict = {"shard": shard}

    def edit(rows):
        r = rows[0]
        row, _ = decode_row(r.parts)
        a, n = int(row.cu_seqlens_padded[0]), int(row.seqlens[0])
        blocks = [(m.block_start, m.block_end) for m in row.media]
        i = next(
            i for i in range(a + 1, a + n - 1)
            if row.labels[i] == -100 and not any(s <= j < e for s, e in blocks for j in (i, i + 1))
        )  # fmt: skip
        labels_, loss = row.labels.copy(), row.loss_mask.copy()
        labels_[i], loss[i] = row.tokens[i + 1], 1
        _set_arrays(r, labels=labels_, loss_mask=loss)
        resign(r)
        where.update(sid=row.sample_ids[0], position=i - a)
        return rows

    rewrite_shard(ds, shard, edit)
    return where


def test_intact_dataset_passes_with_every_sample_checked(demo_reference: Path) -> None:
    roles = results(demo_reference)["roles"]
    assert roles.status == "pass", roles.failures
    spans = pq.read_table(demo_reference / SPANS)
    packed = _meta(demo_reference)["counts"]["packed"]
    assert roles.notes == [f"{packed} samples' supervised tokens checked against {spans.num_rows} assistant turns"]
    assert len(set(spans.column("sample_index").to_pylist())) == packed  # every packed sample has its turns


def test_a_supervised_prompt_token_fails_naming_shard_row_sample_and_position(ds: Path) -> None:
    where = _supervise_a_prompt_token(ds)
    fails = failing(ds)
    assert set(fails) == {"roles"}, fails  # self-consistent: only the turns recorded at measure time see it
    (msg,) = fails["roles"]
    assert msg.startswith(f"{where['shard']} row 0 ")
    assert f"sample {where['sid']} " in msg and "labels/loss_mask" in msg
    assert f"supervise sample position {where['position']} " in msg


def test_damage_to_the_span_table_is_caught_by_the_root(ds: Path) -> None:
    """A forger who supervises a prompt token and widens its sample's recorded turn to cover it passes every
    check but the root: the span table is a leaf like every dataset file."""
    expected = _meta(ds)["root"]["sha256"]
    _supervise_a_prompt_token(ds)
    table = pq.read_table(ds / SPANS)
    start = table.column("start").to_numpy().copy()
    start[:] = 0  # every turn now starts at its sample's first token
    pq.write_table(table.set_column(1, "start", [start.astype(np.int32)]), ds / SPANS)
    assert failing(ds) == {}
    fails = failing(ds, expect_root=expected)
    assert set(fails) == {"root"}
    assert any(m.startswith(f"{SPANS.as_posix()}: ") for m in fails["root"]), fails["root"]


def test_a_dataset_without_spans_says_they_were_not_checked(ds: Path, capsys: pytest.CaptureFixture) -> None:
    (ds / SPANS).unlink()
    edit_json(ds / ".nv-meta" / "omnipack.json", lambda d: d.pop("role_spans_file"))
    roles = results(ds)["roles"]
    assert roles.status == "skip" and roles.skipped.startswith("not checked: no role spans recorded")
    assert main(["verify", str(ds)]) == 0  # not a failure (--strict makes every skip one)
    assert "not checked: no role spans recorded" in capsys.readouterr().out


def test_a_multi_turn_samples_spans_are_the_templates_turn_marker_spans(demo_tokenizer: Path) -> None:
    """Each assistant turn's recorded span is the tokens of the text the template writes after its
    generation prompt (through the turn end), moved past the image expansion before it."""
    chat = ChatTokenizer(demo_tokenizer, get_profile("qwen2_5_vl"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]},
        {"role": "assistant", "content": "A red square on grey."},
        {"role": "user", "content": "And its size?"},
        {"role": "assistant", "content": "About a quarter of the frame."},
    ]
    enc = chat.encode(messages, [chat.profile.plan(MediaMeta("image", width=84, height=56))])
    msgs = template_messages(messages)
    full = chat.render(msgs)
    assert chat._turn_prompt is not None  # the demo template marks assistant turns with a special token
    char_spans = labels.spans_by_turn_prompt(msgs, full, chat._turn_prompt, chat.profile.turn_end)
    starts = np.asarray([a for a, _ in chat.tokenizer(full, return_offsets_mapping=True)["offset_mapping"]])
    (image,) = enc.spans
    block = len(chat.profile.template_blocks["image"])
    moved = (image.end - image.start) - block  # tokens the expansion adds before both turns
    want = [
        [int(np.searchsorted(starts, a)) + moved, int(np.searchsorted(starts, b)) + moved] for a, b in char_spans
    ]
    assert len(want) == 2 and enc.assistant_spans.tolist() == want
    # and the turns hold exactly the supervised targets
    targets = np.flatnonzero(enc.labels != -100) + 1
    assert np.array_equal(targets, np.concatenate([np.arange(a, b) for a, b in want]))

