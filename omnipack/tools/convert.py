"""LLaVA / ShareGPT JSON (``conversations`` with ``from: human/gpt`` and ``<image>`` markers) -> manifest."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..inputs import READERS
from ..inputs.jsonl import first_byte
from ..inputs.markers import ConvertError
from ..inputs.sharegpt import sharegpt_record
from ..inputs.tool_use import normalize_tool_use


def convert_record(rec: Any, index: int) -> dict[str, Any]:
    """One LLaVA record -> one manifest line; media markers become content parts in place."""
    if not isinstance(rec, dict):
        raise ConvertError(f"record is a {type(rec).__name__}, not an object")
    conv = sharegpt_record(rec)
    line = {"id": str(rec.get("id", index)), "messages": conv["messages"]}
    if conv.get("tools") not in (None, "", []):
        line["tools"] = conv["tools"]
    normalize_tool_use(line)  # tool calls and tools as prepare reads them
    return line


def read_llava(path: Path) -> Iterator[Any]:
    """A JSON array file or a JSONL file of LLaVA records, streamed; an unreadable record comes back as a
    ``ConvertError`` in its place, so it is recorded rather than ending the run."""
    reader = READERS["json" if first_byte(path) == b"[" else "jsonl"]
    for rec in reader.records(path, path.name):
        yield rec.record if rec.error is None else ConvertError(f"{rec.where}: {rec.error}")


def convert(records: Iterable[dict[str, Any]], out: Path, errors_out: Path) -> tuple[int, int]:
    ok = bad = 0
    with open(out, "w") as f, open(errors_out, "w") as ferr:
        for i, rec in enumerate(records):
            try:
                if isinstance(rec, ConvertError):
                    raise rec
                try:
                    line = convert_record(rec, i)
                except (TypeError, AttributeError, KeyError, ValueError) as e:
                    if isinstance(e, ConvertError):
                        raise
                    raise ConvertError(f"malformed record: {type(e).__name__}: {e}") from None
            except ConvertError as e:
                rid = rec.get("id") if isinstance(rec, dict) else None
                ferr.write(json.dumps({"index": i, "id": rid, "reason": str(e)}) + "\n")
                bad += 1
                continue
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            ok += 1
    return ok, bad


def cmd_convert(args: argparse.Namespace) -> int:
    out = Path(args.output)
    errors = Path(args.errors) if args.errors else out.with_suffix(".rejects.jsonl")
    ok, bad = convert(read_llava(Path(args.input)), out, errors)
    print(f"converted {ok} records to {out}; {bad} rejected (reasons in {errors})", file=sys.stderr)
    return 0 if ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert-llava",
        help="convert LLaVA/ShareGPT JSON to an omnipack manifest",
        description="Convert LLaVA/ShareGPT records ('conversations' with from: human/gpt and <image>/<video>/"
        "<audio> markers, media in 'image'/'images'/'video'/'audio') to omnipack's JSONL manifest.",
    )
    p.add_argument("input", help="LLaVA JSON array or JSONL file")
    p.add_argument("output", help="manifest JSONL to write")
    p.add_argument(
        "--errors", help="where to write records that cannot be converted (default: OUTPUT.rejects.jsonl)"
    )
    p.set_defaults(func=cmd_convert)
