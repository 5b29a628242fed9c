"""How audio payloads are stored: the constants the writer (``omnipack.media.audio``) and the trainer's reader
(``omnipack.profiles.model_inputs``) share. numpy only, so the trainer side imports it without the decoders."""

from __future__ import annotations

import numpy as np

# How audio payloads are loaded and stored (``omnipack.media.audio``); recorded in profile settings so a
# dataset says which rule its audio follows (datasets without it stored int16 scaled by 32767).
AUDIO_LOADING = (
    "librosa.load reference: soundfile decode (FFmpeg via PyAV where libsndfile cannot read), float32 channel "
    "mean, soxr_hq, decoded length; stored int16 k (= k / 32768) when exact, else float32"
)
INT16_SCALE = 32768.0  # libsndfile's int16 <-> float scale: the writer's and the reader's, both ways
# The dtypes an audio payload may have (int16 where that is exact, else float32).
STORED_AUDIO_DTYPES = (np.dtype(np.int16), np.dtype(np.float32))
