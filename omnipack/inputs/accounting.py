"""Input accounting: every input record is packed or rejected exactly once, checked per input file, and the
run guard on the share of rejected records (``--max-reject-fraction``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Reject

DEFAULT_MAX_REJECT_FRACTION = 0.05
EXIT_TOO_MANY_REJECTS = 3


class TooManyRejects(RuntimeError):
    """More input records were rejected than the run allows; the dataset and its rejects file are written."""

    exit_code = EXIT_TOO_MANY_REJECTS


def per_file_counts(
    ledger: list[dict[str, Any]], rejected_indices: Iterable[int], packed_indices: Iterable[int]
) -> list[dict[str, Any]]:
    """``{"file", "input", "packed", "rejected"}`` per input data file, in input order, from a ledger of
    record ranges (``{"file", "first_index", "records"}``: one per file, or one per part of a file) and the
    sample indices that were packed and rejected. Raises ``AssertionError`` when a file's records are not
    each packed or rejected exactly once."""
    entries = sorted(ledger, key=lambda e: e["first_index"])
    starts = np.asarray([e["first_index"] for e in entries], dtype=np.int64)
    ends = starts + np.asarray([e["records"] for e in entries], dtype=np.int64)
    counts = {}
    for key, indices in (("packed", packed_indices), ("rejected", rejected_indices)):
        idx = (
            np.fromiter((int(i) for i in indices), dtype=np.int64)
            if not isinstance(indices, np.ndarray)
            else indices
        )
        slot = np.searchsorted(starts, idx, side="right") - 1
        outside = (slot < 0) | (idx >= ends[np.maximum(slot, 0)]) if len(entries) else np.ones(len(idx), bool)
        if outside.any():
            raise AssertionError(f"accounting: sample index {int(idx[outside][0])} belongs to no input file")
        counts[key] = np.bincount(slot, minlength=len(entries))
    out: dict[str, dict[str, Any]] = {}
    for k, e in enumerate(entries):
        row = out.setdefault(e["file"], {"file": e["file"], "input": 0, "packed": 0, "rejected": 0})
        row["input"] += int(e["records"])
        row["packed"] += int(counts["packed"][k])
        row["rejected"] += int(counts["rejected"][k])
    for row in out.values():
        if row["packed"] + row["rejected"] != row["input"]:
            raise AssertionError(
                f"accounting: {row['file']}: {row['input']} input != {row['packed']} packed + "
                f"{row['rejected']} rejected"
            )
    return list(out.values())


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_PATHLIKE = re.compile(r"\S*[/\\]\S*")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def reason_kind(reason: str) -> str:
    """A reject reason with its particulars (quoted values, paths, numbers) blanked, so rejects of one
    cause count together: "missing image file: /data/a.png" -> "missing image file: …"."""
    text = _QUOTED.sub("'…'", str(reason))
    text = _PATHLIKE.sub("…", text)
    return _NUMBER.sub("N", text)[:120]


@dataclass
class RejectSummary:
    """The rejects of a run counted by stage and by kind of reason (with one example of each kind)."""

    count: int = 0
    by_stage: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    example: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, rejects: Iterable[Reject]) -> RejectSummary:
        out = cls()
        for r in rejects:
            out.count += 1
            out.by_stage[r.stage] += 1
            kind = reason_kind(r.reason)
            out.kinds[kind] += 1
            out.example.setdefault(kind, str(r.reason)[:200])
        return out

    def top(self, n: int = 5) -> list[tuple[int, str]]:
        """The ``n`` most common kinds of reason: (count, an example reason of that kind)."""
        return [(k, self.example[kind]) for kind, k in self.kinds.most_common(n)]


def check_reject_fraction(
    num_input: int, rejects: Iterable[Reject] | RejectSummary, max_fraction: float, rejects_file: str
) -> None:
    """Raise :class:`TooManyRejects` with a summary when more than ``max_fraction`` of the input was rejected
    (``rejects``: the run's reject records, streamed, or their :class:`RejectSummary`)."""
    if not 0.0 <= max_fraction <= 1.0:
        raise ValueError(f"max_reject_fraction must be in [0, 1], got {max_fraction}")
    summary = rejects if isinstance(rejects, RejectSummary) else RejectSummary.of(rejects)
    n = summary.count
    if not num_input or n <= max_fraction * num_input:
        return
    raise TooManyRejects(
        f"{n} of {num_input} input records rejected ({n / num_input:.1%}), over "
        f"max_reject_fraction {max_fraction:.1%} (--max-reject-fraction); by stage "
        f"{dict(summary.by_stage)}; most common: "
        + "; ".join(f"{k}x {reason}" for k, reason in summary.top(3))
        + f". Every reject is listed in {rejects_file}."
    )
