from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnipack.loader.batch import concat_rows, packed_seq_fields, packed_seq_params, row_to_batch
from omnipack.loader.compat import DatasetAlignmentError, check_dataset_alignment
from tests.loader_rowgen import make_row

BOUNDARY_KEYS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def _assert_batch_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype, k
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def test_row_to_batch_shapes_dtypes_and_values() -> None:
    rng = np.random.default_rng(0)
    row = make_row(rng, 64, 8, mrope=True)
    b = row_to_batch(row)
    w = 64
    for k in ("tokens", "labels", "position_ids"):
        assert b[k].shape == (1, w) and b[k].dtype == torch.int64
        assert np.array_equal(b[k][0].numpy(), row[k])
    assert b["loss_mask"].dtype == torch.float32 and b["loss_mask"].shape == (1, w)
    assert b["padding_mask"].dtype == torch.bool and np.array_equal(
        b["padding_mask"][0].numpy(), row["padding_mask"]
    )
    assert b["mrope_position_ids"].shape == (3, 1, w)
    assert np.array_equal(b["mrope_position_ids"][:, 0].numpy(), row["mrope_position_ids"])
    for k in BOUNDARY_KEYS:
        assert b[k].dtype == torch.int32 and b[k].ndim == 1
    assert np.array_equal(b["cu_seqlens_q"].numpy(), row["cu_seqlens"])
    assert np.array_equal(b["cu_seqlens_kv_padded"].numpy(), row["cu_seqlens_padded"])
    assert b["cu_seqlens_q"].data_ptr() != b["cu_seqlens_kv"].data_ptr()
    assert b["max_seqlen_q"].ndim == 0 and b["max_seqlen_q"].dtype == torch.int32
    assert int(b["max_seqlen_q"]) == int(np.diff(row["cu_seqlens_padded"]).max()) == int(b["max_seqlen_kv"])
    assert b["total_tokens"] == w and isinstance(b["total_tokens"], int)


def test_row_to_batch_accepts_torch_and_readonly_numpy() -> None:
    row = make_row(np.random.default_rng(1), 32, 4)
    for v in row.values():
        v.flags.writeable = False
    b_np = row_to_batch(row)
    b_t = row_to_batch({k: torch.from_numpy(v.copy()) for k, v in row.items()})
    _assert_batch_equal(b_np, b_t)
    assert "mrope_position_ids" not in b_np


@pytest.mark.parametrize(
    ("part", "value", "match"),
    [
        ("cu_seqlens_padded", np.array([0, 8, 12], np.int32), "expected the row width"),
        ("cu_seqlens", np.array([0, 9, 12], np.int32), "logical lengths <= padded"),
        ("tokens", np.zeros(15, np.int32), "shape"),
        ("mrope_position_ids", np.zeros((3, 15), np.int32), "shape"),
    ],
)
def test_row_to_batch_rejects_broken_rows(part: str, value: np.ndarray, match: str) -> None:
    row = {
        "tokens": np.zeros(16, np.int32),
        "labels": np.full(16, -100, np.int32),
        "loss_mask": np.zeros(16, np.int32),
        "position_ids": np.zeros(16, np.int32),
        "padding_mask": np.zeros(16, bool),
        "cu_seqlens": np.array([0, 8, 12], np.int32),
        "cu_seqlens_padded": np.array([0, 8, 16], np.int32),
    }
    row[part] = value
    with pytest.raises(ValueError, match=match):
        row_to_batch(row)


def test_row_to_batch_missing_part() -> None:
    row = make_row(np.random.default_rng(2), 16, 4)
    del row["padding_mask"]
    with pytest.raises(KeyError, match="padding_mask"):
        row_to_batch(row)


