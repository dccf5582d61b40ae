"""The AlexNet-like CNN of the filter-decomposition paper's personalised setup."""

import torch

from fl_lightning.models import AlexNetCNN, Decomposed
from fl_lightning.models.decomposed import coefficient_names


def test_layers_and_shapes_of_the_paper():
    net = AlexNetCNN()
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [c.out_channels for c in convs] == [64, 256, 256]
    assert [lin.out_features for lin in linears] == [256, 128, 200]
    assert net(torch.randn(2, 3, 64, 64)).shape == (2, 200)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 200)  # adaptive pooling: any input size >= 8


def test_the_coefficients_dominate_the_decomposed_model():
    dec = Decomposed(AlexNetCNN(), num_atoms=9)
    state = dec.state_dict()
    coefficients = sum(state[n].numel() for n in coefficient_names(dec))
    assert coefficients == 9 * (3 * 64 + 64 * 256 + 256 * 256)
    assert 0.69 < coefficients / sum(t.numel() for t in state.values()) < 0.70  # 739,008 of 1,060,923
