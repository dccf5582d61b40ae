import pytest
import torch

from fl_lightning.errors import ConfigError
from fl_lightning.models import LeNet, create_model


def count(net):
    return sum(p.numel() for p in net.parameters())


def test_fedrep_cifar_cnn_parameter_counts():
    """Spec §7.4: CNNCifar 307,842 and CNNCifar100 1,075,044 parameters."""
    assert count(LeNet()) == 307_842
    assert count(create_model("lenet", num_classes=100, widths=(64, 128), hidden=(256, 128))) == 1_075_044


@pytest.mark.parametrize(("shape", "padding"), [((3, 32, 32), 0), ((1, 8, 8), 2), ((1, 28, 28), 0)])
def test_lenet_takes_cifar_digits_and_mnist_sizes(shape, padding):
    net = LeNet(in_channels=shape[0], num_classes=7, input_size=shape[1], padding=padding)
    assert net(torch.zeros(2, *shape)).shape == (2, 7)


def test_too_small_inputs_are_a_config_error():
    with pytest.raises(ConfigError, match="input_size=8"):
        LeNet(in_channels=1, input_size=8)


def test_niid_bench_simple_cnn_is_lenet_with_its_sizes():
    """NIID-Bench's ``SimpleCNNMNIST`` (and Flower's ``niid_bench`` ``CNNMnist``), used by
    ``configs/heterogeneity/``: conv 6@5x5, pool, conv 16@5x5, pool, fc 256->120, fc 84, fc 10 on 1x28x28,
    no dropout: 44,426 parameters."""
    net = LeNet(in_channels=1, widths=(6, 16), hidden=(120, 84), dropout=0.0, input_size=28)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (1, 6, (5, 5), (0, 0)),
        (6, 16, (5, 5), (0, 0)),
    ]
    assert [(fc.in_features, fc.out_features) for fc in linears] == [(16 * 4 * 4, 120), (120, 84), (84, 10)]
    assert count(net) == 44_426
    net.train()  # dropout 0: training mode computes what evaluation does
    x = torch.randn(3, 1, 28, 28)
    out = net(x)
    assert torch.equal(out, net.eval()(x))
