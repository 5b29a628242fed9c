"""omnipack: offline packing of multimodal training data into Megatron-Energon THD datasets.

Importing omnipack is cheap and needs no media stack: the trainer-side pieces are loaded lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"
