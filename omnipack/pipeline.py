"""``omnipack prepare``: measure -> pack -> write -> finalize, with every input sample accounted for.

Each stage is a list of units of work (``omnipack.stages``) that an executor runs (``omnipack.executors``:
a local process pool, or Ray); a staged run (``stage=``, ``rank``/``world_size``) runs one stage's share
of units, for schedulers without Ray. Every unit records its completion, so rerunning the same command
after a crash redoes only what is unfinished, and the output folder is held by one run at a time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import __version__
from .alignment import ParallelLayout, check_seq_length
from .dataset.meta import DATASET_CONFIG, NV_META, OMNIPACK_META
from .dataset.shards import SHARD_CHECKSUMS
from .errors import StageError
from .executors import Executor, make_executor
from .inputs import InputPart, InputSpec, data_files, select_inputs
from .inputs.accounting import DEFAULT_MAX_REJECT_FRACTION
from .manifest import default_max_line_bytes
from .media.remote import RemoteSettings
from .media.sources import ALLOW_ROOT_OPTION, local_path, media_root_key, probe_locations
from .profiles import PROFILES, get_profile
from .profiles.checkpoint import choose_profile
from .progress import StageProgress, say
from .stages.finalize import NothingPacked, WriteIncomplete, finalize, remove_meta
from .stages.lock import LOCK_DIR, WHOLE_RUN, OutputLock, OutputLocked
from .stages.measure import MEASURE, PART_LINES, PARTS_FILE, load_parts, parts_key
from .stages.model_files import run_profile_options, run_tokenizer
from .stages.pack import MEASURE_KEY_FILE, MeasureIncomplete, run_pack_stage
from .stages.pack_planner import PackConfig
from .stages.records import PlanRecord, digest, read_record, write_json_atomic
from .stages.sample_store import check_store_location, store_location
from .stages.spec import (
    REJECTS_FILE,
    STAGES_DIR,
    MeasureConfig,
    RunFacts,
    RunSpec,
    ShardLayout,
    WriteSettings,
)
from .stages.storage import (
    REPLACED_DIR,
    BackgroundRemoval,
    is_local,
    make_dirs,
    output_path,
    remove_partials,
    remove_tree,
)
from .stages.tokenizer_facts import TokenizerFacts, offer_tokenizer, tokenizer_facts
from .stages.unit import Stage
from .stages.write import WRITE, sample_store
from .text.hub_cache import NotCached, resolve_model_dir

__all__ = [
    "MEASURE_KEY_FILE",
    "REJECTS_FILE",
    "STAGES",
    "STAGES_DIR",
    "NothingPacked",
    "PrepareConfig",
    "run_prepare",
]

STAGES = ("measure", "pack", "write", "finalize")
FROM_STAGES = ("measure", "pack")


def _check_measure_reusable(measure_dir: Path, key: dict[str, Any]) -> int:
    """The input count of an earlier measure run, after checking it measured with the same settings."""
    path = measure_dir / MEASURE_KEY_FILE
    if not path.exists():
        raise FileNotFoundError(f"no earlier measure run under {measure_dir}; run without --from-stage first")
    recorded = json.loads(path.read_text())
    changed = [k for k, v in key.items() if k != "max_tokens" and recorded.get(k) != v]
    # Samples longer than the earlier run's rows were rejected unmeasured: a longer row needs them measured.
    earlier = recorded.get("max_tokens")
    if earlier is not None and key["max_tokens"] is not None and key["max_tokens"] > earlier:
        changed.append(f"seq_length {key['max_tokens']} over the measured {earlier}")
    if changed:
        raise ValueError(
            f"measure settings changed since the last run ({', '.join(changed)}): re-measure instead"
        )
    return int(recorded["input"])


@dataclass
class PrepareConfig:
    """All settings of one preparation run (a config file's keys; CLI flags override them)."""

    manifest: list[str]
    media_root: str | None  # None: every media reference is embedded or absolute (no relative paths)
    tokenizer: str
    output: str
    # None: the profile the model folder's config.json names (``model``, else the tokenizer folder), else the
    # default (qwen2_5_vl); set, it must agree with that config.json (profiles.checkpoint.choose_profile)
    profile: str | None = None
    profile_options: dict[str, Any] = field(default_factory=dict)
    model: str | None = None  # the model folder (or cached Hub id) its config and processor settings come from
    # 3-D mRoPE position ids: None means what the profile's family needs (on for Qwen-VL / Qwen-Omni, whose
    # trainers take mRoPE ids; off for 1-D families), so prepare and demo agree
    mrope: bool | None = None
    seq_length: int = 4096
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    fp8: str = "none"
    algorithm: str = "bfd"
    seed: int = 0
    shuffle: bool = True
    window: int | None = None
    balance: bool = False
    cost: dict[str, Any] = field(default_factory=dict)  # cost-model overrides (profiles.cost)
    data_parallel: list[int] | int = field(default_factory=lambda: [8, 64])  # straggler estimate DP sizes
    max_samples_per_row: int | None = None
    max_media_per_row: int | None = None
    max_vision_patches_per_row: int | None = None
    max_audio_frames_per_row: int | None = None
    image_encoding: str = "npy"
    compress_video: bool = False
    shard_size_mb: float = 1024.0
    shard_max_rows: int | None = None
    shard_sha256: bool = False  # also record each shard's sha256 (xxh3-128 always; sha256 costs ~15x more)
    val_fraction: float = 0.0
    workers: int = 1
    max_line_bytes: int | None = None  # longer manifest lines are rejected unread (default: from seq_length)
    overwrite: bool = False
    progress: bool = True
    from_stage: str = "measure"  # "pack": reuse the measure tables under stages/ (repack, rewrite)
    # processed media payloads kept for repacks (stages.sample_store): a local folder shared by packings;
    # None: stages/samples of a local output; "off": none
    sample_store: str | None = None
    executor: str = "local"  # "ray": the same units on a Ray cluster (omnipack's ray extra)
    ray_address: str | None = None  # "local" (a new Ray), "auto", host:port; None: RAY_ADDRESS or local
    part_lines: int = PART_LINES  # input records (JSONL: lines) per measure unit
    input_format: str | None = None  # reader of the inputs (jsonl, json, parquet, arrow); None: detected
    input_layout: str = "auto"  # record layout (omnipack, sharegpt, messages_media, prompt_response)
    input_fields: dict[str, str] = field(default_factory=dict)  # omnipack field -> the input's field name
    split: str | None = None  # the split of folder inputs (Hub/DatasetDict) to read; None: train, or the only one
    input_roles: dict[str, str] = field(default_factory=dict)  # the input's role value -> a known role name
    media_allow_roots: list[str] = field(default_factory=list)  # symlink targets allowed outside media_root
    max_reject_fraction: float = DEFAULT_MAX_REJECT_FRACTION  # more rejects: exit code 3 (data still written)
    # remote media (omnipack.media.remote): timeouts, a deadline per URL, and private addresses refused
    http_connect_timeout: float = RemoteSettings.connect_timeout_s
    http_read_timeout: float = RemoteSettings.read_timeout_s
    http_deadline: float = RemoteSettings.deadline_s
    allow_private_urls: bool = False
    allow_private_hosts: list[str] = field(default_factory=list)  # "host" or "host:port" allowed anyway

    def __post_init__(self) -> None:
        try:  # a Hub id's cached snapshot; one not cached is reported where the tokenizer is loaded
            model_dir = resolve_model_dir(self.model or self.tokenizer)
        except NotCached:
            model_dir = None
        self.profile_choice, self.profile_options = choose_profile(self.profile, model_dir, self.profile_options)
        self.profile = self.profile_choice.name
        if self.mrope is None:
            family = PROFILES.get(self.profile)
            self.mrope = bool(family is not None and family.uses_mrope())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrepareConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(sorted(unknown))}")
        if isinstance(d.get("manifest"), str):
            d = {**d, "manifest": [d["manifest"]]}
        return cls(**d)

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(self.tp, self.cp, self.sequence_parallel, self.fp8)

    @property
    def remote(self) -> RemoteSettings:
        return RemoteSettings(
            self.http_connect_timeout,
            self.http_read_timeout,
            self.http_deadline,
            self.allow_private_urls,
            tuple(self.allow_private_hosts),
        )

    @property
    def input_spec(self) -> InputSpec:
        max_line_bytes = self.max_line_bytes or default_max_line_bytes(self.seq_length)
        return InputSpec(
            self.input_format, self.input_layout, dict(self.input_fields), max_line_bytes, self.split,
            dict(self.input_roles),
        )


