"""Gemma 3: the whole ``Gemma3Processor`` (``AutoProcessor`` on a model directory with Google's released
preprocessor_config and a tokenizer with Gemma's special tokens and chat template) on the image files."""

from __future__ import annotations

from pathlib import Path

from tests.family_kit import FamilyReference, KitMedia


def gemma_model_dir(out: Path, name: str) -> Path:
    from tests.test_profiles_gemma3 import build_gemma_model_dir

    return build_gemma_model_dir(out)


def hf_input_ids(model_dir: Path, messages: list[dict], media: list[KitMedia], profile) -> list[int]:
    from PIL import Image
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(str(model_dir))
    text = proc.tokenizer.apply_chat_template(messages, tokenize=False)
    images = [Image.open(m.path).convert("RGB") for m in media if m.kind == "image"]
    out = proc(images=images, text=text, add_special_tokens=False, return_tensors="np")
    return out["input_ids"][0].tolist()


REFERENCE = FamilyReference(hf_input_ids, tokenizer=gemma_model_dir)
