"""The ``omnipack`` command line: prepare, demo, and the dataset tools."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from . import __version__
from .demo.corpus import build_demo_corpus
from .demo.tokenizer import build_demo_tokenizer
from .errors import Reject
from .inputs.accounting import RejectSummary, TooManyRejects, check_reject_fraction
from .inputs.llama_factory import dataset_info_settings
from .media.access import CREDENTIALS_HINT, access_error
from .media.sources import local_path
from .packing.cost import describe_row_cost
from .pipeline import NothingPacked, PrepareConfig, run_prepare
from .profiles import PROFILES, get_profile
from .profiles.checkpoint import PROCESSOR_PROFILE, choose_profile, native_families_line
from .profiles.hf_config import PROCESSOR_OPTIONS
from .stages.finalize import WriteIncomplete
from .stages.lock import OutputLocked, Terminated
from .stages.model_files import shipped_for_output, shipped_option
from .stages.pack import MeasureIncomplete
from .stages.storage import output_path
from .text.hub_cache import NotCached, resolve_model_dir
from .tools import register_tools

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C

PREPARE_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--manifest",), {
            "nargs": "+",
            "help": "input file(s) or folder(s): JSONL, JSON array, Parquet, Arrow / save_to_disk "
            "(format and layout auto-detected; see --input-format, --input-layout)",
        }),
    (("--media-root",), {"help": "folder (or URL: s3://, https://) that relative media paths in the records resolve against "
                         "(not needed when every media reference is embedded or a URL)"}),
    (
        ("--tokenizer",),
        {
            "help": "Hugging Face tokenizer folder (carries the chat template), or a Hub model id ORG/NAME[@REV] "
            "found in the local Hugging Face cache (HF_HOME; never downloaded)"
        },
    ),
    (
        ("--model",),
        {
            "help": "model folder (or cached Hub id): its config.json model_type picks the profile and its processor "
            "settings are read from it; also the tokenizer when --tokenizer is not given"
        },
    ),
    (("--output", "-o"), {"help": "dataset folder to create, or an object store URL (s3://bucket/prefix)"}),
    (
        ("--profile",),
        {
            "help": "model profile: the name of a family module in omnipack/profiles/, e.g. qwen2_5_vl, gemma3 "
            "(default: the one the model folder's config.json model_type names, else qwen2_5_vl; a profile given "
            "must agree with that config.json)"
        },
    ),
    (
        ("--mrope",),
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "store 3-D mRoPE position ids (default: on for families that use mRoPE, e.g. Qwen-VL and "
            "Qwen-Omni, whose trainers need them; off for 1-D families)",
        },
    ),
    (("--seq-length",), {"type": int, "help": "pack width W (tokens per row)"}),
    (("--tp",), {"type": int, "help": "tensor-parallel size of the trainer"}),
    (("--cp",), {"type": int, "help": "context-parallel size of the trainer"}),
    (
        ("--sequence-parallel",),
        {"action": argparse.BooleanOptionalAction, "default": None, "help": "the trainer uses sequence parallelism"},
    ),
    (
        ("--fp8",),
        {"choices": ["none", "fp8", "mxfp8", "fp4"], "help": "low-precision recipe (alignment 16/32)"},
    ),
    (("--algorithm",), {"choices": ["bfd", "ffd"], "help": "packing algorithm"}),
    (("--window",), {"type": int, "help": "streaming packing window (samples); not given: the whole set"}),
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
        {"type": int, "nargs": "+", "help": "DP sizes of the straggler-overhead estimate"},
    ),
    (("--seed",), {"type": int, "help": "seed of the row-order shuffle"}),
    (
        ("--shuffle",),
        {"action": argparse.BooleanOptionalAction, "default": None, "help": "shuffle row order"},
    ),
    (("--max-samples-per-row",), {"type": int, "help": "at most this many samples in a row"}),
    (("--max-media-per-row",), {"type": int, "help": "at most this many media items in a row"}),
    (("--max-vision-patches-per-row",), {"type": int, "help": "vision-encoder patch budget of a row"}),
    (("--max-audio-frames-per-row",), {"type": int, "help": "audio-encoder frame budget of a row"}),
    (
        ("--image-encoding",),
        {"choices": ["npy", "png"], "help": "lossless storage of resized images: npy raw, png smaller"},
    ),
    (
        ("--compress-video",),
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "deflate video frames in shards (smaller, slower to load)",
        },
    ),
    (("--shard-size-mb",), {"type": float, "help": "roll shards over at this size"}),
    (("--shard-max-rows",), {"type": int, "help": "also roll shards over at this many rows"}),
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
        {"choices": ["local", "ray"], "help": "local: a process pool on this machine; ray: a Ray cluster (needs the ray extra)"},
    ),
    (
        ("--ray-address",),
        {
            "help": "Ray cluster: 'local' starts one for this run only, 'auto' joins the one running on this machine "
            "(ray start), host:port or ray://host:port joins that one; default: RAY_ADDRESS if set, else local "
            "(the run says which cluster it is on)"
        },
    ),
    (("--part-lines",), {"type": int, "help": "input records per measure unit (JSONL: lines)"}),
    (
        ("--from-stage",),
        {
            "choices": ["measure", "pack"],
            "help": "pack: reuse the measure tables of an earlier run (repack/rewrite)",
        },
    ),
    (
        ("--sample-store",),
        {
            "help": "folder keeping the processed media payloads, so a repack (other seq length, parallel "
            "layout, seed, packing limits) copies them instead of decoding; may be shared by many packings "
            "(default: stages/samples of a local output; 'off': keep none)",
        },
    ),
    (
        ("--overwrite",),
        {"action": argparse.BooleanOptionalAction, "default": None, "help": "replace what the output holds"},
    ),
    (("--progress",), {"action": argparse.BooleanOptionalAction, "default": None, "help": "progress bars"}),
]
# Input reading and run guards (omnipack.inputs, omnipack.media.sources); set into the config in _input_settings.
INPUT_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--input-format", {"help": "reader of the inputs: jsonl, json, parquet, arrow (hf_disk); detected when not given"}),
    (
        "--input-layout",
        {"help": "record layout: omnipack, sharegpt, messages_media (llama_factory, swift), prompt_response, or auto"},
    ),
    (
        "--split",
        {"help": "the split of folder inputs to read, as the Hub names it (data/{split}-*.parquet, a DatasetDict's "
         "splits, train/validation/test in file or folder names); default: train, or the only one"},
    ),
    (
        "--input-field",
        {"action": "append", "metavar": "FIELD=NAME", "help": "read omnipack FIELD from the input's NAME, e.g. images=pics"},
    ),
    (
        "--input-role",
        {"action": "append", "metavar": "VALUE=ROLE", "help": "read the turn role VALUE as ROLE (user, assistant, system, function_call, observation), e.g. question=user"},
    ),
    (
        "--dataset-info",
        {"metavar": "PATH", "help": "LLaMA-Factory dataset_info.json (or its folder): its entry's file_name, formatting, columns and tags set the inputs"},
    ),
    ("--dataset-name", {"metavar": "NAME", "help": "the dataset_info.json entry to read (needed when it has several)"}),
    (
        "--media-allow-root",
        {"action": "append", "metavar": "DIR", "help": "folder outside --media-root that media symlinks may point into"},
    ),
    (
        "--max-reject-fraction",
        {"type": float, "help": "exit 3 when more input records are rejected (the data is still written)"},
    ),
    ("--http-connect-timeout", {"type": float, "metavar": "S", "help": "media URLs: seconds to connect"}),
    (
        "--http-read-timeout",
        {"type": float, "metavar": "S", "help": "media URLs: seconds to wait for the next bytes of an answer"},
    ),
    (
        "--http-deadline",
        {"type": float, "metavar": "S", "help": "media URLs: seconds one URL may take, all retries included"},
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
    data = (yaml.safe_load(text) or {}) if path.endswith((".yaml", ".yml")) else json.loads(text)
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
    if args.split is not None:
        d["split"] = args.split
    if args.max_reject_fraction is not None:
        d["max_reject_fraction"] = args.max_reject_fraction
    for key in ("http_connect_timeout", "http_read_timeout", "http_deadline", "allow_private_urls"):
        if getattr(args, key) is not None:
            d[key] = getattr(args, key)
    if args.allow_private_host:
        d["allow_private_hosts"] = [*(d.get("allow_private_hosts") or []), *args.allow_private_host]
    if args.media_allow_root:
        d["media_allow_roots"] = [*(d.get("media_allow_roots") or []), *args.media_allow_root]
    for flag, key in (("--input-field", "input_fields"), ("--input-role", "input_roles")):
        mapping = dict(d.get(key) or {})
        for item in getattr(args, key[:-1]) or []:
            name, eq, value = item.partition("=")
            if not eq or not name or not value:
                raise ValueError(f"{flag} expects {'FIELD=NAME' if key == 'input_fields' else 'VALUE=ROLE'}, got {item!r}")
            mapping[name] = value
        d[key] = mapping
    for key in ("dataset_info", "dataset_name"):  # flags, or keys of the config file
        if getattr(args, key) is not None:
            d[key] = getattr(args, key)
    if d.get("dataset_info"):
        _dataset_info_settings(d)
    elif d.pop("dataset_name", None) is not None:
        raise ValueError("--dataset-name needs --dataset-info")


def _dataset_info_settings(d: dict[str, Any]) -> None:
    """The settings of a LLaMA-Factory dataset_info.json entry, under the ones given explicitly (an input
    field or role given is kept over the entry's, a --manifest over its file_name)."""
    lf = dataset_info_settings(d.pop("dataset_info"), d.pop("dataset_name", None))
    for key in ("manifest", "media_root", "input_layout"):
        if not d.get(key) or (key == "input_layout" and d[key] == "auto"):
            d[key] = lf[key]
    for key in ("input_fields", "input_roles"):
        d[key] = {**lf[key], **(d.get(key) or {})}


def _check_model_settings(d: dict[str, Any]) -> None:
    """One-line errors naming the setting for a tokenizer path, a profile option or a preprocessor config
    that can not be used (instead of a traceback, or a silent fallback to defaults)."""
    tok = _resolve_tokenizer_setting(d)
    d["tokenizer"] = str(tok)
    if d.get("model"):
        try:
            model = resolve_model_dir(str(d["model"]))
        except NotCached as e:
            raise ValueError(f"model {str(d['model'])!r} {e} (--model)") from None
        if not (model / "config.json").is_file():
            raise ValueError(f"model folder {str(model)!r} holds no config.json (--model)")
        d["model"] = str(model)
    opts = d.get("profile_options") or {}
    for key in PROCESSOR_OPTIONS:
        if opts.get(key) is None:
            continue
        flag = "--preprocessor-config" if key == "preprocessor_config" else f"--profile-option {key}=..."
        try:
            found = resolve_model_dir(str(opts[key]))
        except NotCached as e:
            raise FileNotFoundError(f"{key} {str(opts[key])!r} {e} ({flag})") from None
        if not found.exists() and not _shipped_option(d.get("output"), key, str(found)):
            raise FileNotFoundError(f"{key} {str(opts[key])!r} does not exist ({flag})")
        opts[key] = str(found)
    _check_profile_choice(d.get("profile"), Path(d.get("model") or tok), opts)


def _resolve_tokenizer_setting(d: dict[str, Any]) -> Path:
    """The tokenizer folder that --tokenizer names: a local folder, a Hub id's cached snapshot, or (on a node
    without either) the copy the run shipped to its output store."""
    name = str(d["tokenizer"])
    try:  # a Hub id (ORG/NAME[@REVISION]) is its snapshot in the local cache
        tok = resolve_model_dir(name)
    except NotCached as e:
        tok, missing = None, ValueError(f"tokenizer {name!r} {e} (--tokenizer)")
    shipped = None
    if (tok is None or not tok.is_dir()) and d.get("output"):
        shipped = shipped_for_output(str(d["output"]), name)  # a node without the folder: the run's copy
    if shipped is not None:
        tok = Path(shipped.name)  # checked where it was shipped from; this node reads the copy
    elif tok is None:
        raise missing
    elif not tok.is_dir():
        raise ValueError(f"tokenizer {name!r} is not a local tokenizer folder nor a Hub model id (--tokenizer)")
    elif not any((tok / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise ValueError(f"tokenizer folder {str(tok)!r} holds no tokenizer.json/tokenizer_config.json (--tokenizer)")
    return tok


def _check_profile_choice(profile: str | None, model_dir: Path, opts: dict[str, Any]) -> None:
    """Refuse profile options the chosen profile does not take, and a model whose processor cannot load."""
    # the profile the run will use: the model folder's, checked against --profile (a disagreement is an error)
    choice, choice_opts = choose_profile(profile, model_dir, opts)
    cls = PROFILES.get(choice.name)
    if cls is not None:
        params = inspect.signature(cls).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            unknown = sorted(set(opts) - set(params))
            if unknown:
                raise ValueError(
                    f"unknown profile option(s) {', '.join(map(repr, unknown))} for profile {choice.name} "
                    f"(--profile-option); its options: {', '.join(sorted(params))}"
                )
        if choice_opts.get("model_dir") is not None and "model_dir" in params:
            try:  # a model's processor that cannot be loaded: refused at start
                get_profile(choice.name, **choice_opts)
            except ValueError as e:
                if choice.source != "fallback":
                    raise
                raise ValueError(
                    f"model_type {choice.model_type!r} of {choice.model_dir} has no native profile (native: "
                    f"{native_families_line()}), and the fallback {e}"
                ) from None


def _shipped_option(output: str | None, key: str, name: str) -> bool:
    """Whether the run in ``output`` shipped the preprocessor config ``name`` (a node without it)."""
    return bool(output) and shipped_option(str(output), key, name)


def _prepare_config(args: argparse.Namespace) -> Any:
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
    d.setdefault("media_root", None)  # embedded and absolute media references need no root
    if d.get("model") and not d.get("tokenizer"):  # a model folder carries its tokenizer
        d["tokenizer"] = d["model"]
    missing = [k for k in ("manifest", "tokenizer", "output") if not d.get(k)]
    if missing:
        raise ValueError(
            f"missing required setting(s): {', '.join(missing)} (give them as flags or in --config)"
        )
    _check_model_settings(d)
    return PrepareConfig.from_dict(d)


def _row_cost_line(row_cost: dict[str, Any]) -> str:
    return describe_row_cost(row_cost)


def _bound_text(p: dict[str, Any]) -> str:
    """The rows lower bound the packer is measured against (the largest of the bounds), with its parts."""
    parts = {"L1": p.get("l1"), "L2": p.get("l2"), "DFF": p.get("dff")}
    bound = max((v for v in parts.values() if v is not None), default=None)
    return (
        f"{bound} = max(L1 ceil(tokens/W) {parts['L1']}, L2 Martello-Toth {parts['L2']}, "
        f"DFF Fekete-Schepers {parts['DFF']})"
    )


def _summary_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    c, p = summary["counts"], summary["packing"]
    over = ""
    if "rows_over_bound" in p:
        over = f"  ({p['rows_over_bound']:.4f} x the lower bound, {p.get('algorithm')})"
    return [
        ("input samples", c["input"]),
        ("packed samples", c["packed"]),
        ("rejected samples", f"{c['rejected']} {c['rejected_by_stage']}"),
        *(
            (f"  {f['file']}", f"input {f['input']}  packed {f['packed']}  rejected {f['rejected']}")
            for f in (c.get("by_input") or [])[:20]
        ),
        ("rows", f"{c['rows']}{over}"),
        ("seq_length / align", f"{summary['seq_length']} / {summary['align']}"),
        ("rows lower bound", _bound_text(p)),
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
        *(
            (f"processor cache ({kind})", f"{c['processor_calls']} calls, {c['cache_hits']} hits ({c['hit_rate']:.1%})")
            for kind, c in (summary.get("processor_cache") or {}).items()
        ),
    ]


def _print_summary(summary: dict[str, Any], out: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"omnipack dataset {out}", show_header=False)
    for k, v in _summary_rows(summary):
        t.add_row(k, str(v))
    Console(stderr=True).print(t)
    if summary.get("root"):  # plain text, to copy: a copy of the dataset is checked against it
        print(f"root: {summary['root']['sha256']} (omnipack verify DIR --expect-root ROOT)", file=sys.stderr)


def _report_rejects(output: str, summary: dict[str, Any], top: int = 5) -> Any:
    """Print where the rejects are and their most common reasons; returns (their ``RejectSummary``, the
    rejects file's path)."""
    path = output_path(output) / summary["rejects_file"]  # a folder or an object store
    with path.open() as f:
        rejects = RejectSummary.of(Reject.from_json(json.loads(line)) for line in f)
    if not rejects.count:
        print(f"rejects: none ({path})", file=sys.stderr)
        return rejects, path
    stages = ", ".join(f"{stage} {n}" for stage, n in rejects.by_stage.most_common())
    print(f"rejects: {rejects.count} in {path} ({stages}); most common reasons:", file=sys.stderr)
    for n, reason in rejects.top(top):
        print(f"  {n}x {reason}", file=sys.stderr)
    return rejects, path


def cmd_prepare(args: argparse.Namespace) -> int:
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

    rejects, path = _report_rejects(cfg.output, summary)
    try:
        check_reject_fraction(summary["counts"]["input"], rejects, cfg.max_reject_fraction, str(path))
    except TooManyRejects as e:
        print(f"omnipack prepare: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    root = local_path(args.output, "the demo's output")  # it builds its corpus and tokenizer there
    src = root / "source"

    if args.profile == PROCESSOR_PROFILE:
        raise ValueError(
            f"the demo builds no model folder, which profile {PROCESSOR_PROFILE} needs (the model's own processor): "
            "prepare with --model MODEL_FOLDER instead, or give the demo a native profile"
        )
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
    print(f"dataset: {cfg.output}", file=sys.stderr)
    _report_rejects(cfg.output, summary)
    return 0


def _config_default(dest: str) -> Any:
    """The prepare config's default for a flag's setting (None when the flag is no config field)."""
    field = next((f for f in dataclasses.fields(PrepareConfig) if f.name == dest), None)
    if field is None:
        return None
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


class _DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default: its argparse default, or for prepare's flags (which default
    to None so a --config file can set them) the prepare config's default, looked up only for --help."""

    config_defaults = False

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        default = action.default
        if default is None and self.config_defaults:
            default = _config_default(action.dest)
        if default is None or default == [] or default == {}:
            return text
        if isinstance(default, list):
            default = " ".join(map(str, default))
        shown = str(default).replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"default: {shown}"


class _PrepareHelpFormatter(_DefaultsHelpFormatter):
    config_defaults = True


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser shows defaults in --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="omnipack",
        description="Prepare multimodal training data offline into packed Megatron-Energon THD datasets.",
    )

    p.add_argument("--version", action="version", version=f"omnipack {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pp = sub.add_parser(
        "prepare",
        help="measure, pack and write a dataset",
        description="Measure every sample (exact placeholder counts), pack rows, write Energon shards. "
        "Settings come from --config (YAML/JSON with the same names, underscores) and flags override them.",
        formatter_class=_PrepareHelpFormatter,
    )
    pp.add_argument("--config", "-c", help="YAML or JSON config file")
    for flags, kw in PREPARE_FLAGS:
        pp.add_argument(*flags, **kw)
    for flag, kw in INPUT_FLAGS + PROFILE_FLAGS:
        pp.add_argument(flag, **kw)
    staged = pp.add_argument_group(
        "staged runs", "one stage's share of units, for schedulers without Ray (e.g. a Slurm array per stage)"
    )
    staged.add_argument(
        "--stage",
        choices=["measure", "pack", "write", "finalize"],
        help="run only this stage (not given: all of them)",
    )
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
    pd.add_argument("--samples", type=int, default=200, help="good samples (six broken ones are added)")
    pd.add_argument("--profile", default="qwen2_5_vl", help="model family of the tokenizer and media")
    pd.add_argument("--seq-length", type=int, default=4096, help="pack width W (tokens per row)")
    pd.add_argument("--cp", type=int, default=2, help="context-parallel size of the trainer")
    pd.add_argument("--workers", "-j", type=int, default=1, help="processes for measuring and writing")
    pd.add_argument("--shard-max-rows", type=int, default=16, help="roll shards over at this many rows")
    pd.set_defaults(func=cmd_demo)


    register_tools(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"omnipack {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if isinstance(e, Terminated):  # a scheduler's SIGTERM (preemption, scancel): the lease is released
            print(f"\nomnipack {args.command}: terminated (SIGTERM); rerun the same command to resume",
                  file=sys.stderr)
            return 128 + signal.SIGTERM
        # one line, no traceback: every finished unit of work is recorded, so the same command goes on
        resume = "; rerun the same command to resume" if args.command in ("prepare", "demo") else ""
        print(f"\nomnipack {args.command}: interrupted{resume}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        reason = access_error(e)  # a store refusing the credentials mid-run: one line, not a traceback
        if reason is None:
            raise
        print(f"omnipack {args.command}: error: {reason}; {CREDENTIALS_HINT}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
