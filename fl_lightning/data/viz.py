"""Pictures for TensorBoard, drawn with numpy only (no plotting dependency)."""

from __future__ import annotations

import numpy as np

# A few anchor colours of the viridis colour map (RGB in 0..1), interpolated linearly.
_VIRIDIS = np.array(
    [
        [0.267, 0.005, 0.329],
        [0.229, 0.322, 0.546],
        [0.128, 0.567, 0.551],
        [0.369, 0.789, 0.383],
        [0.993, 0.906, 0.144],
    ]
)


def colormap(values: np.ndarray) -> np.ndarray:
    """Map values in [0, 1] to RGB (viridis-like); returns ``values.shape + (3,)`` floats."""
    v = np.clip(values, 0.0, 1.0) * (len(_VIRIDIS) - 1)
    lo = np.floor(v).astype(int).clip(0, len(_VIRIDIS) - 2)
    frac = (v - lo)[..., None]
    return _VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac


def partition_heatmap(counts: np.ndarray, cell: int = 12, max_height: int = 2400) -> np.ndarray:
    """An HWC uint8 image of a clients × classes count matrix (rows = clients, columns = classes).

    Each row is normalised by the client's largest class count so that the label skew of small
    and large clients is equally visible; every cell is ``cell`` pixels square, smaller (down to one
    pixel) when the clients would make the image taller than ``max_height``, so that a federation of
    thousands of clients does not cost tens of MB for a picture.
    """
    counts = np.asarray(counts, dtype=np.float64)
    peak = counts.max(axis=1, keepdims=True)
    frac = np.divide(counts, peak, out=np.zeros_like(counts), where=peak > 0)
    img = (colormap(frac) * 255).round().astype(np.uint8)
    cell = max(1, min(cell, max_height // max(len(counts), 1)))
    return np.repeat(np.repeat(img, cell, axis=0), cell, axis=1)


def counts_markdown(counts: np.ndarray, max_rows: int = 50) -> str:
    """A markdown table of per-client class counts (first ``max_rows`` clients)."""
    m, c = counts.shape
    head = "| client | n | " + " | ".join(str(j) for j in range(c)) + " |"
    sep = "|" + "---|" * (c + 2)
    rows = [
        f"| {i} | {int(counts[i].sum())} | " + " | ".join(str(int(v)) for v in counts[i]) + " |"
        for i in range(min(m, max_rows))
    ]
    if m > max_rows:
        rows.append(f"| … {m - max_rows} more | | " + " | " * c)
    return "\n".join([head, sep, *rows])
