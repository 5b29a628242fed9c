"""End to end: manifest -> Energon dataset, read back by the real Energon loader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from omnipack.dataset.codec import decode_row
from omnipack.dataset.contract import row_invariant_errors
from omnipack.dataset.meta import read_omnipack_meta
from omnipack.pipeline import MeasureIncomplete, PrepareConfig, run_prepare

SEQ_LENGTH = 2048


def _prepare(tmp: Path, tokenizer: Path, corpus: tuple[Path, Path], **kw) -> tuple[Path, dict]:
    manifest, media = corpus
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tokenizer),
        output=str(tmp),
        seq_length=kw.pop("seq_length", SEQ_LENGTH),
        progress=False,
        **kw,
    )
    return tmp, run_prepare(cfg)


def read_rows_from_tars(root: Path) -> dict[str, dict[str, bytes]]:
    """Every row's parts, read straight from the tar files (independent of Energon)."""
    rows: dict[str, dict[str, bytes]] = defaultdict(dict)
    for tar_path in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                key, part = m.name.split(".", 1)
                rows[key][part] = tf.extractfile(m).read()
    return dict(rows)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, demo_tokenizer, demo_corpus):
    return _prepare(tmp_path_factory.mktemp("ds"), demo_tokenizer, demo_corpus, cp=2, shard_max_rows=3)


def test_every_input_sample_is_packed_or_rejected_with_a_reason(dataset, demo_corpus):
    root, summary = dataset
    manifest_ids = [json.loads(line)["id"] for line in demo_corpus[0].read_text().splitlines()]
    rejects = [json.loads(line) for line in (root / "rejects.jsonl").read_text().splitlines()]
    packed = [
        sid
        for parts in read_rows_from_tars(root).values()
        for sid in json.loads(parts["meta.json"])["sample_ids"]
    ]
    assert sorted(packed + [r["sample_id"] for r in rejects]) == sorted(manifest_ids)
    assert len(set(packed)) == len(packed)
    reasons = {r["sample_id"]: r["reason"] for r in rejects}
    assert set(reasons) == {"bad-missing", "bad-corrupt", "bad-escape", "bad-role", "bad-empty", "bad-long"}
    assert "missing image" in reasons["bad-missing"]
    assert "unreadable image" in reasons["bad-corrupt"]
    assert "escapes the media root" in reasons["bad-escape"]
    assert "unknown role 'robot'" in reasons["bad-role"]
    assert "empty assistant turn" in reasons["bad-empty"]
    assert "over-length" in reasons["bad-long"] and str(SEQ_LENGTH) in reasons["bad-long"]
    c = summary["counts"]
    assert c["input"] == len(manifest_ids) == c["packed"] + c["rejected"]


def test_rows_hold_the_contract(dataset):
    root, summary = dataset
    assert summary["align"] == 4  # cp=2 -> 2*cp
    rows = read_rows_from_tars(root)
    assert len(rows) == summary["counts"]["rows"]
    for key, parts in rows.items():
        row, meta = decode_row(parts)
        assert row_invariant_errors(row, summary["align"]) == [], key
        assert meta["max_seqlen"] == int(np.diff(row.cu_seqlens).max())
        for m in row.media:
            assert m.part in parts and m.part.endswith(".npy")  # raw uint8 by default
            from omnipack.loader.media import decode_payload

            img = decode_payload(m.part, parts[m.part])  # stored at the model's target size
            assert img.dtype == np.uint8 and list(img.shape) == [*m.info["target_hw"], 3]
            assert img.shape[0] // 14 == m.grid_thw[1] and img.shape[1] // 14 == m.grid_thw[2]
            assert m.num_tokens == m.grid_thw[0] * m.grid_thw[1] * m.grid_thw[2] // 4


def test_energon_loader_reads_back_exactly_what_was_written(dataset):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    root, summary = dataset
    written = {k: decode_row(p)[0] for k, p in read_rows_from_tars(root).items()}
    ds = get_val_dataset(
        str(root),
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=1,
        task_encoder=OmnipackTaskEncoder(),
    )
    seen = set()
    for batch in get_loader(ds):
        key = batch.__key__[0]
        seen.add(key)
        row = written[key]
        assert batch.tokens.shape == (1, SEQ_LENGTH)
        assert np.array_equal(batch.tokens[0].numpy(), row.tokens)
        assert np.array_equal(batch.labels[0].numpy(), row.labels)
        assert np.array_equal(batch.loss_mask[0].numpy(), row.loss_mask.astype(np.float32))
        assert np.array_equal(batch.position_ids[0].numpy(), row.position_ids)
        assert np.array_equal(batch.padding_mask[0].numpy(), row.padding_mask)
        assert np.array_equal(batch.cu_seqlens_q.numpy(), row.cu_seqlens)
        assert np.array_equal(batch.cu_seqlens_q_padded.numpy(), row.cu_seqlens_padded)
        assert batch.sample_ids == [row.sample_ids]
        assert sorted(batch.media[0]) == sorted(m.part for m in row.media)
    assert seen == set(written)


