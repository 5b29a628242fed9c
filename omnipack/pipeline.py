"""``omnipack prepare``: measure -> pack -> write, with every input sample accounted for."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from . import __version__
from .alignment import ParallelLayout, check_seq_length
from .manifest import read_manifest
from .measure import MeasureConfig, run_measure
from .plan import PackConfig, run_pack, write_plan
from .writer.dataset import WriteConfig, write_rows
from .writer.energon_meta import NV_META, write_energon_meta, write_omnipack_meta

STAGES_DIR = "stages"
REJECTS_FILE = "rejects.jsonl"


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
    max_samples_per_row: int | None = None
    max_media_per_row: int | None = None
    max_vision_patches_per_row: int | None = None
    max_audio_frames_per_row: int | None = None
    image_encoding: str = "png"
    shard_size_mb: float = 1024.0
    shard_max_rows: int | None = None
    workers: int = 1
    overwrite: bool = False
    progress: bool = True

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
    out = Path(cfg.output)
    if out.exists() and any(out.iterdir()):
        if not cfg.overwrite:
            raise FileExistsError(f"output {out} is not empty (use --overwrite)")
        for sub in ("shards", NV_META, STAGES_DIR):
            shutil.rmtree(out / sub, ignore_errors=True)
    stages = out / STAGES_DIR
    stages.mkdir(parents=True, exist_ok=True)
    manifests = [Path(p) for p in cfg.manifest]
    for p in manifests:
        if not p.is_file():
            raise FileNotFoundError(f"manifest {p} not found")

    mcfg = MeasureConfig(
        cfg.profile, cfg.tokenizer, cfg.media_root, align, dict(cfg.profile_options), cfg.mrope
    )
    n_input = sum(1 for _ in read_manifest(manifests))
    measured = run_measure(
        read_manifest(manifests),
        mcfg,
        stages / "measure",
        workers=cfg.workers,
        progress=cfg.progress,
        total=n_input,
    )
    samples_path = stages / "measure" / "samples.parquet"

    pcfg = PackConfig(
        seq_length=cfg.seq_length,
        align=align,
        algorithm=cfg.algorithm,
        seed=cfg.seed,
        shuffle=cfg.shuffle,
        window=cfg.window,
        balance=cfg.balance,
        max_samples_per_row=cfg.max_samples_per_row,
        max_media_per_row=cfg.max_media_per_row,
        max_vision_patches_per_row=cfg.max_vision_patches_per_row,
        max_audio_frames_per_row=cfg.max_audio_frames_per_row,
    )
    plan = run_pack(samples_path, pcfg)
    write_plan(plan, stages / "plan.parquet")

    from .profiles import get_profile
    from .profiles.base import placeholder_token_ids
    from .text.chat import ChatTokenizer

    chat = ChatTokenizer(cfg.tokenizer, get_profile(cfg.profile, **cfg.profile_options))
    pad_id = chat.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = chat.tokenizer.eos_token_id
    wcfg = WriteConfig(
        media_root=cfg.media_root,
        seq_length=cfg.seq_length,
        align=align,
        pad_token_id=int(pad_id),
        image_encoding=cfg.image_encoding,
        shard_max_bytes=int(cfg.shard_size_mb * (1 << 20)),
        shard_max_rows=cfg.shard_max_rows,
        workers=cfg.workers,
    )
    shards, write_rejects, write_stats = write_rows(samples_path, plan, out, wcfg, progress=cfg.progress)

    rejects = pq.read_table(stages / "measure" / "rejects.parquet").to_pylist() + plan.rejects + write_rejects
    rejects.sort(key=lambda r: r["sample_index"])
    with open(out / REJECTS_FILE, "w") as f:
        for r in rejects:
            f.write(json.dumps(r) + "\n")
    packed = write_stats["samples_written"]
    if packed + len(rejects) != n_input:  # every input sample is either packed or rejected
        raise AssertionError(f"accounting: {n_input} input != {packed} packed + {len(rejects)} rejected")

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
        "mrope_position_ids": cfg.mrope,
        "counts": {
            "input": n_input,
            "packed": packed,
            "rejected": len(rejects),
            "rows": write_stats["rows_written"],
            "rejected_by_stage": dict(Counter(r["stage"] for r in rejects)),
            "measured": measured["measured"],
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
        raise NothingPacked(
            f"nothing could be packed: all {n_input} samples were rejected (see {out / REJECTS_FILE})"
        )
    write_energon_meta(out, shards)
    write_omnipack_meta(out, summary)
    return summary
