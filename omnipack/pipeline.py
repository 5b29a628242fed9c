"""``omnipack prepare``: measure -> pack -> write, with every input sample accounted for."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__
from .alignment import ParallelLayout, check_seq_length
from .dataset.meta import NV_META, write_energon_meta, write_omnipack_meta
from .dataset.shards import SHARD_CHECKSUMS, file_sha256
from .inputs import InputSpec, count_records, data_files
from .inputs.accounting import DEFAULT_MAX_REJECT_FRACTION, per_file_counts
from .manifest import default_max_line_bytes, read_manifest
from .measure import MeasureConfig, run_measure
from .media.sources import is_url
from .plan import PackConfig, run_pack, write_plan
from .writer.dataset import WriteConfig, write_rows

STAGES_DIR = "stages"
REJECTS_FILE = "rejects.jsonl"


FROM_STAGES = ("measure", "pack")
MEASURE_KEY_FILE = "measure.json"


def _check_measure_reusable(measure_dir: Path, key: dict[str, Any]) -> int:
    """The input count of an earlier measure run, after checking it measured with the same settings."""
    path = measure_dir / MEASURE_KEY_FILE
    if not path.exists() or not (measure_dir / "samples.parquet").exists():
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


def _val_rows(fraction: float, num_rows: int) -> int:
    """Rows held out for validation: at least one when asked for, never all of them."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {fraction}")
    if fraction == 0.0 or num_rows < 2:
        return 0
    return min(num_rows - 1, max(1, round(fraction * num_rows)))


class NothingPacked(RuntimeError):
    """Every input sample was rejected."""


@dataclass
class PrepareConfig:
    """All settings of one preparation run (a config file's keys; CLI flags override them)."""

    manifest: list[str]
    media_root: str
    tokenizer: str
    output: str
    profile: str = "qwen2_5_vl"
    profile_options: dict[str, Any] = field(default_factory=dict)
    mrope: bool = False
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
    cost: dict[str, Any] = field(default_factory=dict)  # cost-model overrides (packing.cost)
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
    input_format: str | None = None  # reader of the inputs (jsonl, json, parquet, arrow); None: detected
    input_layout: str = "auto"  # record layout (omnipack, sharegpt, messages_media, prompt_response)
    input_fields: dict[str, str] = field(default_factory=dict)  # omnipack field -> the input's field name
    media_allow_roots: list[str] = field(default_factory=list)  # symlink targets allowed outside media_root
    max_reject_fraction: float = DEFAULT_MAX_REJECT_FRACTION  # more rejects: exit code 3 (data still written)

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