def test_shards_roll_over_and_match_their_index(dataset):
    root, summary = dataset
    info = json.loads((root / ".nv-meta" / ".info.json").read_text())
    assert len(summary["shards"]) == len(info["shard_counts"]) > 1
    for rel, count in info["shard_counts"].items():
        assert count <= 3
        idx = np.frombuffer((root / (rel + ".idx")).read_bytes(), dtype="<u8")
        assert len(idx) == count + 1
        with tarfile.open(root / rel) as tf:
            firsts = {}
            for m in tf.getmembers():
                firsts.setdefault(m.name.split(".", 1)[0], m.offset)
            assert list(idx[:-1]) == list(firsts.values())
    assert not list(root.rglob("*.partial"))
    meta = read_omnipack_meta(root)
    assert meta["tokenizer"]["fingerprint"] and meta["profile"]["name"] == "qwen2_5_vl"
    assert 0 < meta["packing"]["real_efficiency_written"] <= meta["packing"]["padded_efficiency"] <= 1


def test_no_pickle_in_shards(dataset):
    root, _ = dataset
    for parts in read_rows_from_tars(root).values():
        for name, data in parts.items():
            assert not name.endswith((".pyd", ".pickle", ".pth")), name
            if name.endswith(".npy"):
                header = data[:128]
                assert b"'descr': '|O'" not in header and b"object" not in header


def test_output_is_deterministic_across_worker_counts(tmp_path, demo_tokenizer, demo_corpus):
    a, _ = _prepare(tmp_path / "a", demo_tokenizer, demo_corpus, workers=1)
    b, _ = _prepare(tmp_path / "b", demo_tokenizer, demo_corpus, workers=2)

    def outputs(root: Path) -> dict[str, bytes]:
        files = [*root.glob("shards/*"), *root.glob(".nv-meta/*"), root / "rejects.jsonl"]
        return {str(p.relative_to(root)): p.read_bytes() for p in files}

    out_a, out_b = outputs(a), outputs(b)
    assert any(k.endswith(".tar") for k in out_a) and any(k.endswith(".tar.idx") for k in out_a)
    assert out_a == out_b


