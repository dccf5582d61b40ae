"""Pictures for TensorBoard: numpy for the pixels, Pillow (a dependency of torchvision) for the text."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = [
    "HeatmapLayout",
    "client_shares",
    "colormap",
    "colours",
    "counts_markdown",
    "heatmap_layout",
    "partition_heatmap",
]

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
FONT_SIZE = 13  # px: Pillow's embedded font, legible when TensorBoard shows the image at 1:1
BACKGROUND = (255, 255, 255)
_INK = (0, 0, 0)
_PAD = 8  # px between the blocks of the figure
_TICK = 4  # px length of a tick mark
_BAR_WIDTH = 16  # px width of the colour bar
_BAR_MIN_HEIGHT = 160  # px: the colour bar stays readable beside a short plot
_LABEL_GAP = 4  # px at least between two tick labels


def colormap(values: np.ndarray) -> np.ndarray:
    """Map values in [0, 1] to RGB (viridis-like); returns ``values.shape + (3,)`` floats."""
    v = np.clip(values, 0.0, 1.0) * (len(_VIRIDIS) - 1)
    lo = np.floor(v).astype(int).clip(0, len(_VIRIDIS) - 2)
    frac = (v - lo)[..., None]
    return _VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac


def colours(values: np.ndarray) -> np.ndarray:
    """:func:`colormap` as ``uint8`` RGB (the pixels the heat map draws for ``values`` in [0, 1])."""
    return (colormap(values) * 255).round().astype(np.uint8)


@lru_cache(maxsize=1)
def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's embedded font at :data:`FONT_SIZE` (its bitmap font where Pillow lacks FreeType)."""
    return ImageFont.load_default(size=FONT_SIZE)


def _text_size(text: str) -> tuple[int, int]:
    _, _, right, bottom = _font().getbbox(text)
    return int(right), int(bottom)  # from the drawing origin, so texts drawn at one y line up