def test_concat_one_row_equals_row_to_batch() -> None:
    row = make_row(np.random.default_rng(3), 48, 8, mrope=True)
    _assert_batch_equal(concat_rows([row]), row_to_batch(row))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    mbs=st.integers(1, 4),
    align=st.sampled_from([1, 4, 8, 16]),
    width_mult=st.integers(1, 8),
    mrope=st.booleans(),
)
def test_concat_rows_boundaries(seed: int, mbs: int, align: int, width_mult: int, mrope: bool) -> None:
    rng = np.random.default_rng(seed)
    w = align * width_mult
    rows = [make_row(rng, w, align, mrope=mrope) for _ in range(mbs)]
    b = concat_rows(rows)
    t = mbs * w
    assert b["total_tokens"] == t
    for k in ("tokens", "labels", "loss_mask", "position_ids", "padding_mask"):
        assert b[k].shape == (1, t)
    cu, cup = b["cu_seqlens_q"].numpy(), b["cu_seqlens_q_padded"].numpy()
    n = sum(len(r["cu_seqlens"]) - 1 for r in rows)
    assert cu.shape == cup.shape == (n + 1,)
    assert cu.dtype == cup.dtype == np.int32
    assert cup[-1] == t and cu[0] == cup[0] == 0
    assert (np.diff(cu) <= np.diff(cup)).all() and (cu <= cup).all()
    assert np.array_equal(cu, b["cu_seqlens_kv"].numpy()) and np.array_equal(
        cup, b["cu_seqlens_kv_padded"].numpy()
    )
    # physical: row k's boundaries + k*W, shared joins once; logical: per-sequence real lengths preserved
    expect_cup = np.unique(np.concatenate([r["cu_seqlens_padded"] + k * w for k, r in enumerate(rows)]))
    assert np.array_equal(cup, expect_cup)
    assert np.array_equal(np.diff(cu), np.concatenate([np.diff(r["cu_seqlens"]) for r in rows]))
    assert int(b["max_seqlen_q"]) == max(int(np.diff(r["cu_seqlens_padded"]).max()) for r in rows)
    assert b["max_seqlen_q"].ndim == 0 and b["max_seqlen_q"].dtype == torch.int32
    for k, r in enumerate(rows):  # per-row content preserved at offset k*W
        sl = slice(k * w, (k + 1) * w)
        for part in ("tokens", "labels", "position_ids", "padding_mask"):
            assert np.array_equal(b[part][0, sl].numpy(), r[part])
        if mrope:
            assert np.array_equal(b["mrope_position_ids"][:, 0, sl].numpy(), r["mrope_position_ids"])
    # each sequence's real tokens start at its physical boundary and are not padding
    pad = b["padding_mask"][0].numpy()
    for s, n_real, p in zip(cup[:-1], np.diff(cu), np.diff(cup), strict=True):
        assert not pad[s : s + n_real].any() and pad[s + n_real : s + p].all()


def test_concat_rows_unequal_widths() -> None:
    rng = np.random.default_rng(8)
    rows = [make_row(rng, 16, 4), make_row(rng, 32, 4)]
    b = concat_rows(rows)
    assert b["total_tokens"] == 48 and b["tokens"].shape == (1, 48)
    n0 = len(rows[0]["cu_seqlens_padded"])
    assert b["cu_seqlens_q_padded"][n0 - 1 :].tolist() == (rows[1]["cu_seqlens_padded"] + 16).tolist()
    assert (
        b["cu_seqlens_q"][n0 - 1 :].tolist() == (rows[1]["cu_seqlens"] + rows[0]["cu_seqlens"][-1]).tolist()
    )


def test_concat_rows_errors() -> None:
    rng = np.random.default_rng(4)
    with pytest.raises(ValueError, match="at least one"):
        concat_rows([])
    with pytest.raises(ValueError, match="disagree"):
        concat_rows([make_row(rng, 16, 4, mrope=True), make_row(rng, 16, 4)])


def _expected_fields(b: dict) -> dict:
    return {
        "qkv_format": "thd",
        "max_seqlen_q": int(b["max_seqlen_q"]),
        "max_seqlen_kv": int(b["max_seqlen_kv"]),
    }


def test_packed_seq_params_megatron() -> None:
    psp_mod = pytest.importorskip("megatron.core.packed_seq_params")
    rng = np.random.default_rng(5)
    b = concat_rows([make_row(rng, 32, 8) for _ in range(2)])
    p = packed_seq_params(b)
    assert isinstance(p, psp_mod.PackedSeqParams)
    for k, v in _expected_fields(b).items():
        assert getattr(p, k) == v and type(getattr(p, k)) is type(v)
    for k in BOUNDARY_KEYS:
        assert torch.equal(getattr(p, k), b[k]) and getattr(p, k).dtype == torch.int32
    if hasattr(p, "total_tokens"):
        assert p.total_tokens == 64


def test_packed_seq_params_without_megatron_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from omnipack.loader import batch as batch_mod

    monkeypatch.setattr(batch_mod, "_megatron_packed_seq_params", lambda: (None, frozenset()))
    b = row_to_batch(make_row(np.random.default_rng(6), 32, 8))
    with pytest.raises(ImportError, match=r"megatron extra"):
        packed_seq_params(b)