def input_summary(cfg: PrepareConfig) -> list[dict[str, Any]]:
    """Per input path: the split read (None: the input names none) and its data files (``inputs`` in
    omnipack.json)."""
    return [
        {"path": str(c.path), "split": c.split,
         "files": [f.relative_to(c.path).as_posix() if c.path.is_dir() else f.name for f in c.files]}
        for _, c in select_inputs(list(cfg.manifest), cfg.input_spec)
    ]  # fmt: skip


def build_spec(cfg: PrepareConfig, executor: Executor | None = None) -> RunSpec:
    """The run's plain-data spec: derived stage settings, run facts, and the input's parts. ``executor``
    (the run's, where it measures) is offered the tokenizer loaded for the facts, for its workers' measure
    units (``tokenizer_facts.offer_tokenizer``)."""
    align = cfg.layout.alignment
    check_seq_length(cfg.seq_length, align)
    out = output_path(cfg.output)
    # the tokenizer folder, shipped with the run; or where it is not on this node, the copy shipped before
    tokenizer = run_tokenizer(cfg.tokenizer, out / STAGES_DIR)
    options, shipped_options = run_profile_options(cfg.profile_options, out / STAGES_DIR)  # likewise
    profile = get_profile(cfg.profile, **options)
    # a repack takes them as the earlier run recorded them: no tokenizer (transformers, torch) to load
    tok_facts = tokenizer_facts(
        tokenizer.folder, tokenizer.shipped.digest, profile, {"profile": cfg.profile, "options": options},
        out / STAGES_DIR, reuse=cfg.from_stage == "pack",
        on_load=None if executor is None else functools.partial(offer_tokenizer, executor, tokenizer.shipped),
    )  # fmt: skip
    cost_model = _cost_model(cfg, profile)
    pad_id = tok_facts.pad_token_id
    inputs = cfg.input_spec
    parts = load_parts(out / STAGES_DIR, list(cfg.manifest), inputs, cfg.part_lines)
    measure_key = _measure_key(cfg, tok_facts.fingerprint, parts, inputs.max_record_bytes)
    return RunSpec(
        output=str(out),
        manifests=tuple(str(p) for p in cfg.manifest),
        measure=MeasureConfig(
            cfg.profile,
            tokenizer.name,  # a Hub id's cached snapshot: every worker reads the same files
            cfg.media_root,
            align,
            dict(cfg.profile_options),
            cfg.mrope,
            max_tokens=cfg.seq_length,
            media_allow_roots=tuple(cfg.media_allow_roots),
            remote=cfg.remote,
            cost=None if cost_model is None else dict(cfg.cost),
        ),
        max_line_bytes=inputs.max_record_bytes,
        part_lines=cfg.part_lines,
        # The pack settings are the same-named fields of the prepare config, and the cost model's numbers.
        pack=PackConfig(
            align=align,
            cost_model=None if cost_model is None else cost_model.describe(),
            **{f.name: getattr(cfg, f.name) for f in fields(PackConfig) if f.name not in DERIVED_PACK_FIELDS},
        ),
        layout=ShardLayout(
            int(cfg.shard_size_mb * (1 << 20)), cfg.shard_max_rows, cfg.val_fraction, cfg.seed
        ),
        write=_write_settings(cfg, align, int(pad_id)),
        inputs=inputs,
        parts=tuple(parts),
        model=tokenizer.shipped,
        model_options=shipped_options,
        facts=_run_facts(cfg, tokenizer.name, profile, tok_facts, int(pad_id), measure_key),
    )


