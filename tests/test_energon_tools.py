"""Stock ``energon info|lint|preview`` with default flags on freshly prepared omnipack datasets (text-only,
and images + video + audio with mRoPE ids): ``lint`` once as the real CLI in a fresh process (which proves
that it finds the sample type the dataset names), the other runs as the same click commands in this process
(no interpreter start for each); and the loader reading the same ``dataset.yaml`` (and the crude
config through the task encoder's cooker) to identical batches."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from omnipack.dataset.codec import decode_row
from omnipack.dataset.meta import CRUDE_CONFIG, NV_META, read_omnipack_meta, write_dataset_configs
from omnipack.loader.media import decode_payload
from omnipack.loader.task_encoder import OmnipackTaskEncoder
from tests.test_pipeline import read_rows_from_tars
from tests.tools_dataset import build_av_dataset, stop_loader_workers

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "Tell me about the red square.",
    "What is a circle?",
    "Describe the dark corner, briefly.",
    "Count to five.",
    "Name two bright colours and one dark one.",
]


def energon_here(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """The stock Energon CLI's click command (``energon = megatron.energon.cli.main:main``) run in this process:
    its exit code (non-zero for an exception it raised), stdout and stderr."""
    from click.testing import CliRunner
    from megatron.energon.cli.main import main as energon_main

    res = CliRunner().invoke(energon_main, list(args), input=stdin)
    if res.exit_code != 0:
        stop_loader_workers()
    return subprocess.CompletedProcess(["energon", *args], res.exit_code, res.stdout, res.stderr)


def energon(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """The stock Energon CLI (``energon = megatron.energon.cli.main:main``) in a fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "megatron.energon.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory) -> Path:
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare

    root = tmp_path_factory.mktemp("text")
    tok = build_demo_tokenizer(root / "tok")
    manifest = root / "manifest.jsonl"
    with open(manifest, "w") as f:
        for i in range(12):
            q, a = TEXTS[i % len(TEXTS)], " ".join(TEXTS[(i + 1) % len(TEXTS)] for _ in range(1 + i % 3))
            msgs = [
                {"role": "user", "content": [{"type": "text", "text": q}]},
                {"role": "assistant", "content": a},
            ]
            f.write(json.dumps({"id": f"text-{i:02d}", "messages": msgs}) + "\n")
    out = root / "ds"
    run_prepare(
        PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(root),
            tokenizer=str(tok),
            output=str(out),
            seq_length=256,
            cp=2,
            shard_max_rows=2,
            progress=False,
        )
    )
    return out


@pytest.fixture(scope="module")
def media_dataset(tmp_path_factory) -> Path:
    return build_av_dataset(tmp_path_factory.mktemp("av"), num_samples=8)


def _rows(root: Path) -> int:
    return sum(int(s["count"]) for s in read_omnipack_meta(root)["shards"])


