"""A run's settings and paths as plain data: what every unit of every stage gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..media.remote import DEFAULT_REMOTE, RemoteSettings
from .model_files import ShippedModel
from .pack_planner import PackConfig
from .sample_store import RunSampleStore
from .storage import STAGES_DIR, output_path

REJECTS_FILE = "rejects.jsonl"


@dataclass(frozen=True)
class MeasureConfig:
    """Everything a worker needs to measure samples; plain data so it can cross process boundaries."""

    profile: str
    tokenizer: str
    media_root: str | None  # None: no relative media paths (every reference embedded or absolute)
    align: int = 1
    profile_options: dict[str, Any] = field(default_factory=dict)
    mrope: bool = False
    max_tokens: int | None = None  # the row length: longer samples may be rejected before tokenizing
    media_allow_roots: tuple[str, ...] = ()  # folders outside the media root that symlinks may point into
    remote: RemoteSettings = DEFAULT_REMOTE  # how media URLs are fetched (timeouts, private addresses)
    # the config's cost-model overrides (profiles.cost); None: no cost columns (the profile has no model)
    cost: dict[str, Any] | None = None


@dataclass(frozen=True)
class ShardLayout:
    """How the pack stage cuts the plan's rows into shards (decided before writing, so the cut is the same
    whoever writes which shard)."""

    shard_max_bytes: int = 1 << 30  # estimated from the plan: token arrays plus raw media sizes
    shard_max_rows: int | None = None
    val_fraction: float = 0.0
    val_seed: int = 0


@dataclass(frozen=True)
class WriteSettings:
    media_root: str | None
    seq_length: int
    align: int
    pad_token_id: int
    image_encoding: str = "npy"
    compress_video: bool = False
    shard_checksums: tuple[str, ...] = ("xxh3_128",)
    media_allow_roots: tuple[str, ...] = ()  # folders outside the media root that symlinks may point into
    # how media URLs are fetched; not in the repr, so not in the shard key: the measure key holds what of it
    # decides which samples are packed, and timeouts may change on a resumed run
    remote: RemoteSettings = field(default=DEFAULT_REMOTE, repr=False)
    # where processed media payloads are kept for repacks (stages.sample_store): None, the run's stages/
    # folder; "off", none. Not in the repr (the shard key): a store changes how a shard is made, not its bytes
    sample_store: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RunFacts:
    """What a run records of itself in omnipack.json besides its counts, known before any stage runs (built
    by ``pipeline.build_spec``; finalize copies it into the ``RunSummary``)."""

    omnipack_version: str = ""
    profile: dict[str, Any] = field(default_factory=dict)  # name, options, settings, the choice
    tokenizer: dict[str, Any] = field(default_factory=dict)  # path, fingerprint, pad and placeholder ids
    parallel: dict[str, Any] = field(default_factory=dict)  # the parallel layout (tp, cp, sp, fp8)
    measure_key: dict[str, Any] = field(default_factory=dict)  # what the measured samples depend on
    inputs: list[dict[str, Any]] | None = None  # per input path: the split read and its data files
    settings: dict[str, Any] = field(default_factory=dict)  # what ``verify --source`` re-derives samples with

    @property
    def tokenizer_fingerprint(self) -> str | None:
        return self.tokenizer.get("fingerprint")


@dataclass(frozen=True)
class RunSpec:
    output: str
    manifests: tuple[str, ...]
    measure: MeasureConfig
    max_line_bytes: int
    part_lines: int
    pack: PackConfig
    layout: ShardLayout
    write: WriteSettings
    parts: tuple[Any, ...] = ()  # InputPart, filled in once the input is split
    facts: RunFacts = field(default_factory=RunFacts)  # run facts for omnipack.json (profile, tokenizer)
    inputs: Any = None  # omnipack.inputs.InputSpec: how the parts are read (None: omnipack JSONL defaults)
    model: ShippedModel | None = None  # the tokenizer's copy in the output, for nodes without its folder
    model_options: tuple[tuple[str, ShippedModel], ...] = ()  # profile option -> its preprocessor config
    # the run's sample store, opened where its write units run (``stages.write.sample_store``); not data of
    # the run: left out of its equality, repr and pickles, and a new spec for each spec built or replaced
    samples: RunSampleStore = field(default_factory=RunSampleStore, init=False, compare=False, repr=False)

    @property
    def out(self) -> Path:
        """The output root: a ``Path``, or a ``UPath`` for an object store URL (see ``storage``)."""
        return output_path(self.output)

    @property
    def stages(self) -> Path:
        return self.out / STAGES_DIR

    @property
    def measure_dir(self) -> Path:
        return self.stages / "measure"

    @property
    def write_dir(self) -> Path:
        return self.stages / "write"

    @property
    def plan_record(self) -> Path:
        return self.stages / "plan.json"

    @property
    def plan_table(self) -> Path:
        return self.stages / "plan.parquet"

    @property
    def layout_table(self) -> Path:
        return self.stages / "layout.parquet"

    @property
    def gather_table(self) -> Path:
        """Each shard's samples and where they are in the measured parts (``stages.token_file``)."""
        return self.stages / "gather.bin"