def test_energon_lint_info_and_preview_pass(dataset):
    """``energon lint`` as a user runs it (a fresh process that finds the sample type the dataset names), then
    ``info`` and ``preview``: the same click commands, in this process (no interpreter start for each)."""
    from click.testing import CliRunner
    from megatron.energon.cli.main import main as energon_main

    root, _ = dataset
    # lint reads dataset.yaml, as every Energon tool and loader does by default
    lint = [sys.executable, "-m", "megatron.energon.cli.main", "lint", str(root)]
    res = subprocess.run(lint, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    info = CliRunner().invoke(energon_main, ["info", str(root)])
    assert info.exit_code == 0, info.output
    preview = CliRunner().invoke(energon_main, ["preview", str(root)], input="n\n")
    assert preview.exit_code == 0 and "Sample 0" in preview.output and "cu_seqlens_padded" in preview.output


def test_nothing_packed_is_an_error(tmp_path, demo_tokenizer, demo_corpus):
    from omnipack.pipeline import NothingPacked

    with pytest.raises(NothingPacked, match="all .* samples were rejected"):
        _prepare(tmp_path, demo_tokenizer, demo_corpus, seq_length=8)


def test_row_meta_follows_the_published_schema(dataset):
    import jsonschema

    from omnipack.manifest import load_schema

    root, _ = dataset
    validator = jsonschema.Draft202012Validator(load_schema("packed_row.schema.json"))
    rows = read_rows_from_tars(root)
    for parts in rows.values():
        validator.validate(json.loads(parts["meta.json"]))
        declared = set(load_schema("packed_row.schema.json")["x-array-parts"])
        assert {p for p in parts if p.endswith(".npy") and not p.startswith("media.")} <= declared


def test_repack_from_measure_tables(tmp_path, demo_tokenizer, demo_corpus):
    root, first = _prepare(tmp_path / "ds", demo_tokenizer, demo_corpus, seq_length=4096)
    samples = root / "stages" / "measure" / "part-000000.parquet"
    before = samples.stat().st_mtime_ns
    _, second = _prepare(root, demo_tokenizer, demo_corpus, seq_length=2048, cp=4, from_stage="pack")
    assert samples.stat().st_mtime_ns == before  # nothing re-measured
    assert second["align"] == 8 and second["seq_length"] == 2048
    assert (
        second["counts"]["input"]
        == first["counts"]["input"]
        == second["counts"]["packed"] + second["counts"]["rejected"]
    )
    assert second["counts"]["rows"] > first["counts"]["rows"]
    for parts in read_rows_from_tars(root).values():
        assert row_invariant_errors(decode_row(parts)[0], 8) == []
    with pytest.raises(ValueError, match="measure settings changed .*profile_options"):
        _prepare(root, demo_tokenizer, demo_corpus, from_stage="pack", profile_options={"max_pixels": 50176})
    # a part an earlier release measured into its Arrow copy (no token file) is refused, not read
    record = root / "stages" / "measure" / "part-000000.json"
    parsed = json.loads(record.read_text())
    parsed["files"] = {k.replace(".tokens", ".arrow"): v for k, v in parsed["files"].items()}
    record.write_text(json.dumps(parsed))
    with pytest.raises(MeasureIncomplete, match="earlier layout"):
        _prepare(root, demo_tokenizer, demo_corpus, seq_length=2048, cp=4, from_stage="pack")
    # an edited manifest at the same path must be measured again
    manifest = tmp_path / "copy.jsonl"
    manifest.write_text(demo_corpus[0].read_text())
    corpus = (manifest, demo_corpus[1])
    _prepare(tmp_path / "ds3", demo_tokenizer, corpus)
    manifest.write_text(manifest.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="measure settings changed .*manifest_xxh3"):
        _prepare(tmp_path / "ds3", demo_tokenizer, corpus, from_stage="pack")


def test_val_fraction_writes_separate_val_shards(tmp_path, demo_tokenizer, demo_corpus):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    root, summary = _prepare(
        tmp_path / "ds", demo_tokenizer, demo_corpus, val_fraction=0.25, shard_max_rows=2
    )
    by_split = summary["counts"]["rows_by_split"]
    assert (
        by_split["val"] == round(0.25 * summary["packing"]["rows"])
        and by_split["train"] + by_split["val"] == summary["counts"]["rows"]
    )
    split = yaml.safe_load((root / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    assert (
        split["val"]
        and all("/val-" in p for p in split["val"])
        and not set(split["val"]) & set(split["train"])
    )

    def keys(part):
        ds = get_val_dataset(
            str(root),
            split_part=part,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            batch_size=1,
            task_encoder=OmnipackTaskEncoder(),
        )
        return [b.__key__[0] for b in get_loader(ds)]

    val_keys, train_keys = keys("val"), keys("train")
    assert len(val_keys) == by_split["val"] and len(train_keys) == by_split["train"]
    assert not set(val_keys) & set(train_keys)
    # without the row shuffle the plan is ordered by fill: the val rows must not be just its tail
    root2, s2 = _prepare(tmp_path / "ds2", demo_tokenizer, demo_corpus, val_fraction=0.25, shuffle=False)
    split2 = yaml.safe_load((root2 / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    val2 = set()
    for rel in split2["val"]:
        with tarfile.open(root2 / rel) as tf:
            val2 |= {int(m.name.split(".")[0]) for m in tf.getmembers()}
    n_val, n_rows = s2["counts"]["rows_by_split"]["val"], s2["counts"]["rows"]
    assert len(val2) == n_val and val2 != set(range(n_rows - n_val, n_rows))


def test_manifest_read_once_and_oversized_samples_rejected_without_tokenizing(
    tmp_path, monkeypatch, demo_tokenizer, demo_corpus
):
    """A few-MB line over the line cap is skipped unread; a long text under it is rejected from its
    rendered length before tokenizing; every input is still packed or rejected, from one manifest read."""
    import omnipack.stages.measure as measure_stage
    from omnipack.text.chat import ChatTokenizer

    manifest, media = demo_corpus
    lines = manifest.read_text().splitlines()
    qa = [{"role": "assistant", "content": "ok"}]
    lines.insert(
        3, json.dumps({"id": "huge-line", "messages": [{"role": "user", "content": "w " * 1_500_000}, *qa]})
    )
    lines.insert(
        7, json.dumps({"id": "long-text", "messages": [{"role": "user", "content": "w " * 300_000}, *qa]})
    )
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")

    reads, tokenized = [], []
    read_part = measure_stage.read_part
    monkeypatch.setattr(measure_stage, "read_part", lambda *a, **k: reads.append(1) or read_part(*a, **k))
    tokenize = ChatTokenizer._tokenize_many
    monkeypatch.setattr(
        ChatTokenizer,
        "_tokenize_many",
        lambda self, texts: tokenized.extend(map(len, texts)) or tokenize(self, texts),
    )
    root, summary = _prepare(tmp_path / "ds", demo_tokenizer, (path, media), max_line_bytes=2 << 20)

    assert len(reads) == 1  # one part, read once
    assert max(tokenized) < 100_000  # neither long sample reached the tokenizer
    rejects = {r["sample_id"]: r for r in map(json.loads, (root / "rejects.jsonl").read_text().splitlines())}
    assert rejects["m.jsonl:4"]["stage"] == "read"
    assert (
        rejects["m.jsonl:4"]["reason"].startswith("line of 3000")
        and "max_line_bytes" in rejects["m.jsonl:4"]["reason"]
    )
    assert rejects["long-text"]["stage"] == "measure"
    assert re.search(
        r"over-length: .* over seq_length 2048; rejected before tokenizing", rejects["long-text"]["reason"]
    )
    c = summary["counts"]
    assert c["input"] == len(lines) == c["packed"] + c["rejected"]


def test_repack_for_longer_rows_than_measured_asks_to_remeasure(tmp_path, demo_tokenizer, demo_corpus):
    root, _ = _prepare(tmp_path / "ds", demo_tokenizer, demo_corpus, seq_length=1024)
    _prepare(root, demo_tokenizer, demo_corpus, seq_length=512, from_stage="pack")  # shorter rows: fine
    with pytest.raises(ValueError, match="measure settings changed .*seq_length 2048 over the measured 1024"):
        _prepare(root, demo_tokenizer, demo_corpus, seq_length=2048, from_stage="pack")


def test_progress_moves_by_samples_and_rows_from_the_workers(
    tmp_path, demo_tokenizer, demo_corpus, monkeypatch
):
    """The stage bars move inside units (measure by samples, write by rows), with the counts sent from the
    pool's worker processes, and each bar ends at its stage's total."""
    from omnipack import progress

    seen: list[tuple[str, int, int]] = []
    bars: dict[str, progress.StageProgress] = {}
    advance, enter = progress.StageProgress.advance, progress.StageProgress.__enter__

    def record(self, stage, unit, n):
        seen.append((stage, unit, n))
        advance(self, stage, unit, n)

    def keep(self):
        bars[self.stage] = self
        return enter(self)

    monkeypatch.setattr(progress.StageProgress, "advance", record)
    monkeypatch.setattr(progress.StageProgress, "__enter__", keep)
    monkeypatch.setattr(progress, "REPORT_S", 0.0)  # the workers import it anew: only the parent's
    _, summary = _prepare(tmp_path, demo_tokenizer, demo_corpus, workers=2, part_lines=16, shard_max_rows=1)
    measured = [n for stage, _, n in seen if stage == "measure"]
    written = [n for stage, _, n in seen if stage == "write"]
    assert measured and all(n >= 1 for n in measured), seen  # the queue is there before the first unit
    assert written and all(n >= 1 for n in written), seen
    assert sum(written) <= summary["counts"]["rows"]
    assert sum(measured) <= summary["counts"]["input"]
    assert bars["measure"].count == bars["measure"].total == summary["counts"]["input"]
    assert bars["write"].count == bars["write"].total == summary["counts"]["rows"]
    # in this process every sample and every row is reported as it is done, one at a time
    seen.clear()
    _, summary = _prepare(tmp_path / "inline", demo_tokenizer, demo_corpus, workers=1, shard_max_rows=2)
    measured = [n for stage, _, n in seen if stage == "measure"]
    written = [n for stage, _, n in seen if stage == "write"]
    assert measured == [1] * summary["counts"]["input"]
    assert written == [1] * summary["counts"]["rows"]


def test_mrope_default_follows_the_family(tmp_path, demo_tokenizer, demo_corpus):
    """One default for prepare and demo: mRoPE ids for the families whose trainers need them."""
    assert PrepareConfig(["m"], "r", "t", "o").mrope is True  # qwen2_5_vl
    assert PrepareConfig(["m"], "r", "t", "o", profile="qwen3_omni").mrope is True
    assert PrepareConfig(["m"], "r", "t", "o", profile="gemma3").mrope is False
    settings = {"manifest": "m", "media_root": "r", "tokenizer": "t", "output": "o", "mrope": False}
    assert PrepareConfig.from_dict(settings).mrope is False
    root, summary = _prepare(tmp_path, demo_tokenizer, demo_corpus)
    assert summary["mrope_position_ids"] is True
    rows = read_rows_from_tars(root)
    assert rows and all("mrope_position_ids.npy" in parts for parts in rows.values())
