"""The ``omnipack`` command line: prepare, demo, and the dataset tools."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PREPARE_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--manifest",), {
            "nargs": "+",
            "help": "input file(s) or folder(s): JSONL, JSON array, Parquet, Arrow / save_to_disk "
            "(format and layout auto-detected; see --input-format, --input-layout)",
        }),
    (("--media-root",), {"help": "folder (or URL: s3://, https://) that relative media paths in the records resolve against"}),
    (("--tokenizer",), {"help": "local Hugging Face tokenizer directory (carries the chat template)"}),
    (("--output", "-o"), {"help": "dataset folder to create, or an object store URL (s3://bucket/prefix)"}),
    (("--profile",), {"help": "model profile: the name of a family module in omnipack/profiles/, e.g. qwen2_5_vl, gemma3"}),
    (
        ("--mrope",),
        {"action": argparse.BooleanOptionalAction, "default": None, "help": "store 3-D mRoPE ids"},
    ),
    (("--seq-length",), {"type": int, "help": "pack width W (tokens per row)"}),
    (("--tp",), {"type": int, "help": "tensor-parallel size of the trainer"}),
    (("--cp",), {"type": int, "help": "context-parallel size of the trainer"}),
    (("--sequence-parallel",), {"action": argparse.BooleanOptionalAction, "default": None}),
    (
        ("--fp8",),
        {"choices": ["none", "fp8", "mxfp8", "fp4"], "help": "low-precision recipe (alignment 16/32)"},
    ),
    (("--algorithm",), {"choices": ["bfd", "ffd"], "help": "packing algorithm"}),
    (("--window",), {"type": int, "help": "streaming packing window (samples); default: whole dataset"}),
    (
        ("--balance",),
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "rows of equal modeled training cost (LM attention + media encoders), at most +0.2%% rows",
        },
    ),
    (
        ("--data-parallel",),
        {"type": int, "nargs": "+", "help": "DP sizes of the straggler-overhead estimate (default 8 64)"},
    ),
    (("--seed",), {"type": int, "help": "seed of the row-order shuffle"}),
    (
        ("--shuffle",),
        {"action": argparse.BooleanOptionalAction, "default": None, "help": "shuffle row order"},
    ),
    (("--max-samples-per-row",), {"type": int}),
    (("--max-media-per-row",), {"type": int}),
    (("--max-vision-patches-per-row",), {"type": int}),
    (("--max-audio-frames-per-row",), {"type": int}),
    (
        ("--image-encoding",),
        {"choices": ["npy", "png"], "help": "lossless storage of resized images: npy raw (default), png smaller"},
    ),
    (
        ("--compress-video",),
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "deflate video frames in shards (smaller, slower to load); raw by default",
        },
    ),
    (("--shard-size-mb",), {"type": float, "help": "roll shards over at this size"}),
    (("--shard-max-rows",), {"type": int}),
    (
        ("--shard-sha256",),
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "also record each shard's sha256 (xxh3-128 is always recorded; sha256 is slower)",
        },
    ),
    (
        ("--max-line-bytes",),
        {"type": int, "help": "reject longer manifest lines unread (default max(16 MiB, 256 B x seq_length))"},
    ),
    (("--val-fraction",), {"type": float, "help": "fraction of rows written to separate 'val' shards"}),
    (("--workers", "-j"), {"type": int, "help": "processes (or Ray actors) for measuring and writing"}),
    (
        ("--executor",),
        {"choices": ["local", "ray"], "help": "local process pool (default) or Ray (pip install omnipack[ray])"},
    ),
    (("--ray-address",), {"help": "Ray cluster to join (ray.init(address=...)); default: local Ray"}),
    (("--part-lines",), {"type": int, "help": "input records per measure unit (JSONL: lines; default 4096)"}),
    (
        ("--from-stage",),
        {
            "choices": ["measure", "pack"],
            "help": "pack: reuse the measure tables of an earlier run (repack/rewrite)",
        },
    ),
    (("--overwrite",), {"action": argparse.BooleanOptionalAction, "default": None}),
    (("--progress",), {"action": argparse.BooleanOptionalAction, "default": None, "help": "progress bars"}),
]
# Input reading and run guards (omnipack.inputs, omnipack.media.sources); set into the config in _input_settings.
INPUT_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--input-format", {"help": "reader of the inputs: jsonl, json, parquet, arrow (hf_disk); default: detected"}),
    (
        "--input-layout",
        {"help": "record layout: omnipack, sharegpt, messages_media (llama_factory, swift), prompt_response; default: auto"},
    ),
    (
        "--input-field",
        {"action": "append", "metavar": "FIELD=NAME", "help": "read omnipack FIELD from the input's NAME, e.g. images=pics"},
    ),
    (
        "--media-allow-root",
        {"action": "append", "metavar": "DIR", "help": "folder outside --media-root that media symlinks may point into"},
    ),
    (
        "--max-reject-fraction",
        {"type": float, "help": "exit 3 when more input records are rejected (default 0.05; the data is still written)"},
    ),
    ("--http-connect-timeout", {"type": float, "metavar": "S", "help": "media URLs: seconds to connect (default 10)"}),
    (
        "--http-read-timeout",
        {"type": float, "metavar": "S", "help": "media URLs: seconds to wait for the next bytes of an answer (default 30)"},
    ),
    (
        "--http-deadline",
        {"type": float, "metavar": "S", "help": "media URLs: seconds one URL may take, all retries included (default 120)"},
    ),
    (
        "--allow-private-urls",
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "fetch media URLs from loopback, link-local and private addresses (refused by default)",
        },
    ),
    (
        "--allow-private-host",
        {"action": "append", "metavar": "HOST[:PORT]", "help": "a media host allowed to be at a private address"},
    ),
]
PROFILE_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--min-pixels", {"type": int, "help": "profile: minimum image pixels"}),
    ("--max-pixels", {"type": int, "help": "profile: maximum image pixels"}),
    ("--preprocessor-config", {"help": "profile: a local preprocessor_config.json (or model dir) to read"}),
    (
        "--cost-option",
        {
            "action": "append",
            "metavar": "KEY=VALUE",
            "help": "cost model override, e.g. lm.hidden=5120, vision.layers=24, train_factor=3",
        },
    ),
    (
        "--profile-option",
        {"action": "append", "metavar": "KEY=VALUE", "help": "any other profile option (JSON value)"},
    ),
]


def _load_config_file(path: str) -> dict[str, Any]:
    text = Path(path).read_text()
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"config {path} must hold a mapping of settings, not a {type(data).__name__}")
    return data


def _cost_overrides(cost: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """``--cost-option lm.hidden=5120`` / ``train_factor=2`` into the config's nested ``cost`` mapping."""
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--cost-option expects KEY=VALUE or STACK.FIELD=VALUE, got {item!r}")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        stack, dot, name = key.partition(".")
        if dot:
            cost[stack] = {**(cost.get(stack) or {}), name: parsed}
        else:
            cost[key] = parsed
    return cost


