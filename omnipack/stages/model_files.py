"""The tokenizer folder shipped with a run, so a node needs nothing but omnipack installed.

A run names its tokenizer by a local folder (or a Hub id, resolved to a cached snapshot) that exists where
the run starts, not necessarily on the other nodes. Wherever the folder exists, the run copies its small
files (tokenizer.json, tokenizer_config.json, the chat template, special tokens, processor and model
configs; never weights) into the output next to the run's stages, ``stages/model/DIGEST/``, DIGEST being
a digest of the files' names and contents, and records them in ``stages/model/model.json``. A node where
the folder does not exist reads the tokenizer from that copy (``run_tokenizer``), and every measure worker
reads the copy its spec names (``stages.measure.local_measure_config``), through a local cache folder
keyed by the digest (``OMNIPACK_CACHE_DIR``, else ``XDG_CACHE_HOME/omnipack``, else ``~/.cache/omnipack``) whose files are
checked against the recorded checksums.

The run still names the tokenizer by the folder it was started with (the measure settings, omnipack.json's
``tokenizer.path``), so where it was read from changes no key and no byte. A changed tokenizer is a
different run: its fingerprint is in the measure key (``stages.measure.part_key``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..profiles.hf_config import PROCESSOR_OPTIONS, processor_config_source
from ..progress import say
from ..text.hub_cache import NotCached, resolve_model_dir
from .records import digest, file_xxh3, write_json_atomic
from .storage import STAGES_DIR, AnyPath, make_dirs, output_path, publish, staging_dir, staging_file

MODEL_DIR = "model"  # under the run's stages folder
MODEL_RECORD = "model.json"
# Model weights: a run reads only the tokenizer and configs, and weights are gigabytes.
WEIGHT_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npz",
)  # fmt: skip
MAX_FILE_BYTES = 256 << 20  # larger files are not tokenizer files: not shipped (said so)


@dataclass(frozen=True)
class ShippedModel:
    """A tokenizer folder's copy in the output store: plain data, so it travels in the run spec."""

    name: str  # the folder the run names (the driver's path; a Hub id's cached snapshot)
    location: str  # the copy's folder in the output: stages/model/DIGEST
    digest: str
    files: tuple[tuple[str, int, str], ...]  # (file name, bytes, xxh3-128)


def folder_files(folder: Path) -> tuple[list[tuple[str, int, str]], list[str]]:
    """The files of ``folder`` a run ships, as (name, bytes, xxh3-128) in name order, and what it leaves out
    (weights, large files, sub-folders) with why."""
    files, left_out = [], []
    for path in sorted(folder.iterdir()):
        if not path.is_file():  # follows links: a Hub snapshot's files are links to its blobs
            left_out.append(f"{path.name}/ (a folder)")
            continue
        size = path.stat().st_size
        if path.name.endswith(WEIGHT_SUFFIXES):
            left_out.append(f"{path.name} (weights)")
        elif size > MAX_FILE_BYTES:
            left_out.append(f"{path.name} ({size / 2**20:,.0f} MiB, over {MAX_FILE_BYTES >> 20} MiB)")
        else:
            files.append((path.name, size, file_xxh3(path)))
    return files, left_out


def files_digest(files: list[tuple[str, int, str]] | tuple[tuple[str, int, str], ...]) -> str:
    return digest([list(f) for f in files])[:16]


def ship(folder: Path, name: str, stages: AnyPath) -> ShippedModel:
    """Copy ``folder``'s small files into ``stages/model/DIGEST/`` (unless that copy is already recorded)
    and record it in ``stages/model/model.json``; returns the copy."""
    files, left_out = folder_files(folder)
    if not any(f[0] in ("tokenizer.json", "tokenizer_config.json", "vocab.json") for f in files):
        raise ValueError(f"tokenizer folder {str(folder)!r} holds no tokenizer.json/tokenizer_config.json")
    shipped = _copy(folder, name, files, stages)
    if read_shipped(stages) == shipped:
        return shipped
    if left_out:
        say(f"tokenizer {name}: not shipped with the run (not read to tokenize): {', '.join(left_out)}")
    # last: a record names a whole copy
    write_json_atomic(stages / MODEL_DIR / MODEL_RECORD, _record(shipped))
    return shipped


