"""Cost model values, cost-balanced packing (validity, row bound, determinism) and the run_pack balance path."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnipack.packing import PackConstraints, pack
from omnipack.packing.balance import balance_costs
from omnipack.packing.cost import row_costs, straggler_overhead
from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaPlan
from omnipack.profiles.cost import TransformerShape, build_cost_model, media_encoder_flops, windowed_pairs
from omnipack.stages.pack import MeasureIncomplete
from omnipack.stages.pack_planner import PackConfig, run_pack

# ---- cost model ---------------------------------------------------------------------------------------


def test_token_flops_are_twice_the_published_non_embedding_parameters():
    # Qwen2.5-7B and Qwen3-8B model cards: 6.53B and 6.95B non-embedding parameters (norms/biases are
    # not matmuls, so the count from the shape is a little lower).
    for name, params in (("qwen2_5_vl", 6.53e9), ("qwen3_vl", 6.95e9)):
        lm = get_profile(name).cost_shapes()["lm"]
        assert lm.token_flops() == pytest.approx(2 * params, rel=0.01)


def test_shape_flops_by_hand():
    s = TransformerShape(hidden=8, layers=2, heads=2, ffn=16, kv_heads=1, gated_ffn=False)
    # per layer: q,o 8x8 each, k,v 8x4 each = 192; MLP 2*8*16 = 256 -> 2 * 2 * 448
    assert s.token_flops() == 2 * 2 * 448
    assert s.pair_flops() == 4 * 2 * 4 * 2
    hybrid = TransformerShape(hidden=8, layers=2, heads=2, ffn=16, attention_layers=1, extra_token_flops=5)
    assert hybrid.token_flops() == 2 * (1 * 8 * 32 + 2 * 3 * 8 * 16) + 5
    assert hybrid.pair_flops() == 4 * 2 * 4 * 1


def _brute_window_pairs(gh: int, gw: int, merge: int, window: int) -> int:
    side = merge * window  # window side in patches
    total = 0
    for r0 in range(0, gh, side):
        for c0 in range(0, gw, side):
            total += (min(side, gh - r0) * min(side, gw - c0)) ** 2
    return total


@pytest.mark.parametrize("gh,gw", [(16, 16), (18, 30), (2, 2), (40, 6)])
def test_windowed_pairs_match_enumerated_windows(gh, gw):
    assert windowed_pairs(gh, gw, 2, 4) == _brute_window_pairs(gh, gw, 2, 4)


def test_qwen25_vl_image_cost_by_hand():
    p = get_profile("qwen2_5_vl")
    m = p.cost_model()
    v, lm = m.encoders["vision"], m.lm
    plan = MediaPlan(kind="image", num_tokens=64, grid_thw=(1, 16, 16), vision_patches=256)
    # 256 patches in 4 windows of 8x8 on 28 layers, one block of 256 on the 4 full-attention layers
    attention = 4 * 16 * 80 * (4 * 256**2 + 28 * 4 * 64**2)
    embed = 256 * 2 * 3 * 2 * 14 * 14 * 1280
    merger = 64 * 2 * (5120 * 5120 + 5120 * lm.hidden)
    expected = 256 * v.token_flops() + attention + embed + merger
    assert p.media_cost(plan, m.shapes) == pytest.approx(expected, rel=1e-12)
    # windowed attention: a big image costs less per patch pair than full attention on every layer
    big = MediaPlan(kind="image", num_tokens=1024, grid_thw=(1, 64, 64), vision_patches=4096)
    assert p.media_cost(big, m.shapes) < get_profile("qwen3_vl").media_cost(
        big, {"lm": lm, "vision": TransformerShape(1280, 32, 16, 3420)}
    )


def test_qwen3_omni_audio_attention_is_chunked():
    p = get_profile("qwen3_omni")
    shapes = p.cost_model().shapes
    a = shapes["audio"]
    # 104 tokens per window (13 per 100 mel frames, n_window_infer 800): 300 tokens = 104+104+92
    one = p.audio_tower_flops(3000, 300, shapes)
    full = (
        p.audio_tower_flops(3000, 300, shapes)
        - a.pair_flops() * (104**2 * 2 + 92**2)
        + a.pair_flops() * 300**2
    )
    assert one < full
    doubled = p.audio_tower_flops(6000, 600, shapes)
    assert doubled == pytest.approx(2 * one, rel=0.02)  # windowed: close to linear in duration


def test_video_with_audio_costs_both_towers():
    p = get_profile("qwen3_omni")
    shapes = p.cost_model().shapes
    video = MediaPlan(kind="video", num_tokens=128, grid_thw=(2, 16, 16), vision_patches=512)
    with_audio = MediaPlan(
        kind="video",
        num_tokens=128 + 26,
        grid_thw=(2, 16, 16),
        vision_patches=512,
        audio_num_tokens=26,
        audio_frames=200,
    )
    assert p.media_cost(with_audio, shapes) == pytest.approx(
        p.media_cost(video, shapes) + p.audio_tower_flops(200, 26, shapes)
    )


def test_nemotron_radio_attention_per_image_and_tubelet():
    p = get_profile("nemotron_omni")
    shapes = p.cost_model().shapes
    v = shapes["vision"]
    img = MediaPlan(kind="image", num_tokens=256, grid_thw=(1, 32, 32), vision_patches=1024)
    video = MediaPlan(kind="video", num_tokens=512, grid_thw=(2, 32, 32), vision_patches=4096)
    # two tubelets attend separately: twice one block, plus a 2-frame patch embedding
    embed_extra = 2 * 1024 * 2.0 * 3 * 16 * 16 * v.hidden
    assert p.media_cost(video, shapes) == pytest.approx(2 * p.media_cost(img, shapes) + embed_extra)
    audio = MediaPlan(kind="audio", num_tokens=100, audio_frames=800)
    assert p.media_cost(audio, shapes) > 0


def test_overrides_and_errors():
    p = get_profile("qwen2_5_vl")
    base = p.cost_model()
    deeper = p.cost_model({"lm": {"layers": 56}, "train_factor": 2})
    assert deeper.lm_token == pytest.approx(base.lm_token * 2 * 2 / 3)
    assert deeper.encoders == base.encoders
    with pytest.raises(ValueError, match="unknown stack 'audio'"):
        p.cost_model({"audio": {"layers": 2}})
    with pytest.raises(ValueError, match="cost.lm"):
        p.cost_model({"lm": {"depth": 2}})
    with pytest.raises(ValueError, match="no LM shape"):
        build_cost_model({"vision": base.encoders["vision"]})


def test_sample_costs_causal_attention_and_padding_rule():
    m = get_profile("qwen2_5_vl").cost_model()
    c = m.sample_costs(np.array([1, 4]), np.array([0.0, 10.0]))
    assert c[0] == pytest.approx(m.lm_pair * 1)
    assert c[1] == pytest.approx(m.lm_pair * 10 + 3 * 10.0)  # 4*5/2 pairs, encoder x train_factor
    unpadded = get_profile("qwen2_5_vl").cost_model({"row_padding_computed": False})
    assert unpadded.row_constant(100) == 0
    assert unpadded.sample_costs(np.array([4]))[0] == pytest.approx(m.lm_pair * 10 + m.lm_token * 4)


def test_straggler_overhead_by_hand():
    assert straggler_overhead(np.array([1.0, 1.0, 1.0, 3.0]), 2) == pytest.approx(0.25)
    assert straggler_overhead(np.array([1.0, 1.0, 1.0, 3.0, 9.0]), 2) == pytest.approx(0.25)  # last step cut
    assert straggler_overhead(np.array([2.0, 2.0]), 4) is None  # not one full step


# ---- balanced packing -------------------------------------------------------------------------------


def _mix(n: int, seed: int, width: int = 4096):
    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.round(rng.lognormal(np.log(300), 0.9, n)).astype(np.int64) + 1, width // 4)
    lengths = -(-lengths // 8) * 8
    media = rng.random(n) < 0.5
    encoder = np.where(media, rng.uniform(0.5, 3.0, n) * lengths, 0.0)  # media samples cost more per token
    costs = lengths * (lengths + 1) / 2 * 1e-3 + encoder
    return lengths, costs, media.astype(np.int64) * rng.integers(1, 4, n)


def _check_plan(row_of, rows, lengths, width, constraints=None):
    assert row_of.shape == lengths.shape and row_of.min() == 0 and row_of.max() == rows - 1
    fill = np.bincount(row_of, weights=lengths, minlength=rows)
    assert fill.max() <= width and fill.min() > 0
    if constraints is not None:
        counts = np.bincount(row_of, minlength=rows)
        assert counts.max() <= constraints.max_samples_per_row
        for amounts, budget in constraints.resources.values():
            assert np.bincount(row_of, weights=amounts, minlength=rows).max() <= budget


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_plan_is_valid_denser_than_bound_and_more_even(seed):
    width = 4096
    lengths, costs, _ = _mix(6000, seed, width)
    plan = pack(lengths, width, shuffle=False)
    constant = 3 * float(costs.sum()) / plan.num_rows  # the dense LM layers: most of a row's cost
    row_of, rows = balance_costs(
        lengths,
        costs,
        width,
        plan.row_of,
        plan.num_rows,
        max_rows=plan.num_rows + plan.num_rows // 500,
        row_constant=constant,
    )
    _check_plan(row_of, rows, lengths, width)
    assert rows <= plan.num_rows * 1.002
    before = row_costs(plan.row_of, plan.num_rows, costs, constant)
    after = row_costs(row_of, rows, costs, constant)
    assert (after - constant).sum() == pytest.approx((before - constant).sum())  # every sample once
    assert after.std() / after.mean() < before.std() / before.mean() / 4
    order = np.random.default_rng(seed).permutation(rows)
    assert straggler_overhead(after[order], 64) < 0.02
    assert straggler_overhead(after[order], 64) < straggler_overhead(
        before[np.random.default_rng(seed).permutation(plan.num_rows)], 64
    )


def test_balanced_plan_respects_constraints():
    width = 4096
    lengths, costs, media = _mix(3000, 5, width)
    constraints = PackConstraints(max_samples_per_row=12, resources={"num_media": (media, 6)})
    plan = pack(lengths, width, constraints=constraints, shuffle=False)
    row_of, rows = balance_costs(
        lengths, costs, width, plan.row_of, plan.num_rows, constraints=constraints, row_constant=costs.mean()
    )
    assert rows == plan.num_rows
    _check_plan(row_of, rows, lengths, width, constraints)
    before = row_costs(plan.row_of, rows, costs)
    after = row_costs(row_of, rows, costs)
    assert after.max() < before.max()


def test_balanced_plan_is_deterministic():
    lengths, costs, _ = _mix(4000, 7)
    plan = pack(lengths, 4096, shuffle=False)
    a = balance_costs(lengths, costs, 4096, plan.row_of, plan.num_rows, max_rows=plan.num_rows + 8)
    b = balance_costs(
        lengths.copy(), costs.copy(), 4096, plan.row_of.copy(), plan.num_rows, max_rows=plan.num_rows + 8
    )
    assert a[1] == b[1] and np.array_equal(a[0], b[0])


# ---- run_pack balance path ----------------------------------------------------------------------------


def _measure_table(path, n: int, seed: int, cost: dict | None = None, align: int = 1) -> dict:
    """A samples.parquet with the columns run_pack reads: text samples and Qwen2.5-VL images, each costed
    as the measure stage does (``sample_cost`` of its length aligned to ``align``, with the ``cost``
    overrides); returns the cost model's record."""
    rng = np.random.default_rng(seed)
    profile = get_profile("qwen2_5_vl")
    model = profile.cost_model(cost)
    rows = []
    for i in range(n):
        text = int(rng.integers(20, 600))
        media = []
        plans = []
        patches = 0
        for _ in range(int(rng.integers(0, 3))):
            gh, gw = (int(x) * 2 for x in rng.integers(4, 30, 2))
            plan = MediaPlan(
                kind="image", num_tokens=gh * gw // 4, grid_thw=(1, gh, gw), vision_patches=gh * gw
            )
            media.append({"kind": "image", "plan": plan.to_json()})
            plans.append(plan)
            text += plan.num_tokens
            patches += gh * gw
        rows.append(
            {
                "sample_index": i,
                "sample_id": f"s{i}",
                "source": "test",
                "num_tokens": text,
                "num_media": len(media),
                "vision_patches": patches,
                "audio_frames": 0,
                "media_json": json.dumps(media),
                "sample_cost": model.sample_cost(
                    -(-text // align) * align, media_encoder_flops(profile, model.shapes, plans)
                ),
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), path)
    return model.describe()


def test_run_pack_balances_modeled_cost_and_reports_every_row(tmp_path):
    path = tmp_path / "samples.parquet"
    model = _measure_table(path, 3000, 3, align=8)
    base = dict(seq_length=4096, align=8, cost_model=model, data_parallel=[8, 64])
    plain = run_pack(path, PackConfig(**base))
    balanced = run_pack(path, PackConfig(**base, balance=True))
    again = run_pack(path, PackConfig(**base, balance=True))
    assert np.array_equal(balanced.sample_index, again.sample_index)
    assert np.array_equal(balanced.row_ptr, again.row_ptr)
    assert sorted(balanced.sample_index.tolist()) == list(range(3000))
    assert balanced.num_rows <= plain.num_rows + plain.num_rows // 500
    rc, rc0 = balanced.stats["row_cost"], plain.stats["row_cost"]
    assert len(rc["per_row"]) == balanced.num_rows
    assert set(rc["straggler_overhead"]) == {"8", "64"}
    assert rc["cv"] < rc0["cv"] / 3
    assert rc["straggler_overhead"]["64"] < rc0["straggler_overhead"]["64"]
    assert balanced.stats["algorithm"].endswith("+balance(cost)")
    assert rc["model"] == model  # the model the costs were computed with, as recorded
    # per_row is in plan order: recompute it from the plan, the samples' costs and the row constant
    costs = pq.read_table(path, columns=["sample_cost"]).column(0).to_numpy()
    constant = model["lm_flops_per_token"] * 4096
    rows = np.repeat(np.arange(balanced.num_rows), np.diff(balanced.row_ptr))
    expected = row_costs(rows, balanced.num_rows, costs[balanced.sample_index], constant)
    assert rc["per_row"] == pytest.approx(expected.tolist(), rel=1e-5)
    assert rc["mean"] == pytest.approx(np.mean(rc["per_row"]), rel=1e-5)


def test_run_pack_cost_settings(tmp_path):
    path = tmp_path / "samples.parquet"
    model = _measure_table(path, 200, 4, cost={"lm": {"layers": 56}})
    deeper = run_pack(path, PackConfig(seq_length=4096, cost_model=model))
    assert deeper.stats["row_cost"]["model"]["shapes"]["lm"]["layers"] == 56
    table = pq.read_table(path)
    with pytest.raises(ValueError, match="sample_cost column"):
        run_pack(table.drop_columns(["sample_cost"]), PackConfig(seq_length=4096, cost_model=model))
    no_cost = table.set_column(
        table.schema.get_field_index("sample_cost"), "sample_cost", pa.nulls(table.num_rows, pa.float64())
    )
    with pytest.raises(ValueError, match="measured without a cost model"):
        run_pack(no_cost, PackConfig(seq_length=4096, cost_model=model))
    with pytest.raises(ValueError, match="data_parallel"):
        run_pack(path, PackConfig(seq_length=4096, cost_model=model, data_parallel=0))
    # without a cost model: the attention-only balance and no row_cost stats
    legacy = run_pack(path, PackConfig(seq_length=4096, balance=True))
    assert "row_cost" not in legacy.stats


def test_run_pack_balanced_windows_keep_rows_inside_windows(tmp_path):
    path = tmp_path / "samples.parquet"
    model = _measure_table(path, 1200, 5)
    cfg = PackConfig(seq_length=4096, cost_model=model, balance=True, window=400, shuffle=False)
    res = run_pack(path, cfg)
    for r in range(res.num_rows):
        members = res.row(r)
        assert len({int(i) // 400 for i in members}) == 1


def test_cli_cost_options_nest_into_the_cost_mapping():
    from omnipack.cli import _cost_overrides

    cost = _cost_overrides({"lm": {"hidden": 1}}, ["lm.layers=56", "vision.heads=8", "train_factor=2"])
    assert cost == {"lm": {"hidden": 1, "layers": 56}, "vision": {"heads": 8}, "train_factor": 2}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _cost_overrides({}, ["lm.layers"])


# ---- end to end: prepare records every row's cost; inspect shows it ------------------------------------


def test_prepare_balanced_records_row_costs_and_inspect_shows_them(tmp_path, capsys):
    from omnipack.cli import main
    from omnipack.dataset.reader import open_dataset
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.tools.inspect import scan_rows, summary

    src = tmp_path / "source"
    tok = build_demo_tokenizer(src / "tokenizer")
    manifest, media = build_demo_corpus(src, num_samples=24)
    out = tmp_path / "dataset"
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tok),
        output=str(out),
        seq_length=2048,
        balance=True,
        data_parallel=[2],
        cost={"lm": {"layers": 4}},
        progress=False,
    )
    run_prepare(cfg)
    meta = json.loads((out / ".nv-meta" / "omnipack.json").read_text())
    rc = meta["packing"]["row_cost"]
    assert len(rc["per_row"]) == meta["counts"]["rows"]
    assert list(rc["straggler_overhead"]) == ["2"]
    assert rc["model"]["shapes"]["lm"]["layers"] == 4
    ds = open_dataset(out)
    s = summary(ds, scan_rows(ds))
    assert s["row_cost"]["cv"] == rc["cv"] and "per_row" not in s["row_cost"]
    assert main(["inspect", str(out), "-j", "1"]) == 0
    assert "row cost" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    png = tmp_path / "rows.png"
    assert main(["inspect", str(out), "--plot", str(png), "--json", "-j", "1"]) == 0
    assert png.stat().st_size > 0


def test_cost_is_modeled_at_measure_and_a_repack_refuses_stale_costs(tmp_path):
    """The measure stage writes each sample's cost with the config's ``cost`` overrides and records the
    model; a repack from the measure tables (``--from-stage pack``) under other cost settings is refused
    (its costs would be stale), a fresh run measures them again."""
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare

    src = tmp_path / "source"
    tok = build_demo_tokenizer(src / "tokenizer")
    manifest, media = build_demo_corpus(src, num_samples=16)
    out = tmp_path / "dataset"

    def prepare(**kw):
        cfg = PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(tok),
            output=str(out),
            balance=True,
            data_parallel=[2],
            progress=False,
            **kw,
        )
        return run_prepare(cfg)

    first = prepare(seq_length=2048, cost={"lm": {"layers": 4}})
    part = out / "stages" / "measure" / "part-000000.parquet"
    table = pq.read_table(part, columns=["num_media", "padded_length", "encoder_flops", "sample_cost"])
    model = get_profile("qwen2_5_vl").cost_model({"lm": {"layers": 4}})
    assert table.column("sample_cost").null_count == 0
    with_media = table.column("num_media").to_numpy() > 0
    flops = table.column("encoder_flops").to_numpy()
    assert with_media.any() and (flops[with_media] > 0).all() and (flops[~with_media] == 0).all()
    expected = model.sample_costs(table.column("padded_length").to_numpy(), flops)
    assert np.array_equal(table.column("sample_cost").to_numpy(), expected)
    assert first["packing"]["row_cost"]["model"] == model.describe()

    measured_at = part.stat().st_mtime_ns
    second = prepare(seq_length=1024, cost={"lm": {"layers": 4}}, from_stage="pack")
    assert part.stat().st_mtime_ns == measured_at  # the same costs: repacked from the measure tables
    assert second["packing"]["row_cost"]["model"] == model.describe()
    with pytest.raises(MeasureIncomplete, match="another cost model"):
        prepare(seq_length=1024, cost={"lm": {"layers": 8}}, from_stage="pack")
    third = prepare(seq_length=1024, cost={"lm": {"layers": 8}}, overwrite=True)
    assert third["packing"]["row_cost"]["model"]["shapes"]["lm"]["layers"] == 8
    deeper = get_profile("qwen2_5_vl").cost_model({"lm": {"layers": 8}})
    costs = pq.read_table(part, columns=["padded_length", "encoder_flops", "sample_cost"]).to_pydict()
    expected = deeper.sample_costs(np.asarray(costs["padded_length"]), np.asarray(costs["encoder_flops"]))
    assert np.array_equal(np.asarray(costs["sample_cost"]), expected)


def test_planning_imports_no_profile():
    """Packing plans from numbers: the planner and the packing package import no model profile."""
    import subprocess
    import sys

    code = (
        "import sys, omnipack.stages.pack_planner, omnipack.packing, omnipack.packing.cost\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('omnipack.profiles', 'transformers')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
