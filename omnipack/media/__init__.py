"""Offline media stack: cheap probing and materialisation of images, video and audio.

The bottom layer: it imports nothing else of omnipack's model, text or stage code. The trainer side reaches
only its plain data modules (``meta``, ``errors``, ``storage_plan``, ``audio_storage``, and ``audio``'s sample
arithmetic, through the family modules): numpy alone, the decoder libraries are imported where they decode.
"""

from .errors import MediaError

__all__ = ["MediaError"]