def _measure_key(
    cfg: PrepareConfig, fingerprint: str, parts: list[InputPart], max_line_bytes: int
) -> dict[str, Any]:
    """What the measured samples depend on: a run whose key differs measures again."""
    return {
        "profile": cfg.profile,
        "profile_options": dict(cfg.profile_options),
        "tokenizer_fingerprint": fingerprint,
        "mrope": cfg.mrope,
        "manifest": [str(p) for p in cfg.manifest],
        # contents, not just paths: an edited manifest must be measured again
        "manifest_xxh3": digest([p.xxh3 for p in parts]),
        # the split: in manifest_xxh3; roles only when set (the keys of earlier runs without roles)
        "input_spec": [cfg.input_format, cfg.input_layout, dict(cfg.input_fields)]
        + ([dict(cfg.input_roles)] if cfg.input_roles else []),
        "media_root": media_root_key(cfg.media_root),
        "media_allow_roots": [str(local_path(r, ALLOW_ROOT_OPTION).resolve()) for r in cfg.media_allow_roots],
        # only when not the default (the keys of earlier runs have none)
        **({"remote_media": cfg.remote.access()} if cfg.remote.access() != RemoteSettings().access() else {}),
        "max_line_bytes": max_line_bytes,
        "max_tokens": cfg.seq_length,
    }