def run_prepare(cfg: PrepareConfig) -> dict[str, Any]:
    """Run all stages into ``cfg.output``; returns the run summary (also stored in omnipack.json)."""
    align = cfg.layout.alignment
    check_seq_length(cfg.seq_length, align)
    max_line_bytes = cfg.max_line_bytes or default_max_line_bytes(cfg.seq_length)
    spec = InputSpec(cfg.input_format, cfg.input_layout, dict(cfg.input_fields), max_line_bytes)
    # every input exists and has a reader, checked before the output folder is touched
    input_files = data_files([Path(p) for p in cfg.manifest], spec)
    out = Path(cfg.output)
    stages = out / STAGES_DIR
    measure_dir = stages / "measure"
    if cfg.from_stage not in FROM_STAGES:
        raise ValueError(f"from_stage must be one of {FROM_STAGES}, got {cfg.from_stage!r}")
    resume = cfg.from_stage == "pack"
    if out.exists() and any(out.iterdir()):
        if not (cfg.overwrite or resume):
            raise FileExistsError(
                f"output {out} is not empty (use --overwrite, or --from-stage pack to repack)"
            )
        for sub in ("shards", NV_META) + (() if resume else (STAGES_DIR,)):
            shutil.rmtree(out / sub, ignore_errors=True)
    stages.mkdir(parents=True, exist_ok=True)
    mcfg = MeasureConfig(
        cfg.profile,
        cfg.tokenizer,
        cfg.media_root,
        align,
        dict(cfg.profile_options),
        cfg.mrope,
        max_tokens=cfg.seq_length,
        media_allow_roots=tuple(cfg.media_allow_roots),
    )
    from .profiles import get_profile
    from .profiles.base import placeholder_token_ids
    from .text.chat import ChatTokenizer

    chat = ChatTokenizer(cfg.tokenizer, get_profile(cfg.profile, **cfg.profile_options))
    measure_key = {
        "profile": cfg.profile,
        "profile_options": dict(cfg.profile_options),
        "tokenizer_fingerprint": chat.fingerprint(),
        "mrope": cfg.mrope,
        "manifest": [str(p) for p in cfg.manifest],
        # contents, not just paths: an edited manifest must be measured again
        "manifest_sha256": [file_sha256(df.path) for _, df in input_files],
        "input_spec": [cfg.input_format, cfg.input_layout, dict(cfg.input_fields)],
        "media_root": cfg.media_root if is_url(cfg.media_root) else str(Path(cfg.media_root).resolve()),
        "media_allow_roots": [str(Path(r).resolve()) for r in cfg.media_allow_roots],
        "max_line_bytes": max_line_bytes,
        "max_tokens": cfg.seq_length,
    }
    if resume:
        n_input = _check_measure_reusable(measure_dir, measure_key)
        measured = {"measured": pq.read_metadata(measure_dir / "samples.parquet").num_rows}
        ledger = json.loads((measure_dir / MEASURE_KEY_FILE).read_text()).get("inputs", [])
    else:
        manifests = [Path(p) for p in cfg.manifest]
        ledger: list[dict[str, Any]] = []  # per input file: its first sample index and record count
        # read and checked once; the progress bar's total is a cheap count (metadata, or a byte scan)
        measured = run_measure(
            read_manifest(
                manifests,
                max_line_bytes=max_line_bytes,
                input_format=cfg.input_format,
                input_layout=cfg.input_layout,
                input_fields=dict(cfg.input_fields),
                ledger=ledger,
            ),
            mcfg,
            measure_dir,
            workers=cfg.workers,
            progress=cfg.progress,
            total=count_records(manifests, spec) if cfg.progress else None,
        )
        n_input = measured["measured"] + measured["rejected"]
        (measure_dir / MEASURE_KEY_FILE).write_text(
            json.dumps({**measure_key, "input": n_input, "inputs": ledger}, indent=2)
        )
    samples_path = measure_dir / "samples.parquet"
    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed pages: stages start flat

    # The pack settings are the same-named fields of the prepare config.
    pcfg = PackConfig(
        align=align, **{f.name: getattr(cfg, f.name) for f in fields(PackConfig) if f.name != "align"}
    )
    plan = run_pack(samples_path, pcfg)
    write_plan(plan, stages / "plan.parquet")
    pa.default_memory_pool().release_unused()

    pad_id = chat.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = chat.tokenizer.eos_token_id
    wcfg = WriteConfig(
        media_root=cfg.media_root,
        seq_length=cfg.seq_length,
        align=align,
        pad_token_id=int(pad_id),
        image_encoding=cfg.image_encoding,
        compress_video=cfg.compress_video,
        shard_max_bytes=int(cfg.shard_size_mb * (1 << 20)),
        shard_max_rows=cfg.shard_max_rows,
        shard_checksums=SHARD_CHECKSUMS + (("sha256",) if cfg.shard_sha256 else ()),
        workers=cfg.workers,
        val_rows=_val_rows(cfg.val_fraction, plan.num_rows),
        val_seed=cfg.seed,
        media_allow_roots=tuple(cfg.media_allow_roots),
    )
    shards, write_rejects, write_stats = write_rows(samples_path, plan, out, wcfg, progress=cfg.progress)

    rejects = pq.read_table(measure_dir / "rejects.parquet").to_pylist() + plan.rejects + write_rejects
    rejects.sort(key=lambda r: r["sample_index"])
    with open(out / REJECTS_FILE, "w") as f:
        for r in rejects:
            f.write(json.dumps(r) + "\n")
    packed = write_stats["samples_written"]
    if packed + len(rejects) != n_input:  # every input sample is either packed or rejected
        raise AssertionError(f"accounting: {n_input} input != {packed} packed + {len(rejects)} rejected")
    write_rejected = {r["sample_index"] for r in write_rejects}
    by_input = (  # measure tables of an older omnipack hold no per-file ledger
        per_file_counts(
            ledger,
            (r["sample_index"] for r in rejects),
            (i for i in plan.sample_index.tolist() if i not in write_rejected),
        )
        if ledger
        else []
    )

    summary = {
        "omnipack_version": __version__,
        "profile": {
            "name": cfg.profile,
            "options": dict(cfg.profile_options),
            "settings": chat.profile.settings(),
        },
        "tokenizer": {
            "path": str(cfg.tokenizer),
            "fingerprint": chat.fingerprint(),
            "pad_token_id": int(pad_id),
            # lets the loader count placeholders without the tokenizer directory
            "placeholder_token_ids": placeholder_token_ids(chat.profile, chat.tokenizer),
        },
        "seq_length": cfg.seq_length,
        "align": align,
        "parallel": asdict(cfg.layout),
        "image_encoding": cfg.image_encoding,
        "compress_video": cfg.compress_video,
        "mrope_position_ids": cfg.mrope,
        "counts": {
            "input": n_input,
            "packed": packed,
            "rejected": len(rejects),
            "rows": write_stats["rows_written"],
            "rows_by_split": {
                part: sum(s.count for s in shards if s.split == part) for part in ("train", "val")
            },
            "rejected_by_stage": dict(Counter(r["stage"] for r in rejects)),
            "measured": measured["measured"],
            "reject_fraction": len(rejects) / n_input if n_input else 0.0,
            "by_input": by_input,  # per input data file: input == packed + rejected
        },
        "packing": {
            **plan.stats,
            "algorithm": cfg.algorithm,
            "seed": cfg.seed,
            "shuffle": cfg.shuffle,
            "real_tokens": write_stats["real_tokens"],
            "real_efficiency_written": (
                write_stats["real_tokens"] / (write_stats["rows_written"] * cfg.seq_length)
                if write_stats["rows_written"]
                else 0.0
            ),
        },
        "shards": [asdict(s) for s in shards],
        "rejects_file": REJECTS_FILE,
    }
    if not shards:
        if n_input == 0:
            raise NothingPacked(
                f"nothing to pack: the manifest(s) {', '.join(map(str, cfg.manifest))} hold no samples"
            )
        raise NothingPacked(
            f"nothing could be packed: all {n_input} samples were rejected (see {out / REJECTS_FILE})"
        )
    write_energon_meta(out, shards)
    write_omnipack_meta(out, summary)
    return summary
