from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnipack.alignment import required_alignment
from omnipack.loader.batch import concat_rows, row_to_batch
from omnipack.loader.context_parallel import cp_partition_indices, slice_batch_for_cp
from tests.loader_rowgen import make_row


def reference_indices(cu_padded: list[int], cp: int, rank: int) -> list[int]:
    """Straight per-sequence loop over the documented zigzag: chunks r and 2cp-1-r of each sequence."""
    if cp == 1:
        return list(range(cu_padded[-1]))
    out: list[int] = []
    for a, b in zip(cu_padded[:-1], cu_padded[1:], strict=True):
        c = (b - a) // (2 * cp)
        out += list(range(a + rank * c, a + (rank + 1) * c))
        out += list(range(a + (2 * cp - 1 - rank) * c, a + (2 * cp - rank) * c))
    return out


def te_kernel_formula_indices(cu_padded: np.ndarray, cp: int, rank: int) -> list[int]:
    """The per-token source-index formula documented for TE's THD partition kernel (second oracle)."""
    cu_s = np.asarray(cu_padded, np.int64) // cp
    out = []
    for token in range(int(cu_s[-1])):
        s = int(np.searchsorted(cu_s, token, side="right")) - 1
        seq_len = int(cu_s[s + 1] - cu_s[s])
        index = token - int(cu_s[s])
        offset = rank if index < seq_len // 2 else 2 * cp - 2 - rank
        out.append(index + int(cu_s[s]) * cp + (seq_len // 2) * offset)
    return out


def test_te_golden_vector() -> None:
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    assert cp_partition_indices(cu, 2, 0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert cp_partition_indices(cu, 2, 1).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]
    assert cp_partition_indices(np.array([0, 8, 16]), 2, 1).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]


def test_cp1_is_arange() -> None:
    idx = cp_partition_indices(np.array([0, 3, 10], np.int32), 1, 0)
    assert idx.dtype == torch.int64 and idx.tolist() == list(range(10))


@settings(max_examples=60, deadline=None)
@given(
    cp=st.sampled_from([1, 2, 4, 8]),
    plens=st.lists(st.integers(0, 12), min_size=1, max_size=8),
)
def test_indices_match_reference_and_partition(cp: int, plens: list[int]) -> None:
    cu = np.concatenate([[0], np.cumsum([p * 2 * cp for p in plens])]).astype(np.int32)
    total = int(cu[-1])
    seen = []
    for r in range(cp):
        idx = cp_partition_indices(cu, cp, r)
        assert idx.dtype == torch.int64
        assert idx.tolist() == reference_indices(cu.tolist(), cp, r)
        if cp > 1:
            assert idx.tolist() == te_kernel_formula_indices(cu, cp, r)
        assert len(idx) == total // cp
        seen.append(idx)
    allidx = torch.cat(seen).sort().values if seen else torch.empty(0)
    assert torch.equal(allidx, torch.arange(total))


@pytest.mark.parametrize(
    ("cu", "cp", "match"),
    [
        ([0, 8, 14], 2, r"padded sequence 1 \(tokens \[8, 14\), length 6\).*2\*cp=4"),
        ([0, 6, 8], 2, r"padded sequence 0 .*length 6"),
        ([0, 4, 8], 4, r"padded sequence 0 .*2\*cp=8.*2 of 2"),
        ([1, 8], 2, "starting at 0"),
        ([0, 8, 4], 2, "non-decreasing"),
    ],
)
def test_misaligned_errors(cu: list[int], cp: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cp_partition_indices(np.array(cu), cp, 0)


def test_bad_cp_args() -> None:
    with pytest.raises(ValueError, match="cp_rank"):
        cp_partition_indices(np.array([0, 8]), 2, 2)
    with pytest.raises(ValueError, match="cp_size"):
        cp_partition_indices(np.array([0, 8]), 0, 0)


TOKEN_PARTS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    cp=st.sampled_from([1, 2, 4]),
    sp=st.booleans(),
    mbs=st.integers(1, 3),
    width_mult=st.integers(1, 6),
)
def test_slice_batch_matches_reference(seed: int, cp: int, sp: bool, mbs: int, width_mult: int) -> None:
    tp = 2
    align = required_alignment(tp, cp, sp)
    rng = np.random.default_rng(seed)
    w = align * width_mult
    rows = [make_row(rng, w, align, mrope=True) for _ in range(mbs)]
    b = concat_rows(rows)
    cup = b["cu_seqlens_q_padded"].tolist()
    gathered = {k: [] for k in (*TOKEN_PARTS, "mrope_position_ids")}
    for r in range(cp):
        local = slice_batch_for_cp(b, cp, r, tp_size=tp, sequence_parallel=sp)
        ref = torch.tensor(reference_indices(cup, cp, r), dtype=torch.int64)
        for k in TOKEN_PARTS:
            assert local[k].shape == (1, len(ref)) and local[k].dtype == b[k].dtype
            assert torch.equal(local[k], b[k][:, ref]), k
            gathered[k].append(ref)
        m = local["mrope_position_ids"]
        assert m.shape == (3, 1, len(ref))
        assert torch.equal(m, b["mrope_position_ids"][:, :, ref])
        # mRoPE T row and the 1-D positions were built identically per sequence: still aligned after slicing
        assert torch.equal(m[0], local["position_ids"])
        # boundaries, max_seqlen and total_tokens stay global (TE wants global cu_seqlens)
        for k in (
            "cu_seqlens_q",
            "cu_seqlens_kv",
            "cu_seqlens_q_padded",
            "cu_seqlens_kv_padded",
            "max_seqlen_q",
        ):
            assert local[k] is b[k]
        assert local["total_tokens"] == b["total_tokens"]
        if sp:
            assert local["tokens"].shape[-1] % tp == 0
    union = torch.cat(gathered["tokens"]).sort().values
    assert torch.equal(union, torch.arange(b["total_tokens"]))


def test_slice_keeps_input_untouched_and_extra_keys() -> None:
    b = row_to_batch(make_row(np.random.default_rng(0), 32, 8))
    b["input_ids_copy"] = b["tokens"].clone()
    before = b["tokens"].clone()
    local = slice_batch_for_cp(b, 2, 1, extra_token_keys=["input_ids_copy"])
    assert torch.equal(b["tokens"], before)
    assert torch.equal(local["input_ids_copy"], local["tokens"])
    assert local["tokens"].shape == (1, 16)


def test_slice_sequence_parallel_error() -> None:
    # alignment 4 satisfies cp=2, but SP with tp=4 needs 12/2 = 6 local tokens divisible by 4
    b = row_to_batch(make_row(np.random.default_rng(1), 12, 4))
    with pytest.raises(ValueError, match=r"divisible by tp=4.*12 tokens / cp=2 = 6"):
        slice_batch_for_cp(b, 2, 0, tp_size=4, sequence_parallel=True)
    slice_batch_for_cp(b, 2, 0, tp_size=4, sequence_parallel=False)  # fine without SP


def test_slice_rejects_misaligned_and_mismatched() -> None:
    b = row_to_batch(make_row(np.random.default_rng(2), 24, 2, max_seqs=6))
    cup = b["cu_seqlens_q_padded"]
    if bool((cup.diff() % 4 == 0).all()):  # make sure at least one sequence is misaligned for cp=2
        b["cu_seqlens_q_padded"] = torch.tensor([0, 2, 24], dtype=torch.int32)
    with pytest.raises(ValueError, match="padded sequence"):
        slice_batch_for_cp(b, 2, 0)
    b2 = row_to_batch(make_row(np.random.default_rng(3), 16, 4))
    b2["tokens"] = b2["tokens"][:, :8]
    with pytest.raises(ValueError, match="'tokens' has 8 tokens"):
        slice_batch_for_cp(b2, 2, 0)
    b3 = row_to_batch(make_row(np.random.default_rng(4), 16, 4))
    b3["labels"] = b3["labels"].expand(2, 16)
    with pytest.raises(ValueError, match="batch dim 2"):
        slice_batch_for_cp(b3, 2, 0)
