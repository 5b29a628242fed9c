"""``omnipack inspect``: summary numbers agree with omnipack.json; the row view shows the row as stored."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from omnipack.cli import main
from omnipack.dataset.reader import open_dataset, read_row
from omnipack.tools.inspect import find_sample, row_view, scan_rows, summary
from tests.tools_dataset import build_small_dataset


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_dataset(tmp_path_factory.mktemp("inspect"))


def test_summary_matches_metadata(small: Path) -> None:
    ds = open_dataset(small)
    s = summary(ds, scan_rows(ds))
    meta = ds.meta
    assert s["rows"] == meta["counts"]["rows"]
    assert s["samples"] == meta["counts"]["packed"]
    assert s["rejected"] == meta["counts"]["rejected"] == sum(s["rejects_by_reason"].values())
    assert s["input_samples"] == meta["counts"]["input"]
    assert s["real_tokens"] == meta["packing"]["real_tokens"]
    assert s["real_efficiency"] == pytest.approx(meta["packing"]["real_efficiency_written"])
    assert s["padded_efficiency"] == pytest.approx(meta["packing"]["padded_efficiency"])
    assert (s["seq_length"], s["align"], s["profile"]) == (2048, 4, "qwen2_5_vl")
    assert s["tokenizer"]["fingerprint"] == meta["tokenizer"]["fingerprint"]
    assert sum(s["samples_per_row"].values()) == s["rows"]
    assert sum(int(k) * v for k, v in s["samples_per_row"].items()) == s["samples"]
    assert [x["path"] for x in s["shards"]] == [x["path"] for x in meta["shards"]]
    assert s["total_bytes"] == sum(x["num_bytes"] for x in meta["shards"])
    assert any(k.startswith("pack: over-length") for k in s["rejects_by_reason"])
    # Media counts and tokens against the measure table's per-sample columns.
    from omnipack.stages.measure import read_run_measured

    table = read_run_measured(small / "stages", ["num_images", "image_tokens"]).to_pydict()
    assert s["media_counts"]["image"] == sum(table["num_images"])
    assert s["modality_tokens"]["image"] == sum(table["image_tokens"])
    assert sum(s["modality_tokens"].values()) == s["real_tokens"]
    assert sum(s["modality_mix"].values()) == pytest.approx(1.0)


def test_row_view_layout_and_collapsed_placeholders(small: Path) -> None:
    ds = open_dataset(small)
    rows = scan_rows(ds)
    index = next(i for i, r in enumerate(rows) if r.media)
    v = row_view(ds, index)
    row, _ = read_row(ds, index).decode()
    assert [s["sample_id"] for s in v["sequences"]] == row.sample_ids
    assert [s["start"] for s in v["sequences"]] == row.cu_seqlens_padded[:-1].tolist()
    assert v["sequences"][-1]["padded_end"] == row.seq_length == 2048
    assert sum(s["length"] for s in v["sequences"]) == v["real_tokens"] == int(row.seqlens.sum())
    assert sum(s["supervised_tokens"] for s in v["sequences"]) == int(row.loss_mask.sum())
    seq = next(s for s in v["sequences"] if s["media"])
    text = "".join(seg["text"] for seg in seq["text"])
    for m in seq["media"]:
        assert f"<|image_pad|>×{m['num_tokens']}" in text
    assert "<|image_pad|><|image_pad|>" not in text
    assert [t["role"] for t in seq["turns"]][-2:] == ["user", "assistant"]
    # Supervised targets decode to the assistant reply, ending with the turn end marker.
    sup = "".join(seg["text"] for seg in seq["text"] if seg["supervised"])
    assert sup.endswith("<|im_end|>") and "<|im_start|>" not in sup
    for a, b in seq["supervised_spans"]:
        assert (row.loss_mask[a:b] == 1).all()


def test_row_view_without_tokenizer(small: Path, tmp_path: Path) -> None:
    ds = open_dataset(small)
    ds.meta["tokenizer"]["path"] = str(tmp_path / "moved")  # the recorded tokenizer is gone
    v = row_view(ds, 0)
    assert v["tokenizer"] is None and v["sequences"][0]["turns"] == []
    assert v["sequences"][0]["length"] > 0


def test_cli_sample_and_json(small: Path, capsys: pytest.CaptureFixture) -> None:
    ds = open_dataset(small)
    rows = scan_rows(ds)
    sid = rows[-1].sample_ids[-1]
    assert find_sample(rows, sid) == len(rows) - 1
    assert main(["inspect", str(small), "--sample", sid, "--json", "-j", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["row"]["row"] == len(rows) - 1 and sid in [s["sample_id"] for s in out["row"]["sequences"]]
    assert main(["inspect", str(small), "--sample", sid, "-j", "1"]) == 0
    text = capsys.readouterr().out
    assert sid in text and "supervised" in text
    assert main(["inspect", str(small), "-j", "1"]) == 0
    assert "real efficiency" in capsys.readouterr().out
    assert main(["inspect", str(small), "--sample", "no-such-sample"]) == 2
    assert main(["inspect", str(small), "--row", "999"]) == 2


def test_plot_writes_png(small: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "layout.png"
    assert main(["inspect", str(small), "--plot", str(out), "--json", "-j", "1"]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert np.frombuffer(data[16:24], dtype=">u4").min() > 300  # a real figure, not a stub


def test_plot_without_matplotlib(small: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["inspect", str(small), "--plot", str(tmp_path / "x.png"), "-j", "1"]) == 1
    assert "pip install" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
