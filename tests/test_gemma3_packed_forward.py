"""A tiny random ``Gemma3ForConditionalGeneration`` on the packed rows omnipack's Energon loader gives (prepared
from a small Gemma 3 corpus, as ``tests/test_pipeline_gemma3.py`` does), eager and SDPA attention on CPU.

transformers 5.24 detects the packing from the position resets and masks the full-attention layers right,
but in the sliding-window layers it looks the image-block rule up at each token's *position*, that is in the
row's first sample: a later sample's image is attended as the first sample's token types say. The packed
forward then differs from the per-sample forwards; explicit per-layer masks built from ``cu_seqlens_padded``
and ``token_type_ids`` (``omnipack.loader.masks.packed_layer_masks``) make them equal.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnipack.loader.masks import packed_layer_masks
from tests.family_kit import prepare, val_batches
from tests.test_pipeline_gemma3 import _corpus
from tests.test_profiles_gemma3 import build_gemma_model_dir
from tests.test_profiles_split import BLOCKER

pytest.importorskip("megatron.energon")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
SLIDING_WINDOW = 4  # far below a 256-token image block, so the window matters in every sliding layer
ATOL = 1e-5
FIXED = (
    f"transformers {transformers.__version__} masks packed Gemma 3 rows as it masks each sample: "
    "the README's note on 5.24 is obsolete"
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Rows of 2-3 samples, images in samples after the first, per-sample padding (cp=2)."""
    root = tmp_path_factory.mktemp("gemma3_packed")
    model_dir = build_gemma_model_dir(root / "model", newline_merges=True)
    manifest, media, _ = _corpus(root / "src", n=8)
    out = prepare(
        manifest, media, root / "ds", "--tokenizer", str(model_dir), "--profile", "gemma3",
        "--seq-length", "1024", "--cp", "2", "--max-reject-fraction", "0.2",  # 1 broken sample in 9
    )  # fmt: skip
    return model_dir, out


@pytest.fixture(scope="module")
def batches(prepared):
    got = [b.as_dict() for b in val_batches(prepared[1])]
    # coverage: a row whose later sample holds an image, the case transformers 5.24 masks wrong
    assert any(_later_sample_has_image(b) for b in got)
    return got


def _later_sample_has_image(b: dict) -> bool:
    cup, types = b["cu_seqlens_q_padded"], b["token_type_ids"][0]
    return any(bool(types[cup[k] : cup[k + 1]].any()) for k in range(1, len(cup) - 1))


@pytest.fixture(scope="module")
def models(prepared):
    """One random model per attention implementation, the same weights in each."""
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(str(prepared[0]))
    config = Gemma3Config(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": SLIDING_WINDOW,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "initializer_range": 0.3,  # random weights large enough for a mask error to show in the logits
        },
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 896,
            "patch_size": 56,  # 16x16 patches pooled 1:1 into the 256 soft tokens of a view
        },
        mm_tokens_per_image=256,
        image_token_index=tok.image_token_id,
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    base = Gemma3ForConditionalGeneration(config).eval()
    out = {}
    for impl in ("eager", "sdpa"):
        m = Gemma3ForConditionalGeneration._from_config(config, attn_implementation=impl).eval()
        m.load_state_dict(base.state_dict())
        assert m.config.text_config._attn_implementation == impl
        out[impl] = m
    return out


@pytest.fixture(scope="module")
def singles(batches, models):
    """Per attention implementation, per row: each sample's logits from a forward of that sample alone."""
    with torch.no_grad():
        return {impl: [per_sample_logits(m, b) for b in batches] for impl, m in models.items()}


def explicit_mask_forward(model, b: dict) -> torch.Tensor:
    """The README's snippet: one packed row with its per-layer masks given explicitly."""
    eager = model.config.text_config._attn_implementation == "eager"
    masks = packed_layer_masks(
        b["cu_seqlens_q_padded"],
        b["token_type_ids"],
        model.config.text_config.sliding_window,
        dtype=torch.float32 if eager else None,  # eager adds the mask to the scores; SDPA takes booleans
    )
    return model(
        input_ids=b["tokens"],
        position_ids=b["position_ids"],
        token_type_ids=b["token_type_ids"],
        pixel_values=b.get("pixel_values"),
        attention_mask=masks,
    ).logits


def naive_forward(model, b: dict) -> torch.Tensor:
    """Packing left for transformers to find from the position resets."""
    return model(
        input_ids=b["tokens"],
        position_ids=b["position_ids"],
        token_type_ids=b["token_type_ids"],
        pixel_values=b.get("pixel_values"),
    ).logits


def per_sample_logits(model, b: dict) -> list[torch.Tensor]:
    """Each sample's real tokens alone, with its own views (256 soft tokens each, in row order)."""
    cu, cup, types = b["cu_seqlens_q"], b["cu_seqlens_q_padded"], b["token_type_ids"]
    out, view = [], 0
    for k in range(len(cu) - 1):
        a, n = int(cup[k]), int(cu[k + 1] - cu[k])
        t = types[:, a : a + n]
        views = int(t.sum()) // 256
        px = b["pixel_values"][view : view + views] if views else None
        view += views
        out.append(model(input_ids=b["tokens"][:, a : a + n], token_type_ids=t, pixel_values=px).logits[0])
    return out


