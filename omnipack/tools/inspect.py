"""``omnipack inspect DATASET``: what a dataset holds, and what one row looks like.

The summary reads only each row's ``meta.json`` and boundaries (media payloads are seeked over); the row
view reads one row through the shard's ``.tar.idx`` and, when the tokenizer is at hand, decodes it with
roles, supervised spans and media placeholders collapsed to ``<|image_pad|>×391``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..alignment import pad_to_multiple
from ..dataset.contract import IGNORE_INDEX
from ..dataset.reader import (
    Dataset,
    RowSummary,
    default_workers,
    map_shards,
    open_dataset,
    read_row,
    summarize_shard,
)
from ..media.sources import local_path
from ..packing.cost import describe_row_cost
from ..profiles import profile_class
from .plot import MissingMatplotlib, plot_dataset, require_matplotlib

KINDS = ("image", "video", "audio")


def scan_rows(ds: Dataset, workers: int = 1, progress: bool | None = None) -> list[RowSummary]:
    """Light summaries of every row, shards read in parallel, in dataset order."""
    jobs = [(str(ds.root), s) for s in ds.shards if (ds.root / s).is_file()]
    return [
        r
        for rows in map_shards(summarize_shard, jobs, workers=workers, progress=progress, label="scan")
        for r in rows
    ]


def _reason_key(r: dict[str, Any]) -> str:
    # Reasons often end in a path or a number; the part before the first ':' groups alike rejects.
    return f"{r.get('stage', '?')}: {str(r.get('reason', '')).split(':')[0].strip()}"


def summary(ds: Dataset, rows: list[RowSummary]) -> dict[str, Any]:
    """The dataset summary as a JSON-able dict (numbers from the shards, cross-referenced metadata)."""
    w, align = ds.seq_length, ds.align
    n_rows = len(rows)
    seqlens = np.asarray([n for r in rows for n in r.seqlens], dtype=np.int64)
    real = int(seqlens.sum())
    padded = int(pad_to_multiple(seqlens, align).sum())
    per_row = Counter(len(r.sample_ids) for r in rows)
    media_tokens = dict.fromkeys(KINDS, 0)
    media_counts = dict.fromkeys(KINDS, 0)
    for r in rows:
        for m in r.media:
            media_tokens[m["kind"]] = media_tokens.get(m["kind"], 0) + int(m["num_tokens"])
            media_counts[m["kind"]] = media_counts.get(m["kind"], 0) + 1
    mix = {"text": real - sum(media_tokens.values()), **media_tokens}
    rejects = ds.rejects()
    shards = []
    for s in ds.shards:
        p = ds.root / s
        shards.append(
            {"path": s, "rows": ds.shard_counts.get(s), "bytes": p.stat().st_size if p.exists() else None}
        )
    fills = np.asarray([r.real_tokens / w for r in rows]) if rows and w else np.zeros(0)
    counts = ds.meta.get("counts") or {}
    return {
        "dataset": str(ds.root),
        "profile": (ds.meta.get("profile") or {}).get("name"),
        "tokenizer": {
            k: v for k, v in (ds.meta.get("tokenizer") or {}).items() if k in ("path", "fingerprint")
        },
        "seq_length": w,
        "align": align,
        "parallel": ds.meta.get("parallel"),
        "rows": n_rows,
        "samples": int(len(seqlens)),
        "input_samples": counts.get("input"),
        "rejected": len(rejects),
        "rejects_by_reason": dict(Counter(_reason_key(r) for r in rejects).most_common()),
        "real_tokens": real,
        "real_efficiency": real / (n_rows * w) if n_rows and w else 0.0,
        "padded_efficiency": padded / (n_rows * w) if n_rows and w else 0.0,
        "samples_per_row": {str(k): v for k, v in sorted(per_row.items())},
        "sample_length": _stats(seqlens),
        "row_fill": _stats(fills),
        "modality_tokens": mix,
        "modality_mix": {k: (v / real if real else 0.0) for k, v in mix.items()},
        "media_counts": media_counts,
        "shards": shards,
        "total_bytes": sum(s["bytes"] or 0 for s in shards),
        # modeled training cost per row (packing.cost), recorded by prepare; the per-row list stays in the file
        "row_cost": {
            k: v for k, v in ((ds.meta.get("packing") or {}).get("row_cost") or {}).items() if k != "per_row"
        },
    }


def _stats(x: np.ndarray) -> dict[str, float]:
    if not len(x):
        return {}
    q = np.percentile(x, [50, 90, 99])
    return {
        "min": float(x.min()),
        "mean": float(x.mean()),
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "max": float(x.max()),
    }


# --- row view -------------------------------------------------------------------------------------


def _load_tokenizer(path: str | None) -> Any:
    if not path or not Path(path).exists():
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception:  # inspect still works without text
        return None


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def _token_names(tok: Any, ph_ids: dict[str, list[int]]) -> dict[int, str]:
    names = {}
    for kind, tids in ph_ids.items():
        for tid in tids:
            name = tok.convert_ids_to_tokens(int(tid)) if tok is not None else None
            names.setdefault(int(tid), name or f"<{kind} placeholder>")
    return names


def _text_segments(
    ids: np.ndarray, target: np.ndarray, ph_names: dict[int, str], tok: Any
) -> list[dict[str, Any]]:
    """Decoded text split where supervision or placeholder runs change; placeholder runs collapsed."""
    segs: list[dict[str, Any]] = []
    i, n = 0, len(ids)
    while i < n:
        tid = int(ids[i])
        if tid in ph_names:
            j = i
            while j < n and ids[j] == tid:
                j += 1
            segs.append(
                {"text": f"{ph_names[tid]}×{j - i}", "placeholder": True, "supervised": False, "count": j - i}
            )
        else:
            j = i
            while j < n and int(ids[j]) not in ph_names and target[j] == target[i]:
                j += 1
            text = tok.decode(ids[i:j].tolist(), skip_special_tokens=False) if tok is not None else None
            segs.append({"text": text, "placeholder": False, "supervised": bool(target[i]), "count": j - i})
        i = j
    return segs


def _turn_start(ds: Dataset) -> str | None:
    """The dataset profile's start-of-turn marker (``ModelProfile.turn_start``); None for an unknown profile."""
    try:
        return profile_class((ds.meta.get("profile") or {}).get("name", "")).turn_start
    except ValueError:
        return None


