"""Model profiles, found by name: profile ``X`` is the module ``omnipack.profiles.X`` and its ``PROFILE``.

Adding a family is one new module: a ``ModelProfile`` subclass (the offline planner) with its
``EncoderInputs`` subclass (the trainer half) as ``inputs_class``, and ``PROFILE = <the planner>``.
Nothing here lists the families, and resolving a name imports only that family's module. A family also declares
the checkpoint ``model_type`` values it serves (``ModelProfile.model_types``): ``model_type_families``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ..media.errors import MediaRejected
from ..media.meta import MediaMeta
from .base import MediaPlan, MediaSpan, ModelProfile, Segment
from .model_inputs import EncoderInputs

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def profile_class(name: str) -> type[ModelProfile]:
    """The planner class of profile ``name`` (imports ``omnipack.profiles.<name>`` and nothing else)."""
    module = None
    if _NAME.match(name or ""):
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the family module exists but needs something missing: say that, not "unknown"
    cls = getattr(module, "PROFILE", None)
    if cls is None or getattr(cls, "name", None) != name:
        raise ValueError(f"unknown profile {name!r}; available: {', '.join(available_profiles())}")
    return cls


def get_profile(name: str, **options: Any) -> ModelProfile:
    """Instantiate the planner called ``name`` with its options (e.g. ``max_pixels``)."""
    return profile_class(name)(**options)


def get_encoder_inputs(name: str, settings: Mapping[str, Any]) -> EncoderInputs:
    """The trainer half of profile ``name`` from a dataset's recorded ``settings`` (omnipack.json)."""
    return profile_class(name).inputs_class.from_settings(settings)


def available_profiles() -> list[str]:
    """Names of every family module in this package (imports them all: for listings, not for loading)."""
    names = []
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg or not _NAME.match(info.name):
            continue
        cls = getattr(importlib.import_module(f"{__name__}.{info.name}"), "PROFILE", None)
        if cls is not None and getattr(cls, "name", None) == info.name:
            names.append(info.name)
    return sorted(names)


def model_type_families() -> dict[str, list[str]]:
    """``{model_type: [families that declare it]}``: each family module's ``model_types`` (the config.json
    ``model_type`` values it serves), found by scanning the family modules; nothing here lists them."""
    out: dict[str, list[str]] = {}
    for name in available_profiles():
        for model_type in profile_class(name).model_types:
            out.setdefault(model_type, []).append(name)
    return out


class _Profiles(Mapping[str, type[ModelProfile]]):
    """``{name: planner class}`` of every family, discovered on first use."""

    def __getitem__(self, name: str) -> type[ModelProfile]:
        if name not in available_profiles():
            raise KeyError(name)
        return profile_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(available_profiles())

    def __len__(self) -> int:
        return len(available_profiles())


PROFILES: Mapping[str, type[ModelProfile]] = _Profiles()


__all__ = [
    "PROFILES",
    "EncoderInputs",
    "MediaMeta",
    "MediaPlan",
    "MediaRejected",
    "MediaSpan",
    "ModelProfile",
    "Segment",
    "available_profiles",
    "get_encoder_inputs",
    "get_profile",
    "model_type_families",
    "profile_class",
]
