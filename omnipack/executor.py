"""Kept for imports of ``omnipack.executor.map_ordered``: the executors live in ``omnipack.executors``."""

from .executors.local import map_ordered

__all__ = ["map_ordered"]
