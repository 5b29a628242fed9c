"""The processor-backed profile (``hf``) on InternVL, a model whose processor holds a torchvision video
processor: a tiny random ``InternVLForConditionalGeneration`` fed the loader's packed rows (position
resets, a block-diagonal causal mask, the stored tensors under the processor's keys) gives, on every
sample's tokens, the logits of that sample alone through the processor and the model. Opt-in (``pytest -m
hf_processors``), skipped where torchvision does not import; the model folder is test_profile_hf_vision.py's.

GLM-4.6V has no such test: its model gives image tokens 3-D (mRoPE) positions that its ``get_rope_index``
derives from the whole sequence and the image grids, while a processor-backed dataset's packed rows carry
1-D position resets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import prepare_hf_corpus
from tests.hf_oracles import require_torchvision

pytestmark = pytest.mark.hf_processors
pytest.importorskip("transformers")
pytest.importorskip("megatron.energon")
require_torchvision()

from tests.family_kit import assert_each_samples_own_logits  # noqa: E402
from tests.test_profile_hf_payload import TINY_TEXT  # noqa: E402
from tests.test_profile_hf_vision import build_internvl_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_internvl_model_dir(tmp_path_factory.mktemp("internvl") / "model")


def processor_alone(proc, media: Path, messages: list[dict]) -> dict[str, np.ndarray]:
    """The processor's outputs for one sample alone (numpy, in its dtypes)."""
    text = proc.apply_chat_template(messages, tokenize=False)
    paths = [p["image"] for m in messages for p in m["content"] if p["type"] == "image"]
    kw = {"images": [[Image.open(media / p).convert("RGB") for p in paths]]} if paths else {}
    return dict(proc(text=[text], add_special_tokens=False, return_tensors="np", **kw))


def tiny_internvl(proc):
    """A random InternVL whose vision tower gives the processor's 4 context tokens a 32 px tile (patch 8:
    16 patches, pixel-shuffled 2x2 into 4), over a 2-layer Qwen2 (the family's default text model)."""
    import torch
    import transformers

    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=[32, 32],
        patch_size=[8, 8],
    )  # fmt: skip
    text = dict(TINY_TEXT, model_type="qwen2", vocab_size=len(proc.tokenizer))
    config = transformers.InternVLConfig(
        vision_config=vision, text_config=text, downsample_ratio=0.5, vision_feature_layer=-1,
        image_token_id=proc.tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.InternVLForConditionalGeneration._from_config(config, attn_implementation="eager").eval()


def test_a_packed_row_gives_each_samples_own_logits(tmp_path_factory, model_dir, proc):
    """(A row attending across its samples is off by ~9, far above the float noise allowed.)"""
    media, samples, out = prepare_hf_corpus(tmp_path_factory.mktemp("hf_internvl"), model_dir, seq_length=2048)
    alone = lambda sid: processor_alone(proc, media, samples[sid])  # noqa: E731
    assert assert_each_samples_own_logits(tiny_internvl(proc), out, alone)  # a later sample of a row holds images
