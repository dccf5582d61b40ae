"""Tests of fl_lightning.data.viz: the partition heat map's geometry, colours and labels."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from fl_lightning.data.viz import (
    BACKGROUND,
    _nice_ceiling,
    _text_size,
    client_shares,
    colours,
    counts_markdown,
    heatmap_layout,
    partition_heatmap,
)


def cell(img: np.ndarray, lay, row: int, cls: int) -> np.ndarray:
    """The pixel at the centre of a cell."""
    return img[
        lay.plot_y + row * lay.cell_h + lay.cell_h // 2, lay.plot_x + cls * lay.cell_w + lay.cell_w // 2
    ]


def inked(region: np.ndarray) -> np.ndarray:
    """Where a region differs from the white background."""
    return (region != np.array(BACKGROUND, dtype=np.uint8)).any(axis=-1)


def runs(mask: np.ndarray, bridge: int = 2) -> int:
    """Runs of True in a 1-d mask, gaps of up to ``bridge`` pixels (inside a label) bridged: one run
    per text label along an axis."""
    m = np.asarray(mask, dtype=bool).copy()
    on = np.flatnonzero(m)
    for a, b in pairwise(on):
        if 1 < b - a <= bridge + 1:
            m[a:b] = True
    edges = np.diff(np.concatenate([[0], m.astype(int), [0]]))
    return int((edges == 1).sum())


def layout_of(counts: np.ndarray, **kw):
    shares = client_shares(counts, heatmap_layout(*counts.shape, 1.0, **kw).group)
    return heatmap_layout(*counts.shape, _nice_ceiling(float(shares.max())), **kw)


# ------------------------------------------------------------------------------------------ geometry
@pytest.mark.parametrize(
    ("clients", "classes", "width", "height"),
    [
        (10, 10, (500, 1000), (450, 1000)),
        (100, 100, (600, 1000), (600, 1000)),
        (3, 2, (200, 600), (150, 400)),
    ],
)
def test_heatmap_size_is_legible_and_bounded(clients, classes, width, height):
    counts = np.random.default_rng(0).integers(0, 20, size=(clients, classes))
    img = partition_heatmap(counts)
    lay = layout_of(counts)
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert img.shape[:2] == (lay.height, lay.width)
    assert width[0] <= img.shape[1] <= width[1] and height[0] <= img.shape[0] <= height[1]
    # clients down, classes across: the grid is clients cells high and classes cells wide
    assert (lay.rows, lay.classes, lay.group) == (clients, classes, 1)
    assert lay.plot_h == clients * lay.cell_h and lay.plot_w == classes * lay.cell_w
    assert lay.plot_x + lay.plot_w < lay.bar_x and lay.plot_y + lay.plot_h < img.shape[0]
    if lay.plot_h >= 300:  # beside a tall grid the colour bar ends level with it
        assert lay.bar_y + lay.bar_h == lay.plot_y + lay.plot_h


@pytest.mark.parametrize(
    ("largest", "top"),
    [(0.115, 0.2), (0.21, 0.25), (0.3, 0.5), (0.5, 0.5), (0.75, 1.0), (0.03, 0.05), (0.0, 1.0)],
)
def test_colour_scale_tops_at_a_round_share_at_or_above_the_largest(largest, top):
    assert _nice_ceiling(largest) == top


def test_a_thousand_clients_get_one_pixel_row_each_and_more_are_averaged_into_rows():
    counts = np.random.default_rng(0).integers(0, 5, size=(1000, 10))
    img = partition_heatmap(counts)
    assert layout_of(counts).cell_h == 1 and 1000 < img.shape[0] <= 1200
    alternating = np.tile(np.array([[4, 0], [0, 4]]), (1000, 1))  # 2000 clients, each of one class
    img, lay = partition_heatmap(alternating), layout_of(alternating)
    assert lay.group == 2 and lay.rows == 1000 and img.shape[0] <= 1200
    # a row is the mean of clients 2i and 2i+1: half of each class (the top of a 0..0.5 scale)
    assert lay.vmax == 0.5
    assert (cell(img, lay, 0, 0) == colours(np.array(1.0))).all()
    assert (cell(img, lay, 999, 1) == colours(np.array(1.0))).all()
    # rows are labelled with the id of their first client: row 980 is client 1960, four digits wide
    y = lay.plot_y + 980
    assert lay.row_step == 20
    ink = np.flatnonzero(inked(img[y - 3 : y + 4, 24 : lay.plot_x - 4]).any(axis=0)) + 24
    assert ink.min() < lay.plot_x - 6 - _text_size("980")[0] - 2
    assert partition_heatmap(np.ones((10_000, 10))).shape[0] <= 1200


# ------------------------------------------------------------------------------------------- colours
def test_cell_colour_is_the_clients_share_of_the_class_on_the_colour_bars_scale():
    counts = np.array([[10, 0, 10, 20], [0, 0, 0, 0], [1, 1, 1, 1]])  # shares .25 0 .25 .5 / 0 / .25
    img, lay = partition_heatmap(counts), layout_of(counts)
    assert lay.vmax == 0.5  # the largest share, rounded up to a round number
    expected = np.array([[0.25, 0, 0.25, 0.5], [0, 0, 0, 0], [0.25, 0.25, 0.25, 0.25]]) / 0.5
    for r in range(3):
        for c in range(4):
            assert (cell(img, lay, r, c) == colours(np.array(expected[r, c]))).all(), (r, c)
    skewed = np.array([[30, 10, 0, 0], [0, 0, 0, 1]])  # shares .75 and 1: the scale tops at 1
    img, lay = partition_heatmap(skewed), layout_of(skewed)
    assert lay.vmax == 1.0
    assert (cell(img, lay, 0, 0) == colours(np.array(0.75))).all()
    assert (cell(img, lay, 0, 1) == colours(np.array(0.25))).all()
    assert (cell(img, lay, 1, 3) == colours(np.array(1.0))).all()


def test_colour_bar_runs_from_the_top_of_the_scale_down_to_zero():
    counts = np.array([[1, 3], [2, 2]])
    img, lay = partition_heatmap(counts), layout_of(counts)
    column = img[lay.bar_y : lay.bar_y + lay.bar_h, lay.bar_x + 8]
    assert (column[0] == colours(np.array(1.0))).all() and (column[-1] == colours(np.array(0.0))).all()
    (_, y0), (_, y_mid), (_, y_top) = lay.bar_ticks()
    assert y_top == lay.bar_y and y0 == lay.bar_y + lay.bar_h - 1
    assert np.abs(img[y_mid, lay.bar_x + 8].astype(int) - colours(np.array(0.5))).max() <= 2
    # its three values are written to the right of the bar, level with their ticks
    for _, y in lay.bar_ticks():
        assert inked(img[y - 2 : y + 3, lay.bar_x + 16 + 6 : lay.width]).any()


# -------------------------------------------------------------------------------------------- labels
@pytest.mark.parametrize(
    ("clients", "classes", "client_labels", "class_labels"), [(10, 10, 10, 10), (100, 100, 20, 20)]
)
def test_every_kth_client_and_class_id_is_written_beside_the_grid(
    clients, classes, client_labels, class_labels
):
    counts = np.random.default_rng(1).integers(0, 9, size=(clients, classes))
    img, lay = partition_heatmap(counts), layout_of(counts)
    assert lay.row_step == clients // client_labels and lay.class_step == classes // class_labels
    # left of the grid (between the axis title and the tick marks): one block of text per labelled client
    widest = _text_size(str(clients - 1))[0]
    left = img[lay.plot_y - 8 : lay.plot_y + lay.plot_h + 8, lay.plot_x - 6 - widest : lay.plot_x - 4]
    rows_with_ink = inked(left).any(axis=1)
    assert runs(rows_with_ink) == client_labels
    # labelled clients have text level with their row
    for row in range(0, lay.rows, lay.row_step):
        y = lay.plot_y + row * lay.cell_h + lay.cell_h // 2 - (lay.plot_y - 8)
        assert rows_with_ink[y], row
    # below the grid: one block of text per labelled class
    top = lay.plot_y + lay.plot_h + 5
    below = img[top : top + 14, lay.plot_x - 8 : lay.plot_x + lay.plot_w + 8]
    assert runs(inked(below).any(axis=0)) == class_labels


def test_title_axis_titles_and_colour_bar_title_are_drawn():
    counts = np.random.default_rng(2).integers(0, 9, size=(10, 10))
    img, lay = partition_heatmap(counts), layout_of(counts)
    assert inked(img[: lay.plot_y - 10]).sum() > 500  # two lines of title
    below_ids = lay.plot_y + lay.plot_h + 4 + 2 + 14
    assert inked(img[below_ids:, lay.plot_x : lay.plot_x + lay.plot_w]).any()  # "class"
    mid = lay.plot_y + lay.plot_h // 2
    assert inked(img[mid - 20 : mid + 20, :24]).any()  # "client", turned on its side
    assert inked(img[lay.plot_y : lay.bar_y - 8, lay.bar_x : lay.width]).any()  # "share"
    assert not inked(img[lay.plot_y + lay.plot_h + 2 :, lay.width - 8 :]).any()  # a clean right edge


def test_client_shares_sum_to_one_per_client_and_empty_clients_are_zero():
    shares = client_shares(np.array([[1, 3], [0, 0], [5, 5]]))
    np.testing.assert_allclose(shares, [[0.25, 0.75], [0, 0], [0.5, 0.5]])
    np.testing.assert_allclose(
        client_shares(np.array([[1, 3], [3, 1], [2, 0]]), group=2), [[0.5, 0.5], [1, 0]]
    )


def test_counts_markdown_lists_clients_and_totals():
    table = counts_markdown(np.array([[1, 2], [3, 4]]))
    assert "| 0 | 3 | 1 | 2 |" in table and "| 1 | 7 | 3 | 4 |" in table
