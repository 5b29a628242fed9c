"""Which profile a run uses, and why: the one a model folder names, the one asked for, or the default.

A model folder (``--model``, or a ``--tokenizer`` folder holding ``config.json``) says what it is: its
``model_type`` picks the native family that declares it (``ModelProfile.model_types``), and the family reads
its processor settings from that folder, where transformers reads them (``processor_config_source``). An
explicit profile that disagrees with the checkpoint is an error, never a mixed profile; a model type with no
native family is refused by name. The choice is printed at start and recorded in omnipack.json.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import ModelProfile, processor_config_source

DEFAULT_PROFILE = "qwen2_5_vl"
CONFIG_FILE = "config.json"
# Profile options that name a processor settings folder, and the kind of settings each reads there.
PROCESSOR_OPTIONS = {"preprocessor_config": "image", "video_preprocessor_config": "video"}


@dataclass(frozen=True)
class Checkpoint:
    """What a model folder's ``config.json`` says the model is."""

    folder: Path
    model_type: str
    architectures: tuple[str, ...] = ()

    @classmethod
    def read(cls, folder: str | Path) -> Checkpoint | None:
        """The folder's checkpoint facts; None when it holds no ``config.json`` (a bare tokenizer folder)."""
        path = Path(folder) / CONFIG_FILE
        if not path.is_file():
            return None
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"model config {path} is not valid JSON ({e})") from None
        model_type = config.get("model_type") if isinstance(config, dict) else None
        if not isinstance(model_type, str) or not model_type:
            raise ValueError(f"model config {path} names no model_type: omnipack cannot tell which model it is")
        architectures = config.get("architectures") or ()
        return cls(Path(folder), model_type, tuple(str(a) for a in architectures))


@dataclass(frozen=True)
class ProfileChoice:
    """The run's profile, where the choice came from and where its processor settings were read."""

    name: str
    source: str  # "checkpoint" (config.json model_type), "explicit" (--profile / config file) or "default"
    model_type: str | None = None
    architectures: tuple[str, ...] = ()
    model_dir: str | None = None
    # kind -> where the profile read that kind's processor settings ("<file>" or "<file>#<section>")
    processor_files: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The choice's keys in omnipack.json's ``profile`` (beside name, options, settings)."""
        return {
            "source": self.source,
            "model_type": self.model_type,
            "architectures": list(self.architectures),
            "model_dir": self.model_dir,
            "processor_files": dict(self.processor_files),
        }

    def describe(self, settings: dict[str, Any]) -> str:
        """One start-of-run line: the profile, why it was chosen, and its processor settings."""
        if self.source == "checkpoint":
            why = f"from the checkpoint's model_type {self.model_type} ({Path(str(self.model_dir)) / CONFIG_FILE})"
        elif self.source == "explicit":
            why = "given explicitly" + (f", agrees with model_type {self.model_type}" if self.model_type else "")
        else:
            why = "the default: no profile given and no config.json in the model folder"
        files = ", ".join(f"{kind} {path}" for kind, path in self.processor_files.items()) or "none (defaults)"
        return (
            f"profile {self.name} ({why}); processor settings read from: {files}; "
            f"settings {json.dumps(settings, separators=(',', ':'))}"
        )


def _takes_option(cls: type[ModelProfile], option: str) -> bool:
    params = inspect.signature(cls).parameters
    return option in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def choose_profile(
    explicit: str | None, model_dir: str | Path | None, options: dict[str, Any]
) -> tuple[ProfileChoice, dict[str, Any]]:
    """The profile for a run and its options with the model folder's processor settings filled in.

    ``explicit``: the profile asked for (None: none); ``model_dir``: the local model (or tokenizer) folder;
    ``options``: the profile options given (they win over the folder's). Raises ``ValueError`` with one line
    when the explicit profile disagrees with the checkpoint or no native family serves its model type.
    """
    from . import model_type_families, profile_class

    checkpoint = Checkpoint.read(model_dir) if model_dir is not None and Path(model_dir).is_dir() else None
    if checkpoint is None:
        name = explicit or DEFAULT_PROFILE
        files = _processor_files(profile_class(name), options)
        return ProfileChoice(name, "explicit" if explicit else "default", processor_files=files), dict(options)
    families = model_type_families()
    serving = families.get(checkpoint.model_type, [])
    config = checkpoint.folder / CONFIG_FILE
    if explicit is not None and explicit not in serving:
        profile_class(explicit)  # an unknown name is reported as such
        served = f"profile {', '.join(serving)}" if serving else "no native profile"
        raise ValueError(
            f"--profile {explicit} disagrees with the checkpoint: {config} has model_type "
            f"{checkpoint.model_type!r} ({served}; {explicit} serves {', '.join(profile_class(explicit).model_types)}); "
            "drop --profile to use the checkpoint's, or point --model/--tokenizer at the matching model"
        )
    if not serving:
        native = ", ".join(f"{name} ({', '.join(profile_class(name).model_types)})" for name in _native_families())
        raise ValueError(
            f"model_type {checkpoint.model_type!r} of {config} has no native profile; native families "
            f"(model types): {native}"
        )
    if explicit is None and len(serving) > 1:
        raise ValueError(
            f"model_type {checkpoint.model_type!r} of {config} is served by several profiles "
            f"({', '.join(serving)}): choose one with --profile"
        )
    name = explicit or serving[0]
    cls = profile_class(name)
    opts = dict(options)
    for option, kind in PROCESSOR_OPTIONS.items():  # the folder's settings, unless given explicitly
        if (
            _takes_option(cls, option)
            and opts.get(option) is None
            and processor_config_source(checkpoint.folder, kind) is not None
        ):
            opts[option] = str(checkpoint.folder)
    choice = ProfileChoice(
        name,
        "explicit" if explicit else "checkpoint",
        checkpoint.model_type,
        checkpoint.architectures,
        str(checkpoint.folder),
        _processor_files(cls, opts),
    )
    return choice, opts


def _processor_files(cls: type[ModelProfile], options: dict[str, Any]) -> dict[str, str]:
    """kind -> where the profile reads that kind's processor settings, for the options that name them."""
    return {
        kind: _settings_file(options[option], kind)
        for option, kind in PROCESSOR_OPTIONS.items()
        if options.get(option) is not None and _takes_option(cls, option)
    }


def _settings_file(path: str | Path, kind: str) -> str:
    """Where a processor-settings option (a json file or a model folder) is read for ``kind``."""
    if not Path(path).is_dir():
        return str(path)
    found = processor_config_source(path, kind)
    if found is None:
        return f"{path} (no {kind} processor settings there)"
    return f"{found[0]}#{found[1]}" if found[1] else str(found[0])


def _native_families() -> list[str]:
    from . import available_profiles, profile_class

    return [name for name in available_profiles() if profile_class(name).model_types]


__all__ = ["DEFAULT_PROFILE", "Checkpoint", "ProfileChoice", "choose_profile"]