def _turns(ids: np.ndarray, tok: Any, offset: int, turn_start: str | None) -> list[dict[str, Any]]:
    """Chat turns found by their ``<turn_start>role`` markers (row positions)."""
    if tok is None or turn_start is None:
        return []
    marker = tok.convert_tokens_to_ids(turn_start)
    if marker is None or marker == tok.unk_token_id:
        return []
    starts = np.flatnonzero(ids == marker).tolist()
    turns = []
    for k, s in enumerate(starts):
        head = tok.decode(ids[s + 1 : s + 6].tolist(), skip_special_tokens=False)
        role = head.split("\n")[0].strip() or "?"
        end = starts[k + 1] if k + 1 < len(starts) else len(ids)
        turns.append({"role": role, "start": offset + s, "end": offset + end})
    return turns


def row_view(
    ds: Dataset, index: int, tokenizer: str | None = None, ph_ids: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """One row laid out sequence by sequence (positions are row positions)."""
    shard, local = ds.locate(index)
    raw = read_row(ds, index)
    row, meta = raw.decode()
    tok = _load_tokenizer(tokenizer or ds.tokenizer_path)
    if ph_ids is None:
        ph_ids = {
            k: [int(t) for t in v]
            for k, v in ((ds.meta.get("tokenizer") or {}).get("placeholder_token_ids") or {}).items()
        }
    ph_names = _token_names(tok, ph_ids)
    turn_start = _turn_start(ds)
    cu, cup = row.cu_seqlens.astype(int), row.cu_seqlens_padded.astype(int)
    supervised = row.labels != IGNORE_INDEX
    seqs = []
    for i, sid in enumerate(row.sample_ids):
        a, b, c = int(cup[i]), int(cup[i] + cu[i + 1] - cu[i]), int(cup[i + 1])
        ids = row.tokens[a:b]
        # A supervised position p predicts token p+1: highlight the predicted (target) tokens.
        target = np.zeros(b - a, dtype=bool)
        target[1:] = supervised[a : b - 1]
        seqs.append(
            {
                "index": i,
                "sample_id": sid,
                "start": a,
                "end": b,
                "padded_end": c,
                "length": b - a,
                "padded_length": c - a,
                "padding": c - b,
                "supervised_spans": [[a + s, a + e] for s, e in _runs(supervised[a:b])],
                "supervised_tokens": int(supervised[a:b].sum()),
                "media": [
                    {**m.to_json(), "offset_in_sample": m.token_start - a}
                    for m in row.media
                    if m.sample_index == i
                ],
                "turns": _turns(ids, tok, a, turn_start),
                "text": _text_segments(ids, target, ph_names, tok),
            }
        )
    return {
        "row": index,
        "shard": shard,
        "row_in_shard": local,
        "key": raw.key,
        "seq_length": row.seq_length,
        "real_tokens": int(row.seqlens.sum()),
        "fill": float(row.seqlens.sum() / row.seq_length),
        "has_mrope": row.mrope_position_ids is not None,
        "tokenizer": tokenizer or ds.tokenizer_path if tok is not None else None,
        "sequences": seqs,
        "extra_meta": {k: v for k, v in meta.items() if k not in ("sample_ids", "media")},
    }


def find_sample(rows: list[RowSummary], sample_id: str) -> int:
    for i, r in enumerate(rows):
        if sample_id in r.sample_ids:
            return i
    raise ValueError(f"sample {sample_id!r} is not in any row (rejected? see rejects.jsonl)")


# --- terminal output --------------------------------------------------------------------------------


def print_summary(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"omnipack dataset {s['dataset']}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    tok = s["tokenizer"]
    rows = [
        ("profile", s["profile"]),
        ("tokenizer", f"{tok.get('fingerprint')}  ({tok.get('path')})"),
        ("W / align", f"{s['seq_length']} / {s['align']}  (parallel {s['parallel']})"),
        ("rows", s["rows"]),
        ("samples", f"{s['samples']} packed of {s['input_samples']} input, {s['rejected']} rejected"),
        ("real efficiency", f"{s['real_efficiency']:.2%}"),
        ("padded efficiency", f"{s['padded_efficiency']:.2%}"),
        ("sample length", _fmt_stats(s["sample_length"], "{:.0f}")),
        ("row fill", _fmt_stats(s["row_fill"], "{:.1%}")),
        (
            "modality mix",
            "  ".join(f"{k} {s['modality_tokens'][k]} ({v:.1%})" for k, v in s["modality_mix"].items()),
        ),
        ("media", "  ".join(f"{k} {v}" for k, v in s["media_counts"].items())),
        ("shards", f"{len(s['shards'])}, {s['total_bytes'] / 2**20:.1f} MiB"),
    ]
    if s.get("row_cost"):
        rows.append(("row cost", describe_row_cost(s["row_cost"])))
    for k, v in rows:
        t.add_row(k, str(v))
    con.print(t)

    h = Table(title="samples per row", title_justify="left")
    h.add_column("samples", justify="right")
    h.add_column("rows", justify="right")
    h.add_column("")
    most = max(s["samples_per_row"].values(), default=1)
    for k, v in s["samples_per_row"].items():
        h.add_row(k, str(v), "█" * max(1, round(30 * v / most)))
    con.print(h)
    if s["rejects_by_reason"]:
        r = Table(title="rejects by reason", title_justify="left")
        r.add_column("stage: reason")
        r.add_column("count", justify="right")
        for k, v in s["rejects_by_reason"].items():
            r.add_row(k, str(v))
        con.print(r)
    sh = Table(title="shards", title_justify="left")
    sh.add_column("path")
    sh.add_column("rows", justify="right")
    sh.add_column("MiB", justify="right")
    show = s["shards"] if len(s["shards"]) <= 12 else s["shards"][:6] + [None] + s["shards"][-5:]
    for x in show:
        if x is None:
            sh.add_row("…", "", "")
        else:
            mib = "missing" if x["bytes"] is None else f"{x['bytes'] / 2**20:.1f}"
            sh.add_row(x["path"], str(x["rows"]), mib)
    con.print(sh)


def _fmt_stats(st: dict[str, float], fmt: str) -> str:
    if not st:
        return "-"
    return "  ".join(f"{k} {fmt.format(v)}" for k, v in st.items())


def print_row(v: dict[str, Any], only_sample: str | None = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    con = Console()
    con.print(
        f"[bold]row {v['row']}[/] ({v['shard']} row {v['row_in_shard']}, key {v['key']}): "
        f"W={v['seq_length']}, {len(v['sequences'])} samples, {v['real_tokens']} real tokens "
        f"({v['fill']:.1%} full){', mrope ids' if v['has_mrope'] else ''}"
    )
    t = Table()
    for col in ("#", "sample", "logical", "padded", "len", "pad", "media", "supervised"):
        t.add_column(col, justify="left" if col in ("sample", "media") else "right", no_wrap=col != "media")
    for s in v["sequences"]:
        kinds = Counter(m["kind"] for m in s["media"])
        t.add_row(
            str(s["index"]),
            Text(s["sample_id"], style="bold" if s["sample_id"] == only_sample else ""),
            f"[{s['start']},{s['end']})",
            f"[{s['start']},{s['padded_end']})",
            str(s["length"]),
            str(s["padding"]),
            " ".join(f"{k}×{n}" for k, n in kinds.items()),
            str(s["supervised_tokens"]),
        )
    con.print(t)
    if v["tokenizer"] is None:
        con.print("[yellow]text not decoded: tokenizer not found (pass --tokenizer DIR)[/]")
    else:
        con.print(
            "[dim]text: [green]green[/] = supervised targets, [magenta]magenta[/] = media placeholders[/]"
        )
    for s in v["sequences"]:
        if only_sample is not None and s["sample_id"] != only_sample:
            continue
        con.rule(f"{s['index']}: {escape(s['sample_id'])}  [{s['start']},{s['end']}) +{s['padding']} pad")
        if s["turns"]:
            con.print("turns: " + "  ".join(f"{x['role']} [{x['start']},{x['end']})" for x in s["turns"]))
        for m in s["media"]:
            grid = f" grid_thw {tuple(m['grid_thw'])}" if m.get("grid_thw") else ""
            con.print(
                f"{m['kind']} {m['part']}: block [{m['block'][0]},{m['block'][1]}) "
                f"×{m['num_tokens']} placeholders from {m['token_start']}{grid}",
                soft_wrap=True,
            )
        sup = " ".join(f"[{a},{b})" for a, b in s["supervised_spans"])
        con.print(f"supervised (label positions): {sup}  ({s['supervised_tokens']} tokens)", soft_wrap=True)
        if v["tokenizer"] is not None:
            text = Text()
            for seg in s["text"]:
                style = "magenta" if seg["placeholder"] else ("green" if seg["supervised"] else "")
                text.append(seg["text"] or "", style=style)
            con.print(text)


def cmd_inspect(args: argparse.Namespace) -> int:
    ds = open_dataset(args.dataset)
    progress = False if args.json else args.progress
    # matplotlib writes a local file; fail before the scan, not after it
    plot = local_path(args.plot, "--plot", "file") if args.plot else None
    if plot is not None:
        try:
            require_matplotlib()
        except MissingMatplotlib as e:
            print(f"omnipack inspect: {e}", file=sys.stderr)
            return 1
    need_scan = args.sample is not None or args.plot or (args.row is None)
    rows = scan_rows(ds, args.workers, progress) if need_scan else []
    out: dict[str, Any] = {}
    if args.row is not None or args.sample is not None:
        index = args.row if args.row is not None else find_sample(rows, args.sample)
        try:
            view = row_view(ds, index, args.tokenizer)
        except IndexError as e:
            raise ValueError(str(e)) from None
        out["row"] = view
        if not args.json:
            print_row(view, args.sample)
    else:
        s = summary(ds, rows)
        out["summary"] = s
        if not args.json:
            print_summary(s)
    if plot is not None:
        try:
            plot_dataset(
                rows,
                ds.seq_length,
                plot,
                max_rows=args.plot_rows,
                title=str(ds.root),
                row_costs=((ds.meta.get("packing") or {}).get("row_cost") or {}).get("per_row"),
            )
        except MissingMatplotlib as e:
            print(f"omnipack inspect: {e}", file=sys.stderr)
            return 1
        out["plot"] = args.plot
        if not args.json:
            print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a dataset, or show one row laid out",
        description="Summary: profile, tokenizer, W/alignment, rows, samples, rejects by reason, efficiency, "
        "samples per row, modality mix, media and shard sizes. --row N / --sample ID lays one row out "
        "sequence by sequence (roles, media blocks, supervised spans, decoded text with placeholders "
        "collapsed). --plot writes a PNG (needs matplotlib: omnipack's plot extra, or pip install matplotlib).",
    )
    p.add_argument("dataset", help="dataset folder (the one holding .nv-meta/)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--row", type=int, help="show global row N (0-based, shard order)")
    which.add_argument("--sample", help="show the row holding sample ID")
    p.add_argument("--tokenizer", help="tokenizer directory for decoding (default: the one in omnipack.json)")
    p.add_argument("--plot", metavar="FILE.png", help="write a row-layout strip chart and histograms")
    p.add_argument("--plot-rows", type=int, default=48, help="rows drawn in the strip chart")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--workers", "-j", type=int, default=default_workers(), help="processes for the scan")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    p.set_defaults(func=cmd_inspect)
