"""A tiny local Qwen3.5 checkpoint, built offline from the transformers 5.24 classes (nothing downloaded).

The directory holds what a Qwen3.5 release holds for preprocessing: a ``Qwen3_5Tokenizer`` (a byte-level BPE
trained on the demo text, with Qwen's special tokens and a thinking chat template), the released
``preprocessor_config.json`` and ``video_preprocessor_config.json``, and a tiny ``Qwen3_5Config`` whose
token ids are the tokenizer's. ``AutoImageProcessor`` resolves it to ``Qwen2VLImageProcessorPil``; the
processor class of the release, ``Qwen3VLProcessor``, is built around it with its own methods (its
constructor and ``AutoProcessor`` want the torchvision video processor, absent here).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np

from tests.family_kit import byte_level_bpe

SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>",
]  # fmt: skip
# Qwen/Qwen3.5-* preprocessor_config.json and video_preprocessor_config.json (as released).
RELEASED_PREPROCESSOR_CONFIG = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
RELEASED_VIDEO_PREPROCESSOR_CONFIG = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor",
}

# A test template in the shape of Qwen3.5's (written for these tests): ChatML turns, media as
# <|vision_start|><|image_pad|/video_pad|><|vision_end|>, and the last assistant turn after the last user
# message opened by a thinking block (reasoning of earlier turns dropped, so earlier turns re-render).
CHAT_TEMPLATE = (
    "{%- macro content(c) -%}{%- if c is string -%}{{- c -}}{%- else -%}{%- for item in c -%}"
    "{%- if item.type == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item.type == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif item.type == 'text' -%}{{- item.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\\n' -}}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last_user -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- content(m.content) -}}{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)


def build_qwen35_model_dir(out_dir: str | Path) -> Path:
    """Tokenizer, released preprocessor configs and a tiny model config, saved as a model directory."""
    from transformers import AutoTokenizer
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = json.loads(byte_level_bpe(SPECIAL).to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Qwen3_5Tokenizer(vocab=model["vocab"], merges=merges)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(RELEASED_PREPROCESSOR_CONFIG))
    (out / "video_preprocessor_config.json").write_text(json.dumps(RELEASED_VIDEO_PREPROCESSOR_CONFIG))
    tok = AutoTokenizer.from_pretrained(out)
    tiny_config(tok).save_pretrained(out)
    return out


def tiny_config(tok, *, linear_attention: bool = True):
    """A tiny ``Qwen3_5Config`` with the tokenizer's ids (``linear_attention=False``: every layer full)."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    layers = ["linear_attention", "full_attention"] if linear_attention else ["full_attention"] * 2
    text = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, layer_types=layers,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                         "mrope_interleaved": True, "partial_rotary_factor": 1.0},
        pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
    )  # fmt: skip
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=16, spatial_merge_size=2,
        temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64,
    )  # fmt: skip
    return Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def qwen35_processor(model_dir: str | Path):
    """``Qwen3VLProcessor`` (the class a Qwen3.5 release names) over the directory's image processor and
    tokenizer, its own ``__call__`` and replacement methods unchanged; the video processor is a stand-in
    with the released sizes (``replace_video_token`` reads only ``merge_size`` / ``temporal_patch_size``)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    from tests.hf_oracles import bare_processor

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids = {f"{k}_id": tok.convert_tokens_to_ids(v) for k, v in _TOKENS.items()}
    return bare_processor(
        "models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor", tok,
        image_processor=AutoImageProcessor.from_pretrained(str(model_dir)),
        video_processor=types.SimpleNamespace(merge_size=2, temporal_patch_size=2), **_TOKENS, **ids,
    )  # fmt: skip


_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}


def hf_video_inputs(video_paths: list[Path], size: dict[str, int] | None = None) -> dict:
    """What ``Qwen3VLVideoProcessor`` (the released ``size`` by default, its class defaults otherwise) returns
    for the mp4 files besides pixels: ``video_grid_thw`` and the sampled frames' ``video_metadata``. Decoded
    by transformers' ``load_video`` (PyAV), sampled by its ``sample_frames``, sized by its ``smart_resize``
    and padded to the temporal patch as its ``_preprocess`` / ``patchify`` do (their resize itself runs on
    torchvision, absent here)."""
    from transformers.video_utils import load_video

    from tests.hf_oracles import import_hf

    m = import_hf("models.qwen3_vl.video_processing_qwen3_vl")
    cls = m.Qwen3VLVideoProcessor
    size = size or RELEASED_VIDEO_PREPROCESSOR_CONFIG["size"]
    proc = object.__new__(cls)
    proc.fps, proc.num_frames = cls.fps, cls.num_frames
    grids, metas = [], []
    for path in video_paths:
        frames, meta = load_video(str(path), backend="pyav")
        indices = [int(i) for i in cls.sample_frames(proc, meta)]
        n, (h, w) = len(indices), frames.shape[1:3]
        rh, rw = m.smart_resize(n, h, w, cls.temporal_patch_size, cls.patch_size * cls.merge_size,
                                size["shortest_edge"], size["longest_edge"])  # fmt: skip
        grids.append(np.array([-(-n // cls.temporal_patch_size), rh // cls.patch_size, rw // cls.patch_size]))
        meta.frames_indices = indices
        metas.append(meta)
    return {"video_grid_thw": grids, "video_metadata": metas}


def hf_ids_and_types(
    proc, text: str, image_paths: list[Path], video_paths: list[Path]
) -> tuple[list[int], list[int]]:
    """``Qwen3VLProcessor``'s replacement of every block in ``text`` (images by ``replace_image_token`` from
    its image processor's grids, videos by ``replace_video_token`` from ``hf_video_inputs``), tokenized as its
    ``__call__`` does: (input_ids, mm_token_type_ids) of the one sample."""
    from PIL import Image

    image_inputs: dict = {"image_grid_thw": []}
    if image_paths:
        images = [Image.open(p).convert("RGB") for p in image_paths]
        image_inputs = proc.image_processor(images=images, return_tensors="np")
    video_inputs = hf_video_inputs(video_paths)
    image_reps = [proc.replace_image_token(image_inputs, i) for i in range(len(image_paths))]
    video_reps = [proc.replace_video_token(video_inputs, i) for i in range(len(video_paths))]
    text = proc.get_text_with_replacements([text], image_reps, video_reps, [])[0][0]
    ids = proc.tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids, [int(x) for x in proc.create_mm_token_type_ids([ids])[0]]


def model_rope_index(
    model, ids: list[int], mm_types: list[int], image_grids: list, video_grids: list
) -> np.ndarray:
    """``Qwen3_5Model.get_rope_index`` of one sample (int64 [3, L]) from the processor's grids."""
    import torch

    img = [list(map(int, g)) for g in image_grids]
    vid = [list(map(int, g)) for g in video_grids]
    pos, _ = model.model.get_rope_index(
        torch.tensor([ids]),
        torch.tensor([mm_types]),
        image_grid_thw=torch.tensor(img) if img else None,
        video_grid_thw=torch.tensor(vid) if vid else None,
    )
    return pos[:, 0].numpy()
