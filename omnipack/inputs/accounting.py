"""Input accounting: every input record is packed or rejected exactly once, checked per input file, and the
run guard on the share of rejected records (``--max-reject-fraction``)."""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from typing import Any

DEFAULT_MAX_REJECT_FRACTION = 0.05
EXIT_TOO_MANY_REJECTS = 3


class TooManyRejects(RuntimeError):
    """More input records were rejected than the run allows; the dataset and its rejects file are written."""

    exit_code = EXIT_TOO_MANY_REJECTS


def per_file_counts(
    ledger: list[dict[str, Any]], rejected_indices: Iterable[int], packed_indices: Iterable[int]
) -> list[dict[str, Any]]:
    """``{"file", "input", "packed", "rejected"}`` per input data file, from the reader's ledger (each file's
    first sample index and record count) and the indices that were packed and rejected. Raises
    ``AssertionError`` when a file's records are not each packed or rejected exactly once."""
    entries = sorted(ledger, key=lambda e: e["first_index"])
    starts = [e["first_index"] for e in entries]
    out = [{"file": e["file"], "input": e["records"], "packed": 0, "rejected": 0} for e in entries]

    def slot(i: int) -> int:
        k = bisect_right(starts, i) - 1
        if k < 0 or i >= starts[k] + entries[k]["records"]:
            raise AssertionError(f"accounting: sample index {i} belongs to no input file")
        return k

    for key, indices in (("packed", packed_indices), ("rejected", rejected_indices)):
        for i in indices:
            out[slot(int(i))][key] += 1
    for row in out:
        if row["packed"] + row["rejected"] != row["input"]:
            raise AssertionError(
                f"accounting: {row['file']}: {row['input']} input != {row['packed']} packed + "
                f"{row['rejected']} rejected"
            )
    return out


def check_reject_fraction(
    num_input: int, rejects: Iterable[dict[str, Any]], max_fraction: float, rejects_file: str
) -> None:
    """Raise :class:`TooManyRejects` with a summary when more than ``max_fraction`` of the input was rejected
    (``rejects``: the run's reject records, streamed)."""
    if not 0.0 <= max_fraction <= 1.0:
        raise ValueError(f"max_reject_fraction must be in [0, 1], got {max_fraction}")
    by_stage: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for r in rejects:
        by_stage[r["stage"]] += 1
        reasons[str(r["reason"])[:100]] += 1
    n = sum(by_stage.values())
    if not num_input or n <= max_fraction * num_input:
        return
    raise TooManyRejects(
        f"{n} of {num_input} input records rejected ({n / num_input:.1%}), over "
        f"max_reject_fraction {max_fraction:.1%} (--max-reject-fraction); by stage "
        f"{dict(by_stage)}; most common: "
        + "; ".join(f"{k}x {reason}" for reason, k in reasons.most_common(3))
        + f". Every reject is listed in {rejects_file}."
    )
