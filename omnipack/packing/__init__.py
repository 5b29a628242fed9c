"""Offline packing of padded sample lengths into fixed-width THD rows."""

from .bounds import lower_bounds
from .constraints import PackConstraints
from .engine import pack
from .plan import PackPlan
from .stats import packing_stats

__all__ = ["PackConstraints", "PackPlan", "lower_bounds", "pack", "packing_stats"]
