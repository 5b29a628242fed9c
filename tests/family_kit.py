"""The family conformance kit's helpers (``tests/test_family_conformance.py`` runs them for every family).

A family registers its HF reference as ``REFERENCE = FamilyReference(...)`` in ``tests/references/<name>.py``;
the kit discovers families with ``omnipack.profiles.available_profiles()`` and their references by that
module name. A new family adds its module under ``omnipack/profiles``, its reference there and its own test
file; nothing in the kit names a family.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaMeta, MediaPlan, ModelProfile
from omnipack.profiles.model_inputs import EncoderInputs, MediaInputOptions


@dataclass(frozen=True)
class KitMedia:
    """One media item of the kit's conversation: its file, what probing it gives and the profile's plan."""

    kind: str
    path: Path
    meta: MediaMeta
    plan: MediaPlan


def demo_tokenizer(out: Path, name: str) -> Path:
    """The demo tokenizer with family ``name``'s chat template and special tokens."""
    from omnipack.demo.tokenizer import build_demo_tokenizer

    return build_demo_tokenizer(out, profile=name)


@dataclass(frozen=True)
class FamilyReference:
    """What a family registers for the kit.

    ``hf_input_ids(tokenizer_dir, messages, media, profile)``: the token ids the family's HF processor gives
    for the conversation ``messages`` (its chat template rendered by the tokenizer, each media placeholder
    replaced by the processor's own ``replace_<kind>_token``, tokenized), ``media`` in conversation order.
    ``tokenizer(out, name)``: a tokenizer directory the processor and omnipack both use (default: the demo
    tokenizer). ``profile_options``: the profile's options for this comparison (where a default follows
    another consumer than the HF processor, e.g. Nemotron's Bridge audio rule).
    """

    hf_input_ids: Callable[[Path, list[dict], list[KitMedia], ModelProfile], list[int]]
    tokenizer: Callable[[Path, str], Path] = demo_tokenizer
    profile_options: dict[str, Any] = field(default_factory=dict)


def reference(name: str) -> FamilyReference:
    """Family ``name``'s registered reference; a clear failure when it registered none."""
    try:
        module = importlib.import_module(f"tests.references.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"tests.references.{name}":
            raise
        raise AssertionError(
            f"family {name!r} registers no HF reference: add tests/references/{name}.py with "
            "REFERENCE = FamilyReference(...) (see tests/family_kit.py)"
        ) from None
    ref = getattr(module, "REFERENCE", None)
    assert isinstance(ref, FamilyReference), f"tests/references/{name}.py defines no REFERENCE FamilyReference"
    return ref


def write_media(root: Path, kinds: tuple[str, ...]) -> dict[str, Path]:
    """One small real file per kind: a noise PNG (300x400), a 2 s mp4 (96x128 at 16 fps: 32 frames, the
    fewest a family samples, Gemma 4), a 1.5 s wav."""
    from PIL import Image

    from omnipack.demo.media import sine, write_audio, write_video

    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    if "image" in kinds:
        px = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
        Image.fromarray(px).save(root / "image.png")
        out["image"] = root / "image.png"
    if "video" in kinds:
        write_video(root / "video.mp4", n=32, fps=16, w=128, h=96)
        out["video"] = root / "video.mp4"
    if "audio" in kinds:
        write_audio(root / "audio.wav", sine(24000, 16000), 16000)
        out["audio"] = root / "audio.wav"
    return out


def kit_media(root: Path, profile: ModelProfile) -> list[KitMedia]:
    """One probed, planned item of every kind ``profile`` takes (image, video, audio order)."""
    from omnipack.media.probe import probe

    files = write_media(root, profile.kinds)
    items = []
    for kind in ("image", "video", "audio"):
        if kind in files:
            meta = probe(files[kind], kind)
            items.append(KitMedia(kind, files[kind], meta, profile.plan(meta)))
    return items


ANSWERS = ("It shows what was asked about.", "Two of them.")


def conversation(media: list[KitMedia]) -> list[dict]:
    """Two user turns (every media item in the first) and two assistant answers (``ANSWERS``)."""
    first: list[dict] = [{"type": m.kind, m.kind: str(m.path)} for m in media]
    first.append({"type": "text", "text": "Describe these."})
    return [
        {"role": "user", "content": first},
        {"role": "assistant", "content": ANSWERS[0]},
        {"role": "user", "content": [{"type": "text", "text": "How many?"}]},
        {"role": "assistant", "content": ANSWERS[1]},
    ]


def supervised_runs(input_ids: np.ndarray, labels: np.ndarray) -> list[list[int]]:
    """The runs of supervised targets; ``labels[p]`` must be ``input_ids[p + 1]`` wherever it is set."""
    runs: list[list[int]] = []
    cur: list[int] = []
    for p in range(len(input_ids) - 1):
        if labels[p] != -100:
            assert labels[p] == input_ids[p + 1], f"label at {p} is not the next token"
            cur.append(int(labels[p]))
        elif cur:
            runs.append(cur)
            cur = []
    assert labels[-1] == -100, "the last position has no next token to supervise"
    return [*runs, cur] if cur else runs


def family_profile(name: str, ref: FamilyReference) -> ModelProfile:
    return get_profile(name, **ref.profile_options)


def planned_payloads(name: str) -> list[tuple[dict, object]]:
    """(item, payload) pairs of every kind the family takes, stored as its own plans say (sizes, frames,
    views, samples), with the plans' JSON as the items' recorded info."""
    rng = np.random.default_rng(3)
    planner = get_profile(name)
    metas = {
        "image": MediaMeta(kind="image", height=120, width=200),
        "video": MediaMeta(kind="video", height=64, width=64, num_frames=32, fps=16.0),
        "audio": MediaMeta(kind="audio", num_samples=23456, sample_rate=16000),
    }
    out: list[tuple[dict, object]] = []
    for kind in planner.kinds:
        plan = planner.plan(metas[kind])
        if kind == "audio":
            t = np.arange(plan.num_audio_samples) / 16000
            payload: object = (0.2 * np.sin(2 * np.pi * 330 * t) * 32767).astype(np.int16)
        else:
            views = len(plan.frame_indices) if kind == "video" else max(1, len(plan.image_views or ()))
            payload = rng.integers(0, 256, (views, *plan.target_hw, 3), np.uint8)
            payload = payload[0] if kind == "image" and views == 1 else payload
        out.append(({"kind": kind, "info": plan.to_json()}, payload))
    return out


def encode_payloads(inputs: EncoderInputs, name: str) -> dict[str, np.ndarray]:
    """The family's encoder inputs of ``planned_payloads(name)`` (default options), and their feature counts
    under ``_counts``."""
    pairs = planned_payloads(name)
    plain = MediaInputOptions()
    per_item = [inputs.media_inputs(item, payload, plain) for item, payload in pairs]
    counts = [inputs.feature_count(item, payload) for item, payload in pairs]
    out = {k: np.asarray(v) for k, v in inputs.collate_media(per_item, plain).items()}
    out["_counts"] = np.asarray(counts)
    return out
