"""What encoding one conversation gives: its token ids, labels and media spans, or the reason it can not."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SampleReject
from ..profiles.base import MediaSpan


class SampleRejected(SampleReject):
    """The sample cannot be encoded; the message is the reject reason."""


@dataclass
class EncodedSample:
    input_ids: np.ndarray  # int32 [L]
    labels: np.ndarray  # int32 [L], next-token targets on assistant turns, IGNORE_INDEX elsewhere
    spans: list[MediaSpan]
    mrope_position_ids: np.ndarray | None = None  # int32 [3, L]
    # int32 [K, 2]: each assistant turn's [start, end) in input_ids (``labels.assistant_token_spans``)
    assistant_spans: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
