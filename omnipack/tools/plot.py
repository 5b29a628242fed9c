"""Row-layout strip chart and length / fill histograms of a dataset (matplotlib, an optional extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset.reader import RowSummary

# Text samples alternate between blues so neighbours stay distinct; media kinds get loud colours on top.
SAMPLE_COLORS = ("#9ecae1", "#4f8fc0", "#c6dbef", "#2f6a9a")
KIND_COLORS = {"image": "#f28e2b", "video": "#b07aa1", "audio": "#59a14f"}
PAD_COLOR = "#e6e6e6"


class MissingMatplotlib(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise MissingMatplotlib with an install hint when matplotlib is absent."""
    _pyplot()


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingMatplotlib(
            "--plot needs matplotlib, an optional extra: pip install '.[plot]' in the omnipack repository "
            "(or pip install matplotlib)"
        ) from None
    return plt


def plot_dataset(
    rows: Sequence[RowSummary],
    width: int,
    out: str | Path,
    *,
    max_rows: int = 48,
    title: str = "",
    row_costs: Sequence[float] | None = None,
) -> Path:
    """Write a PNG: the first ``max_rows`` rows as horizontal bars (samples, media, padding), a histogram
    of sample lengths, one of row fill and, given ``row_costs`` (the modeled cost of every row), one of
    row cost relative to the mean."""
    plt = _pyplot()
    shown = list(rows[:max_rows])
    strip_h = max(2.5, 0.22 * len(shown) + 1.2)
    fig = plt.figure(figsize=(13, strip_h + 3.6), constrained_layout=True)
    columns = 3 if row_costs else 2
    grid = fig.add_gridspec(2, columns, height_ratios=[strip_h, 3.2])
    _draw_row_layout(fig.add_subplot(grid[0, :]), shown, len(rows), width, title)
    _draw_histograms(fig, grid, rows, width, row_costs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _draw_row_layout(ax: Any, shown: Sequence[RowSummary], total_rows: int, width: int, title: str) -> None:
    """Rows as horizontal bars: each sample a shade, media blocks over them, padding grey."""
    from matplotlib.patches import Patch

    for y, r in enumerate(shown):
        cu, cup = r.cu_seqlens, r.cu_seqlens_padded
        ax.broken_barh([(0, width)], (y - 0.4, 0.8), facecolors=PAD_COLOR, edgecolor="none")
        for i in range(len(r.sample_ids)):
            start, length = cup[i], cu[i + 1] - cu[i]
            ax.broken_barh(
                [(start, length)],
                (y - 0.4, 0.8),
                facecolors=SAMPLE_COLORS[i % len(SAMPLE_COLORS)],
                edgecolor="white",
                linewidth=0.4,
            )
        for m in r.media:
            ax.broken_barh(
                [(m["block"][0], m["block"][1] - m["block"][0])],
                (y - 0.28, 0.56),
                facecolors=KIND_COLORS.get(m["kind"], "#e15759"),
                edgecolor="none",
            )
    ax.set_xlim(0, width)
    ax.set_ylim(len(shown) - 0.5, -0.5)  # row 0 on top
    ax.set_xlabel("token position")
    ax.set_ylabel("row")
    step = max(1, len(shown) // 16)
    ax.set_yticks(range(0, len(shown), step))
    more = f" (first {len(shown)} of {total_rows})" if total_rows > len(shown) else ""
    ax.set_title(f"row layout{more}, W={width}" + (f" — {title}" if title else ""), loc="left")
    kinds = sorted({m["kind"] for r in shown for m in r.media})
    handles = [Patch(color=SAMPLE_COLORS[0], label="text (samples alternate shades)")]
    handles += [Patch(color=KIND_COLORS.get(k, "#e15759"), label=k) for k in kinds]
    handles.append(Patch(color=PAD_COLOR, label="padding"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def _draw_histograms(
    fig: Any, grid: Any, rows: Sequence[RowSummary], width: int, row_costs: Sequence[float] | None
) -> None:
    """The bottom panels: sample lengths, row fill and (given ``row_costs``) row cost against the mean."""
    lens = np.asarray([n for r in rows for n in r.seqlens])
    ax1 = fig.add_subplot(grid[1, 0])
    ax1.hist(lens, bins=min(50, max(5, len(lens) // 4)), color=SAMPLE_COLORS[1])
    ax1.set_title(f"sample lengths (n={len(lens)}, mean {lens.mean() if len(lens) else 0:.0f})", loc="left")
    ax1.set_xlabel("tokens")
    ax1.set_ylabel("samples")
    fills = np.asarray([r.real_tokens / width for r in rows]) if width else np.zeros(0)
    ax2 = fig.add_subplot(grid[1, 1])
    ax2.hist(fills * 100, bins=20, range=(0, 100), color="#76b7b2")
    ax2.set_title(f"row fill (real tokens / W, mean {fills.mean() if len(fills) else 0:.1%})", loc="left")
    ax2.set_xlabel("% of W")
    ax2.set_ylabel("rows")
    if row_costs:
        costs = np.asarray(row_costs, dtype=np.float64)
        rel = costs / costs.mean() - 1
        ax3 = fig.add_subplot(grid[1, 2])
        ax3.hist(rel * 100, bins=40, color="#e15759")
        ax3.set_title(f"row cost vs mean (modeled, max {rel.max():+.1%})", loc="left")
        ax3.set_xlabel("% above / below the mean row cost")
        ax3.set_ylabel("rows")