def _copy(folder: Path, name: str, files: list[tuple[str, int, str]], stages: AnyPath) -> ShippedModel:
    """``files`` of ``folder`` in ``stages/model/DIGEST/`` (uploaded unless they are there as recorded)."""
    key = files_digest(files)
    root = stages / MODEL_DIR / key
    shipped = ShippedModel(name, str(root), key, tuple(files))
    if all((root / f).exists() and (root / f).stat().st_size == b for f, b, _ in files):
        return shipped  # a copy is put whole (one PUT, or a rename) or not at all
    make_dirs(root)
    for file, _, _ in files:
        tmp = staging_file(root / file)
        shutil.copyfile(folder / file, tmp)
        publish(tmp, root / file)
    return shipped


def _record(shipped: ShippedModel) -> dict[str, Any]:
    return {"name": shipped.name, "digest": shipped.digest, "files": [list(f) for f in shipped.files]}


def _shipped(record: dict[str, Any], stages: AnyPath) -> ShippedModel:
    files = tuple((str(n), int(b), str(x)) for n, b, x in record["files"])
    return ShippedModel(record["name"], str(stages / MODEL_DIR / record["digest"]), record["digest"], files)


OPTIONS_RECORD = "profile_options.json"


def run_profile_options(
    options: dict[str, Any], stages: AnyPath
) -> tuple[dict[str, Any], tuple[tuple[str, ShippedModel], ...]]:
    """``options`` with each preprocessor config path (``PROCESSOR_OPTIONS``) on this machine, and those files'
    copies in the output: shipped where the path exists, read from the copy where it does not. A model
    folder's file is the one transformers reads for the option's kind (``processor_config_source``), and the
    option then names the copy's folder, so the profile reads it the same way."""
    try:
        recorded = json.loads((stages / MODEL_DIR / OPTIONS_RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        recorded = {}
    local, shipped, folders = dict(options), [], {}
    # shipped like the tokenizer, so every node's profile reads the same settings
    for key, kind in PROCESSOR_OPTIONS.items():
        if options.get(key) is None:
            continue
        name = str(options[key])
        path = Path(name).expanduser()
        found = processor_config_source(path, kind) if path.is_dir() else None
        file = found[0] if found else path
        if file.is_file():
            copy = _copy(file.parent, name, [(file.name, file.stat().st_size, file_xxh3(file))], stages)
            folders[key] = path.is_dir()
        elif not path.exists() and (recorded.get(key) or {}).get("name") == name:
            copy = _shipped(recorded[key], stages)
            folders[key] = bool(recorded[key].get("folder"))
            say(f"{key} {name}: not on this machine, read from the run's copy {copy.location}")
        elif path.exists():
            continue  # a model folder without that kind's config: the profile's defaults, everywhere
        else:
            raise FileNotFoundError(
                f"profile option {key} {name!r} is not on this machine, and the run's output holds no "
                f"shipped copy of it ({stages / MODEL_DIR / OPTIONS_RECORD}): run a stage where it exists "
                "first"
            )
        local[key] = str(materialise(copy)) if folders[key] else str(materialise(copy) / copy.files[0][0])
        shipped.append((key, copy))
    mine = {key: {**_record(copy), "folder": folders[key]} for key, copy in shipped}
    if mine and any(recorded.get(k) != v for k, v in mine.items()):
        write_json_atomic(stages / MODEL_DIR / OPTIONS_RECORD, {**recorded, **mine})
    return local, tuple(shipped)


def read_shipped(stages: AnyPath) -> ShippedModel | None:
    """The run's shipped tokenizer as recorded under ``stages``; None when there is none."""
    try:
        return _shipped(json.loads((stages / MODEL_DIR / MODEL_RECORD).read_text()), stages)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def names_match(name: str, shipped: ShippedModel) -> bool:
    """Whether the tokenizer a node is given (a folder, or a Hub id) is the shipped one: the same folder, or
    the Hub id whose cached snapshot the driver read (``.../models--ORG--NAME/snapshots/COMMIT``)."""
    if os.path.expanduser(name) == shipped.name:
        return True
    repo = name.partition("@")[0]
    snapshot = Path(shipped.name)
    return "/" in repo and snapshot.parent.name == "snapshots" and (
        snapshot.parent.parent.name == "models--" + repo.replace("/", "--")
    )


def cache_dir() -> Path:
    """This machine's folder for tokenizer copies read from runs' outputs."""
    root = os.environ.get("OMNIPACK_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "omnipack"


def _holds(folder: Path, files: tuple[tuple[str, int, str], ...]) -> bool:
    """Whether ``folder`` holds ``files`` with their recorded sizes and checksums."""
    try:
        return all(
            (folder / n).stat().st_size == b and file_xxh3(folder / n) == x for n, b, x in files
        )
    except OSError:
        return False


def materialise(shipped: ShippedModel) -> Path:
    """A local folder with the shipped files: in this machine's cache (this process's staging folder where
    the cache can not be written), downloaded once per digest, checked against the recorded checksums."""
    root = cache_dir() / "model"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        root = staging_dir() / "model"
        root.mkdir(parents=True, exist_ok=True)
    folder = root / shipped.digest
    if _holds(folder, shipped.files):
        return folder
    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    source = output_path(shipped.location)
    for name, _, _ in shipped.files:
        with (source / name).open("rb") as src, (tmp / name).open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    if not _holds(tmp, shipped.files):
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(
            f"the run's copy of {shipped.name} in {shipped.location} does not match its record (sizes or "
            "checksums): rerun a stage where that exists to ship it again"
        )
    if folder.exists() and not _holds(folder, shipped.files):  # damaged: moved aside whole, then removed
        stale = folder.with_name(f"{folder.name}.{os.getpid()}.stale")
        with contextlib.suppress(OSError):
            os.replace(folder, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process put a copy there first
        shutil.rmtree(tmp, ignore_errors=True)
        if not _holds(folder, shipped.files):
            raise
    return folder


@dataclass(frozen=True)
class RunTokenizer:
    name: str  # what the run records (the folder the run was started with)
    folder: Path  # where this machine reads it
    shipped: ShippedModel


def run_tokenizer(name: str, stages: AnyPath) -> RunTokenizer:
    """The run's tokenizer on this machine: the named folder (a Hub id's cached snapshot), shipped to the
    output (``ship``), or where it does not exist here, the copy an earlier stage shipped."""
    why = "is not a folder on this machine"
    try:
        folder = resolve_model_dir(name)
    except NotCached as e:
        folder, why = None, str(e)
    if folder is not None and folder.is_dir():
        return RunTokenizer(str(folder), folder, ship(folder, str(folder), stages))
    shipped = read_shipped(stages)
    if shipped is not None and names_match(name, shipped):
        say(f"tokenizer {name}: not on this machine, read from the run's copy {shipped.location}")
        return RunTokenizer(shipped.name, materialise(shipped), shipped)
    record = stages / MODEL_DIR / MODEL_RECORD
    other = f" (it holds {shipped.name!r})" if shipped is not None else ""
    raise ValueError(
        f"tokenizer {name!r} {why}, and the run's output holds no shipped copy of it ({record}{other}): "
        "run a stage where the tokenizer folder exists first (the whole run, or the measure stage's rank 0), "
        "which ships it with the run, or give a tokenizer folder on this machine"
    )


def local_copy(shipped: ShippedModel) -> str:
    """This machine's checked copy of a shipped folder, as a path (``materialise``: its files are checked on
    each call, so a worker keeps what it loads from the copy: ``stages.measure.worker_measurer``)."""
    return str(materialise(shipped))


def shipped_for_output(output: str, name: str) -> ShippedModel | None:
    """The tokenizer a run in ``output`` shipped, when it is the one named ``name``."""
    shipped = read_shipped(output_path(output) / STAGES_DIR)
    return shipped if shipped is not None and names_match(name, shipped) else None


def shipped_option(output: str, key: str, name: str) -> bool:
    """Whether a run in ``output`` shipped the preprocessor config profile option ``key`` names ``name``."""
    try:
        recorded = json.loads((output_path(output) / STAGES_DIR / MODEL_DIR / OPTIONS_RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return (recorded.get(key) or {}).get("name") == name


__all__ = [
    "ShippedModel", "local_copy", "run_profile_options", "run_tokenizer", "shipped_for_output",
    "shipped_option",
]  # fmt: skip
