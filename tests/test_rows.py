"""Row assembly holds the THD contract for any mix of sequence lengths and alignments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnipack.alignment import ParallelLayout, check_seq_length, pad_to_multiple, required_alignment
from omnipack.dataset.contract import IGNORE_INDEX, row_invariant_errors
from omnipack.stages.write import SequenceInput, assemble_row

PAD = 0


def _seq(rng: np.random.Generator, i: int, n: int) -> SequenceInput:
    ids = rng.integers(5, 500, size=n).astype(np.int32)
    mask = rng.random(n) < 0.5
    labels = np.full(n, IGNORE_INDEX, dtype=np.int32)
    labels[:-1] = np.where(mask[1:], ids[1:], IGNORE_INDEX)
    return SequenceInput(f"s{i}", ids, labels)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=12),
    align=st.sampled_from([1, 2, 4, 8, 16, 32, 48]),
    slack=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_assembled_rows_hold_every_invariant(lengths, align, slack, seed):
    rng = np.random.default_rng(seed)
    w = sum(pad_to_multiple(n, align) for n in lengths) + slack * align
    seqs = [_seq(rng, i, n) for i, n in enumerate(lengths)]
    row = assemble_row(seqs, w, align, PAD)
    assert row_invariant_errors(row, align) == []
    assert np.array_equal(np.diff(row.cu_seqlens), lengths)
    padded = [pad_to_multiple(n, align) for n in lengths]
    padded[-1] += w - sum(padded)  # the row tail belongs to the last sequence
    assert np.array_equal(np.diff(row.cu_seqlens_padded), padded)
    assert row.max_seqlen == max(lengths) and row.max_seqlen_padded == max(padded)
    assert int((~row.padding_mask).sum()) == sum(lengths)
    for s, a in zip(seqs, row.cu_seqlens_padded[:-1], strict=True):
        assert np.array_equal(row.tokens[a : a + len(s.input_ids)], s.input_ids)
        assert row.position_ids[a] == 0


def test_invariant_checker_catches_broken_rows():
    rng = np.random.default_rng(0)
    row = assemble_row([_seq(rng, 0, 10), _seq(rng, 1, 7)], 24, 4, PAD)
    assert row_invariant_errors(row, 4) == []
    bad = assemble_row([_seq(rng, 0, 10), _seq(rng, 1, 7)], 24, 4, PAD)
    bad.padding_mask[11] = False
    assert any("padding_mask" in e for e in row_invariant_errors(bad, 4))
    bad = assemble_row([_seq(rng, 0, 10), _seq(rng, 1, 7)], 24, 4, PAD)
    bad.position_ids[12] = 5
    assert any("position_ids" in e for e in row_invariant_errors(bad, 4))
    bad = assemble_row([_seq(rng, 0, 10), _seq(rng, 1, 7)], 24, 4, PAD)
    bad.labels[9] = bad.tokens[10]  # last token of sequence 0 predicting the next sample
    bad.loss_mask[9] = 1
    assert any("next token" in e or "last token" in e for e in row_invariant_errors(bad, 4))
    assert any("multiples of align" in e for e in row_invariant_errors(row, 8))
    bad = assemble_row([_seq(rng, 0, 10), _seq(rng, 1, 7)], 24, 4, PAD)
    bad.loss_mask[np.flatnonzero(bad.loss_mask)[0]] = 2  # not 0/1, yet nonzero where labels are set
    assert any("other than 0/1" in e for e in row_invariant_errors(bad, 4))


def test_stray_placeholders_are_caught_in_rows_without_media():
    from omnipack.dataset.contract import media_placeholder_errors

    rng = np.random.default_rng(1)
    row = assemble_row([_seq(rng, 0, 10), _seq(rng, 1, 7)], 24, 4, PAD)
    ids = {"image": [900], "video": [901]}
    assert media_placeholder_errors(row, ids) == []
    row.tokens[3] = 901
    assert media_placeholder_errors(row, ids) == [
        "row holds 1 placeholder tokens but its media items account for 0"
    ]


def test_row_overflow_is_an_error():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="need 16 positions"):
        assemble_row([_seq(rng, 0, 7), _seq(rng, 1, 7)], 12, 8, PAD)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (ParallelLayout(), 1),
        (ParallelLayout(cp=2), 4),
        (ParallelLayout(tp=4, cp=2, sequence_parallel=True), 8),  # lcm(2*2, 2*4)
        (ParallelLayout(tp=4, sequence_parallel=True), 4),
        (ParallelLayout(tp=4), 1),  # no SP, no constraint from TP
        (ParallelLayout(cp=2, fp8="fp8"), 16),
        (ParallelLayout(cp=4, fp8="mxfp8"), 32),
        (ParallelLayout(tp=3, cp=2, sequence_parallel=True), 12),
    ],
)
def test_alignment_rule(layout, expected):
    assert (
        layout.alignment
        == expected
        == required_alignment(layout.tp, layout.cp, layout.sequence_parallel, layout.fp8)
    )


def test_seq_length_must_be_multiple_of_alignment():
    check_seq_length(4096, 32)
    with pytest.raises(ValueError, match="not a multiple of the alignment 12; use 4104 or 4092"):
        check_seq_length(4096, 12)


def test_row_media_info_keeps_its_shape_with_a_typed_storage_plan():
    """The writer's typed instructions (``truncate``) are recorded in the row's media info as the keys and
    order datasets were written with ("truncated" in its info under a length cap, nothing without one); a
    video stores its own audio only when its block interleaves it."""
    from omnipack.media.storage_plan import StoragePlan
    from omnipack.profiles import MediaPlan

    ids = np.arange(10, 16, dtype=np.int32)
    for truncate, recorded in ((True, {"truncated": True}), (False, {"truncated": False}), (None, None)):
        audio = MediaPlan("audio", 4, sample_rate=16000, num_audio_samples=480000, audio_frames=3000,
                          truncate=truncate)  # fmt: skip
        seq = SequenceInput("a", ids, np.full(6, IGNORE_INDEX, np.int32), [(audio, (1, 5, 1, 4), "media.0.npy")])
        (item,) = assemble_row([seq], 8, 8, PAD).media
        expected = [("sample_rate", 16000), ("num_audio_samples", 480000), ("audio_frames", 3000)]
        assert list(item.info.items()) == expected + ([("info", recorded)] if recorded else [])
        assert audio.storage.truncate is bool(truncate) and audio.storage.num_audio_samples == 480000
    video = MediaPlan("video", 8, target_hw=(28, 28), frame_indices=(0, 1), sample_rate=16000, num_audio_samples=99)
    assert video.storage == StoragePlan("video", target_hw=(28, 28), frame_indices=(0, 1), sample_rate=16000)
    with_audio = MediaPlan("video", 8, frame_indices=(0, 1), sample_rate=16000, num_audio_samples=99, audio_num_tokens=2)
    assert with_audio.storage.num_audio_samples == 99
