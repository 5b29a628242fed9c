"""Which profile a run uses, and why: the one a model folder names, the one asked for, or the default.

A model folder (``--model``, or a ``--tokenizer`` folder holding ``config.json``) says what it is: its
``model_type`` picks the native family that declares it (``ModelProfile.model_types``), and the family reads
its processor settings from that folder, where transformers reads them (``processor_config_source``). An
explicit profile that disagrees with the checkpoint is an error, never a mixed profile; a model type with no
native family falls back to the processor-backed profile (``hf``), saying so. The choice is printed at start and recorded in omnipack.json.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import available_profiles, model_type_families, profile_class
from .base import ModelProfile
from .hf_config import PROCESSOR_OPTIONS, PROCESSOR_SETTINGS, processor_config_source

DEFAULT_PROFILE = "qwen2_5_vl"
# The processor-backed profile: the model's own processor decides (for a model type without a native family).
PROCESSOR_PROFILE = "hf"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class Checkpoint:
    """What a model folder's ``config.json`` says the model is."""

    folder: Path
    model_type: str
    architectures: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # config.json as read

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
        return cls(Path(folder), model_type, tuple(str(a) for a in architectures), config)


@dataclass(frozen=True)
class ProfileChoice:
    """The run's profile, where the choice came from and where its processor settings were read."""

    name: str
    # "checkpoint" (config.json model_type), "explicit" (--profile / config file), "fallback" (a model type without
    # a native family: the processor-backed profile) or "default" (no profile given, no config.json)
    source: str
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
        elif self.source == "explicit" and self.name == PROCESSOR_PROFILE:
            why = f"given explicitly: the model's own processor ({self.model_dir}) decides every count"
        elif self.source == "explicit":
            why = "given explicitly" + (f", agrees with model_type {self.model_type}" if self.model_type else "")
        elif self.source == "fallback":
            why = (
                f"the checkpoint's model_type {self.model_type} has no native profile: its own processor "
                f"({Path(str(self.model_dir))}) decides every count"
            )
        else:
            why = "the default: no profile given and no config.json in the model folder"
        files = ", ".join(f"{kind} {path}" for kind, path in self.processor_files.items()) or "none (defaults)"
        return (
            f"profile {self.name} ({why}); processor settings read from: {files}; "
            f"settings {json.dumps(settings, separators=(',', ':'))}"
        )


def _takes_option(cls: type[ModelProfile], option: str) -> bool:
    """Whether the profile's constructor (or one it forwards its keywords to, up the classes) names ``option``."""
    return any(option in inspect.signature(c.__init__).parameters for c in cls.__mro__ if "__init__" in vars(c))


def choose_profile(
    explicit: str | None, model_dir: str | Path | None, options: dict[str, Any]
) -> tuple[ProfileChoice, dict[str, Any]]:
    """The profile for a run and its options with the model folder's processor settings filled in.

    ``explicit``: the profile asked for (None: none); ``model_dir``: the local model (or tokenizer) folder;
    ``options``: the profile options given (they win over the folder's). Raises ``ValueError`` with one line
    when the explicit profile disagrees with the checkpoint.
    """
    folder = Path(model_dir) if model_dir is not None and Path(model_dir).is_dir() else None
    checkpoint = Checkpoint.read(folder) if folder is not None else None
    opts = dict(options)
    if checkpoint is None:
        name = explicit or DEFAULT_PROFILE
        cls = profile_class(name)
        if folder is not None and _takes_option(cls, "model_dir") and opts.get("model_dir") is None:
            opts["model_dir"] = str(folder)  # a processor-backed profile reads the processor in the folder
        source = "explicit" if explicit else "default"
        return ProfileChoice(name, source, model_dir=opts.get("model_dir"), processor_files=_processor_files(cls, opts)), opts
    name, source = _checkpoint_profile(explicit, checkpoint)
    cls = profile_class(name)
    if _takes_option(cls, "model_dir") and opts.get("model_dir") is None:
        opts["model_dir"] = str(checkpoint.folder)
    for option, kind in PROCESSOR_OPTIONS.items():  # the folder's settings, unless given explicitly
        if (
            _takes_option(cls, option)
            and opts.get(option) is None
            and processor_config_source(checkpoint.folder, kind) is not None
        ):
            opts[option] = str(checkpoint.folder)
    opts.update(_model_config_options(cls, checkpoint.config, opts))
    choice = ProfileChoice(
        name,
        source,
        checkpoint.model_type,
        checkpoint.architectures,
        str(checkpoint.folder),
        _processor_files(cls, opts),
    )
    return choice, opts


def _model_config_options(cls: type[ModelProfile], config: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The profile's ``model_config_options`` the checkpoint's config sets, where not given explicitly."""
    found = {}
    for option, keys in cls.model_config_options.items():
        value: Any = config
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None and given.get(option) is None:
            found[option] = value
    return found


def _checkpoint_profile(explicit: str | None, checkpoint: Checkpoint) -> tuple[str, str]:
    """(profile name, how it was chosen) for a checkpoint: ``explicit`` when it serves the checkpoint's
    model_type, else the one native profile that does, else the processor-backed fallback."""
    families = model_type_families()
    serving = families.get(checkpoint.model_type, [])
    config = checkpoint.folder / CONFIG_FILE
    if explicit is not None and explicit not in serving and explicit != PROCESSOR_PROFILE:
        profile_class(explicit)  # an unknown name is reported as such
        served = f"profile {', '.join(serving)}" if serving else "no native profile"
        raise ValueError(
            f"--profile {explicit} disagrees with the checkpoint: {config} has model_type "
            f"{checkpoint.model_type!r} ({served}; {explicit} serves {', '.join(profile_class(explicit).model_types)}); "
            f"drop --profile to use the checkpoint's (or --profile {PROCESSOR_PROFILE}, its own processor), or "
            "point --model/--tokenizer at the matching model"
        )
    if explicit is None and len(serving) > 1:
        raise ValueError(
            f"model_type {checkpoint.model_type!r} of {config} is served by several profiles "
            f"({', '.join(serving)}): choose one with --profile"
        )
    if explicit is not None:
        name, source = explicit, "explicit"
    elif serving:
        name, source = serving[0], "checkpoint"
    else:  # no native family: the model's own processor decides
        name, source = PROCESSOR_PROFILE, "fallback"
    return name, source


def _processor_files(cls: type[ModelProfile], options: dict[str, Any]) -> dict[str, str]:
    """kind -> where the profile reads that kind's processor settings, for the options that name them."""
    if options.get("model_dir") is not None and _takes_option(cls, "model_dir"):  # the processor reads them all
        found = {kind: processor_config_source(options["model_dir"], kind) for kind in PROCESSOR_SETTINGS}
        return {kind: f"{f[0]}#{f[1]}" if f[1] else str(f[0]) for kind, f in found.items() if f is not None}
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


def native_families_line() -> str:
    """The native families and the model types each serves, for messages."""
    return ", ".join(
        f"{name} ({', '.join(profile_class(name).model_types)})"
        for name in available_profiles()
        if profile_class(name).model_types
    )


__all__ = ["DEFAULT_PROFILE", "PROCESSOR_PROFILE", "Checkpoint", "ProfileChoice", "choose_profile", "native_families_line"]