def _write_settings(cfg: PrepareConfig, align: int, pad_id: int) -> WriteSettings:
    """The write stage's settings: the same-named prepare settings, the alignment and the pad token."""
    return WriteSettings(
        media_root=cfg.media_root,
        seq_length=cfg.seq_length,
        align=align,
        pad_token_id=pad_id,
        image_encoding=cfg.image_encoding,
        compress_video=cfg.compress_video,
        shard_checksums=SHARD_CHECKSUMS + (("sha256",) if cfg.shard_sha256 else ()),
        media_allow_roots=tuple(cfg.media_allow_roots),
        remote=cfg.remote,
        # a folder as its absolute path: every worker (a Ray actor too) finds the same store
        sample_store=store_location(cfg.sample_store),
    )


def _run_facts(
    cfg: PrepareConfig,
    tokenizer: str,
    profile: Any,
    tok_facts: TokenizerFacts,
    pad_id: int,
    measure_key: dict[str, Any],
) -> RunFacts:
    """The run facts omnipack.json records (finalize adds the counts)."""
    return RunFacts(
        omnipack_version=__version__,
        profile={
            "name": cfg.profile,
            "options": dict(cfg.profile_options),
            "settings": profile.settings(),
            **cfg.profile_choice.record(),  # where the choice and the processor settings came from
        },
        tokenizer={
            "path": tokenizer,
            "fingerprint": tok_facts.fingerprint,
            "pad_token_id": pad_id,
            # lets the loader count placeholders without the tokenizer directory
            "placeholder_token_ids": tok_facts.placeholder_token_ids,
        },
        parallel=asdict(cfg.layout),
        measure_key=measure_key,
        inputs=input_summary(cfg),
        # what ``verify --source`` re-derives the samples with (not where the run wrote them, nor how it
        # split the input: the dataset's bytes depend on neither)
        settings=source_settings(cfg),
    )


# PackConfig fields the run derives rather than takes from the same-named prepare setting
DERIVED_PACK_FIELDS = ("align", "cost_model")


def _cost_model(cfg: PrepareConfig, profile: Any) -> Any:
    """The profile's cost model with the config's ``cost`` overrides (``profiles.cost.CostModel``); None
    when the profile has none, unless balancing or cost settings ask for one (an error then)."""
    try:
        return profile.cost_model(cfg.cost)
    except ValueError:
        if cfg.balance or cfg.cost:
            raise
        return None


