"""The loader's per-row contract check: each kind of damage (built with every count, index and checksum
kept consistent, so only the check itself can see it) stops the real Energon loader with a fatal error
naming the row key and the sample; ``check_rows=False`` turns it off."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from megatron.energon import WorkerConfig, get_loader, get_val_dataset
from megatron.energon.errors import FatalSampleError

from omnipack.dataset.codec import load_npy, npy_bytes
from omnipack.dataset.contract import IGNORE_INDEX
from omnipack.loader.task_encoder import OmnipackTaskEncoder, RowContractError
from tests.tools_dataset import build_small_dataset, copy_dataset, rewrite_shard, stop_loader_workers

SHARD = "shards/shard-000000.tar"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_dataset(tmp_path_factory.mktemp("contract"))


def _cause(e: BaseException) -> BaseException:
    """The innermost exception Energon wrapped."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _placeholders(root: Path) -> np.ndarray:
    meta = json.loads((root / ".nv-meta" / "omnipack.json").read_text())
    ids = meta["tokenizer"]["placeholder_token_ids"]
    return np.asarray(sorted({i for v in ids.values() for i in v}))


def _load_all(root: Path, workers: int = 0, **options) -> int:
    te = OmnipackTaskEncoder.from_dataset(root, **options)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = get_val_dataset(str(root), split_part="train", worker_config=wc, batch_size=1, task_encoder=te)
    try:
        return sum(1 for _ in get_loader(ds))
    except BaseException:
        if workers:
            stop_loader_workers()
        raise


def _damage(root: Path, fn: Callable[[dict[str, np.ndarray], dict], str]) -> tuple[str, str]:
    """Apply ``fn(arrays, meta) -> damaged sample id`` to the first row of SHARD that has an image;
    returns (row key, sample id). The shard's index, size, sha256 and counts are rewritten to match."""
    hit: dict[str, str] = {}

    def transform(rows):
        for r in rows:
            meta = json.loads(r.parts["meta.json"])
            if hit or not any(m["kind"] == "image" for m in meta["media"]):
                continue
            arrays = {
                p[:-4]: load_npy(d) for p, d in r.parts.items() if p.endswith(".npy") and "media" not in p
            }
            hit["sample"] = fn(arrays, meta)
            hit["key"] = r.key
            for name, arr in arrays.items():
                r.parts[f"{name}.npy"] = npy_bytes(arr)
            r.parts["meta.json"] = json.dumps(meta).encode()
        assert hit, "no row with an image in the shard"
        return rows

    rewrite_shard(root, SHARD, transform)
    return hit["key"], hit["sample"]


def _sample_at(a: dict[str, np.ndarray], meta: dict, pos: int) -> str:
    return meta["sample_ids"][int(np.searchsorted(a["cu_seqlens_padded"], pos, side="right")) - 1]


def _first_placeholder(a: dict[str, np.ndarray], meta: dict, root: Path) -> int:
    m = next(m for m in meta["media"] if m["kind"] == "image")
    assert a["tokens"][m["token_start"]] in _placeholders(root)
    return int(m["token_start"])


def _supervise(a: dict[str, np.ndarray], i: int) -> None:
    """Position i predicts its next token, with loss: consistent with every other invariant."""
    a["labels"][i] = a["tokens"][i + 1]
    a["loss_mask"][i] = 1


def dmg_label_on_placeholder(root):
    def fn(a, meta):
        i = _first_placeholder(a, meta, root)
        _supervise(a, i)
        return _sample_at(a, meta, i)

    return fn, "supervised on a placeholder token"


def dmg_label_targets_placeholder(root):
    def fn(a, meta):
        i = _first_placeholder(a, meta, root) - 1  # the token before the first placeholder (vision start)
        _supervise(a, i)
        return _sample_at(a, meta, i)

    return fn, "a label whose target is a placeholder token"