def _nice_step(min_units: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least ``min_units``."""
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale >= min_units:
                return m * scale
        scale *= 10


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value``, at most 1."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        top = m * 10.0**exp
        if top >= value * (1 - 1e-9):
            return min(1.0, float(f"{top:.6g}"))
    return 1.0


@dataclass(frozen=True)
class HeatmapLayout:
    """Where :func:`partition_heatmap` puts things (pixels; ``x`` to the right, ``y`` down).

    Attributes:
        width, height: Image size.
        plot_x, plot_y: Top-left pixel of the cell grid.
        cell_w, cell_h: Pixels of one cell (one class wide, one row high).
        group: Clients averaged into one row (1 unless there are more clients than ``max_rows``).
        rows: Rows drawn, ``ceil(clients / group)``.
        classes: Columns drawn.
        row_step, class_step: Every ``row_step``-th row and ``class_step``-th class gets a tick label.
        vmax: The share drawn in the top colour of the scale (shares above are clipped; none are).
        bar_x, bar_y, bar_h: Top-left pixel and height of the colour bar (``_BAR_WIDTH`` wide).
        title: The lines of the title.
    """

    width: int
    height: int
    plot_x: int
    plot_y: int
    cell_w: int
    cell_h: int
    group: int
    rows: int
    classes: int
    row_step: int
    class_step: int
    vmax: float
    bar_x: int
    bar_y: int
    bar_h: int
    title: tuple[str, ...]

    @property
    def plot_w(self) -> int:
        return self.classes * self.cell_w

    @property
    def plot_h(self) -> int:
        return self.rows * self.cell_h

    def bar_ticks(self) -> list[tuple[float, int]]:
        """``(share, y pixel)`` of the colour bar's three labelled ticks: 0, ``vmax / 2``, ``vmax``."""
        values = (0.0, self.vmax / 2, self.vmax)
        return [(v, self.bar_y + round((1 - v / self.vmax) * (self.bar_h - 1))) for v in values]


def _bar_label(value: float) -> str:
    return f"{value:.3g}"


def heatmap_layout(
    num_clients: int,
    num_classes: int,
    vmax: float,
    plot_size: int = 640,
    max_cell: int = 48,
    max_rows: int = 1000,
) -> HeatmapLayout:
    """The geometry of :func:`partition_heatmap` for a ``num_clients x num_classes`` matrix.

    Cells are ``plot_size // n`` pixels along each axis (between 1 and ``max_cell``), so the grid is
    at most about ``plot_size`` pixels on a side up to ``plot_size`` clients or classes; beyond
    ``max_rows`` clients, consecutive clients are averaged into one row so that the image stays at
    most about ``max_rows + 100`` pixels high.
    """
    group = max(1, math.ceil(num_clients / max_rows))
    rows = max(1, math.ceil(num_clients / group))
    classes = max(1, num_classes)
    cell_w = min(max_cell, max(1, plot_size // classes))
    cell_h = min(max_cell, max(1, plot_size // rows))
    _, text_h = _text_size("0123456789")
    row_step = _nice_step((text_h + _LABEL_GAP) / cell_h)
    widest_class = _text_size(str(classes - 1))[0]
    class_step = _nice_step((widest_class + _LABEL_GAP) / cell_w)

    title = (
        "Partition: share of each client's training samples per class",
        f"{num_clients} clients x {num_classes} classes; each row sums to 1"
        + (f"; a row averages {group} clients" if group > 1 else ""),
    )
    title_h = len(title) * (text_h + 2)
    widest_client = _text_size(str(max(0, (rows - 1) * group)))[0]
    axis_title_h = _text_size("client")[1]
    plot_x = _PAD + axis_title_h + _PAD + widest_client + _TICK + 2
    plot_y = _PAD + title_h + _PAD + text_h // 2  # room for the first client id, centred on row 0
    plot_w, plot_h = classes * cell_w, rows * cell_h
    bar_y = plot_y + text_h + text_h // 2 + _PAD  # below the colour bar's title and its top value
    bar_h = max(plot_h - (bar_y - plot_y), _BAR_MIN_HEIGHT)
    bar_x = plot_x + plot_w + 2 * _PAD
    widest_bar = max(_text_size(_bar_label(v))[0] for v in (0.0, vmax / 2, vmax))
    bar_title_w = _text_size("share")[0]
    right = bar_x + _BAR_WIDTH + _TICK + 2 + max(widest_bar, bar_title_w) + _PAD
    width = max(right, _PAD + max(_text_size(t)[0] for t in title) + _PAD)
    below_plot = plot_y + plot_h + _TICK + 2 + text_h + _PAD + axis_title_h + _PAD
    height = max(below_plot, bar_y + bar_h + text_h // 2 + _PAD)
    return HeatmapLayout(
        width=width,
        height=height,
        plot_x=plot_x,
        plot_y=plot_y,
        cell_w=cell_w,
        cell_h=cell_h,
        group=group,
        rows=rows,
        classes=classes,
        row_step=row_step,
        class_step=class_step,
        vmax=vmax,
        bar_x=bar_x,
        bar_y=bar_y,
        bar_h=bar_h,
        title=title,
    )


def client_shares(counts: np.ndarray, group: int = 1) -> np.ndarray:
    """Each client's class counts divided by its total (rows of zeros for empty clients), with
    ``group`` consecutive clients averaged into one row."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
    if group > 1:
        starts = np.arange(0, len(shares), group)
        sizes = np.diff(np.append(starts, len(shares)))[:, None]
        shares = np.add.reduceat(shares, starts, axis=0) / sizes
    return shares


def partition_heatmap(counts: np.ndarray, plot_size: int = 640, max_rows: int = 1000) -> np.ndarray:
    """An HWC uint8 picture of a clients x classes count matrix, with axes, ids and a colour bar.

    Rows are clients (ids on the left axis, every k-th labelled when there are many), columns are
    classes (ids below); a cell's colour is the share of the client's training samples in that
    class (each row sums to 1), on a viridis scale from 0 to a round ``vmax`` at or above the
    largest share, shown by the colour bar on the right with its values. The grid is about
    ``plot_size`` pixels on a side (cells of 1 to 48 pixels); above ``max_rows`` clients,
    consecutive clients are averaged into one row (the title says how many), so 1000 clients make
    an image about 1100 pixels high and 10,000 no higher.

    Args:
        counts: ``[clients, classes]`` sample counts.
        plot_size: Target side of the cell grid in pixels.
        max_rows: Most rows drawn.

    Returns:
        ``uint8 [H, W, 3]`` RGB image on a white background.
    """
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be a [clients, classes] matrix, got shape {counts.shape}")
    num_clients, num_classes = counts.shape
    probe = heatmap_layout(num_clients, num_classes, 1.0, plot_size, max_rows=max_rows)
    shares = client_shares(counts, probe.group)
    vmax = _nice_ceiling(float(shares.max())) if shares.size else 1.0
    lay = heatmap_layout(num_clients, num_classes, vmax, plot_size, max_rows=max_rows)
    font = _font()
    _, text_h = _text_size("0123456789")

    img = np.full((lay.height, lay.width, 3), BACKGROUND, dtype=np.uint8)
    if shares.size:
        cells = colours(shares / vmax)
        grid = np.repeat(np.repeat(cells, lay.cell_h, axis=0), lay.cell_w, axis=1)
        img[lay.plot_y : lay.plot_y + lay.plot_h, lay.plot_x : lay.plot_x + lay.plot_w] = grid
    ramp = colours(np.linspace(1.0, 0.0, lay.bar_h))  # top = vmax
    img[lay.bar_y : lay.bar_y + lay.bar_h, lay.bar_x : lay.bar_x + _BAR_WIDTH] = ramp[:, None, :]

    pic = Image.fromarray(img)
    draw = ImageDraw.Draw(pic)
    for i, line in enumerate(lay.title):
        draw.text((_PAD, _PAD + i * (text_h + 2)), line, fill=_INK, font=font)
    # client ids: left axis, centred on their rows
    for row in range(0, lay.rows, lay.row_step):
        y = lay.plot_y + row * lay.cell_h + lay.cell_h // 2
        label = str(row * lay.group)
        w, _ = _text_size(label)
        draw.line([(lay.plot_x - _TICK, y), (lay.plot_x - 1, y)], fill=_INK)
        draw.text((lay.plot_x - _TICK - 2 - w, y - text_h // 2 - 1), label, fill=_INK, font=font)
    # class ids: below the grid, centred on their columns
    below = lay.plot_y + lay.plot_h
    for cls in range(0, lay.classes, lay.class_step):
        x = lay.plot_x + cls * lay.cell_w + lay.cell_w // 2
        label = str(cls)
        w, _ = _text_size(label)
        draw.line([(x, below), (x, below + _TICK - 1)], fill=_INK)
        draw.text((x - w // 2, below + _TICK + 1), label, fill=_INK, font=font)
    # axis titles
    axis_y = below + _TICK + 2 + text_h + _PAD
    draw.text(
        (lay.plot_x + lay.plot_w // 2 - _text_size("class")[0] // 2, axis_y), "class", fill=_INK, font=font
    )
    side = Image.new("RGB", _text_size("client"), BACKGROUND)
    ImageDraw.Draw(side).text((0, 0), "client", fill=_INK, font=font)
    side = side.rotate(90, expand=True)
    pic.paste(side, (_PAD, lay.plot_y + lay.plot_h // 2 - side.height // 2))
    # colour bar: its title above, values on the right
    draw.text((lay.bar_x, lay.plot_y), "share", fill=_INK, font=font)
    right = lay.bar_x + _BAR_WIDTH
    for value, y in lay.bar_ticks():
        draw.line([(right, y), (right + _TICK - 1, y)], fill=_INK)
        draw.text((right + _TICK + 2, y - text_h // 2 - 1), _bar_label(value), fill=_INK, font=font)
    return np.asarray(pic, dtype=np.uint8).copy()


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