def test_packed_seq_fields_is_a_plain_dict_with_total_tokens() -> None:
    b = row_to_batch(make_row(np.random.default_rng(6), 32, 8))
    p = packed_seq_fields(b)
    assert isinstance(p, dict)
    assert p["total_tokens"] == 32
    for k, v in _expected_fields(b).items():
        assert p[k] == v and type(p[k]) is type(v)
    for k in BOUNDARY_KEYS:
        assert torch.equal(p[k], b[k])


def test_packed_seq_params_unpadded_shares_object() -> None:
    # TE picks its no-padding path only if padded and logical are the same objects.
    row = make_row(np.random.default_rng(7), 16, 1, max_seqs=1)
    row["cu_seqlens"] = row["cu_seqlens_padded"].copy()
    row["padding_mask"][:] = False
    p = packed_seq_fields(row_to_batch(row))
    assert p["cu_seqlens_q_padded"] is p["cu_seqlens_q"] and p["cu_seqlens_kv_padded"] is p["cu_seqlens_kv"]


def test_loader_imports_without_media_stack() -> None:
    code = (
        "import sys\n"
        "import omnipack.loader.batch, omnipack.loader.context_parallel, omnipack.loader.compat\n"
        "bad = [m for m in ('av', 'decord', 'PIL', 'transformers', 'megatron.core') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("kwargs", "needed"),
    [
        ({}, 1),
        ({"cp": 2}, 4),
        ({"tp": 4, "cp": 2, "sequence_parallel": True}, 8),
        ({"tp": 2, "sequence_parallel": True, "fp8": "fp8"}, 16),
        ({"cp": 4, "fp8": "mxfp8"}, 32),
    ],
)
def test_check_dataset_alignment_ok(kwargs: dict, needed: int) -> None:
    assert check_dataset_alignment(needed, **kwargs) == needed
    assert check_dataset_alignment(needed * 3, seq_length=needed * 12, **kwargs) == needed


def test_check_dataset_alignment_errors() -> None:
    with pytest.raises(DatasetAlignmentError, match=r"alignment 4.*need a multiple of 8.*--cp 4"):
        check_dataset_alignment(4, cp=4)
    with pytest.raises(DatasetAlignmentError, match=r"--tp 4 --cp 2 --sequence-parallel --fp8 fp8"):
        check_dataset_alignment(8, tp=4, cp=2, sequence_parallel=True, fp8="fp8")
    with pytest.raises(DatasetAlignmentError, match="seq_length"):
        check_dataset_alignment(4, cp=2, seq_length=4090)
    with pytest.raises(ValueError, match="fp8"):
        check_dataset_alignment(16, fp8="fp16")
    with pytest.raises(ValueError, match="positive"):
        check_dataset_alignment(0)


def test_packed_seq_params_passes_total_tokens_where_megatron_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Newer megatron-core PackedSeqParams take ``total_tokens``: it is passed (the physical width), and
    fields a version lacks are not (the installed 0.16 has no ``total_tokens``)."""
    import dataclasses

    from omnipack.loader import batch as batch_mod

    @dataclasses.dataclass
    class NewerPackedSeqParams:
        qkv_format: str | None = None
        cu_seqlens_q: torch.Tensor | None = None
        cu_seqlens_kv: torch.Tensor | None = None
        cu_seqlens_q_padded: torch.Tensor | None = None
        cu_seqlens_kv_padded: torch.Tensor | None = None
        max_seqlen_q: int | None = None
        max_seqlen_kv: int | None = None
        total_tokens: int | None = None

    names = frozenset(f.name for f in dataclasses.fields(NewerPackedSeqParams))
    monkeypatch.setattr(batch_mod, "_megatron_packed_seq_params", lambda: (NewerPackedSeqParams, names))
    rng = np.random.default_rng(7)
    b = concat_rows([make_row(rng, 32, 8) for _ in range(2)])
    p = packed_seq_params(b)
    assert isinstance(p, NewerPackedSeqParams) and p.total_tokens == 64 and type(p.total_tokens) is int
    older = names - {"total_tokens"}
    monkeypatch.setattr(batch_mod, "_megatron_packed_seq_params", lambda: (_Older, older))
    assert packed_seq_params(b).qkv_format == "thd"


class _Older:
    """A PackedSeqParams without ``total_tokens``: passing it would be a TypeError."""

    def __init__(
        self,
        *,
        qkv_format,
        cu_seqlens_q,
        cu_seqlens_kv,
        cu_seqlens_q_padded,
        cu_seqlens_kv_padded,
        max_seqlen_q,
        max_seqlen_kv,
    ) -> None:
        self.qkv_format = qkv_format
