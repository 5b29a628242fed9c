#!/usr/bin/env python3
"""Convert LLaVA/ShareGPT JSON to an omnipack manifest (same as ``omnipack convert-llava``)."""

import sys

from omnipack.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert-llava", *sys.argv[1:]]))
