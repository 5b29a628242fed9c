"""What a failure means: a data problem of one sample, or a bug.

A :class:`SampleReject` (and its subclasses: ``ManifestError``, ``MediaError``, ``MediaRejected``,
``SampleRejected``) is a problem of one input sample: the stage that meets it records the sample as
rejected with the error's reason and goes on. Any other exception raised by a stage's work is a bug (or a
broken environment): the stage raises :class:`StageError`, naming the sample or the stage it failed in, from
the original error, and the run stops with its traceback. Usage errors (bad flags or settings) are raised
before any stage starts and stay one-line errors of the command line.
"""

from __future__ import annotations


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