def _output_state(cfg: PrepareConfig, stage: str | None) -> str:
    """What to do with the output folder: "fresh", "resume", "repack", "overwrite" or "finished" (this very
    run is done: nothing to do); refusals raise."""
    out = output_path(cfg.output)
    if stage not in (None, "measure"):
        if not (out / STAGES_DIR).is_dir():
            raise FileNotFoundError(f"no run under {out}: run the measure stage first")
        return "resume"
    entries = [p for p in out.iterdir() if p.name != LOCK_DIR] if out.is_dir() else []
    # both: on an object store the metadata appears file by file, dataset.yaml last
    finished = (out / NV_META / OMNIPACK_META).exists() and (out / NV_META / DATASET_CONFIG).exists()
    is_run = (out / STAGES_DIR).is_dir()
    if cfg.from_stage == "pack":
        return "repack"
    if not entries:
        return "fresh"
    if is_run and not finished:
        return "resume"  # an unfinished run: its records say what is left to do
    if cfg.overwrite:
        return "overwrite"
    if finished and _same_finished_run(cfg):
        return "finished"
    if finished:
        raise FileExistsError(
            f"output {out} already holds a dataset (use --overwrite to replace it, or --from-stage pack to repack)"
        )
    raise FileExistsError(f"output {out} is not empty (use --overwrite, or --from-stage pack to repack)")


