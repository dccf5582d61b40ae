import numpy as np

from fl_lightning.data.viz import colormap, counts_markdown, partition_heatmap


def test_heatmap_is_rows_normalised_and_scaled():
    counts = np.array([[10, 0, 5], [0, 0, 0]])
    img = partition_heatmap(counts, cell=4)
    assert img.shape == (8, 12, 3) and img.dtype == np.uint8
    top, low = (colormap(np.array([1.0])) * 255).round().astype(np.uint8)[0], img[4, 0]
    assert (img[0, 0] == top).all()  # the client's largest class is the brightest colour
    assert (img[0, 4] == low).all()  # zero counts get the darkest colour, also for an empty client
    assert not (img[0, 8] == top).all()


def test_heatmap_of_many_clients_shrinks_its_cells_to_bound_the_height():
    counts = np.random.default_rng(0).integers(0, 5, size=(1000, 10))
    assert partition_heatmap(counts).shape == (2000, 20, 3)  # 2 px per client instead of 12
    assert partition_heatmap(counts[:250]).shape[0] == 250 * 9
    assert partition_heatmap(np.ones((5000, 10))).shape == (5000, 10, 3)  # never below one pixel


def test_counts_markdown_lists_clients_and_totals():
    table = counts_markdown(np.array([[1, 2], [3, 4]]))
    assert "| 0 | 3 | 1 | 2 |" in table and "| 1 | 7 | 3 | 4 |" in table