def _sample_errors(packed: torch.Tensor, b: dict, singles: list[torch.Tensor]) -> list[float]:
    cu, cup = b["cu_seqlens_q"], b["cu_seqlens_q_padded"]
    errs = []
    for k, single in enumerate(singles):
        a, n = int(cup[k]), int(cu[k + 1] - cu[k])
        errs.append(float((packed[0, a : a + n] - single).abs().max()))
    return errs


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_packed_forward_with_explicit_masks_equals_each_sample_alone(batches, models, singles, impl):
    model = models[impl]
    with torch.no_grad():
        for b, alone in zip(batches, singles[impl], strict=True):
            errs = _sample_errors(explicit_mask_forward(model, b), b, alone)
            assert max(errs) <= ATOL, errs


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_transformers_5_24_masks_a_packed_row_wrong(batches, models, singles, impl):
    """Documents the transformers behaviour the README warns of: left to detect the packing, the forward gives
    a later sample with an image other logits than that sample alone (the first sample stays right)."""
    model = models[impl]
    later_with_image = []
    with torch.no_grad():
        for b, alone in zip(batches, singles[impl], strict=True):
            errs = _sample_errors(naive_forward(model, b), b, alone)
            assert errs[0] <= ATOL  # the block rule read at the first sample's own positions is its own
            cup, types = b["cu_seqlens_q_padded"], b["token_type_ids"][0]
            later_with_image += [e for k, e in enumerate(errs) if k and types[cup[k] : cup[k + 1]].any()]
    assert later_with_image  # coverage
    if max(later_with_image) <= ATOL:
        pytest.skip(FIXED)
    assert min(later_with_image) > 1e-3, later_with_image


def test_transformers_sliding_mask_reads_the_first_samples_blocks(batches, models):
    """The masks themselves: transformers' full-attention mask for a packed row equals ours; its
    sliding-window mask is ours with each token's image block looked up at its position (the first sample's
    token types), which differs for a row whose later sample holds an image."""
    from transformers.models.gemma3.modeling_gemma3 import (
        create_masks_for_vision_model,
        get_block_sequence_ids_for_mask,
    )

    config = models["sdpa"].config.get_text_config()
    checked = 0
    for b in (b for b in batches if _later_sample_has_image(b)):
        types, pos, cup = b["token_type_ids"], b["position_ids"], b["cu_seqlens_q_padded"]
        w = types.shape[1]
        hf = create_masks_for_vision_model(
            config=config,
            inputs_embeds=torch.zeros(1, w, 8),
            attention_mask=None,
            cache=None,
            position_ids=pos,
            block_sequence_ids=get_block_sequence_ids_for_mask(types),
        )
        ours = packed_layer_masks(cup, types, SLIDING_WINDOW)
        assert torch.equal(hf["full_attention"], ours["full_attention"])
        if torch.equal(hf["sliding_attention"], ours["sliding_attention"]):
            pytest.skip(FIXED)
        # the 5.24 rule: blocks read at positions (indices into the row, i.e. its first sample)
        blocks = get_block_sequence_ids_for_mask(types)[0]
        p = pos[0]
        at_pos = blocks[p]
        same_block = (at_pos[:, None] == at_pos[None, :]) & (at_pos[:, None] >= 0)
        seq = torch.searchsorted(cup.long(), torch.arange(w), right=True) - 1
        same_seq = seq[:, None] == seq[None, :]
        q, kv = p[:, None], p[None, :]
        bug = same_seq & ((kv <= q) | same_block) & (kv > q - SLIDING_WINDOW)
        assert torch.equal(hf["sliding_attention"][0, 0], bug)
        checked += 1
    assert checked


def test_masks_by_hand():
    """Two sequences of one stream: 5 tokens (an image run at 1-2, padding at 4) and 4 (an image run at 0-1)."""
    cup = torch.tensor([0, 5, 9], dtype=torch.int32)
    types = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0, 0]])
    m = packed_layer_masks(cup, types, 2)
    full, sliding = m["full_attention"][0, 0].int(), m["sliding_attention"][0, 0].int()
    assert m["full_attention"].shape == (1, 1, 9, 9) and m["full_attention"].dtype == torch.bool
    want_full = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1, 1, 1, 1],
        ]
    )
    assert torch.equal(full, want_full)
    q, kv = torch.arange(9)[:, None], torch.arange(9)[None, :]
    assert torch.equal(sliding, want_full * (kv > q - 2))
    # an image run at a sequence boundary is two blocks
    m2 = packed_layer_masks(torch.tensor([0, 2, 4]), torch.tensor([0, 1, 1, 0]), 8)
    assert not m2["full_attention"][0, 0, 1, 2] and not m2["full_attention"][0, 0, 2, 1]
    additive = packed_layer_masks(cup, types, 2, dtype=torch.float32)["sliding_attention"][0, 0]
    assert torch.equal(additive == 0, sliding.bool())
    assert bool((additive[sliding == 0] == torch.finfo(torch.float32).min).all())


@pytest.mark.parametrize(
    ("cup", "types", "window", "message"),
    [
        ([0, 3], [0, 0, 0, 0], 4, "must rise from 0 to W=4"),
        ([1, 4], [0, 0, 0, 0], 4, "must rise from 0 to W=4"),
        ([0, 3, 2, 4], [0, 0, 0, 0], 4, "must rise from 0 to W=4"),
        ([0, 4], [[0, 0], [0, 0]], 4, "must be [W] or [1, W]"),
        ([0, 4], [0, 0, 0, 0], 0, "sliding_window must be >= 1"),
    ],
)
def test_bad_arguments_are_refused(cup, types, window, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        packed_layer_masks(torch.tensor(cup), torch.tensor(types), window)


def test_masks_import_without_the_prepare_stack():
    code = BLOCKER + "from omnipack.loader.masks import packed_layer_masks\nimport torch\n"
    code += "print(packed_layer_masks(torch.tensor([0, 2]), torch.tensor([1, 1]), 1)['full_attention'].all())\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "tensor(True)", out.stderr
