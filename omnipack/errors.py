"""What a failure means: a data problem of one sample (recorded as a :class:`Reject`), or a bug.

A :class:`SampleReject` (and its subclasses: ``ManifestError``, ``MediaError``, ``MediaRejected``,
``SampleRejected``) is a problem of one input sample: the stage that meets it records the sample as
rejected with the error's reason and goes on. Any other exception raised by a stage's work is a bug (or a
broken environment): the stage raises :class:`StageError`, naming the sample or the stage it failed in, from
the original error, and the run stops with its traceback. Usage errors (bad flags or settings) are raised
before any stage starts and stay one-line errors of the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SampleReject(ValueError):
    """A data problem of one sample; its message is the reject reason. ``stage`` is the stage that rejects it
    when the error knows (None: the stage that catches it)."""

    stage: str | None = None

    def __init__(self, reason: str, *, stage: str | None = None) -> None:
        super().__init__(reason)
        if stage is not None:
            self.stage = stage

    @property
    def reason(self) -> str:
        return str(self)


class StageError(RuntimeError):
    """A stage's work failed on something that is not a data problem; raised from the original error."""


def sample_failed(stage: str, sample_id: str, source: str, error: BaseException) -> StageError:
    """The error to raise (``from error``) when ``error``, not a :class:`SampleReject`, escapes the work on
    one sample: it names the sample, so the traceback says which input to look at."""
    return StageError(
        f"{stage}: sample {sample_id!r} ({source}) failed with {type(error).__name__}: {error} "
        "(a bug, not a data problem: data problems are rejected with a reason)"
    )


@dataclass(frozen=True)
class Reject:
    """One input sample left out of the dataset: which (its input index, id and where it was read), the stage
    that left it out and why. Every stage's rejects, and each line of ``rejects.jsonl``, are these."""

    sample_index: int
    sample_id: str | None
    source: str | None
    stage: str
    reason: str

    @classmethod
    def of(
        cls, sample_index: int, sample_id: str | None, source: str | None, stage: str, error: SampleReject
    ) -> Reject:
        """The reject of ``error`` met by ``stage`` (the error's own stage, when it names one)."""
        return cls(sample_index, sample_id, source, error.stage or stage, error.reason)

    def to_json(self) -> dict[str, Any]:
        """Its JSON object, keys in field order (as ``rejects.jsonl`` writes them)."""
        return {
            "sample_index": self.sample_index,
            "sample_id": self.sample_id,
            "source": self.source,
            "stage": self.stage,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Reject:
        return cls(int(d["sample_index"]), d["sample_id"], d["source"], d["stage"], d["reason"])
