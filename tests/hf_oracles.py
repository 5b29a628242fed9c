"""Import transformers modules used as oracles.

Some 5.24 modules import torchvision at module level only for their tensor resize paths; the pure
functions we compare against (``sample_frames``, ``smart_resize``, ``get_patch_grid_size``) do not use it.
When torchvision is missing (or its build does not match torch), a throwaway stub lets the module import;
those functions are then called unbound, never the torchvision-backed ones.
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest


def _torchvision_ok() -> bool:
    try:
        import torchvision  # noqa: F401
        import torchvision.transforms.v2.functional  # noqa: F401

        return True
    except Exception:
        return False


def require_torchvision() -> None:
    """Skip the calling test module unless a torchvision matching torch imports (the transformers video
    processors, and every processor holding one, need it): run such modules with ``pytest -m hf_processors``
    in an environment with torchvision (README, "Model profiles")."""
    if not _torchvision_ok():
        pytest.skip(
            "needs a working torchvision matching torch (missing, or a build for another torch); install it to "
            "run these opt-in tests (README, 'Model profiles')",
            allow_module_level=True,
        )


def import_hf(module: str):
    """Import ``transformers.<module>``, stubbing torchvision if needed; skip if torch is missing."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    name = f"transformers.{module}"
    if name in sys.modules or _torchvision_ok():
        return importlib.import_module(name)
    stubs = {}
    for sub in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2"):
        stubs[sub] = types.ModuleType(sub)
    fn = types.ModuleType("torchvision.transforms.v2.functional")
    fn.InterpolationMode = type("InterpolationMode", (), {})
    stubs["torchvision.transforms.v2.functional"] = fn
    stubs["torchvision"].transforms = stubs["torchvision.transforms"]
    stubs["torchvision.transforms"].v2 = stubs["torchvision.transforms.v2"]
    stubs["torchvision.transforms.v2"].functional = fn
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        return importlib.import_module(name)
    except Exception as e:  # pragma: no cover - depends on the installed transformers
        pytest.skip(f"cannot import {name} without torchvision: {e}")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def bare_processor(module: str, cls_name: str, tokenizer, **attrs):
    """An HF processor object built without ``__init__`` (which would want the torchvision video processor).

    Its own methods (``replace_video_token``, ``get_text_with_replacements``, ``create_mm_token_type_ids``,
    ``_merge_kwargs``) run unchanged; ``attrs`` supplies what ``__init__`` would have set (token strings,
    token ids, stand-ins for the image/video processors' size attributes).
    """
    cls = getattr(importlib.import_module(f"transformers.{module}"), cls_name)
    proc = object.__new__(cls)
    proc.tokenizer = tokenizer
    for k, v in attrs.items():
        setattr(proc, k, v)
    return proc


def processor_videos_kwargs(module: str, cls_name: str) -> dict:
    """The ``videos_kwargs`` a call without video options hands the video processor: the processor class's
    own defaults, resolved by its ``_merge_kwargs`` as a user's call resolves them."""
    cls = getattr(importlib.import_module(f"transformers.{module}"), cls_name)
    proc = object.__new__(cls)
    return dict(proc._merge_kwargs(tokenizer_init_kwargs={})["videos_kwargs"])


def qwen_image_processor(profile):
    """``Qwen2VLImageProcessorPil`` configured as ``profile``'s images are (the class users call)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    s = profile.image
    return Qwen2VLImageProcessorPil(
        patch_size=s.patch_size,
        merge_size=s.merge_size,
        temporal_patch_size=s.temporal_patch_size,
        min_pixels=s.min_pixels,
        max_pixels=s.max_pixels,
        image_mean=list(profile.image_mean),
        image_std=list(profile.image_std),
    )


def processor_input_ids(proc, tokenizer, messages: list[dict], replacements: dict[str, list[str]]) -> list[int]:
    """Token ids of ``messages`` as an HF processor call gives them: the tokenizer's chat template rendered,
    each media placeholder replaced in order by ``replacements[kind]`` (what the processor's own
    ``replace_<kind>_token`` returned) through its ``get_text_with_replacements``, then tokenized."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    text = proc.get_text_with_replacements(
        [text], replacements.get("image", []), replacements.get("video", []), replacements.get("audio", [])
    )[0][0]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def qwen_image_grids(profile, paths) -> np.ndarray:
    """``image_grid_thw`` the profile's configured ``Qwen2VLImageProcessorPil`` gives for the image files."""
    from PIL import Image

    if not paths:
        return np.zeros((0, 3), np.int64)
    images = []
    for p in paths:
        with Image.open(p) as img:
            images.append(np.asarray(img.convert("RGB")))
    return qwen_image_processor(profile)(images=images, return_tensors="np")["image_grid_thw"]