def dmg_loss_mask_without_label(root):
    def fn(a, meta):
        i = int(np.flatnonzero((a["labels"] == IGNORE_INDEX) & ~a["padding_mask"])[0])
        a["loss_mask"][i] = 1
        return meta["sample_ids"][0]

    return fn, "loss_mask disagrees with labels"


def dmg_padding_mask(root):
    def fn(a, meta):
        i = int(a["cu_seqlens"][1]) - 1  # the last real token of the first sequence marked as padding
        a["padding_mask"][i] = True
        return meta["sample_ids"][0]

    return fn, "padding_mask is not exactly the alignment gaps"


def dmg_boundary_not_at_width(root):
    def fn(a, meta):
        a["cu_seqlens_padded"][-1] -= 4  # still a multiple of align, logical ends untouched
        return meta["sample_ids"][-1]

    return fn, "cu_seqlens_padded ends at"


def dmg_boundaries_not_monotone(root):
    def fn(a, meta):
        cu = a["cu_seqlens"]
        assert len(cu) >= 3, "needs a row with two sequences"
        cu[1] = cu[2] + 1  # logical boundaries go backwards
        return meta["sample_ids"][0]

    return fn, "not strictly increasing"


def dmg_dtype(root):
    def fn(a, meta):
        a["tokens"] = a["tokens"].astype(np.int64)
        return meta["sample_ids"][0]

    return fn, "tokens dtype int64, expected int32"


DAMAGES = [
    dmg_label_on_placeholder,
    dmg_label_targets_placeholder,
    dmg_loss_mask_without_label,
    dmg_padding_mask,
    dmg_boundary_not_at_width,
    dmg_boundaries_not_monotone,
    dmg_dtype,
]


def test_the_intact_dataset_passes_the_check(small: Path) -> None:
    assert _load_all(small) > 0


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__[4:])
def test_each_damage_stops_the_loader_naming_row_and_sample(small: Path, tmp_path: Path, damage) -> None:
    ds = copy_dataset(small, tmp_path / "ds")
    fn, message = damage(ds)
    key, sample = _damage(ds, fn)
    # Energon's error handler re-raises a FatalSampleError (wrapping ours), never skips the row.
    with pytest.raises(FatalSampleError, match="packed-row contract") as e:
        _load_all(ds)
    assert isinstance(_cause(e.value), RowContractError)
    text = str(e.value)
    assert f"row {key!r}" in text and repr(sample) in text and message in text, text


def test_a_worker_process_stops_the_loader_too(small: Path, tmp_path: Path) -> None:
    ds = copy_dataset(small, tmp_path / "ds")
    key, sample = _damage(ds, dmg_label_on_placeholder(ds)[0])
    with pytest.raises(Exception, match="supervised on a placeholder token") as e:
        _load_all(ds, workers=1)
    assert key in str(e.value) and sample in str(e.value)


def test_check_rows_false_turns_the_check_off(small: Path, tmp_path: Path) -> None:
    ds = copy_dataset(small, tmp_path / "ds")
    _damage(ds, dmg_label_on_placeholder(ds)[0])  # media and placeholder counts stay intact
    with pytest.raises(FatalSampleError, match="packed-row contract"):
        _load_all(ds)
    assert _load_all(ds, check_rows=False) == _load_all(small)


def test_is_any_of_equals_isin() -> None:
    """The loader's per-row membership test gives np.isin's answer (ids close together, far apart, none,
    negative labels, more members than the comparison loop takes)."""
    from omnipack.dataset.contract import is_any_of

    rng = np.random.default_rng(0)
    values = rng.integers(-100, 152000, 5000).astype(np.int32)
    values[::7] = 151655
    for members in ([151655, 151656], [0, 1], [], [-100], [3, 151655, 99999], list(range(151640, 151670))):
        assert np.array_equal(is_any_of(values, members), np.isin(values, np.asarray(members, dtype=np.int64)))
