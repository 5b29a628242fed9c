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

import pytest


def _torchvision_ok() -> bool:
    try:
        import torchvision  # noqa: F401
        import torchvision.transforms.v2.functional  # noqa: F401

        return True
    except Exception:
        return False


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