@pytest.mark.parametrize("which", ["text_dataset", "media_dataset"])
def test_energon_info_with_default_flags(which, request):
    root = request.getfixturevalue(which)
    res = energon_here("info", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"({_rows(root)} samples" in res.stdout
    assert "Sample Type: {py:class}`OmnipackRow <omnipack.loader.energon_dataset.OmnipackRow>`" in res.stdout
    assert re.search(rf"`train`: 100%, {_rows(root)} samples", res.stdout)


@pytest.mark.parametrize("which", ["text_dataset", "media_dataset"])
def test_energon_lint_with_default_flags_decodes_every_row(which, request):
    root = request.getfixturevalue(which)
    # the real CLI once (a fresh process finds the sample type the dataset names); the same command in this
    # process for the other dataset (the sample type is found the same way: no interpreter start again)
    res = (energon if which == "text_dataset" else energon_here)("lint", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Checking the index files" in res.stdout
    assert f"{_rows(root)}/{_rows(root)}" in res.stderr  # tqdm: every row went through the loader


def test_energon_lint_names_a_row_that_does_not_decode(text_dataset, tmp_path):
    """A row whose tokens part is not an .npy array; the tar, its index and the counts stay consistent, so
    only decoding the row can find it."""
    root = shutil.copytree(text_dataset, tmp_path / "ds")
    shard = sorted((root / "shards").glob("*.tar"))[0]
    with tarfile.open(shard) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    bad_key = members[0][0].name.split(".", 1)[0]
    buf, offsets, prev = io.BytesIO(), [], None
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as out:
        for m, data in members:
            key, part = m.name.split(".", 1)
            if key != prev:
                offsets.append(out.offset)
                prev = key
            if key == bad_key and part == "tokens.npy":
                data = b"not an npy array"
            info = tarfile.TarInfo(m.name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        offsets.append(out.offset)
    shard.write_bytes(buf.getvalue())
    Path(f"{shard}.idx").write_bytes(np.asarray(offsets, dtype="<u8").tobytes())
    res = energon_here("lint", str(root))
    assert res.returncode != 0
    assert f"row {bad_key!r} of " in res.stderr and "does not decode" in res.stderr, res.stderr[-3000:]
    assert "Validation failed" in res.stderr


def _preview_first_row(root: Path) -> tuple[str, str]:
    res = energon_here("preview", str(root), stdin="n\n")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "Sample 0" in out and "Sample 1" not in out and "Exiting Preview" in out
    assert len(out) < 40_000, len(out)  # fields print as summaries: no payload bytes, no [3, W] "picture"
    key = re.search(r"row '([^']+)'", out).group(1)
    return out, key


@pytest.mark.parametrize("which", ["text_dataset", "media_dataset"])
def test_energon_preview_shows_what_the_row_holds(which, request):
    root = request.getfixturevalue(which)
    out, key = _preview_first_row(root)
    parts = read_rows_from_tars(root)[key]
    row, meta = decode_row(parts)
    width, padding = row.tokens.size, int(row.padding_mask.sum())
    lengths = np.diff(row.cu_seqlens)
    assert f"{width} tokens = {width - padding} in {len(lengths)} sequences + {padding} padding" in out
    assert f"{int(row.loss_mask.sum())} supervised" in out
    for i, (sid, n) in enumerate(zip(row.sample_ids, lengths.tolist(), strict=True)):
        assert f"sequence {i} {sid!r}: {n} tokens" in out
    for j, m in enumerate(row.media):
        payload = decode_payload(m.part, parts[m.part])
        arrays = payload if isinstance(payload, dict) else {"": payload}
        shapes = ", ".join(
            f"{(k + ' ') if k else ''}{a.dtype.name} {list(a.shape)}" for k, a in arrays.items()
        )
        assert f"media {j}: {m.kind} {m.part!r} {shapes}, {m.num_tokens} placeholder tokens" in out
    if which == "text_dataset":
        assert not row.media and "media 0:" not in out and " - mrope (" in out
    else:
        kinds = {m.kind for r in read_rows_from_tars(root).values() for m in decode_row(r)[0].media}
        assert kinds == {"image", "video", "audio"}
        assert row.media, "the first row of the demo corpus holds media"
        mrope = row.mrope_position_ids
        assert f"mRoPE ids {mrope.dtype.name} [3, {width}]: t 0..{int(mrope[0].max())}" in out
        assert (
            "mrope (" in out
            and " - mrope (omnipack.loader.energon_dataset.MRopePositionIds | None): None" not in out
        )
    assert re.search(r" - media \(.*\): \{" + (r"'" if row.media else r"\}"), out)


def test_a_dataset_prepared_with_the_crude_dataset_yaml_is_upgraded_in_place(text_dataset, tmp_path):
    root = shutil.copytree(text_dataset, tmp_path / "ds")
    meta = root / NV_META
    (meta / "dataset.yaml").write_text((meta / CRUDE_CONFIG).read_text())  # how older omnipack wrote it
    assert energon_here("info", str(root)).returncode != 0  # KeyError: 'sample_type'
    write_dataset_configs(root)
    assert energon_here("info", str(root)).returncode == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_the_typed_dataset_yaml_and_the_crude_cooker_path_load_identical_batches(media_dataset, workers):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    def batches(dataset_config: str | None) -> list:
        te = OmnipackTaskEncoder.from_dataset(media_dataset, cp=2, cp_rank=1)
        kwargs = {} if dataset_config is None else {"dataset_config": dataset_config}
        ds = get_val_dataset(
            str(media_dataset),
            split_part="train",
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers),
            batch_size=2,
            task_encoder=te,
            **kwargs,
        )
        return list(get_loader(ds))

    typed, crude = batches(None), batches(CRUDE_CONFIG)
    assert len(typed) == len(crude) > 0
    saw_mrope = False
    for a, b in zip(typed, crude, strict=True):
        assert a.__key__ == b.__key__ and a.sample_ids == b.sample_ids
        da, db = a.as_dict(), b.as_dict()
        assert set(da) == set(db)
        for k, v in da.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, db[k]), k
            else:
                assert v == db[k], k
        saw_mrope |= da.get("mrope_position_ids") is not None
    assert saw_mrope