def _same_finished_run(cfg: PrepareConfig) -> bool:
    """Whether the finished dataset in the output is this run's: the same settings (``stages/run.json``) and
    input files unchanged since they were split (names, sizes, modification stamps). The same command rerun
    after a kill that came once the dataset was whole (its lock not yet released) is then done."""
    stages = output_path(cfg.output) / STAGES_DIR
    try:
        recorded = json.loads((stages / RUN_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    if recorded != _run_settings(cfg):
        return False
    split_key = parts_key(list(cfg.manifest), cfg.input_spec, cfg.part_lines)
    return read_record(stages / PARTS_FILE, split_key) is not None


RUN_FILE = "run.json"
# Settings that change how a run goes, never what it writes: a resumed run may change them.
HOW_NOT_WHAT = (
    "workers",
    "executor",
    "ray_address",
    "progress",
    "overwrite",
    "from_stage",
    "sample_store",
    "max_reject_fraction",
    "http_connect_timeout",
    "http_read_timeout",
    "http_deadline",
)


def absolute(path: Any) -> Any:
    """A local path that exists, made absolute (a URL, a Hub id or None as given)."""
    if isinstance(path, str) and "://" not in path and os.path.exists(path):
        return os.path.abspath(path)
    return path


def source_settings(cfg: PrepareConfig) -> dict[str, Any]:
    """The run's settings as ``verify --source`` re-derives the samples with them: local paths absolute (it
    may run elsewhere); not where the run wrote them, nor how it split the input (the bytes depend on
    neither)."""
    settings = {k: v for k, v in _run_settings(cfg).items() if k not in ("output", "part_lines")}
    for key in ("media_root", "tokenizer", "model"):
        settings[key] = absolute(settings.get(key))
    for key in ("manifest", "media_allow_roots"):
        settings[key] = [absolute(p) for p in settings.get(key) or []]
    return settings


def _run_settings(cfg: PrepareConfig) -> dict[str, Any]:
    """The settings that decide what a run writes, as recorded in ``stages/run.json``."""
    return json.loads(json.dumps({k: v for k, v in asdict(cfg).items() if k not in HOW_NOT_WHAT}))


def _check_run_settings(cfg: PrepareConfig, state: str) -> None:
    """Resume only the same run: an unfinished run with other settings is refused without --overwrite
    (with it, the run goes on and redoes exactly the units the changed settings touch); the pieces of a
    staged run must all be started with the same settings."""
    path = output_path(cfg.output) / STAGES_DIR / RUN_FILE
    settings = _run_settings(cfg)
    if state == "resume" and path.exists():
        recorded = json.loads(path.read_text())
        changed = sorted(k for k in settings.keys() | recorded.keys() if settings.get(k) != recorded.get(k))
        if changed and not cfg.overwrite:
            raise FileExistsError(
                f"output {cfg.output} holds an unfinished run with other settings ({', '.join(changed)}): "
                "rerun it with the same settings to resume it, or use --overwrite to go on with these"
            )
    make_dirs(path.parent)
    write_json_atomic(path, settings)


def _inputs_line(files: list[Any]) -> str:
    """What is being read: the number of input files and the first few of them, with their formats."""
    named = [f"{df.path} ({reader.name})" for reader, df in files]
    more = f", ... ({len(named) - 3} more)" if len(named) > 3 else ""
    return f"reading {len(named)} input file(s): {', '.join(named[:3])}{more}"


def _lock_name(stage: str | None, rank: int, world_size: int) -> str:
    if stage is None:
        return WHOLE_RUN
    return f"{stage}-{rank}-of-{world_size}" if stage in ("measure", "write") else stage


# How a run stops on purpose inside a stage (the command line says each in one line); any other error there
# is a bug.
RUN_STOPS = (StageError, MeasureIncomplete, WriteIncomplete, NothingPacked, OutputLocked)


@contextlib.contextmanager
def stage_work(stage: str) -> Iterator[None]:
    """A stage's work: an error other than a run's stops is raised as ``StageError`` from it, so a bug (a
    ``ValueError`` too) fails the run with its traceback instead of reading as a usage error."""
    try:
        yield
    except RUN_STOPS:
        raise
    except Exception as e:
        raise StageError(f"{stage} stage failed with {type(e).__name__}: {e}") from e


def _run_units(executor: Any, fn: Any, spec: RunSpec, units: list[int], bar: StageProgress) -> list:
    """``fn`` over ``units`` on the executor, the stage's bar moved by the units' own counts as they go and
    by each unit's whole count as it finishes (in the order units finish); the records in unit order."""
    done = {}
    with bar:
        for unit, record in executor.map_unordered(fn, spec, units):
            bar.finish(unit)
            done[unit] = record
    return [done[unit] for unit in units]


def _resume_line(
    stage: str, units: list[int], totals: dict[int, int], done: dict[int, int], item: str
) -> str:
    """What a rerun keeps of a stage, and how it checks what it keeps: a kept file whose stamp (size, inode,
    mtime, ctime; an object's ETag) is as recorded is trusted unread; any other is read whole to check its
    recorded checksum (and its unit redone when that differs)."""
    kept = sum(done.values())
    return (
        f"resuming: {len(done)} of {len(units)} {stage} units done "
        f"({sum(totals[u] for u in done):,} of {sum(totals.values()):,} {item}); "
        f"kept: {kept / 2**20:,.1f} MiB of files, trusted by their recorded stamps "
        "(a file changed since is read again to check its checksum)"
    )


def _stage_progress(
    stage: Stage[Any],
    spec: RunSpec,
    plan: PlanRecord | None,
    units: list[int],
    done: dict[int, int],
    executor: Any,
    enabled: bool,
) -> StageProgress:
    """A mapped stage's bar, with the units an earlier run finished (``done``: their kept bytes) counted done."""
    totals = {u: stage.size(spec, plan, u) for u in units}
    work = stage.describe(spec, units, sum(totals.values()))
    say(f"{stage.name}: {work}, {executor.workers} worker(s)", enabled)
    if done:  # also without the bars: what a rerun reused belongs in a batch job's log
        say(_resume_line(stage.name, units, totals, done, stage.item))
    return StageProgress(
        stage.name, totals, stage.bar_item, enabled=enabled, done=set(done), reports=executor.progress_queue
    )


def run_mapped(
    stage: Stage[Any],
    spec: RunSpec,
    plan: PlanRecord | None,
    executor: Any,
    *,
    enabled: bool = False,
    rank: int = 0,
    world_size: int = 1,
    replaced: BackgroundRemoval | None = None,
) -> list[Any]:
    """The stage's units ``rank::world_size`` on the executor (each run once); their records, in unit order.
    ``replaced``: where the earlier outputs of the units to be redone go (moved there before the units run)."""
    units = stage.units(spec, plan)[rank::world_size]
    done = {u: r.kept_bytes for u in units if (r := stage.current(spec, plan, u)) is not None}
    bar = _stage_progress(stage, spec, plan, units, done, executor, enabled)
    if replaced is not None:  # what the units to be redone replace: out of their way now, deleted meanwhile
        for unit in units:
            if unit not in done:
                for path in stage.outputs(spec, plan, unit):
                    replaced.move(path)
    with stage_work(stage.name):
        return _run_units(executor, stage.run, spec, units, bar)


def check_rank(rank: int, world_size: int) -> None:
    """A staged task's ``rank`` of ``world_size`` (prepare's and ``verify --source``'s ``--rank``/``--world-size``)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank {rank} of {world_size}")


def _check_run_arguments(cfg: PrepareConfig, stage: str | None, rank: int, world_size: int) -> None:
    """One-line errors for a stage, rank or option combination no run can take."""
    if stage is not None and stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    check_rank(rank, world_size)
    if stage is not None and cfg.overwrite:  # ranks would delete each other's fresh outputs
        raise ValueError("--overwrite applies to whole runs; remove the old output before a staged run")
    if cfg.from_stage not in FROM_STAGES:
        raise ValueError(f"from_stage must be one of {FROM_STAGES}, got {cfg.from_stage!r}")
    check_store_location(cfg.sample_store)
    for root in cfg.media_allow_roots:  # folders this machine's symlinks point into
        local_path(root, ALLOW_ROOT_OPTION)
    check_seq_length(cfg.seq_length, cfg.layout.alignment)


def run_prepare(
    cfg: PrepareConfig, *, stage: str | None = None, rank: int = 0, world_size: int = 1
) -> dict[str, Any]:
    """Run all stages into ``cfg.output`` (or, with ``stage``, that stage's units ``rank::world_size``);
    returns the run summary as omnipack.json records it (``RunSummary.to_json``, with the root digest), or a
    staged piece's counts."""
    _check_run_arguments(cfg, stage, rank, world_size)
    # credentials and permissions of every store the run uses, before any work (one line, no retries)
    # (not an HTTP(S) media root: a web server's answer for a folder URL, often 403 or 404, says nothing about
    # its files, and HTTP media carry no credentials of the run)
    web_root = str(cfg.media_root or "").startswith(("http://", "https://"))
    probe_locations(
        [("output", cfg.output), ("media root", None if web_root else cfg.media_root)]
        + [("input", m) for m in cfg.manifest]
    )
    # every input exists, has a reader and a split to read, and does not end cut short (its last bytes),
    # checked before the output folder is touched; local paths, or URLs (s3://bucket/data/)
    inputs = select_inputs(list(cfg.manifest), cfg.input_spec)
    out = output_path(cfg.output)
    say(f"omnipack prepare: {_inputs_line(data_files(list(cfg.manifest), cfg.input_spec))} -> {out}", cfg.progress)
    for reader, choice in inputs:
        print(f"omnipack prepare: {choice.describe()}", file=sys.stderr)
        for f in choice.files:
            reader.check_end(f)
    with OutputLock(out, _lock_name(stage, rank, world_size)):
        # what the run replaces (an overwritten run, a repack's shards) is deleted on a thread of its own
        removal = BackgroundRemoval(out / STAGES_DIR / REPLACED_DIR) if is_local(out) else None
        with removal if removal is not None else contextlib.nullcontext():
            state = _output_state(cfg, stage)
            if state == "finished":
                say(f"{out} already holds the finished dataset of this run: nothing to do")
                return json.loads((out / NV_META / OMNIPACK_META).read_text())
            if state == "overwrite":
                remove_meta(out)  # first: a dataset in the making never looks whole
                _clear_outputs(out, removal)
                (out / REJECTS_FILE).unlink(missing_ok=True)
            _check_run_settings(cfg, state)
            if stage is None and (removed := remove_partials(out)):  # a whole run's lock: no other writer
                say(f"removed {removed} half-written file(s) (*.partial) of a killed run")
            if state == "resume":
                say(f"resuming the unfinished run in {out}", cfg.progress)
            # made before the split: a Ray cluster and its actors start in the background meanwhile
            executor = None
            if stage in (None, "measure", "write"):
                executor = make_executor(cfg.executor, cfg.workers, cfg.ray_address)
            try:
                say(f"loading the tokenizer {cfg.tokenizer} and splitting the input into parts", cfg.progress)
                spec = build_spec(cfg, executor if stage in (None, "measure") else None)  # the measure's workers
                say(f"omnipack prepare: {cfg.profile_choice.describe(spec.facts.profile['settings'])}")
                reuse = cfg.from_stage == "pack"
                if reuse and stage in (None, "pack"):
                    _check_measure_reusable(spec.measure_dir, spec.facts.measure_key)
                if state == "repack":
                    remove_meta(out)  # first: a dataset in the making never looks whole
            except BaseException:
                if executor is not None:
                    executor.close(abort=True)
                raise
            return _run_stages(cfg, spec, stage, rank, world_size, reuse, executor, removal)


def _clear_outputs(out: Any, removal: BackgroundRemoval | None) -> None:
    """An overwritten run's shards and records gone: in a folder moved aside for ``removal`` (a rename each,
    so the new run starts at once, however many terabytes they hold), else (an object store) removed now."""
    if removal is None:
        for sub in ("shards", STAGES_DIR):
            remove_tree(out / sub)
        return
    stages = out / STAGES_DIR
    earlier = [out / "shards", *(p for p in (stages.iterdir() if stages.is_dir() else []) if p.name != REPLACED_DIR)]
    for path in earlier:
        if removal.move(path):
            continue
        if path.is_dir():  # on another file system than the removal's folder
            remove_tree(path)
        else:
            path.unlink(missing_ok=True)


def _run_stages(
    cfg: PrepareConfig,
    spec: RunSpec,
    stage: str | None,
    rank: int,
    world_size: int,
    reuse: bool,
    executor: Any,
    removal: BackgroundRemoval | None,
) -> dict[str, Any]:
    """The stages of a run (or the one stage ``stage``); ``removal``: where what they replace goes (a local
    output), deleted in the background."""
    share = {"enabled": cfg.progress, "rank": rank, "world_size": world_size}
    with executor if executor is not None else contextlib.nullcontext():
        if stage in (None, "measure") and not reuse:
            parts = run_mapped(MEASURE, spec, None, executor, **share)
            if stage:
                return {"stage": stage, "parts": len(parts), "measured": sum(r.measured for r in parts)}
        if stage in (None, "pack"):
            say("pack: planning rows from the measured lengths", cfg.progress)
            with stage_work("pack"):
                plan, kept = run_pack_stage(spec, reuse_measure=reuse)
            if kept:
                say(f"resuming: the plan of the earlier run is current: kept ({plan.num_rows:,} rows)")
            if stage:
                return {"stage": stage, "rows": plan.num_rows, "shards": len(plan.shards)}
        plan = PlanRecord.read(spec.plan_record)
        if plan is None:
            raise FileNotFoundError(f"no plan under {spec.stages}: run the pack stage first")
        if stage in (None, "write"):
            if (samples := sample_store(spec)) is not None:  # earlier writes' payloads, merged
                samples.refresh_index()
            # shards of an earlier plan are deleted while the new ones are written, not before each (seconds a GB)
            shards = run_mapped(WRITE, spec, plan, executor, **share, replaced=removal)
            if stage:
                return {"stage": stage, "shards": len(shards), "rows": sum(r.rows_written for r in shards)}
        say("finalize: metadata and rejects", cfg.progress)
        with stage_work("finalize"):
            return finalize(spec, plan, reuse_measure=reuse, replaced=removal).to_json()