def _input_settings(d: dict[str, Any], args: argparse.Namespace) -> None:
    if args.input_format is not None:
        d["input_format"] = args.input_format
    if args.input_layout is not None:
        d["input_layout"] = args.input_layout
    if args.max_reject_fraction is not None:
        d["max_reject_fraction"] = args.max_reject_fraction
    for key in ("http_connect_timeout", "http_read_timeout", "http_deadline", "allow_private_urls"):
        if getattr(args, key) is not None:
            d[key] = getattr(args, key)
    if args.allow_private_host:
        d["allow_private_hosts"] = [*(d.get("allow_private_hosts") or []), *args.allow_private_host]
    if args.media_allow_root:
        d["media_allow_roots"] = [*(d.get("media_allow_roots") or []), *args.media_allow_root]
    fields = dict(d.get("input_fields") or {})
    for item in args.input_field or []:
        key, eq, value = item.partition("=")
        if not eq or not key or not value:
            raise ValueError(f"--input-field expects FIELD=NAME, got {item!r}")
        fields[key] = value
    d["input_fields"] = fields


def _check_model_settings(d: dict[str, Any]) -> None:
    """One-line errors naming the setting for a tokenizer path, a profile option or a preprocessor config
    that can not be used (instead of a traceback, or a silent fallback to defaults)."""
    import inspect

    tok = Path(d["tokenizer"])
    if not tok.is_dir():
        raise ValueError(f"tokenizer {str(tok)!r} is not a local tokenizer folder (--tokenizer)")
    if not any((tok / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise ValueError(f"tokenizer folder {str(tok)!r} holds no tokenizer.json/tokenizer_config.json (--tokenizer)")
    opts = d.get("profile_options") or {}
    for key in ("preprocessor_config", "video_preprocessor_config"):
        if opts.get(key) is not None and not Path(opts[key]).exists():
            flag = "--preprocessor-config" if key == "preprocessor_config" else f"--profile-option {key}=..."
            raise FileNotFoundError(f"{key} {str(opts[key])!r} does not exist ({flag})")
    from .profiles import PROFILES

    cls = PROFILES.get(d.get("profile") or "qwen2_5_vl")
    if cls is not None:
        params = inspect.signature(cls).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            unknown = sorted(set(opts) - set(params))
            if unknown:
                raise ValueError(
                    f"unknown profile option(s) {', '.join(map(repr, unknown))} for profile {d.get('profile') or 'qwen2_5_vl'} "
                    f"(--profile-option); its options: {', '.join(sorted(params))}"
                )


def _prepare_config(args: argparse.Namespace) -> Any:
    from .pipeline import PrepareConfig

    d: dict[str, Any] = _load_config_file(args.config) if args.config else {}
    for flags, _ in PREPARE_FLAGS:
        key = flags[0].lstrip("-").replace("-", "_")
        if getattr(args, key) is not None:
            d[key] = getattr(args, key)
    opts = dict(d.get("profile_options") or {})
    for flag in ("min_pixels", "max_pixels", "preprocessor_config"):
        if getattr(args, flag) is not None:
            opts[flag] = getattr(args, flag)
    for item in args.profile_option or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--profile-option expects KEY=VALUE, got {item!r}")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    d["profile_options"] = opts
    if args.cost_option:
        d["cost"] = _cost_overrides(dict(d.get("cost") or {}), args.cost_option)
    _input_settings(d, args)
    missing = [k for k in ("manifest", "media_root", "tokenizer", "output") if not d.get(k)]
    if missing:
        raise ValueError(
            f"missing required setting(s): {', '.join(missing)} (give them as flags or in --config)"
        )
    _check_model_settings(d)
    return PrepareConfig.from_dict(d)


def _row_cost_line(row_cost: dict[str, Any]) -> str:
    from .packing.cost import describe_row_cost

    return describe_row_cost(row_cost)


def _print_summary(summary: dict[str, Any], out: str) -> None:
    from rich.console import Console
    from rich.table import Table

    c, p = summary["counts"], summary["packing"]
    t = Table(title=f"omnipack dataset {out}", show_header=False)
    for k, v in [
        ("input samples", c["input"]),
        ("packed samples", c["packed"]),
        ("rejected samples", f"{c['rejected']} {c['rejected_by_stage']}"),
        *(
            (f"  {f['file']}", f"input {f['input']}  packed {f['packed']}  rejected {f['rejected']}")
            for f in (c.get("by_input") or [])[:20]
        ),
        ("rows", c["rows"]),
        ("seq_length / align", f"{summary['seq_length']} / {summary['align']}"),
        ("rows lower bounds", f"L1 {p.get('l1')}  L2 (Martello-Toth) {p.get('l2')}  DFF (Fekete-Schepers) {p.get('dff')}  ({p.get('algorithm')})"),
        ("real-token efficiency", f"{p.get('real_efficiency_written', 0):.2%}"),
        ("padded efficiency", f"{p.get('padded_efficiency', 0):.2%}"),
        ("alignment overhead", f"{p.get('alignment_overhead', 0):.2%}"),
        (
            "samples per row",
            " ".join(
                f"{k}:{v}"
                for k, v in sorted(
                    (p.get("samples_per_row_histogram") or {}).items(), key=lambda kv: int(kv[0])
                )
            ),
        ),
        (
            "shards",
            f"{len(summary['shards'])} ({sum(s['num_bytes'] for s in summary['shards']) / 2**20:.1f} MiB)",
        ),
        *([("row cost", _row_cost_line(p["row_cost"]))] if p.get("row_cost") else []),
    ]:
        t.add_row(k, str(v))
    Console(stderr=True).print(t)


def cmd_prepare(args: argparse.Namespace) -> int:
    from .pipeline import NothingPacked, run_prepare
    from .stages.finalize import WriteIncomplete
    from .stages.lock import OutputLocked
    from .stages.pack import MeasureIncomplete

    cfg = _prepare_config(args)
    try:
        summary = run_prepare(cfg, stage=args.stage, rank=args.rank, world_size=args.world_size)
    except NothingPacked as e:
        print(f"omnipack prepare: {e}", file=sys.stderr)
        return 1
    except (OutputLocked, MeasureIncomplete, WriteIncomplete) as e:
        print(f"omnipack prepare: error: {e}", file=sys.stderr)
        return 2
    if args.stage not in (None, "finalize"):
        print(f"omnipack prepare: {json.dumps(summary)}", file=sys.stderr)
        return 0
    _print_summary(summary, cfg.output)
    from .inputs.accounting import TooManyRejects, check_reject_fraction
    from .stages.storage import output_path

    rejects_path = output_path(cfg.output) / summary["rejects_file"]  # a folder or an object store
    try:
        with rejects_path.open() as f:
            check_reject_fraction(
                summary["counts"]["input"], map(json.loads, f), cfg.max_reject_fraction, str(rejects_path)
            )
    except TooManyRejects as e:
        print(f"omnipack prepare: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo.corpus import build_demo_corpus
    from .demo.tokenizer import build_demo_tokenizer
    from .pipeline import PrepareConfig, run_prepare

    root = Path(args.output)
    src = root / "source"
    from .profiles import get_profile

    tok = build_demo_tokenizer(src / "tokenizer", profile=args.profile)
    profile = get_profile(args.profile)
    manifest, media = build_demo_corpus(src, num_samples=args.samples, kinds=profile.kinds)
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tok),
        output=str(root / "dataset"),
        profile=args.profile,
        seq_length=args.seq_length,
        cp=args.cp,
        overwrite=True,
        workers=args.workers,
        shard_max_rows=args.shard_max_rows,
        mrope=profile.uses_mrope(),
    )
    summary = run_prepare(cfg)
    _print_summary(summary, cfg.output)
    print(f"dataset: {cfg.output}\nrejects: {Path(cfg.output) / summary['rejects_file']}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omnipack",
        description="Prepare multimodal training data offline into packed Megatron-Energon THD datasets.",
    )
    from . import __version__

    p.add_argument("--version", action="version", version=f"omnipack {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    pp = sub.add_parser(
        "prepare",
        help="measure, pack and write a dataset",
        description="Measure every sample (exact placeholder counts), pack rows, write Energon shards. "
        "Settings come from --config (YAML/JSON with the same names, underscores) and flags override them.",
    )
    pp.add_argument("--config", "-c", help="YAML or JSON config file")
    for flags, kw in PREPARE_FLAGS:
        pp.add_argument(*flags, **kw)
    for flag, kw in INPUT_FLAGS + PROFILE_FLAGS:
        pp.add_argument(flag, **kw)
    staged = pp.add_argument_group(
        "staged runs", "one stage's share of units, for schedulers without Ray (e.g. a Slurm array per stage)"
    )
    staged.add_argument("--stage", choices=["measure", "pack", "write", "finalize"])
    staged.add_argument("--rank", type=int, default=0, help="this task's rank (measure and write)")
    staged.add_argument("--world-size", type=int, default=1, help="tasks sharing the stage")
    pp.set_defaults(func=cmd_prepare)

    pd = sub.add_parser(
        "demo",
        help="build a small synthetic corpus and pack it",
        description="Build a tiny tokenizer, synthetic images and a manifest (with a few broken samples), "
        "then prepare them into an Energon dataset under OUTPUT/dataset.",
    )
    pd.add_argument("output", nargs="?", default="demo_out", help="folder for the corpus and dataset")
    pd.add_argument("--samples", type=int, default=200)
    pd.add_argument("--profile", default="qwen2_5_vl")
    pd.add_argument("--seq-length", type=int, default=4096)
    pd.add_argument("--cp", type=int, default=2)
    pd.add_argument("--workers", "-j", type=int, default=1)
    pd.add_argument("--shard-max-rows", type=int, default=16)
    pd.set_defaults(func=cmd_demo)

    from .tools import register_tools

    register_tools(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"omnipack {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
