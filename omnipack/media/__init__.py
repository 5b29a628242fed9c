"""Offline media stack: cheap probing and materialisation of images, video and audio.

Imported only by the preparation pipeline; the trainer-side loader never imports this package.
"""

from .errors import MediaError

__all__ = ["MediaError"]
